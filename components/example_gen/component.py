"""EmbeddingExampleGen: TFX's FileBasedExampleGen (same driver, spans, versions, splits and ML
Metadata) with this project's executor and the pipeline configuration as one more parameter."""
from __future__ import annotations

from tfx import types
from tfx.components.example_gen import utils
from tfx.components.example_gen.component import FileBasedExampleGen
from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.proto import example_gen_pb2
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ExecutionParameter

from components.config.stages import stage_json
from components.config.schema import PipelineConfig
from components.tfx_wiring.component_keys import CONFIG_KEY
from components.example_gen import executor


class EmbeddingExampleGenSpec(standard_component_specs.FileBasedExampleGenSpec):
    PARAMETERS = dict(
        standard_component_specs.FileBasedExampleGenSpec.PARAMETERS,
        **{CONFIG_KEY: ExecutionParameter(type=str)},
    )


class EmbeddingExampleGen(FileBasedExampleGen):
    """Reads the configured CSV or TFRecord input into typed rows (Parquet splits), with a row ledger."""

    SPEC_CLASS = EmbeddingExampleGenSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, config: PipelineConfig, input_base: str, input_config=None, output_config=None, range_config=None):
        input_config = input_config or utils.make_default_input_config()
        spec = EmbeddingExampleGenSpec(
            input_base=input_base,
            input_config=input_config,
            output_config=output_config or utils.make_default_output_config(input_config),
            range_config=range_config,
            output_data_format=example_gen_pb2.FORMAT_PARQUET,
            output_file_format=example_gen_pb2.FILE_FORMAT_PARQUET,
            examples=types.Channel(type=standard_artifacts.Examples),
            **{CONFIG_KEY: stage_json(config, "example_gen")},  # its share only (components/config/stages.py)
        )
        # FileBasedExampleGen.__init__ builds its own spec; the base class takes ours.
        base_beam_component.BaseBeamComponent.__init__(self, spec=spec)
