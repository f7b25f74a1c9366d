"""TFX's Evaluator seen by the registering Pusher: what it wrote (TFMA's output, `read_evaluation`)
and its blessing as the push's `evaluator` check (`evaluator_check`), recorded beside the
exporter's gate checks (`embedding_exporter.gate`) in the registry entry. Only a pipeline with
TFX's Evaluator (`evaluator.enabled`; pipelines/evaluation.py) has one."""
from __future__ import annotations

from typing import Any, Dict, Optional

from components.rules.metrics import is_defined, reported


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
      The check as the gate's `decide` writes its checks: {"name": "evaluator", "passed", "model_auc",
      "calibration", "examples", "slices", "evaluation", "reason"}.
    """
    overall = (evaluation or {}).get("overall", {})
    # TFMA's NaN (an AUC of one label) is no figure: None here, and named in the reason
    undefined = [k for k in ("auc", "calibration") if k in overall and not is_defined(overall[k])]
    (auc, _), (calibration, _) = reported(overall.get("auc")), reported(overall.get("calibration"))
    figures = ", ".join([f"{k} {v:.4f}" for k, v in (("AUC", auc), ("calibration", calibration)) if v is not None]
                        + [f"{'AUC' if k == 'auc' else k} undefined ({overall[k]!r})" for k in undefined])
    if blessed:
        reason = f"TFX's Evaluator blessed the serving model ({figures or 'no metrics read'})"
    else:
        failures = (evaluation or {}).get("failures") or []
        reason = (f"TFX's Evaluator did not bless the serving model ({figures or 'no metrics read'}): "
                  + ("; ".join(failures) if failures else "its thresholds did not hold"))
    return {"name": "evaluator", "passed": bool(blessed), "model_auc": auc, "calibration": calibration,
            "examples": overall.get("example_count"), "slices": (evaluation or {}).get("slices"),
            "evaluation": evaluation_uri, "reason": reason}
