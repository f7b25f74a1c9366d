"""Gradient-boosted trees (LightGBM) on the pipeline's own train/eval split: the bar tabular users
hold the model to, beside the model and the built-in baseline of the same run.

    .venv/bin/python bench/gbdt_reference.py OUTPUT_DIR CONFIG [--rounds 3000] [--max-categories 10000]

OUTPUT_DIR: a finished `pipelines run` of CONFIG. Reads the newest ExampleGen Parquet splits (the
raw typed columns: the same rows and the same hash split the model saw) and builds LightGBM's input
from CONFIG: every dense feature as a float (a missing cell stays NaN: LightGBM's own missing-value
handling), every categorical feature as a pandas category of its raw cell (a multi-valued cell as
one category; a feature with more distinct train values than --max-categories keeps its most
frequent ones and puts the rest in one "other" category), except a multi-hot feature (a
`separator`), which enters as a bag of its tokens: one count column per token seen at least
--bag-min-count times in the train split (a text's words; as one category every review would be
its own). Rows without a label are left out, as
preprocessing leaves them out. The number of boosting rounds is chosen by early stopping on a 10%
slice of the train split, never on the eval split; the eval AUC is the exact AUC on the whole eval
split (components.rules.metrics.roc_auc, as the validation gate computes it). Prints one RESULT line:
the run's model and baseline AUC (its eval_metrics.json) and LightGBM's, with seconds.

LightGBM is a benchmark-only dependency, kept out of the product's lock: install it once with
`.venv/.tools/bin/uv pip install --python .venv/bin/python --target data/bench/lightgbm --no-deps lightgbm==4.6.0`
(it needs only numpy and scipy, both in .venv).
"""
import argparse
import glob
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "data", "bench", "lightgbm"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import components  # noqa: E402,F401


def first_values(col: pa.ChunkedArray):
    """A list column -> (first value of each row as a numpy array, whether the row has one)."""
    col = col.combine_chunks()
    offsets = np.asarray(col.offsets)
    has = np.diff(offsets) > 0
    flat = col.flatten()
    return flat.take(pa.array(offsets[:-1][has])), has


def frame(tables, cfg, max_categories: int, categories=None):
    """Raw Parquet tables of one split -> (features DataFrame, labels, the categories used)."""
    t = pa.concat_tables(tables)
    label_values, has_label = first_values(t.column(cfg.label))
    keep = np.flatnonzero(has_label)
    y = (np.asarray(label_values.to_numpy(zero_copy_only=False), dtype=np.float64) > 0).astype(np.int32)
    out = {}
    categories = dict(categories or {})
    for d in cfg.dense_features:
        values, has = first_values(t.column(d.source))
        x = np.full(t.num_rows, np.nan)
        x[has] = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float64)
        out[d.name] = x[keep]
    bags = []
    for f in cfg.categorical_features:
        source = f.source
        if source in out:
            continue
        if f.separator:
            bags.append((source, f.separator))
            continue
        values, has = first_values(t.column(source))
        raw = np.full(t.num_rows, None, dtype=object)
        raw[has] = values.cast(pa.string()).to_numpy(zero_copy_only=False) if pa.types.is_binary(values.type) \
            else values.to_numpy(zero_copy_only=False).astype(str)
        raw = pd.Series(raw[keep])
        if source not in categories:  # from the train split: its most frequent values
            categories[source] = list(raw.value_counts().index[:max_categories])
        known = raw.where(raw.isin(categories[source]), other="__other__").where(raw.notna(), None)
        out[source] = pd.Categorical(known, categories=[*categories[source], "__other__"])
    return pd.DataFrame(out), y, categories, {s: _texts(t.column(s), keep) for s, _ in bags}


def _texts(col, keep):
    values, has = first_values(col)
    raw = np.full(len(has), "", dtype=object)
    raw[has] = values.cast(pa.string()).to_numpy(zero_copy_only=False)
    return raw[keep]


