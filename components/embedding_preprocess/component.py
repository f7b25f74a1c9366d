"""EmbeddingPreprocess: a TFX component that only wires its spec to the Beam executor."""
from __future__ import annotations

from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import ComponentSpec, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ExecutionParameter
from tfx.types import channel_utils

from components.config.stages import stage_json
from components.tfx_wiring.artifact_types import EmbeddingStatistics, EmbeddingVocabulary
from components.config.schema import PipelineConfig
from components.tfx_wiring.component_keys import CONFIG_KEY
from components.embedding_preprocess import executor
from components.tfx_wiring import component_keys


class EmbeddingPreprocessSpec(ComponentSpec):
    PARAMETERS = {CONFIG_KEY: ExecutionParameter(type=str)}
    INPUTS = {component_keys.EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples)}
    OUTPUTS = {
        component_keys.TRANSFORMED_EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        component_keys.VOCABULARY_KEY: ChannelParameter(type=EmbeddingVocabulary),
        component_keys.STATISTICS_KEY: ChannelParameter(type=EmbeddingStatistics),
    }


class EmbeddingPreprocess(base_beam_component.BaseBeamComponent):
    """Builds vocabularies, maps raw values to embedding IDs and computes statistics."""

    SPEC_CLASS = EmbeddingPreprocessSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, examples, config: PipelineConfig):
        super().__init__(
            spec=EmbeddingPreprocessSpec(
                examples=examples,
                config_json=stage_json(config, "preprocess"),  # its share only (components/config/stages.py)
                transformed_examples=channel_utils.as_channel([standard_artifacts.Examples()]),
                vocabulary=channel_utils.as_channel([EmbeddingVocabulary()]),
                statistics=channel_utils.as_channel([EmbeddingStatistics()]),
            )
        )
