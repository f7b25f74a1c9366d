"""Metrics as ML Metadata custom properties, through one guard: never a NaN or an infinity.

ML Metadata's SQLite store cannot hold a NaN double (its INSERT fails with "no such column: nan"
while the component's outputs are published, after its executor succeeded), and a NaN in any store
answers no query. So a metric that is undefined on the rows it was measured on (AUC of a sample
holding one label) is not written as a float: the artifact gets the string property
`<name>_undefined` with the reason instead, and no `<name>` property at all, the way TFX leaves out
a figure it could not compute rather than writing a placeholder.
"""
from __future__ import annotations

from typing import Any, Optional

from absl import logging

from components.rules.metrics import reported

UNDEFINED_SUFFIX = "_undefined"


def set_metric_property(artifact: Any, name: str, value: Any, reason: Optional[str] = None) -> Optional[str]:
    """Writes a metric as the artifact's float custom property, or, undefined, its reason.

    Args:
      artifact: a TFX Artifact (its `set_float_custom_property` / `set_string_custom_property`).
      name: the property's name, e.g. `eval_auc`.
      value: the metric; None, NaN or infinite when undefined.
      reason: why it is undefined, when the caller knows ("undefined: the 512-row sample holds
        only label 0"); else a generic sentence naming the value.

    Returns:
      None when the float was written; the reason written to `<name>_undefined` otherwise.
    """
    number, why = reported(value, reason if reason else (None if value is not None else "undefined: not measured"))
    if why is None:
        artifact.set_float_custom_property(name, number)
        return None
    artifact.set_string_custom_property(name + UNDEFINED_SUFFIX, why)
    logging.warning("%s of %s is not recorded in ML Metadata: %s", name, getattr(artifact, "uri", "an artifact"), why)
    return why
