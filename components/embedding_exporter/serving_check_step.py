"""`ServingCheck`: the serving check (serving_check.py) as a pipeline step after the exporter, with
`serving_check.enabled`; the Pusher requires its blessing.

Its output is TFX's `InfraBlessing` (what TFX's InfraValidator writes, and what TFX's Pusher logic
reads): `INFRA_BLESSED` or `INFRA_NOT_BLESSED` in the artifact with the `blessed` property, and
`serving_check.json` (what the check found, or why it failed). A model the exporter did not bless is
not checked (nothing would push it) and is marked not blessed, saying so.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from tfx import types
from tfx.components.util import model_utils
from tfx.dsl.components.base import base_component, base_executor, executor_spec
from tfx.types import artifact_utils, channel_utils, standard_artifacts
from tfx.types import standard_component_specs as specs
from tfx.types.component_spec import ChannelParameter, ComponentSpec
from tfx.utils import io_utils, path_utils

from components.embedding_exporter.serving_check import ServingCheckFailed, check_serving
from components.reporting import progress
from components.tfx_wiring.component_keys import BLESSING_KEY

STAGE = progress.SERVING_CHECK  # the step's node id, as progress events name it
REPORT_FILE = "serving_check.json"
REASON_PROPERTY = "reason"


def _mark(blessing: types.Artifact, blessed: bool, report: Dict[str, Any]) -> None:
    """As TFX's InfraValidator marks its blessing, with what the check found beside it."""
    io_utils.write_string_file(os.path.join(blessing.uri, "INFRA_BLESSED" if blessed else "INFRA_NOT_BLESSED"), "")
    io_utils.write_string_file(os.path.join(blessing.uri, REPORT_FILE), json.dumps(report, sort_keys=True))
    blessing.set_int_custom_property("blessed", int(blessed))
    if not blessed:
        blessing.set_string_custom_property(REASON_PROPERTY, report.get("reason", ""))


class ServingCheckExecutor(base_executor.BaseExecutor):
    """Checks the exporter's serving model; blesses it when it loads and answers as exported."""

    @progress.staged(STAGE)
    def Do(self, input_dict: Dict[str, List[types.Artifact]], output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        blessing = artifact_utils.get_single_instance(output_dict[BLESSING_KEY])
        exported = artifact_utils.get_single_instance(input_dict[specs.MODEL_BLESSING_KEY])
        if not model_utils.is_model_blessed(exported):
            _mark(blessing, False, {"checked": False, "reason": "the exporter did not bless the model: not checked"})
            progress.phase(STAGE, "not checked: the exporter did not bless the model")
            return
        model = artifact_utils.get_single_instance(input_dict[specs.MODEL_KEY])
        path = path_utils.serving_model_path(model.uri, path_utils.is_old_model_artifact(model))
        try:
            found = check_serving(path)
        except ServingCheckFailed as e:
            _mark(blessing, False, {"checked": True, "reason": str(e)})
            progress.phase(STAGE, f"FAILED: {e}")
            return
        _mark(blessing, True, dict(found.to_dict(), checked=True))
        progress.phase(STAGE, f"passed: {found.compared} recorded answers, serving_default p50 at batch 1 "
                              f"{found.timings.get('1', {}).get('p50_ms', float('nan')):.2f} ms")


class ServingCheckSpec(ComponentSpec):
    PARAMETERS: Dict[str, Any] = {}
    INPUTS = {specs.MODEL_KEY: ChannelParameter(type=standard_artifacts.Model),
              specs.MODEL_BLESSING_KEY: ChannelParameter(type=standard_artifacts.ModelBlessing)}
    OUTPUTS = {BLESSING_KEY: ChannelParameter(type=standard_artifacts.InfraBlessing)}


class ServingCheck(base_component.BaseComponent):
    """The serving check after the exporter (module docstring).

    Args:
      model: the exporter's serving `Model` channel.
      model_blessing: the exporter's `ModelBlessing` channel.
    """

    SPEC_CLASS = ServingCheckSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(ServingCheckExecutor)

    def __init__(self, model, model_blessing):
        super().__init__(spec=ServingCheckSpec(
            model=model, model_blessing=model_blessing,
            blessing=channel_utils.as_channel([standard_artifacts.InfraBlessing()])))
