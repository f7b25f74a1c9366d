"""AUC ceiling check for generated data: a logistic regression given only the features that carry
signal in the generator (dense ones as log1p with missing indicators, one-hot of the signal
categoricals, mean one-hot of the signal multi-hot feature), trained on the first N rows.

    .venv/bin/python bench/auc_ceiling.py TRAIN.csv EVAL.csv [N ...]

Both files from `python -m components.example_gen.synthetic_data` (same cardinalities). Measured (docs/training.md,
"Eval AUC on generated data"): 0.852 at 40k and 0.861 at 300k training rows against a best achievable 0.864.
"""
import os
import sys

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from components.example_gen.synthetic_data import GeneratorSpec
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import OneHotEncoder
from sklearn.metrics import roc_auc_score
import scipy.sparse as sp
spec = GeneratorSpec()
sig_cat = [f"C{c+1}" for c in range(26) if spec.cardinalities[c] <= spec.signal_max_cardinality and c not in spec.multi_hot]
print(sig_cat)
def load(p):
    d = pd.read_csv(p, dtype=str, keep_default_na=False)
    return d
tr, ev = load(sys.argv[1]), load(sys.argv[2])
def feats(d, enc=None, hot=None):
    dense = []
    for j in (0, 2, 4, 8):
        x = d[f"I{j+1}"]
        miss = (x == "").values
        v = np.log1p(np.maximum(pd.to_numeric(x.replace("", "0")).values, 0))
        dense += [np.where(miss, 0, v), miss.astype(float)]
    D = np.stack(dense, 1)
    cats = d[sig_cat].values
    if enc is None:
        enc = OneHotEncoder(handle_unknown="ignore", min_frequency=3).fit(cats)
    # C24 multi-hot mean of one-hot
    toks = d["C24"].str.split("|")
    if hot is None:
        from collections import Counter
        c = Counter(t for ts in toks for t in ts if t)
        hot = {t: i for i, (t, n) in enumerate(c.most_common()) if n >= 3}
    rows, cols, vals = [], [], []
    for i, ts in enumerate(toks):
        ts = [t for t in ts if t]
        for t in ts:
            if t in hot:
                rows.append(i); cols.append(hot[t]); vals.append(1.0 / len(ts))
    M = sp.csr_matrix((vals, (rows, cols)), shape=(len(d), len(hot)))
    return sp.hstack([sp.csr_matrix(D), enc.transform(cats), M]).tocsr(), enc, hot
Xtr, enc, hot = feats(tr); Xev, _, _ = feats(ev, enc, hot)
ytr, yev = tr["label"].astype(int).values, ev["label"].astype(int).values
for n in [int(a) for a in sys.argv[3:]] or [len(tr)]:
    m = LogisticRegression(C=1.0, max_iter=2000).fit(Xtr[:n], ytr[:n])
    print(n, "oracle-feature LR eval AUC", roc_auc_score(yev, m.predict_proba(Xev)[:, 1]))
