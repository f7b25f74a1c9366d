"""What eval AUC other model families reach on a finished run's own split (bench/README.md "Defaults
on real data": is a target reachable at all on this dataset?).

    .venv/bin/python bench/reachable_auc.py OUTPUT_DIR CONFIG [--c 0.3 1.0] [--alpha 0.01 0.1 1.0] [--seeds 0 1]

OUTPUT_DIR: a finished `pipelines run` of CONFIG; its newest transformed examples are reused. The
design matrix is baseline_vs_sklearn.py's (tests/test_validation_gate._one_hot: one column per
table row, mean over a feature's IDs, the dense features signed-log1p), fitted on the whole train
split and scored on the whole eval split by the same exact AUC as the pipeline. Fits, each one
RESULT line (family, setting, eval AUC, seconds):
- scikit-learn's LogisticRegression at each C;
- the same with a cubic spline basis (8 knots) of every dense feature added: a linear model with
  a smooth nonlinear term per dense feature (only where the config has dense features);
- scikit-learn's MLPClassifier, one hidden layer of 64 ReLUs over the one-hot matrix (a sum of
  64-wide embeddings), Adam, L2 `alpha` on every weight, early stopping on a tenth of the train
  split, at each alpha and seed.
Then one BEST line. LightGBM on the same split is bench/gbdt_reference.py.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import components  # noqa: E402,F401

from bench.defaults_sweep import config_with, finished_run  # noqa: E402
from components.planning.run_plan import derive_plan  # noqa: E402
from components.rules.metrics import roc_auc  # noqa: E402
from tests.test_validation_gate import _one_hot  # noqa: E402  (the test's independent design matrix)


def main(argv=None) -> None:
    import scipy.sparse as sp
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import SplineTransformer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output_dir")
    ap.add_argument("config")
    ap.add_argument("--c", type=float, nargs="*", default=[0.3, 1.0])
    ap.add_argument("--alpha", type=float, nargs="*", default=[0.01, 0.1, 1.0])
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    args = ap.parse_args(argv)

    train, evals, manifest, stats = finished_run(args.output_dir)
    plan = derive_plan(config_with(args.config), manifest, stats)
    x, y = _one_hot(train, manifest, plan)
    xe, ye = _one_hot(evals, manifest, plan)
    print(f"train {x.shape[0]:,} rows, eval {xe.shape[0]:,} rows, {x.shape[1]:,} columns", flush=True)
    results = []

    def report(family: str, setting: str, scores, start: float) -> None:
        auc = roc_auc(scores, ye)
        results.append((auc, family, setting))
        print(f"RESULT {family} {setting} auc {auc:.4f} seconds {time.time() - start:.0f}", flush=True)

    designs = [("logistic_regression", x, xe)]
    n_dense = len(manifest.dense_names)
    if n_dense:  # the dense features are _one_hot's last columns
        dense, dense_e = x[:, -n_dense:].toarray(), xe[:, -n_dense:].toarray()
        splines = SplineTransformer(n_knots=8, degree=3).fit(dense)
        designs.append(("logistic_regression+splines",
                        sp.hstack([x, sp.csr_matrix(splines.transform(dense))]).tocsr(),
                        sp.hstack([xe, sp.csr_matrix(splines.transform(dense_e))]).tocsr()))
    for family, a, b in designs:
        for c in args.c:
            start = time.time()
            report(family, f"C={c}", LogisticRegression(C=c, max_iter=5000).fit(a, y).decision_function(b), start)
    for alpha in args.alpha:
        for seed in args.seeds:
            start = time.time()
            mlp = MLPClassifier(hidden_layer_sizes=(64,), alpha=alpha, early_stopping=True, random_state=seed,
                                max_iter=200).fit(x, y)
            report("mlp", f"alpha={alpha} seed={seed} epochs={mlp.n_iter_}", mlp.predict_proba(xe)[:, 1], start)
    auc, family, setting = max(results)
    print(f"BEST {family} {setting} auc {auc:.4f}", flush=True)


if __name__ == "__main__":
    main()
