"""TFX executor of EmbeddingExporter."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from tfx import types
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils
from tfx.dsl.io import fileio
from tfx.utils import io_utils

from absl import logging

from components.rows import ledger
from components.reporting import progress
from components.model_registry import registry

from components.embedding_exporter.export import export_serving_model
from components.tfx_wiring.executor_base import CONFIG_KEY, config_of, upstream_ledger

MODEL_KEY = "model"
EXAMPLES_KEY = "examples"
SERVING_MODEL_KEY = "serving_model"
BLESSING_KEY = "blessing"
LAST_MODEL_KEY = "last_blessed_model"  # optional: LastBlessedModel's pointer to the served model
SERVING_MODEL_PROPERTY = "serving_model"  # the blessing's: the serving Model artifact it blesses


class Executor(base_executor.BaseExecutor):
    @progress.staged(progress.EXPORTER)
    def Do(
        self,
        input_dict: Dict[str, List[types.Artifact]],
        output_dict: Dict[str, List[types.Artifact]],
        exec_properties: Dict[str, Any],
    ) -> None:
        cfg = config_of(exec_properties)
        model = artifact_utils.get_single_instance(input_dict[MODEL_KEY])
        examples = artifact_utils.get_single_instance(input_dict[EXAMPLES_KEY])
        serving = artifact_utils.get_single_instance(output_dict[SERVING_MODEL_KEY])
        blessing = artifact_utils.get_single_instance(output_dict[BLESSING_KEY])
        eval_pattern = io_utils.all_files_pattern(artifact_utils.get_split_uri([examples], "eval"))
        # No blessing for a model of a run whose rows do not add up (ExampleGen's ledger).
        upstream = upstream_ledger(examples.uri)
        if upstream is not None:
            ledger.check_ledger(upstream, "EmbeddingExporter")
        # The last blessed model: the one served at the push destination, as LastBlessedModel read
        # it from the model registry there (None: a pipeline without that step).
        last = input_dict.get(LAST_MODEL_KEY) or []
        previous = registry.read_lookup(last[0].uri) if last else None
        if last and previous is None:
            raise ValueError(f"{LAST_MODEL_KEY} {last[0].uri}: no {registry.LOOKUP_FILE}; give the output of "
                             "LastBlessedModel (components.model_registry)")
        # Raises ExportRefused (the execution fails, nothing is published or pushed) on any mismatch.
        report = export_serving_model(cfg, model.uri, eval_pattern, serving.uri, last_blessed=previous)
        parity = report["parity"]
        serving.set_float_custom_property("parity_max_abs_diff", parity["max_abs_diff"])
        serving.set_string_custom_property("table_layouts", ",".join(report["layout"]["kinds"]))
        serving.set_string_custom_property("table_dtype", report["table_dtype"])
        serving.set_float_custom_property("eval_auc", report["eval_auc"]["serving"])
        decision = report["validation"]
        blessed = bool(decision["blessed"])
        # TFX's blessing properties (Evaluator's names); `current_model` (the Trainer model) goes
        # into the registry entry the Pusher writes (the next run's warm start).
        blessing.set_int_custom_property("blessed", int(blessed))
        blessing.set_int_custom_property("current_model_id", model.id)
        blessing.set_string_custom_property("current_model", model.uri)
        blessing.set_string_custom_property(SERVING_MODEL_PROPERTY, serving.uri)
        blessing.set_float_custom_property("parity_max_abs_diff", parity["max_abs_diff"])
        blessing.set_int_custom_property("parity_examples", parity["examples"])
        for c in decision["checks"]:
            if "model_auc" in c:
                blessing.set_float_custom_property(f"{c['name']}_reference_auc", c["reference_auc"])
        if not blessed:
            blessing.set_string_custom_property("not_blessed_reason", "; ".join(decision["reasons"]))
            logging.warning("model not blessed (kept, not pushed): %s", "; ".join(decision["reasons"]))
        io_utils.write_string_file(os.path.join(blessing.uri, "BLESSED" if blessed else "NOT_BLESSED"), "")
