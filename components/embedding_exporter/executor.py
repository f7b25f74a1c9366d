"""TFX executor of EmbeddingExporter."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from tfx import types
from tfx.dsl.components.base import base_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils
from tfx.utils import io_utils

from absl import logging

from components.rows import ledger
from components.reporting import progress
from components.model_registry import registry

from components.config.loading import apply_values
from components.contracts.artifacts import TRAINING_RUN_FILE
from components.embedding_exporter.export import export_serving_model
from components.tfx_wiring.executor_base import config_of, upstream_ledger
from components.tfx_wiring.metric_properties import set_metric_property
from components.tfx_wiring.component_keys import (BLESSING_KEY, EXAMPLES_KEY, LAST_MODEL_KEY, MODEL_KEY,
                                                 SERVING_MODEL_KEY)

SERVING_MODEL_PROPERTY = "serving_model"  # the blessing's: the serving Model artifact it blesses


class Executor(base_executor.BaseExecutor):
    """Exports the Trainer's model as a verified serving model and writes its blessing."""

    @progress.staged(progress.EXPORTER)
    def Do(
        self,
        input_dict: Dict[str, List[types.Artifact]],
        output_dict: Dict[str, List[types.Artifact]],
        exec_properties: Dict[str, Any],
    ) -> None:
        """Runs the export (export.py) and records the gate's decision as a ModelBlessing.

        Args:
          input_dict: `model` (the Trainer's Model), `examples` (ExampleGen's, its eval split read)
            and optionally `last_blessed_model` (LastBlessedModel's lookup).
          output_dict: `serving_model` (Model) and `blessing` (ModelBlessing).
          exec_properties: `config_json`, the exporter's share of the pipeline config.

        Raises:
          ExportRefused: the export is refused (nothing is published or pushed).
          ValueError: `last_blessed_model` is not LastBlessedModel's output.
        """
        cfg = config_of(exec_properties)
        model = artifact_utils.get_single_instance(input_dict[MODEL_KEY])
        # The Tuner's values the Trainer trained with (the model's shape: cross layers, ...).
        cfg = apply_values(cfg, tuned_values(model.uri))
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
        _record_serving_model(serving, report)
        _write_blessing(blessing, model, serving, report)


def tuned_values(model_uri: str) -> Dict[str, Any]:
    """The values the Trainer applied from the Tuner's best hyperparameters (its training_run.json's
    `tuned`); empty for a model trained without tuning."""
    path = os.path.join(model_uri, TRAINING_RUN_FILE)
    if not fileio.exists(path):
        return {}
    return json.loads(io_utils.read_string_file(path)).get("tuned") or {}


def _record_serving_model(serving: types.Artifact, report: Dict[str, Any]) -> None:
    """The export's figures as the serving Model's properties (an undefined metric as its reason,
    `<name>_undefined`: metric_properties.py)."""
    set_metric_property(serving, "parity_max_abs_diff", report["parity"]["max_abs_diff"])
    serving.set_string_custom_property("table_layouts", ",".join(report["layout"]["kinds"]))
    serving.set_string_custom_property("table_dtype", report["table_dtype"])
    set_metric_property(serving, "eval_auc", report["eval_auc"]["serving"], report["eval_auc"].get("undefined"))


def _write_blessing(blessing: types.Artifact, model: types.Artifact, serving: types.Artifact,
                    report: Dict[str, Any]) -> None:
    """The gate's decision as the ModelBlessing's properties and its BLESSED/NOT_BLESSED file."""
    parity = report["parity"]
    decision = report["validation"]
    blessed = bool(decision["blessed"])
    # TFX's blessing properties (Evaluator's names); `current_model` (the Trainer model) goes
    # into the registry entry the Pusher writes (the next run's warm start).
    blessing.set_int_custom_property("blessed", int(blessed))
    blessing.set_int_custom_property("current_model_id", model.id)
    blessing.set_string_custom_property("current_model", model.uri)
    blessing.set_string_custom_property(SERVING_MODEL_PROPERTY, serving.uri)
    set_metric_property(blessing, "parity_max_abs_diff", parity["max_abs_diff"])
    blessing.set_int_custom_property("parity_examples", parity["examples"])
    for c in decision["checks"]:
        if "reference_auc" in c:
            set_metric_property(blessing, f"{c['name']}_reference_auc", c["reference_auc"], c.get("undefined"))
    if not blessed:
        blessing.set_string_custom_property("not_blessed_reason", "; ".join(decision["reasons"]))
        logging.warning("model not blessed (kept, not pushed): %s", "; ".join(decision["reasons"]))
    io_utils.write_string_file(os.path.join(blessing.uri, "BLESSED" if blessed else "NOT_BLESSED"), "")
