"""EmbeddingExporter: wires its spec to the executor; outputs a Model the standard Pusher takes."""
from __future__ import annotations

from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import ComponentSpec, channel_utils, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ExecutionParameter

from components.config.stages import stage_json
from components.config.schema import PipelineConfig
from components.embedding_exporter import executor
from components.tfx_wiring.component_keys import CONFIG_KEY
from components.tfx_wiring import component_keys


class EmbeddingExporterSpec(ComponentSpec):
    """The exporter's inputs (the Trainer's Model, ExampleGen's Examples, optionally the last
    blessed model), outputs (serving Model, ModelBlessing) and its config parameter."""

    PARAMETERS = {CONFIG_KEY: ExecutionParameter(type=str)}
    INPUTS = {
        component_keys.MODEL_KEY: ChannelParameter(type=standard_artifacts.Model),
        component_keys.EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        # LastBlessedModel's output (components/model_registry): what the push destination serves.
        component_keys.LAST_MODEL_KEY: ChannelParameter(type=standard_artifacts.Model, optional=True),
    }
    OUTPUTS = {
        component_keys.SERVING_MODEL_KEY: ChannelParameter(type=standard_artifacts.Model),
        component_keys.BLESSING_KEY: ChannelParameter(type=standard_artifacts.ModelBlessing),
    }


class EmbeddingExporter(base_component.BaseComponent):
    """Converts the trained model into a CPU serving SavedModel over raw features, verified by parity,
    and decides whether it is blessed (gate.py).

    A parity failure fails the execution (nothing published). A model that passes parity but not
    the validation gate (the trainer's baseline; the last blessed model, i.e. the one served at
    the push destination, given by LastBlessedModel as `last_blessed_model`) is published with a
    NOT_BLESSED blessing, which the Pusher does not push.

    Args:
      model: channel of the Trainer's Model.
      examples: channel of ExampleGen's Examples (the raw eval split is read).
      config: the pipeline config; the exporter gets its share (components/config/stages.py).
      last_blessed_model: channel of LastBlessedModel's Model (None: no comparison with the
        served model).
    """

    SPEC_CLASS = EmbeddingExporterSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, model, examples, config: PipelineConfig, last_blessed_model=None):
        super().__init__(
            spec=EmbeddingExporterSpec(
                model=model,
                examples=examples,
                last_blessed_model=last_blessed_model,
                config_json=stage_json(config, "exporter"),  # its share only (components/config/stages.py)
                serving_model=channel_utils.as_channel([standard_artifacts.Model()]),
                blessing=channel_utils.as_channel([standard_artifacts.ModelBlessing()]),
            )
        )
