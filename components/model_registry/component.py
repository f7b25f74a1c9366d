"""The registry's two TFX components, each a thin wiring of its executor.

- `LastBlessedModel`: reads the registry at the push destination (the pipeline runs it before
  ExampleGen, so a broken registry stops the run before any data is read) and outputs a `Model` artifact that
  points at the served model: the Trainer takes it as `base_model` (warm start, drift), the exporter
  as `last_blessed_model` (the gate's reference). It replaces TFX's Resolver with
  LatestBlessedModelStrategy, an ML Metadata query that open-source KFP's backend cannot run.
- `RegistryPusher`: TFX's Pusher (same inputs, output and destination) that registers each model
  it pushes. With TFX's stock Evaluator in the pipeline it also takes the Evaluator's blessing
  (required: both blessings must bless) and its evaluation (recorded in the registry entry).
"""
from __future__ import annotations

from typing import Optional

from tfx.dsl.components.base import base_component, executor_spec
from tfx.proto import pusher_pb2
from tfx.types import ComponentSpec, channel_utils, standard_artifacts
from tfx.types import standard_component_specs as specs
from tfx.types.component_spec import ChannelParameter, ExecutionParameter

from components.model_registry import executor
from components.tfx_wiring import component_keys


class LastBlessedModelSpec(ComponentSpec):
    """`LastBlessedModel`'s parameters (serving_dir, run_id) and its one output, `model`."""

    PARAMETERS = {
        component_keys.SERVING_DIR_KEY: ExecutionParameter(type=str),
        # Kubeflow: `{{$.pipeline_job_uuid}}`, so that no two runs share a cache key (a cached
        # lookup would hand a run an older served model) even when caching is on at submission.
        component_keys.RUN_ID_KEY: ExecutionParameter(type=str, optional=True),
    }
    INPUTS = {}
    OUTPUTS = {component_keys.MODEL_KEY: ChannelParameter(type=standard_artifacts.Model)}


class LastBlessedModel(base_component.BaseComponent):
    """Outputs the model served at `serving_dir` (the Pusher's destination), read from its registry.

    Args:
      serving_dir: the push destination whose registry is read.
      run_id: a value unique to each run (Kubeflow: `{{$.pipeline_job_uuid}}`), so that no
        cached lookup is reused; None locally.
    """

    SPEC_CLASS = LastBlessedModelSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.LookupExecutor)

    def __init__(self, serving_dir: str, run_id: Optional[str] = None):
        super().__init__(spec=LastBlessedModelSpec(
            serving_dir=serving_dir, run_id=run_id, model=channel_utils.as_channel([standard_artifacts.Model()])))


class RegistryPusherSpec(ComponentSpec):
    """`RegistryPusher`'s parameters, inputs (model, blessings, evaluation) and output, `pushed_model`."""

    PARAMETERS = {
        specs.PUSH_DESTINATION_KEY: ExecutionParameter(type=pusher_pb2.PushDestination),
        component_keys.PIPELINE_NAME_KEY: ExecutionParameter(type=str),
        # Kubeflow: `{{$.pipeline_job_uuid}}` / `{{$.pipeline_job_name}}`, which KFP and Vertex
        # substitute when a parameter's constant value is exactly the placeholder; local: empty.
        component_keys.RUN_ID_KEY: ExecutionParameter(type=str, optional=True),
        component_keys.RUN_NAME_KEY: ExecutionParameter(type=str, optional=True),
    }
    INPUTS = {
        specs.MODEL_KEY: ChannelParameter(type=standard_artifacts.Model),
        specs.MODEL_BLESSING_KEY: ChannelParameter(type=standard_artifacts.ModelBlessing),
        # TFX's Evaluator's outputs (pipelines/evaluation.py), when the pipeline has one.
        component_keys.EVALUATOR_BLESSING_KEY: ChannelParameter(type=standard_artifacts.ModelBlessing, optional=True),
        component_keys.EVALUATION_KEY: ChannelParameter(type=standard_artifacts.ModelEvaluation, optional=True),
        # The serving check's blessing (serving_check.enabled): TFX's Pusher logic requires it when given.
        specs.INFRA_BLESSING_KEY: ChannelParameter(type=standard_artifacts.InfraBlessing, optional=True),
    }
    OUTPUTS = {specs.PUSHED_MODEL_KEY: ChannelParameter(type=standard_artifacts.PushedModel)}


class RegistryPusher(base_component.BaseComponent):
    """Pushes a blessed model to a filesystem destination and registers it there.

    Args:
      model: the Trainer's `Model` channel.
      model_blessing: the exporter's `ModelBlessing` channel.
      serving_dir: the push destination.
      pipeline_name: recorded in each registry entry.
      run_id: the run's ID, recorded in the entry (Kubeflow: `{{$.pipeline_job_uuid}}`); None locally.
      run_name: the run's name, recorded in the entry (Kubeflow: `{{$.pipeline_job_name}}`); None locally.
      evaluator_blessing: TFX's Evaluator's blessing channel; given, the push also needs it to bless.
      evaluation: TFX's Evaluator's `ModelEvaluation` channel, recorded in the entry.
      infra_blessing: the serving check's `InfraBlessing` channel; given, the push also needs it to bless.
    """

    SPEC_CLASS = RegistryPusherSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.RegistryPusherExecutor)

    def __init__(self, model, model_blessing, serving_dir: str, pipeline_name: str,
                 run_id: Optional[str] = None, run_name: Optional[str] = None,
                 evaluator_blessing=None, evaluation=None, infra_blessing=None):
        super().__init__(spec=RegistryPusherSpec(
            model=model, model_blessing=model_blessing,
            evaluator_blessing=evaluator_blessing, evaluation=evaluation, infra_blessing=infra_blessing,
            push_destination=pusher_pb2.PushDestination(
                filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=serving_dir)),
            pipeline_name=pipeline_name, run_id=run_id, run_name=run_name,
            pushed_model=channel_utils.as_channel([standard_artifacts.PushedModel()])))
