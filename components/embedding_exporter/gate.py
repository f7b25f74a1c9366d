"""The validation gate: whether an exported model is blessed (and so pushed by TFX's Pusher).

Two checks, each with its figures in the export report's `validation` section:
- `baseline`: the model's eval AUC (the trainer's, exact on the whole eval split) against the
  logistic regression the trainer fitted beside it on the same split (`eval_metrics.json`'s
  `baseline`), less `validation.baseline_margin`;
- `last_blessed`: the new serving model's AUC against the last blessed serving model's (the one
  served at the push destination, found in its model registry by the pipeline's LastBlessedModel
  step: components/model_registry), both scored by the exporter on the same raw eval rows of this
  run, less `validation.regression_margin`. The first model of a push destination has nothing to
  compare with: the check is recorded as skipped, with the lookup's note.

A check whose figure is undefined (an AUC measured on rows of one label: "undefined: the 400-row
eval sample holds only label 0") fails with that reason: a model is never blessed on a comparison
with NaN, which would pass or fail by accident. And a model whose serving AUC is undefined is not
blessed even with both checks off (check `eval_auc`): the model registry records every pushed
model's AUC, and the eval rows say nothing of the model.

A refused model is still exported and kept (its artifact, report and `NOT_BLESSED` blessing); only
the push is withheld.

A third check, `evaluator`, joins these when the pipeline runs TFX's stock Evaluator
(`evaluator.enabled`; pipelines/evaluation.py): it scores the serving model after the exporter, so
its blessing cannot be decided here. The registering Pusher (components/model_registry) takes both
blessings, pushes only when both bless the model, and records the `evaluator` check
(`model_registry.evaluation.evaluator_check`) beside this gate's checks in the registry entry.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf

from components.config.schema import PipelineConfig
from components.embedding_exporter.scoring import score
from components.rules.metrics import auc_undefined_reason, is_defined, reported, roc_auc


def score_previous(previous_serving_dir: str, raw: List[bytes], labels: np.ndarray) -> Dict[str, Any]:
    """Scores the last blessed serving model on this run's raw eval rows.

    Args:
      previous_serving_dir: the served model's SavedModel directory (its `serving_default` scores).
      raw: serialized raw tf.Examples, shape [n].
      labels: their 0/1 labels, shape [n].

    Returns:
      {"serving_dir", "examples": n, "eval_auc"}: what `decide` takes as `previous`; `eval_auc`
      is None when undefined on these rows, with `eval_auc_undefined` saying why.

    Raises:
      OSError, ValueError, tf.errors.OpError: the model cannot be loaded or scored; IndexError: a
        variables file cut short (TensorFlow's "Read less bytes than requested").
      KeyError: the model has no `serving_default` signature.
    """
    loaded = tf.saved_model.load(previous_serving_dir)
    probs = score(loaded.signatures["serving_default"], raw)
    auc, why = reported(roc_auc(probs, labels), auc_undefined_reason(labels, "eval sample"))
    out = {"serving_dir": previous_serving_dir, "examples": int(len(labels)), "eval_auc": auc}
    if why:
        out["eval_auc_undefined"] = why
    return out


def _undefined(value: Any, reason: Optional[str], what: str) -> Optional[str]:
    """Why `value` (a compared figure) is undefined, naming `what` it is; None when it is a number."""
    _, why = reported(value, reason)
    return f"{what} is {why}" if why else None


def decide(cfg: PipelineConfig, model_metrics: Optional[Dict[str, Any]], serving_auc: Optional[float],
           previous: Optional[Dict[str, Any]], no_previous: Optional[str] = None,
           serving_auc_undefined: Optional[str] = None) -> Dict[str, Any]:
    """Decides whether the exported model is blessed, by the `baseline` and `last_blessed` checks.

    Args:
      cfg: the pipeline config; its `validation` margins choose the checks (None: check off).
      model_metrics: the trainer's eval_metrics.json (None: not written).
      serving_auc: the new serving model's AUC on the rows `previous` was scored on (None or NaN:
        undefined on them).
      previous: `score_previous`'s result, None for a push destination's first model.
      no_previous: why there is no previous model (the registry lookup's note).
      serving_auc_undefined: why `serving_auc` is undefined, when it is.

    Returns:
      The report's `validation` section: {"blessed": bool, "checks": [one dict per check, with its
      figures and reason], "reasons": [the failed checks' reasons]}.
    """
    v = cfg.validation
    checks: List[Dict[str, Any]] = []
    if v.baseline_margin is not None:
        checks.append(_baseline_check(model_metrics, v.baseline_margin))
    if v.regression_margin is not None:
        checks.append(_last_blessed_check(serving_auc, serving_auc_undefined, previous, no_previous, v.regression_margin))
    if not is_defined(serving_auc) and not any(c.get("undefined") for c in checks):
        why = _undefined(serving_auc, serving_auc_undefined, "the serving model's AUC on the eval sample")
        checks.append({"name": "eval_auc", "passed": False, "model_auc": None, "undefined": why,
                       "reason": f"{why}: a model whose AUC cannot be measured is not pushed (the registry "
                                 "records each pushed model's AUC); give the eval split rows of both labels"})
    blessed = all(c["passed"] for c in checks)
    return {
        "blessed": blessed,
        "checks": checks,
        "reasons": [c["reason"] for c in checks if not c["passed"]],
    }


def _baseline_check(model_metrics: Optional[Dict[str, Any]], margin: float) -> Dict[str, Any]:
    """The `baseline` check: the model's eval AUC against the trainer's baseline's, less `margin`
    (`validation.baseline_margin`); failed when either is missing or undefined."""
    base = (model_metrics or {}).get("baseline")
    if base is None:
        return {"name": "baseline", "passed": False, "reason": (
            "the Trainer's eval_metrics.json has no baseline (a model trained before validation.baseline "
            "existed, or with it disabled); retrain, or set validation.baseline_margin: null")}
    if why := (_undefined(model_metrics.get("auc"), (model_metrics.get("undefined") or {}).get("auc"),
                          "the model's eval AUC")
               or _undefined(base.get("auc"), (base.get("undefined") or {}).get("auc"), "the baseline's eval AUC")):
        return {"name": "baseline", "passed": False, "model_auc": _number(model_metrics.get("auc")),
                "reference_auc": _number(base.get("auc")), "margin": margin,
                "examples": base.get("examples"), "undefined": why,
                "reason": f"{why}: the model cannot be compared with the baseline"}
    model_auc, ref = float(model_metrics["auc"]), float(base["auc"])
    ok = model_auc >= ref - margin
    return {
        "name": "baseline", "passed": ok, "model_auc": model_auc, "reference_auc": ref,
        "margin": margin, "examples": base.get("examples"),
        "reason": (f"eval AUC {model_auc:.4f} {'>=' if ok else '<'} baseline ({base['model']}) "
                   f"{ref:.4f} - margin {margin}"),
    }


def _last_blessed_check(serving_auc: Optional[float], serving_auc_undefined: Optional[str],
                        previous: Optional[Dict[str, Any]], no_previous: Optional[str], margin: float) -> Dict[str, Any]:
    """The `last_blessed` check: the serving model's AUC against the last blessed model's on the same
    eval rows, less `margin` (`validation.regression_margin`); skipped without a previous model,
    failed when either AUC is undefined."""
    if previous is None:
        return {"name": "last_blessed", "passed": True, "skipped": True,
                "reason": no_previous or "no blessed model before this one"}
    if why := (_undefined(serving_auc, serving_auc_undefined, "the serving model's AUC on the eval sample")
               or _undefined(previous.get("eval_auc"), previous.get("eval_auc_undefined"),
                             "the last blessed model's AUC on the eval sample")):
        return {"name": "last_blessed", "passed": False, "model_auc": _number(serving_auc),
                "reference_auc": _number(previous.get("eval_auc")), "margin": margin,
                "examples": previous["examples"], "reference_model": previous["serving_dir"],
                "undefined": why, "reason": f"{why}: the model cannot be compared with the last blessed one"}
    prev = float(previous["eval_auc"])
    ok = serving_auc >= prev - margin
    return {
        "name": "last_blessed", "passed": ok, "model_auc": serving_auc, "reference_auc": prev,
        "margin": margin, "examples": previous["examples"],
        "reference_model": previous["serving_dir"],
        "reason": (f"serving AUC {serving_auc:.4f} {'>=' if ok else '<'} last blessed model's {prev:.4f} "
                   f"on the same {previous['examples']} eval rows - margin {margin}"),
    }


def _number(value: Any) -> Optional[float]:
    """`value` as a float when it is a finite number, else None (what the report holds)."""
    return reported(value)[0]
