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

A refused model is still exported and kept (its artifact, report and `NOT_BLESSED` blessing); only
the push is withheld.

A third check, `evaluator`, joins these when the pipeline runs TFX's stock Evaluator
(`evaluator.enabled`; pipelines/evaluation.py): it scores the serving model after the exporter, so
its blessing cannot be decided here. The registering Pusher (components/model_registry) takes both
blessings, pushes only when both bless the model, and records `evaluator_check`'s result beside
this gate's checks in the registry entry.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf

from components.config.schema import PipelineConfig
from components.embedding_exporter.scoring import score
from components.rules.metrics import roc_auc


def score_previous(previous_serving_dir: str, raw: List[bytes], labels: np.ndarray) -> Dict[str, Any]:
    """Scores the last blessed serving model on this run's raw eval rows.

    Args:
      previous_serving_dir: the served model's SavedModel directory (its `serving_default` scores).
      raw: serialized raw tf.Examples, shape [n].
      labels: their 0/1 labels, shape [n].

    Returns:
      {"serving_dir", "examples": n, "eval_auc"}: what `decide` takes as `previous`.

    Raises:
      OSError, ValueError, tf.errors.OpError: the model cannot be loaded or scored.
      KeyError: the model has no `serving_default` signature.
    """
    loaded = tf.saved_model.load(previous_serving_dir)
    probs = score(loaded.signatures["serving_default"], raw)
    return {"serving_dir": previous_serving_dir, "examples": int(len(labels)), "eval_auc": roc_auc(probs, labels)}


def decide(cfg: PipelineConfig, model_metrics: Optional[Dict[str, Any]], serving_auc: float,
           previous: Optional[Dict[str, Any]], no_previous: Optional[str] = None) -> Dict[str, Any]:
    """Decides whether the exported model is blessed, by the `baseline` and `last_blessed` checks.

    Args:
      cfg: the pipeline config; its `validation` margins choose the checks (None: check off).
      model_metrics: the trainer's eval_metrics.json (None: not written).
      serving_auc: the new serving model's AUC on the rows `previous` was scored on.
      previous: `score_previous`'s result, None for a push destination's first model.
      no_previous: why there is no previous model (the registry lookup's note).

    Returns:
      The report's `validation` section: {"blessed": bool, "checks": [one dict per check, with its
      figures and reason], "reasons": [the failed checks' reasons]}.
    """
    v = cfg.validation
    checks: List[Dict[str, Any]] = []
    if v.baseline_margin is not None:
        base = (model_metrics or {}).get("baseline")
        if base is None:
            checks.append({"name": "baseline", "passed": False, "reason": (
                "the Trainer's eval_metrics.json has no baseline (a model trained before validation.baseline "
                "existed, or with it disabled); retrain, or set validation.baseline_margin: null")})
        else:
            model_auc, ref = float(model_metrics["auc"]), float(base["auc"])
            ok = model_auc >= ref - v.baseline_margin
            checks.append({
                "name": "baseline", "passed": ok, "model_auc": model_auc, "reference_auc": ref,
                "margin": v.baseline_margin, "examples": base.get("examples"),
                "reason": (f"eval AUC {model_auc:.4f} {'>=' if ok else '<'} baseline ({base['model']}) "
                           f"{ref:.4f} - margin {v.baseline_margin}"),
            })
    if v.regression_margin is not None:
        if previous is None:
            checks.append({"name": "last_blessed", "passed": True, "skipped": True,
                           "reason": no_previous or "no blessed model before this one"})
        else:
            prev = float(previous["eval_auc"])
            ok = serving_auc >= prev - v.regression_margin
            checks.append({
                "name": "last_blessed", "passed": ok, "model_auc": serving_auc, "reference_auc": prev,
                "margin": v.regression_margin, "examples": previous["examples"],
                "reference_model": previous["serving_dir"],
                "reason": (f"serving AUC {serving_auc:.4f} {'>=' if ok else '<'} last blessed model's {prev:.4f} "
                           f"on the same {previous['examples']} eval rows - margin {v.regression_margin}"),
            })
    blessed = all(c["passed"] for c in checks)
    return {
        "blessed": blessed,
        "checks": checks,
        "reasons": [c["reason"] for c in checks if not c["passed"]],
    }


def read_evaluation(evaluation_uri: str) -> Dict[str, Any]:
    """Reads what TFX's Evaluator wrote (TFMA's output).

    Args:
      evaluation_uri: the Evaluator's ModelEvaluation artifact directory.

    Returns:
      {"overall": {metric name: value} of the overall slice, "slices": how many slices,
      "validation_ok": whether its thresholds held, "failures": each failed threshold's message}.
    """
    import tensorflow_model_analysis as tfma  # lazy: TFMA is heavy and only a pipeline with the Evaluator reads it

    overall: Dict[str, float] = {}
    slices = 0
    for m in tfma.load_metrics(evaluation_uri):
        slices += 1
        if m.slice_key.single_slice_keys:
            continue
        for kv in m.metric_keys_and_values:
            if kv.value.HasField("double_value"):
                overall[kv.key.name] = float(kv.value.double_value.value)
    result = tfma.load_validation_result(evaluation_uri)
    failures = [f.message or f"{f.metric_key.name} {f.metric_value}" for v in result.metric_validations_per_slice
                for f in v.failures]
    return {"overall": overall, "slices": slices, "validation_ok": bool(result.validation_ok), "failures": failures}


def evaluator_check(blessed: bool, evaluation: Optional[Dict[str, Any]], evaluation_uri: Optional[str]) -> Dict[str, Any]:
    """Builds the `evaluator` check from the Evaluator's blessing: passed exactly when it blesses.

    Args:
      blessed: whether the Evaluator's blessing blesses the serving model.
      evaluation: `read_evaluation`'s result, None when the Pusher was given no evaluation.
      evaluation_uri: where that evaluation was read from (None: none given).

    Returns:
      The check as `decide` writes its checks: {"name": "evaluator", "passed", "model_auc",
      "calibration", "examples", "slices", "evaluation", "reason"}.
    """
    overall = (evaluation or {}).get("overall", {})
    auc, calibration = overall.get("auc"), overall.get("calibration")
    figures = ", ".join(f"{k} {v:.4f}" for k, v in (("AUC", auc), ("calibration", calibration)) if v is not None)
    if blessed:
        reason = f"TFX's Evaluator blessed the serving model ({figures or 'no metrics read'})"
    else:
        failures = (evaluation or {}).get("failures") or []
        reason = (f"TFX's Evaluator did not bless the serving model ({figures or 'no metrics read'}): "
                  + ("; ".join(failures) if failures else "its thresholds did not hold"))
    return {"name": "evaluator", "passed": bool(blessed), "model_auc": auc, "calibration": calibration,
            "examples": overall.get("example_count"), "slices": (evaluation or {}).get("slices"),
            "evaluation": evaluation_uri, "reason": reason}
