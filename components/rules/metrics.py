"""Exact evaluation metrics on numpy arrays (no threshold buckets, unlike Keras' AUC)."""
from __future__ import annotations

import numpy as np


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Exact ROC AUC by the rank-sum (Mann-Whitney) statistic, ties counted half.

    Args:
      scores: model scores, any shape (flattened), float.
      labels: 0/1 labels, same number of elements.

    Returns:
      The AUC; NaN when the labels hold one class only.
    """
    # lazy: keeps scipy off the command line's start (the demo's data generator imports this module)
    from scipy.stats import rankdata

    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels).ravel().astype(bool)
    pos = int(labels.sum())
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def log_loss(probs: np.ndarray, labels: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy.

    Args:
      probs: predicted probabilities, any shape (flattened).
      labels: 0/1 labels, same number of elements.
      eps: probabilities are clipped to [eps, 1 - eps].

    Returns:
      The mean log loss.
    """
    p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), eps, 1 - eps)
    y = np.asarray(labels, dtype=np.float64).ravel()
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
