"""This run's embedding plan and length: what the installed TensorFlow and the data decide.

The plan itself (`EmbeddingPlan`) is TensorFlow-free and shared by the stages
(components.contracts.plan), derived by derivation.py; rendered into TensorFlow objects it is the
model layer's (components.embedding_model.tf_objects). The trainer adds what only a run can know: whether the
installed TensorFlow has `SparseCoreEmbeddingConfig`, and how many steps the run takes.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.config.schema import PipelineConfig
from components.planning import derivation
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.contracts.statistics import EmbeddingStatistics


def training_steps(cfg: PipelineConfig, statistics: Optional[EmbeddingStatistics],
                   train_steps: Optional[int] = None) -> Dict[str, Any]:
    """The run's length in steps, and where it comes from.

    `train_steps` (the Trainer's TrainArgs) or training.train_steps when set; else training.epochs
    passes (unset: the default for the train split's size, TrainingConfig.epochs_for) over the rows
    trained on (the train split less the held-out slice, TrainingConfig.trained_rows; the split's
    row count from the preprocessing statistics), rounded up to whole steps_per_execution.

    Args:
      cfg: the pipeline config.
      statistics: preprocessing's statistics of the training data (the train split's row count),
        None when the examples have none.
      train_steps: the Trainer's TrainArgs.num_steps, None or 0 when unset.

    Returns:
      {"steps": int, "source": a sentence naming the rule}, plus, when the length was derived from
      the train split's row count, "train_rows", "trained_rows" and "epochs": the numbers the steps
      were computed from, which the source writes out as `epochs x trained_rows / batch` (its
      arithmetic, rounded up, gives the steps).

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
    rows = int(rows)
    epochs, trained = t.epochs_for(rows), t.trained_rows(rows)
    steps = t.steps_for_epochs(rows, epochs)
    named = (f"training.epochs {_exact(epochs)}" if t.epochs is not None
             else f"default epochs {_exact(epochs)} (training.epochs unset)")
    split = (f"{rows} train rows less the held-out slice of {rows - trained}" if trained != rows
             else f"{rows} train rows, none held out")
    source = f"{named} x {trained} rows trained on ({split}) / batch {t.batch_size}"
    if t.steps_per_execution > 1:
        source += f", rounded up to whole steps_per_execution ({t.steps_per_execution})"
    return {"steps": steps, "source": source, "train_rows": rows, "trained_rows": trained, "epochs": epochs}


def _exact(x: float) -> str:
    """`x` written short (15, 2.5) where that is its exact value, else in full (1.2345678)."""
    return f"{x:g}" if float(f"{x:g}") == x else repr(float(x))


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
      `derivation.derive_plan`'s plan, with SparseCore limits applied where this TensorFlow
      can take them.

    Raises:
      PlanError: the config and manifest give no valid plan (one line naming the field).
    """
    return derivation.derive_plan(cfg, manifest, statistics, sparsecore_config_available())
