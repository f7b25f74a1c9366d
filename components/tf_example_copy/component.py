"""TFExampleCopy: wires its spec to the executor; outputs a standard Examples artifact (tf.Example
payload) that TFX's Evaluator, StatisticsGen, Transform ... read with their TFRecord TFXIO."""
from __future__ import annotations

import json
from typing import List, Optional

from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import ComponentSpec, channel_utils, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ExecutionParameter

from components.tf_example_copy import executor
from components.tfx_wiring import component_keys


class TFExampleCopySpec(ComponentSpec):
    """`TFExampleCopy`'s parameter (`splits`, a JSON list), input `examples` and output `tf_examples`."""

    PARAMETERS = {component_keys.SPLITS_KEY: ExecutionParameter(type=str)}
    INPUTS = {component_keys.EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples)}
    OUTPUTS = {component_keys.TF_EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples)}


class TFExampleCopy(base_beam_component.BaseBeamComponent):
    """Copies splits of a Parquet Examples artifact (EmbeddingExampleGen's) into tf.Example TFRecords.

    Every row is copied and counted. The pipeline uses it only when the stock Evaluator is on.

    Args:
      examples: the Parquet `Examples` channel.
      splits: the splits to copy; None copies `eval` only.
    """

    SPEC_CLASS = TFExampleCopySpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, examples, splits: Optional[List[str]] = None):
        super().__init__(spec=TFExampleCopySpec(
            examples=examples, splits=json.dumps(list(splits or ["eval"])),
            **{component_keys.TF_EXAMPLES_KEY: channel_utils.as_channel([standard_artifacts.Examples()])}))
