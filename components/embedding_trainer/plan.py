"""The embedding plan for the trainer.

The plan itself (`EmbeddingPlan`, `derive_plan`, its rules) is TensorFlow-free and shared by the
stages: `components.contracts.plan`. This module adds the run's length and whether the installed
TensorFlow has `SparseCoreEmbeddingConfig`, and re-exports the plan rendered into TensorFlow
objects (learning-rate schedule, Keras optimizers, TableConfig / FeatureConfig), which the model
layer owns (components.embedding_model.tf_objects).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.config.schema import PipelineConfig
from components.contracts.artifacts import PLAN_FILE  # noqa: F401  (re-exported)
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import (  # noqa: F401  (re-exported: the plan's vocabulary)
    HYPERPARAMETERS,
    MAX_RULE_DIM,
    PLAN_VERSION,
    EmbeddingPlan,
    PlanError,
    fourth_root_dim,
    optimizer_spec,
)
from components.contracts.plan import derive_plan as _derive_plan
from components.contracts.statistics import EmbeddingStatistics
from components.embedding_model.tf_objects import (  # noqa: F401  (re-exported: the plan in TensorFlow objects)
    WarmupDecay,
    build_optimizer,
    dense_id_widths,
    feature_configs,
    gradient_multiplier,
    keras_optimizer,
    learning_rate,
    sequence_lengths,
    table_configs,
    tf_initializer,
)


def training_steps(cfg: PipelineConfig, statistics: Optional[EmbeddingStatistics],
                   train_steps: Optional[int] = None) -> Dict[str, Any]:
    """{steps, source}: the run's length. `train_steps` (the Trainer's TrainArgs) or
    training.train_steps when set; else training.epochs passes over the train split (unset: the
    default for its size, TrainingConfig.epochs_for), whose row count the preprocessing statistics
    give, rounded up to whole steps_per_execution."""
    t = cfg.training
    if train_steps or t.train_steps:
        return {"steps": int(train_steps or t.train_steps), "source": "training.train_steps"}
    rows = ((statistics.splits if statistics else {}).get("train") or {}).get("examples_written")
    if not rows:
        raise ValueError(
            "training.train_steps is unset and the train split's row count is unknown (no preprocessing "
            "statistics beside the examples); set training.train_steps")
    steps = t.steps_for_epochs(rows)
    epochs = (f"training.epochs {t.epochs:g}" if t.epochs is not None
              else f"default epochs {t.epochs_for(rows):g} (training.epochs unset)")
    return {"steps": steps, "source": f"{epochs} x {rows} train rows / batch {t.batch_size}", "train_rows": int(rows)}


def sparsecore_config_available() -> bool:
    """Whether this TensorFlow can take SparseCore limits (SparseCoreEmbeddingConfig, TF >= 2.17)."""
    return hasattr(tf.tpu.experimental.embedding, "SparseCoreEmbeddingConfig")


def derive_plan(
    cfg: PipelineConfig, manifest: VocabularyManifest, statistics: Optional[EmbeddingStatistics] = None
) -> EmbeddingPlan:
    """`contracts.plan.derive_plan` for the installed TensorFlow."""
    return _derive_plan(cfg, manifest, statistics, sparsecore_config_available())


