"""The Trainer and the Tuner on Vertex AI (TFX's google_cloud_ai_platform extension), passing the
transformed examples' artifact URI as executors.py's do.

Kept apart from component.py: only a Vertex route imports TFX's Google Cloud extension and its
client libraries. The URI is added before the job is launched; the job's own TFX executor (TFX's
generic Trainer; the Tuner's worker) receives it in custom_config. Node ids stay `Trainer` and
`Tuner`.
"""
from __future__ import annotations

from tfx.dsl.components.base import executor_spec
from tfx.extensions.google_cloud_ai_platform.trainer import component as vertex_trainer_component
from tfx.extensions.google_cloud_ai_platform.trainer import executor as vertex_trainer_executor
from tfx.extensions.google_cloud_ai_platform.tuner import component as vertex_tuner_component
from tfx.extensions.google_cloud_ai_platform.tuner import executor as vertex_tuner_executor

from components.embedding_trainer.executors import PassesExamplesUri


class VertexTrainerExecutor(PassesExamplesUri, vertex_trainer_executor.GenericExecutor):
    """TFX's Vertex AI Trainer executor (a custom job running TFX's generic Trainer), passing the examples' URI."""


class VertexTunerExecutor(PassesExamplesUri, vertex_tuner_executor.Executor):
    """TFX's Vertex AI Tuner executor (one custom job of `tuning.parallel_trials` replicas), passing the examples' URI."""


class Trainer(vertex_trainer_component.Trainer):
    """TFX's Vertex AI Trainer through `VertexTrainerExecutor`."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(VertexTrainerExecutor)


class Tuner(vertex_tuner_component.Tuner):
    """TFX's Vertex AI Tuner through `VertexTunerExecutor`."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(VertexTunerExecutor)
