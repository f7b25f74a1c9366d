"""TFExampleCopy: wires its spec to the executor; outputs a standard Examples artifact (tf.Example
payload) that TFX's Evaluator, StatisticsGen, Transform ... read with their TFRecord TFXIO."""
from __future__ import annotations

import json
from typing import List, Optional

from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import ComponentSpec, channel_utils, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ExecutionParameter

from components.tf_example_copy import executor


class TFExampleCopySpec(ComponentSpec):
    PARAMETERS = {executor.SPLITS_KEY: ExecutionParameter(type=str)}
    INPUTS = {executor.EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples)}
    OUTPUTS = {executor.OUTPUT_KEY: ChannelParameter(type=standard_artifacts.Examples)}


class TFExampleCopy(base_beam_component.BaseBeamComponent):
    """The `splits` of a Parquet Examples artifact (EmbeddingExampleGen's) as tf.Example TFRecords,
    every row copied (counted). Used by the pipeline only when the stock Evaluator is on."""

    SPEC_CLASS = TFExampleCopySpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, examples, splits: Optional[List[str]] = None):
        super().__init__(spec=TFExampleCopySpec(
            examples=examples, splits=json.dumps(list(splits or ["eval"])),
            **{executor.OUTPUT_KEY: channel_utils.as_channel([standard_artifacts.Examples()])}))
