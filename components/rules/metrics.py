"""Exact evaluation metrics on numpy arrays (no threshold buckets, unlike Keras' AUC).

A metric can be undefined on the rows it is measured on: ROC AUC needs both labels, log loss at
least one row. Such a metric is NaN here, and `auc_undefined_reason` / `log_loss_undefined_reason`
say why in one sentence ("undefined: the 512-row sample holds only label 0"). What leaves a stage
(a report, a JSON file, an ML Metadata property) never carries the NaN: `reported` turns a metric
into `(value or None, reason or None)` and `with_reasons` does it for a whole dict of metrics, so a
reader finds `null` and the reason beside it, under `undefined`.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import numpy as np

# The key under which `with_reasons` lists each undefined metric's reason.
UNDEFINED_KEY = "undefined"


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Exact ROC AUC by the rank-sum (Mann-Whitney) statistic, ties counted half.

    Args:
      scores: model scores, any shape (flattened), float.
      labels: 0/1 labels, same number of elements.

    Returns:
      The AUC; NaN when the labels hold one class only, or none (`auc_undefined_reason` says which).
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
      The mean log loss; NaN for no rows (`log_loss_undefined_reason` says so).
    """
    p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), eps, 1 - eps)
    y = np.asarray(labels, dtype=np.float64).ravel()
    if y.size == 0:
        return float("nan")
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def is_defined(value: Any) -> bool:
    """Whether `value` is a finite number (not None, NaN or infinite).

    Args:
      value: a metric's value.

    Returns:
      True for a finite int or float.
    """
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) \
        and math.isfinite(float(value))


def _rows(n: int, what: str) -> str:
    return f"the {n:,}-row {what}"


def _no_rows_reason(examples: int, what: str) -> Optional[str]:
    """Why a metric is undefined on no rows, or None when there are some."""
    return None if examples > 0 else f"undefined: the {what} holds no rows"


def _non_finite_float(value: Any) -> bool:
    """A float that is NaN or infinite (what an undefined metric is before it leaves a stage)."""
    return isinstance(value, (float, np.floating)) and not math.isfinite(float(value))


def auc_undefined_reason(labels: np.ndarray, what: str = "sample") -> Optional[str]:
    """Why ROC AUC is undefined on these labels, or None when it is defined.

    Args:
      labels: the 0/1 labels the AUC is measured on.
      what: what the rows are, for the sentence ("sample", "eval split").

    Returns:
      e.g. "undefined: the 512-row sample holds only label 0", or None (both labels present).
    """
    y = np.asarray(labels).ravel().astype(bool)
    return counts_undefined_reason(int(y.size), int(y.sum()), what)


def counts_undefined_reason(examples: int, positives: int, what: str = "sample") -> Optional[str]:
    """`auc_undefined_reason` from the counts alone (an evaluation that kept only them).

    Args:
      examples: how many rows the AUC was measured on.
      positives: how many of them have label 1.
      what: what the rows are, for the sentence.

    Returns:
      The reason, or None when both labels are present.
    """
    if examples <= 0:
        return _no_rows_reason(examples, what)
    if positives <= 0:
        return f"undefined: {_rows(examples, what)} holds only label 0"
    if positives >= examples:
        return f"undefined: {_rows(examples, what)} holds only label 1"
    return None


def log_loss_undefined_reason(labels: np.ndarray, what: str = "sample") -> Optional[str]:
    """Why log loss is undefined on these labels (no rows), or None when it is defined.

    Args:
      labels: the labels the log loss is measured on.
      what: what the rows are, for the sentence.

    Returns:
      The reason, or None.
    """
    return _no_rows_reason(int(np.asarray(labels).size), what)


def reported(value: Any, reason: Optional[str] = None) -> Tuple[Optional[float], Optional[str]]:
    """A metric as it leaves a stage: its value, or None and why it is undefined.

    Args:
      value: the metric (NaN or infinite when undefined).
      reason: why it is undefined, when the caller knows (e.g. `auc_undefined_reason`).

    Returns:
      (float value, None) when defined; (None, reason) otherwise, the reason "undefined: not a
      finite number (nan)" when none was given.
    """
    if is_defined(value):
        return float(value), None
    return None, reason or f"undefined: not a finite number ({value!r})"


def with_reasons(metrics: Dict[str, Any], reasons: Optional[Dict[str, Optional[str]]] = None) -> Dict[str, Any]:
    """A dict of metrics with every undefined float replaced by None and its reason under `undefined`.

    Args:
      metrics: {name: value}; values that are not floats (ints, strings, dicts) are kept as they are.
      reasons: {name: why it is undefined} for the metrics whose reason the caller knows.

    Returns:
      A new dict: defined metrics unchanged, each NaN/infinite float None, and (when any is) the
      key `undefined` {name: reason}, merged with one already there.
    """
    out: Dict[str, Any] = dict(metrics)
    undefined: Dict[str, str] = dict(out.get(UNDEFINED_KEY) or {})
    for name, value in metrics.items():
        if _non_finite_float(value):
            out[name], undefined[name] = reported(value, (reasons or {}).get(name))
    if undefined:
        out[UNDEFINED_KEY] = undefined
    return out


def evaluation_reasons(metrics: Dict[str, Any], what: str = "eval split") -> Dict[str, Optional[str]]:
    """Why an evaluation's `auc` and `log_loss` are undefined, from its `examples` and `positive_rate`.

    Args:
      metrics: an evaluation's metrics ({"auc", "log_loss", "examples", "positive_rate"}).
      what: what the rows are, for the sentence.

    Returns:
      {"auc": reason or None, "log_loss": reason or None}.
    """
    examples = int(metrics.get("examples") or 0)
    rate = metrics.get("positive_rate")
    positives = int(round(float(rate) * examples)) if is_defined(rate) else 0
    return {"auc": counts_undefined_reason(examples, positives, what),
            "log_loss": _no_rows_reason(examples, what)}


def json_safe(obj: Any) -> Any:
    """`obj` with every NaN or infinite float, at any depth, replaced by None (strict JSON).

    Args:
      obj: plain data (dicts, lists, numbers, strings).

    Returns:
      A copy that `json.dumps(..., allow_nan=False)` accepts; a dict in which a float was replaced
      lists it under `undefined` (the reason already there is kept).
    """
    if isinstance(obj, dict):
        out = {k: json_safe(v) for k, v in obj.items()}
        replaced = {k: "undefined: not a finite number" for k, v in obj.items() if _non_finite_float(v)}
        if replaced:
            out[UNDEFINED_KEY] = {**replaced, **(obj.get(UNDEFINED_KEY) or {})}
        return out
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return None if _non_finite_float(obj) else obj
