"""TFX's BulkInferrer executor with the stage's live progress and a record of what it scored.

The record (`SCORING_RECORD_FILE` in its `inference_result`) holds the rows of each split it was
given (the tf.Example copy's `<split>_rows`), where its PredictionLogs are, or why it scored none
(an unblessed model: TFX's executor then writes an empty `inference_result` and says nothing). The
summary reads it (pipelines/summary.py). A module of its own: TFX's executor loads TensorFlow,
which the config path (pipelines/bulk_inference.py) does not.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List

from tfx.components.bulk_inferrer import executor as tfx_executor
from tfx.components.util import model_utils
from tfx.types import standard_component_specs as keys
from tfx.utils import io_utils

from components.contracts.artifacts import SCORING_RECORD_FILE
from components.reporting import progress


def _splits(exec_properties) -> List[str]:
    """The splits the DataSpec names (TFX passes it as JSON)."""
    spec = json.loads(exec_properties.get(keys.DATA_SPEC_KEY) or "{}")
    return list(spec.get("exampleSplits") or spec.get("example_splits") or [])


class BulkInferrerExecutor(tfx_executor.Executor):
    """TFX's executor, with progress lines and `SCORING_RECORD_FILE` (module docstring)."""

    @progress.staged(progress.BULK_INFERRER)
    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802  (TFX's name)
        blessing = (input_dict.get(keys.MODEL_BLESSING_KEY) or [None])[0]
        blessed = blessing is None or model_utils.is_model_blessed(blessing)
        examples = input_dict[keys.EXAMPLES_KEY][0]
        rows: Dict[str, int] = {s: examples.get_int_custom_property(f"{s}_rows") for s in _splits(exec_properties)}
        progress.phase(progress.BULK_INFERRER, ("scoring " + ", ".join(f"{s} {n:,} rows" for s, n in rows.items()))
                       if blessed else "not scoring: the model was not blessed")
        super().Do(input_dict, output_dict, exec_properties)
        result = (output_dict.get(keys.INFERENCE_RESULT_KEY) or [None])[0]
        if result is not None:
            record = {"scored": blessed, "rows": rows if blessed else {}, "output": result.uri,
                      "why_not": None if blessed else "the model was not blessed (the validation gate kept it back)"}
            io_utils.write_string_file(os.path.join(result.uri, SCORING_RECORD_FILE), json.dumps(record))
