"""A trained model rebuilt for CPU from its training checkpoint, whatever platform wrote it.

The one way both the Trainer (evaluation, its SavedModel) and the exporter get a model after
training: a `ServingRankingModel` built from the plan, its dense tower restored from the checkpoint
(every dense weight must be there) and each table read by the layout-aware reader (layouts.py:
A = one variable per table, as CPU/GPU and TPUEmbedding save; B = SparseCore stacks; C =
host-partitioned). Nothing here depends on the strategy that trained the model, so the CPU tests
run exactly what a TPU run runs after `fit`.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional

import numpy as np

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.config.schema import ExportLayoutConfig, PipelineConfig
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.embedding_model.checkpoint_keys import CHECKPOINT_ROOT, dense_checkpoint_parts
from components.embedding_model.layouts import CheckpointTables, LayoutError
from components.embedding_model.serving_model import ServingRankingModel
from components.embedding_model.unreadable import reading

# What to do about a training checkpoint cut short or damaged (unreadable.py), unless the caller says otherwise.
RERUN_TRAINER = ("rerun the Trainer that wrote it (a local run: without the cache, `--no-cache`), or remove that "
                 "Model artifact")


class ExportRefused(RuntimeError):
    """The export would not be the trained model; nothing was written where a pusher would look."""


def build_serving_model(plan: EmbeddingPlan, manifest: VocabularyManifest, cfg: PipelineConfig, table_dtype: str,
                        sample_features, stacked: bool = True, precision: str = "float32") -> ServingRankingModel:
    """The CPU serving model with its variables created, its weights not yet set.

    Args:
      plan: the embedding plan.
      manifest: the vocabulary manifest.
      cfg: the pipeline configuration (its training section shapes the dense tower).
      table_dtype: the tables' storage dtype (float32, float16 or int8).
      sample_features: a batch of the model's inputs, to create the variables.
      stacked: the tables of one dim in one variable (what the serving transform's fused inputs
        pool from), else one variable per table (the Trainer's SavedModel).
      precision: the dense network's (ServingRankingModel's): float32 but to score a bfloat16
        run's training graph.

    Returns:
      The serving model, no optimizer (so no slot variables).
    """
    model = ServingRankingModel(plan, manifest, cfg.training, table_dtype=table_dtype, stacked=stacked,
                                precision=precision)
    model(sample_features)  # creates the variables
    return model


def dense_variables(model: ServingRankingModel) -> List[tf.Variable]:
    """The model's dense tower variables, in a fixed order (by part name, then key)."""
    return model.dense_tower.variables()


def restore_dense(model: ServingRankingModel, checkpoint_path: str) -> int:
    """Restores the dense tower (not the tables, which layouts.py converts) from a training checkpoint.

    The parts and their checkpoint names are checkpoint_keys.dense_checkpoint_parts, under its root.

    Args:
      model: the built serving model.
      checkpoint_path: the training checkpoint's prefix.

    Returns:
      How many dense variables were restored.

    Raises:
      ExportRefused: a dense weight is missing or has another shape, or the checkpoint is cut short
        or damaged (one line naming it).
    """
    mirror = tf.train.Checkpoint(**{CHECKPOINT_ROOT: tf.train.Checkpoint(**dense_checkpoint_parts(model))})
    try:
        with reading(checkpoint_path, "training checkpoint", RERUN_TRAINER, ExportRefused):
            status = mirror.restore(checkpoint_path)
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.InvalidArgumentError) as e:
        raise ExportRefused(
            f"checkpoint {checkpoint_path} does not hold this model's dense network "
            f"({cfg_hint(model)}): {e}"
        ) from None
    status.expect_partial()  # tables come from the layout reader; optimizer slots are not exported
    return len(dense_variables(model))


def cfg_hint(model: ServingRankingModel) -> str:
    """What to check in the config when the checkpoint's dense tower is not the model's."""
    return f"model {model.model_type}; check training.model, bottom_mlp, top_mlp and cross_layers match the training run"


def open_checkpoint_tables(
    checkpoint_path: str, plan: EmbeddingPlan, layout: Optional[ExportLayoutConfig] = None, way_out: str = RERUN_TRAINER,
) -> CheckpointTables:
    """The plan's tables located in a training checkpoint, their layouts detected.

    Args:
      checkpoint_path: the training checkpoint's prefix.
      plan: the embedding plan.
      layout: the export's layout options (None: detect every layout).
      way_out: what to do when the checkpoint is cut short or damaged (the message's end).

    Returns:
      The tables' reader.

    Raises:
      ExportRefused: a table cannot be located as the plan describes it, or the checkpoint's index
        is cut short or damaged.
    """
    try:
        with reading(checkpoint_path, "training checkpoint", way_out, ExportRefused):
            return CheckpointTables(checkpoint_path, plan, layout)
    except LayoutError as err:
        raise ExportRefused(f"checkpoint {checkpoint_path}: {err}") from None


def load_tables(
    model: ServingRankingModel, tables: CheckpointTables,
    on_table: Optional[Callable[[str, Any, np.ndarray], None]] = None,
) -> None:
    """Every table of the model from the checkpoint, one at a time (read in its layout, checked
    finite, assigned), so that only one table's values are in memory at once.

    Args:
      model: the built serving model.
      tables: the checkpoint's tables (open_checkpoint_tables).
      on_table: called as on_table(name, source, values) after each table, while its values exist.

    Raises:
      ExportRefused: a table holds NaN or infinite values, or cannot be read (the checkpoint is cut
        short or damaged).
    """
    for name, source in tables.sources.items():
        if name not in model.serving_tables:
            continue
        with reading(tables.prefix, f"training checkpoint (table {name!r})", RERUN_TRAINER, ExportRefused):
            values = tables.read(name)
        check_finite(name, values, tables.prefix)
        model.serving_tables[name].assign(name, values)
        if on_table is not None:
            on_table(name, source, values)
        del values


def model_from_checkpoint(
    plan: EmbeddingPlan, manifest: VocabularyManifest, cfg: PipelineConfig, checkpoint_path: str, sample_features,
    layout: Optional[ExportLayoutConfig] = None, stacked: bool = False, precision: str = "float32",
) -> ServingRankingModel:
    """The float32 CPU model of a training checkpoint (its dense network in `precision`).

    Args:
      plan, manifest, cfg, sample_features, stacked, precision: see build_serving_model.
      checkpoint_path: the training checkpoint's prefix.
      layout: the export's layout options (None: detect every layout).

    Returns:
      The serving model: dense tower restored, every table converted from its training layout.

    Raises:
      ExportRefused: naming what does not match or is not finite.
    """
    tables = open_checkpoint_tables(checkpoint_path, plan, layout)
    model = build_serving_model(plan, manifest, cfg, "float32", sample_features, stacked=stacked, precision=precision)
    restore_dense(model, checkpoint_path)
    load_tables(model, tables)
    return model


def check_finite(name: str, values: np.ndarray, checkpoint_path: str) -> None:
    """Refuses a table with NaN or infinite values.

    Args:
      name: the table's name.
      values: its rows.
      checkpoint_path: the checkpoint it came from, for the message.

    Raises:
      ExportRefused: a value is NaN or infinite.
    """
    if not np.isfinite(values).all():
        raise ExportRefused(f"table {name!r} holds NaN or infinite values (checkpoint {checkpoint_path}); training diverged")
