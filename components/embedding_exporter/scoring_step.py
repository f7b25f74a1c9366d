"""`FileScoring`: `python -m pipelines score` as a pipeline step (`bulk_inference.path`), after the
exporter, on the file the config names, with the exporter's serving model.

Its output (`ScoredFile`) holds `scores.parquet` (one row per scored input row: `row`, `score`, the
`bulk_inference.carry` columns: batch_scoring.py) and `scoring_record.json` (rows read, scored and
malformed, seconds, or why nothing was scored: a model the exporter did not bless is not used).
It scores on the step's own machine, streaming the file in bounded memory; a file bigger than one
machine wants the same scoring as a Beam job, which is not built.
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
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter
from tfx.utils import io_utils, path_utils

from components.contracts.artifacts import SCORING_RECORD_FILE
from components.embedding_exporter.batch_scoring import score_file
from components.reporting import progress
from components.tfx_wiring.artifact_types import ScoredFile

STAGE = progress.FILE_SCORING
SCORES_FILE = "scores.parquet"
INPUT_PATH_KEY, CARRY_KEY, SCORES_KEY = "input_path", "carry", "scores"


class FileScoringExecutor(base_executor.BaseExecutor):
    """Scores `input_path` with the blessed serving model into the `scores` artifact."""

    @progress.staged(STAGE)
    def Do(self, input_dict: Dict[str, List[types.Artifact]], output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        out = artifact_utils.get_single_instance(output_dict[SCORES_KEY])
        blessing = artifact_utils.get_single_instance(input_dict[specs.MODEL_BLESSING_KEY])
        path = exec_properties[INPUT_PATH_KEY]
        if not model_utils.is_model_blessed(blessing):
            record: Dict[str, Any] = {"scored": False, "input": path,
                                      "why_not": "the model was not blessed (the validation gate kept it back)"}
            progress.phase(STAGE, "not scoring: the model was not blessed")
        else:
            model = artifact_utils.get_single_instance(input_dict[specs.MODEL_KEY])
            model_dir = path_utils.serving_model_path(model.uri, path_utils.is_old_model_artifact(model))
            progress.phase(STAGE, f"scoring {path}")
            last = [0]

            def on_batch(rows: int) -> None:  # progress counts are deltas
                progress.count(STAGE, "scoring", rows - last[0])
                last[0] = rows

            report = score_file(model_dir, path, os.path.join(out.uri, SCORES_FILE),
                                carry=json.loads(exec_properties.get(CARRY_KEY) or "[]"), on_batch=on_batch)
            record = dict(report.to_dict(), scored=True, input=path, why_not=None)
        io_utils.write_string_file(os.path.join(out.uri, SCORING_RECORD_FILE), json.dumps(record, sort_keys=True))


class FileScoringSpec(ComponentSpec):
    PARAMETERS = {INPUT_PATH_KEY: ExecutionParameter(type=str), CARRY_KEY: ExecutionParameter(type=str)}
    INPUTS = {specs.MODEL_KEY: ChannelParameter(type=standard_artifacts.Model),
              specs.MODEL_BLESSING_KEY: ChannelParameter(type=standard_artifacts.ModelBlessing)}
    OUTPUTS = {SCORES_KEY: ChannelParameter(type=ScoredFile)}


class FileScoring(base_component.BaseComponent):
    """The file scoring step (module docstring).

    Args:
      model: the exporter's serving `Model` channel.
      model_blessing: the exporter's `ModelBlessing` channel.
      input_path: the CSV or Parquet file to score.
      carry: input columns copied beside each score.
    """

    SPEC_CLASS = FileScoringSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(FileScoringExecutor)

    def __init__(self, model, model_blessing, input_path: str, carry: List[str]):
        super().__init__(spec=FileScoringSpec(
            model=model, model_blessing=model_blessing, input_path=input_path, carry=json.dumps(list(carry)),
            scores=channel_utils.as_channel([ScoredFile()])))
