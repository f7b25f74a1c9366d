"""The gate's baseline against scikit-learn's converged logistic regression (bench/README.md "Defaults on
real data": how the baseline's FTRL settings were chosen).

    .venv/bin/python bench/baseline_vs_sklearn.py OUTPUT_DIR CONFIG [C ...]

OUTPUT_DIR: a finished `pipelines run` of CONFIG; its newest transformed examples are reused. Fits
the Trainer's baseline (baseline.py, `validation.baseline` of CONFIG) and, for each inverse
regularisation C (default 1.0 and 0.1), scikit-learn's LogisticRegression on a one-hot matrix of
the same examples built independently (tests/test_validation_gate._one_hot: one column per table
row, mean over a feature's IDs, the dense features signed-log1p). Prints one RESULT line each:
exact eval AUC on the whole eval split, seconds.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import components  # noqa: E402,F401

from bench.defaults_sweep import config_with, finished_run  # noqa: E402
from components.embedding_trainer.run_plan import derive_plan, training_steps  # noqa: E402
from components.embedding_trainer.baseline import train_baseline  # noqa: E402
from components.rules.metrics import roc_auc  # noqa: E402
from tests.test_validation_gate import _one_hot  # noqa: E402  (the test's independent design matrix)


def main(output_dir: str, config_path: str, cs) -> None:
    from sklearn.linear_model import LogisticRegression

    train, evals, manifest, stats = finished_run(output_dir)
    cfg = config_with(config_path)
    plan = derive_plan(cfg, manifest, stats)
    length = training_steps(cfg, stats)
    start = time.time()
    ours = train_baseline(cfg, plan, manifest, train, evals, model_steps=length["steps"],
                          train_rows=stats.splits["train"]["examples_written"])
    print(f"RESULT baseline ({cfg.validation.baseline.optimizer.name}) auc {ours['auc']:.4f} "
          f"seconds {time.time() - start:.0f}", flush=True)
    x, y = _one_hot(train, manifest, plan)
    xe, ye = _one_hot(evals, manifest, plan)
    for c in cs:
        start = time.time()
        fit = LogisticRegression(C=c, max_iter=5000).fit(x, y)
        print(f"RESULT sklearn LogisticRegression C={c} auc {roc_auc(fit.decision_function(xe), ye):.4f} "
              f"seconds {time.time() - start:.0f}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2], [float(c) for c in sys.argv[3:]] or [1.0, 0.1])
