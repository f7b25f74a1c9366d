"""A trained model rebuilt for CPU from its training checkpoint, whatever platform wrote it.

The one way both the Trainer (evaluation, its SavedModel) and the exporter get a model after
training: a `RankingModel` with plain `ServingTable`s, its dense network restored from the
checkpoint (every dense weight must be there) and each table read by the layout-aware reader
(layouts.py: A = one variable per table, as CPU/GPU and TPUEmbedding save; B = SparseCore stacks;
C = host-partitioned). Nothing here depends on the strategy that trained the model, so the CPU
tests run exactly what a TPU run runs after `fit`.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional

import components  # noqa: F401
import numpy as np
import tensorflow as tf

from components.config.schema import ExportLayoutConfig, PipelineConfig
from components.embedding_model import layouts
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.embedding_model.model import CHECKPOINT_ROOT, RankingModel, dense_checkpoint_parts


class ExportRefused(RuntimeError):
    """The export would not be the trained model; nothing was written where a pusher would look."""


def build_serving_model(plan: EmbeddingPlan, manifest: VocabularyManifest, cfg: PipelineConfig, table_dtype: str,
                        sample_features, stacked: bool = True) -> RankingModel:
    """The CPU serving model: plain tables of `table_dtype`, no optimizer (so no slot variables);
    `stacked`: the tables of one dim in one variable (what the serving transform's fused inputs
    pool from), else one variable per table (the Trainer's SavedModel)."""
    model = RankingModel(plan, manifest, cfg.training, serving_table_dtype=table_dtype, stack_serving_tables=stacked)
    model(sample_features)  # creates the variables
    return model


def dense_variables(model: RankingModel) -> List[tf.Variable]:
    out: List[tf.Variable] = []
    for name, part in sorted(dense_checkpoint_parts(model).items()):
        if name in ("projections", "bucket_tables"):
            out += [v for k in sorted(part) for v in part[k].variables]
        elif name == "cross":
            out += [v for layer in part for v in layer.variables]
        else:
            out += list(part.variables)
    return out


def restore_dense(model: RankingModel, checkpoint_path: str) -> int:
    """Restores the dense network (not the tables, which layouts.py converts) from the checkpoint;
    every dense weight must be found with its shape. Returns how many were restored. The parts and
    their checkpoint names are the model's (model.dense_checkpoint_parts), under its checkpoint root."""
    mirror = tf.train.Checkpoint(**{CHECKPOINT_ROOT: tf.train.Checkpoint(**dense_checkpoint_parts(model))})
    try:
        status = mirror.restore(checkpoint_path)
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.InvalidArgumentError) as e:
        raise ExportRefused(
            f"checkpoint {checkpoint_path} does not hold this model's dense network "
            f"({cfg_hint(model)}): {e}"
        ) from None
    status.expect_partial()  # tables come from the layout reader; optimizer slots are not exported
    return len(dense_variables(model))


def cfg_hint(model: RankingModel) -> str:
    return f"model {model.model_type}; check training.model, bottom_mlp, top_mlp and cross_layers match the training run"


def open_checkpoint_tables(
    checkpoint_path: str, plan: EmbeddingPlan, layout: Optional[ExportLayoutConfig] = None
) -> "layouts.CheckpointTables":
    """The plan's tables located in the checkpoint (layouts detected); ExportRefused if not."""
    try:
        return layouts.CheckpointTables(checkpoint_path, plan, layout)
    except layouts.LayoutError as err:
        raise ExportRefused(f"checkpoint {checkpoint_path}: {err}") from None


def load_tables(
    model: RankingModel, tables: "layouts.CheckpointTables",
    on_table: Optional[Callable[[str, Any, np.ndarray], None]] = None,
) -> None:
    """Every table of `model` from the checkpoint, one at a time (read in its layout, checked
    finite, assigned); `on_table(name, source, values)` runs after each, while its values exist."""
    for name, source in tables.sources.items():
        if name not in model.serving_tables:
            continue
        values = tables.read(name)
        check_finite(name, values, tables.prefix)
        model.serving_tables[name].assign(name, values)
        if on_table is not None:
            on_table(name, source, values)
        del values


def model_from_checkpoint(
    plan: EmbeddingPlan, manifest: VocabularyManifest, cfg: PipelineConfig, checkpoint_path: str, sample_features,
    layout: Optional[ExportLayoutConfig] = None, stacked: bool = False,
) -> RankingModel:
    """The float32 CPU model of `checkpoint_path`: dense network restored, every table converted
    from its training layout (`stacked`: see build_serving_model). Raises ExportRefused naming what
    does not match or is not finite."""
    tables = open_checkpoint_tables(checkpoint_path, plan, layout)
    model = build_serving_model(plan, manifest, cfg, "float32", sample_features, stacked=stacked)
    restore_dense(model, checkpoint_path)
    load_tables(model, tables)
    return model


def check_finite(name: str, values: np.ndarray, checkpoint_path: str) -> None:
    if not np.isfinite(values).all():
        raise ExportRefused(f"table {name!r} holds NaN or infinite values (checkpoint {checkpoint_path}); training diverged")
