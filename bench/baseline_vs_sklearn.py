"""The gate's baseline against scikit-learn's converged logistic regression on the same features
and rows (bench/README.md "Defaults on real data": the built-in baseline's settings).

    .venv/bin/python bench/baseline_vs_sklearn.py OUTPUT_DIR CONFIG [BASELINE_JSON ...]

OUTPUT_DIR: a finished `pipelines run` of CONFIG; its newest transformed examples are reused. Fits
the Trainer's baseline (baseline.py, `validation.baseline` of CONFIG, each BASELINE_JSON merged
into it, e.g. '{"optimizer": {"name": "adagrad", "learning_rate": 0.5}}') and scikit-learn's
LogisticRegression (lbfgs) on a design matrix of the same examples built
independently (tests/test_validation_gate._one_hot: one column per table row holding the ID's count
in the row, a bag; the dense features signed-log1p), fitted on the rows the baseline trains on (the
train split less its held-out slice), three ways: C = 1 (its default), C chosen on the same held-out
slice the baseline chooses its L2 on (C = 1 / (2 l2) for the baseline's non-zero candidates), and
the better of C = 1 and 0.1 on the eval split itself (optimistic: chosen on the rows it is scored
on). Prints one RESULT line each: exact AUC on the whole eval split, seconds; and `gap`: the
baseline's AUC less each. `--skip-sklearn`: the baseline alone (its seconds on a large split).
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import components  # noqa: E402,F401

from bench.defaults_sweep import finished_run  # noqa: E402
from components.config.loading import parse_config  # noqa: E402
from components.planning.run_plan import derive_plan, training_steps  # noqa: E402
from components.embedding_trainer.baseline import baseline_holdout_fraction, train_baseline  # noqa: E402
from components.rules.metrics import roc_auc  # noqa: E402
from tests.test_validation_gate import _one_hot  # noqa: E402  (the test's independent design matrix)


def _config(config_path: str, baseline_override=None):
    import yaml

    with open(config_path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    raw["input"]["path"] = os.path.abspath(os.path.join(os.path.dirname(config_path), raw["input"]["path"]))
    if baseline_override:
        raw.setdefault("validation", {}).setdefault("baseline", {}).update(baseline_override)
    return parse_config(raw)


def main(output_dir: str, config_path: str, overrides, sklearn: bool = True) -> None:
    from sklearn.linear_model import LogisticRegression

    train, evals, manifest, stats = finished_run(output_dir)
    rows = stats.splits["train"]["examples_written"]
    best_sk = None
    for override in overrides or [None]:
        cfg = _config(config_path, json.loads(override) if override else None)
        plan = derive_plan(cfg, manifest, stats)
        length = training_steps(cfg, stats)
        ours = train_baseline(cfg, plan, manifest, train, evals, model_steps=length["steps"], train_rows=rows)
        cands = " ".join(f"{c['l2']:g}:{c['holdout_auc']:.4f}" for c in ours["candidates"] if c["holdout_auc"] is not None)
        print(f"RESULT baseline {override or 'config'} auc {ours['auc']:.4f} l2 {ours['l2']:g} "
              f"(held-out {cands}) steps {ours['train_steps']} epochs {ours['epochs']} seconds {ours['seconds']:.0f}",
              flush=True)
        if not sklearn:
            continue
        if best_sk is None:
            fraction = baseline_holdout_fraction(cfg, rows)
            x, y = _one_hot(train, manifest, plan, part="train", holdout_fraction=fraction)
            xh, yh = _one_hot(train, manifest, plan, part="holdout", holdout_fraction=fraction)
            xe, ye = _one_hot(evals, manifest, plan)
            fits = {}
            for c in sorted({1.0, 0.1, *(1 / (2 * l2) for l2 in cfg.validation.baseline.l2 if l2 > 0)}, reverse=True):
                start = time.time()
                fit = LogisticRegression(C=c, max_iter=5000).fit(x, y)
                fits[c] = (roc_auc(fit.decision_function(xh), yh), roc_auc(fit.decision_function(xe), ye))
                print(f"RESULT sklearn LogisticRegression C={c:.4g} held-out auc {fits[c][0]:.4f} eval auc {fits[c][1]:.4f} "
                      f"seconds {time.time() - start:.0f}", flush=True)
            chosen = max(fits, key=lambda c: fits[c][0])
            best_sk = {"C=1": fits[1.0][1], f"C={chosen:.4g} (held-out)": fits[chosen][1],
                       "best of C=1, 0.1 on eval": max(fits[1.0][1], fits[0.1][1])}
        print(f"RESULT gap {override or 'config'} " + ", ".join(f"{k} {ours['auc'] - v:+.4f}" for k, v in best_sk.items()),
              flush=True)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output_dir", help="a finished `pipelines run` of CONFIG")
    ap.add_argument("config")
    ap.add_argument("baseline_json", nargs="*", help="validation.baseline fields merged in, one fit each")
    ap.add_argument("--skip-sklearn", action="store_true", help="the baseline's fit and seconds only (a large split)")
    args = ap.parse_args()
    main(args.output_dir, args.config, args.baseline_json, sklearn=not args.skip_sklearn)
