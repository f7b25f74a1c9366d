"""The Trainer and the Tuner as the pipeline wires them: TFX's stock components (their node ids
stay `Trainer` and `Tuner`) whose executors pass the transformed examples' artifact URI
(executors.py), as TFX's own Vertex AI extension subclasses them."""
from __future__ import annotations

from tfx.components.trainer import component as trainer_component
from tfx.components.tuner import component as tuner_component
from tfx.dsl.components.base import executor_spec

from components.embedding_trainer.executors import TrainerExecutor, TunerExecutor


class Trainer(trainer_component.Trainer):
    """TFX's Trainer running run_fn (trainer_module.py) through `TrainerExecutor`."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(TrainerExecutor)


class Tuner(tuner_component.Tuner):
    """TFX's Tuner running tuner_fn (tuner.py) through `TunerExecutor`."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(TunerExecutor)
