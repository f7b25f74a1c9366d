"""Each component's share of the configuration: the sections its code reads, every other section
at its default.

TFX fingerprints a component's execution by its execution properties, so a component that gets the
whole configuration runs again when any field changes. Each component gets `stage_json(cfg, stage)`
instead: editing `export:`, `kubeflow:`, `validation:` or `continuous:` leaves ExampleGen's and
preprocessing's properties as they were, and a cached run reuses their outputs.

What each stage reads (checked against the code; the tests run every stage on its share):
- `example_gen`: `input` (format, range_mb, path), the columns (`label`, `label_rule`,
  `dense_features`, `categorical_features`, `tables` and `categorical_defaults` for weight columns),
  `beam`. `training.embedding_optimizer` stays only because a table's optimizer override is
  checked against it when the share is read back.
- `preprocess`: `input` (with the feature-health limits), the features and tables, `statistics`,
  `transformed_examples`, `beam`, `name` (the report's title), `training.batch_size` (per-batch
  statistics) and `training.embedding_optimizer` (table memory). Not `label_rule`: ExampleGen
  already wrote the derived label.
- `exporter`: everything but `kubeflow`, `continuous`, `statistics`, `transformed_examples`,
  `beam`, `evaluator`, `bulk_inference` and `serving_check`. (Those three are read by the
  pipeline only, which builds the Evaluator, the BulkInferrer and the serving check from them:
  example_gen and preprocess do not get them either.)
- `tuner`: the sections the trials' training reads: everything but `export`, `validation`,
  `continuous`, `kubeflow`, `evaluator`, `bulk_inference` and `beam` (with `tuning`, which
  example_gen, preprocess and the exporter do not get: the exporter reads the tuned values from the
  Trainer's model).
- `trainer`: the whole configuration. It keys its resumable state by it and writes it into the
  Model artifact (`pipeline_config.json`, which the exporter's CLI reads back).
"""
from __future__ import annotations

from typing import Callable, Dict

from components.config.loading import config_from_json
from components.config.schema import (BeamConfig, BulkInferenceConfig, ContinuousConfig, EvaluatorConfig,
                                      ExportConfig, InputConfig, KubeflowConfig, PipelineConfig, ServingCheckConfig,
                                      StatisticsConfig, TransformedExamplesConfig, ValidationConfig)
from components.config.training_schema import TrainingConfig

STAGES = ("example_gen", "preprocess", "trainer", "exporter", "tuner")


def _example_gen(cfg: PipelineConfig) -> None:
    kept = cfg.input
    cfg.input = InputConfig(path=kept.path, format=kept.format, range_mb=kept.range_mb)
    cfg.name = PipelineConfig.name
    cfg.training = TrainingConfig(embedding_optimizer=cfg.training.embedding_optimizer)
    cfg.export, cfg.validation, cfg.continuous = ExportConfig(), ValidationConfig(), ContinuousConfig()
    cfg.statistics, cfg.transformed_examples, cfg.kubeflow = StatisticsConfig(), TransformedExamplesConfig(), KubeflowConfig()
    cfg.evaluator, cfg.bulk_inference, cfg.serving_check = EvaluatorConfig(), BulkInferenceConfig(), ServingCheckConfig()
    cfg.tuning = None


def _preprocess(cfg: PipelineConfig) -> None:
    cfg.label_rule = None
    cfg.training = TrainingConfig(batch_size=cfg.training.batch_size, embedding_optimizer=cfg.training.embedding_optimizer)
    cfg.export, cfg.validation, cfg.continuous, cfg.kubeflow = ExportConfig(), ValidationConfig(), ContinuousConfig(), KubeflowConfig()
    cfg.evaluator, cfg.bulk_inference, cfg.serving_check = EvaluatorConfig(), BulkInferenceConfig(), ServingCheckConfig()
    cfg.tuning = None


def _exporter(cfg: PipelineConfig) -> None:
    cfg.kubeflow, cfg.continuous, cfg.statistics = KubeflowConfig(), ContinuousConfig(), StatisticsConfig()
    cfg.transformed_examples, cfg.evaluator = TransformedExamplesConfig(), EvaluatorConfig()
    if not cfg.export.store.beam:  # with it, the store's row files are written with the `beam` section's options
        cfg.beam = BeamConfig()
    cfg.bulk_inference, cfg.serving_check = BulkInferenceConfig(), ServingCheckConfig()
    cfg.tuning = None  # the tuned values come with the model (training_run.json's `tuned`)


def _tuner(cfg: PipelineConfig) -> None:
    cfg.export, cfg.validation, cfg.continuous, cfg.kubeflow = ExportConfig(), ValidationConfig(), ContinuousConfig(), KubeflowConfig()
    cfg.evaluator, cfg.bulk_inference, cfg.beam = EvaluatorConfig(), BulkInferenceConfig(), BeamConfig()
    cfg.serving_check = ServingCheckConfig()


_SHARES: Dict[str, Callable[[PipelineConfig], None]] = {
    "example_gen": _example_gen,
    "preprocess": _preprocess,
    "trainer": lambda cfg: None,
    "exporter": _exporter,
    "tuner": _tuner,
}


def stage_config(cfg: PipelineConfig, stage: str) -> PipelineConfig:
    """A copy of the configuration with the sections a stage does not read at their defaults.

    Args:
      cfg: a resolved configuration.
      stage: one of `STAGES`.

    Returns:
      A new, resolved configuration (the share is checked again, so it must stand on its own).

    Raises:
      ValueError: `stage` is not one of `STAGES`.
      ConfigError: the share does not pass the checks on its own.
    """
    if stage not in _SHARES:
        raise ValueError(f"unknown stage {stage!r}; one of {STAGES}")
    share = config_from_json(cfg.to_json())
    _SHARES[stage](share)
    return config_from_json(share.to_json())  # the share must stand on its own (it is checked again)


def stage_json(cfg: PipelineConfig, stage: str) -> str:
    """What a stage's component gets as its `config_json` execution property.

    Args:
      cfg: a resolved configuration.
      stage: one of `STAGES`.

    Returns:
      `stage_config(cfg, stage).to_json()`: TFX fingerprints it, so a field the stage does not read
      leaves it unchanged.
    """
    return stage_config(cfg, stage).to_json()
