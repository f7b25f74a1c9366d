"""This run's embedding plan and length: what the installed TensorFlow and the data decide.

The plan itself (`EmbeddingPlan`, its rules) is TensorFlow-free and shared by the stages
(components.contracts.plan); rendered into TensorFlow objects it is the model layer's
(components.embedding_model.tf_objects). The trainer adds what only a run can know: whether the
installed TensorFlow has `SparseCoreEmbeddingConfig`, and how many steps the run takes.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.config.schema import PipelineConfig
from components.contracts import plan as contracts_plan
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.contracts.statistics import EmbeddingStatistics


def training_steps(cfg: PipelineConfig, statistics: Optional[EmbeddingStatistics],
                   train_steps: Optional[int] = None) -> Dict[str, Any]:
    """The run's length in steps, and where it comes from.

    `train_steps` (the Trainer's TrainArgs) or training.train_steps when set; else training.epochs
    passes over the train split (unset: the default for its size, TrainingConfig.epochs_for),
    whose row count the preprocessing statistics give, rounded up to whole steps_per_execution.

    Args:
      cfg: the pipeline config.
      statistics: preprocessing's statistics of the training data (the train split's row count),
        None when the examples have none.
      train_steps: the Trainer's TrainArgs.num_steps, None or 0 when unset.

    Returns:
      {"steps": int, "source": a sentence naming the rule}, plus "train_rows" when the length
      was derived from the train split's row count.

    Raises:
      ValueError: no step count is set and the train split's row count is unknown.
    """
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
    """Whether this TensorFlow can take SparseCore limits (SparseCoreEmbeddingConfig, TF >= 2.17).

    Returns:
      True when `tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig` exists.
    """
    return hasattr(tf.tpu.experimental.embedding, "SparseCoreEmbeddingConfig")


def derive_plan(
    cfg: PipelineConfig, manifest: VocabularyManifest, statistics: Optional[EmbeddingStatistics] = None
) -> EmbeddingPlan:
    """The embedding plan of `cfg` and `manifest` for the installed TensorFlow.

    Args:
      cfg: the pipeline config.
      manifest: preprocessing's manifest (features, vocabularies, OOV buckets).
      statistics: preprocessing's statistics (SparseCore limits); None reports those limits as unknown.

    Returns:
      `contracts.plan.derive_plan`'s plan, with SparseCore limits applied where this TensorFlow
      can take them.

    Raises:
      PlanError: the config and manifest give no valid plan (one line naming the field).
    """
    return contracts_plan.derive_plan(cfg, manifest, statistics, sparsecore_config_available())