def with_bags(x: pd.DataFrame, texts, cfg, vocab, min_count: int):
    """x's columns (categories as their codes, missing NaN) and each multi-hot feature's bag of
    tokens (a count column per token of `vocab`, built from the train split when empty) as one CSR
    matrix; returns it and the categorical columns' indices."""
    from collections import Counter

    from scipy import sparse

    seps = {f.source: f.separator for f in cfg.categorical_features if f.separator}
    cols, cat_idx = [], []
    for i, c in enumerate(x.columns):
        if isinstance(x[c].dtype, pd.CategoricalDtype):
            codes = x[c].cat.codes.to_numpy().astype(np.float64)
            cols.append(np.where(codes < 0, np.nan, codes))
            cat_idx.append(i)
        else:
            cols.append(x[c].to_numpy(np.float64))
    blocks = [sparse.csr_matrix(np.stack(cols, 1)) if cols else sparse.csr_matrix((len(next(iter(texts.values()))), 0))]
    for source, raw in texts.items():
        toks = [[t for t in s.split(seps[source]) if t] for s in raw]
        if source not in vocab:
            counts = Counter(t for row in toks for t in row)
            vocab[source] = {t: j for j, t in enumerate(sorted(t for t, n in counts.items() if n >= min_count))}
        v = vocab[source]
        rows, idx = [], []
        for r, row in enumerate(toks):
            for t in row:
                if t in v:
                    rows.append(r)
                    idx.append(v[t])
        blocks.append(sparse.csr_matrix((np.ones(len(idx)), (rows, idx)), shape=(len(toks), len(v))))
    return sparse.hstack(blocks, format="csr"), cat_idx


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output_dir")
    ap.add_argument("config")
    ap.add_argument("--rounds", type=int, default=3000, help="most boosting rounds (early stopping picks fewer)")
    ap.add_argument("--max-categories", type=int, default=10000)
    ap.add_argument("--learning-rate", type=float, default=0.05)
    ap.add_argument("--leaves", type=int, default=63)
    ap.add_argument("--bag-min-count", type=int, default=5, help="a multi-hot feature's tokens kept as columns")
    args = ap.parse_args(argv)
    try:
        import lightgbm as lgb
    except ImportError:
        raise SystemExit("lightgbm is not installed: see this script's docstring for the one command that installs it")
    from components.config.loading import load_config
    from components.rules.metrics import roc_auc

    cfg = load_config(args.config)
    # the last run's own artifacts, as its summary names them
    with open(os.path.join(args.output_dir, "summary.json"), encoding="utf-8") as fh:
        artifacts = json.load(fh)["artifacts"]
    examples = artifacts["EmbeddingExampleGen.examples"]
    metrics_path = os.path.join(artifacts["Trainer.model"], "eval_metrics.json")
    metrics = json.load(open(metrics_path)) if os.path.isfile(metrics_path) else {}

    def read(split):
        return [pq.read_table(f) for f in sorted(glob.glob(os.path.join(examples, f"Split-{split}", "*.parquet")))]

    start = time.time()
    x, y, cats, texts = frame(read("train"), cfg, args.max_categories)
    xe, ye, _, texts_e = frame(read("eval"), cfg, args.max_categories, cats)
    categorical = "auto"
    if texts:
        vocab = {}
        x, categorical = with_bags(x, texts, cfg, vocab, args.bag_min_count)
        xe, _ = with_bags(xe, texts_e, cfg, vocab, args.bag_min_count)
    # the early-stopping slice: every 10th train row (the split's rows are in file order, not by label)
    hold = np.arange(len(y)) % 10 == 0
    params = {"objective": "binary", "learning_rate": args.learning_rate, "num_leaves": args.leaves,
              "min_data_in_leaf": 50, "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1,
              "lambda_l2": 1.0, "cat_smooth": 10.0, "cat_l2": 10.0, "max_cat_to_onehot": 4,
              "num_threads": os.cpu_count() or 1, "verbose": -1, "seed": 1}
    train = lgb.Dataset(x[~hold], y[~hold], categorical_feature=categorical)
    valid = lgb.Dataset(x[hold], y[hold], reference=train)
    booster = lgb.train(params, train, num_boost_round=args.rounds, valid_sets=[valid],
                        callbacks=[lgb.early_stopping(50, verbose=False)])
    auc = roc_auc(booster.predict(xe, num_iteration=booster.best_iteration), ye)
    seconds = time.time() - start
    ours, base = metrics.get("auc"), (metrics.get("baseline") or {}).get("auc")
    fmt = lambda v: f"{v:.4f}" if isinstance(v, (int, float)) else "-"  # noqa: E731
    print(f"RESULT {cfg.name}: model {fmt(ours)} baseline {fmt(base)} lightgbm {auc:.4f} "
          f"({booster.best_iteration} rounds, {seconds:.0f} s; train {len(y):,} rows, eval {len(ye):,})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
