"""Logical tables into a SparseCore model's stacked variables, and which checkpoints a run may resume.

TF 2.16's `TPUEmbeddingV2` keeps the tables of a stack in one variable, padded, mod-sharded over the
SparseCores with a rotation per table (sparsecore_layout.py), and creates it only when the model
is built; its checkpoint names the stack, not the tables. So a checkpoint with one variable per
table (CPU/GPU, `TPUEmbedding`, or the host twin the warm start writes) matches no stack of several
tables, and a lone table's stack, named like the table, would be restored with its rows in the wrong
places (or fail on its padded shape). TensorFlow restores neither correctly; this module does the
one thing that is needed:

- `assign_logical_tables`: each table's rows, and its optimizer slots' rows, placed into the built
  stacked variables through the layout the exporter reads them with
  (`plan_sparse_core_layouts`, which tests/test_sparsecore_real.py checks against TF's own
  constructor), one device's part of a stack at a time;
- `check_resumable`: a training state written under one checkpoint layout (A: a variable per
  table; B: SparseCore stacks at a topology) is resumed only under the same one, else the run
  stops and says why, instead of starting the tables fresh without a word.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Optional

import components  # noqa: F401
import numpy as np
import tensorflow as tf

from components.contracts.plan import CheckpointLayout, EmbeddingPlan
from components.embedding_model.sparsecore_layout import plan_sparse_core_layouts, stacked_variables

LAYOUT_FILE = "checkpoint_layout.json"  # in a training state directory: the layout its checkpoints have


class LayoutMismatch(RuntimeError):
    """A checkpoint cannot be restored into this run's table layout; says what to do."""


def sparse_core_object(model) -> Optional[Any]:
    """The model's TPUEmbeddingV2 (SparseCore) object, or None (CPU/GPU, TPUEmbedding, TensorCore only)."""
    layer = getattr(model, "embedding_layer", None)
    mid = getattr(layer, "_tpu_embedding", None)
    return mid if isinstance(mid, tf.tpu.experimental.embedding.TPUEmbeddingV2) else None


def _assign_stacked(variable, full: np.ndarray, what: str) -> None:
    """A stacked value [SparseCores x rows per shard, cols] into a TPUEmbeddingShardedVariable:
    device d holds shards d x per_chip ... (d + 1) x per_chip - 1, contiguous (what its sharded
    saveables write at offset d x rows)."""
    parts = list(variable.values)
    rows = full.shape[0] // len(parts)
    if rows * len(parts) != full.shape[0] or list(parts[0].shape) != [rows, full.shape[1]]:
        raise LayoutMismatch(
            f"{what}: the recomputed SparseCore stack is {list(full.shape)} but TensorFlow built "
            f"{len(parts)} parts of {parts[0].shape.as_list()}; the plan's layout is not the one this run built")
    for d, part in enumerate(parts):
        part.assign(full[d * rows:(d + 1) * rows])


def assign_logical_tables(model, plan: EmbeddingPlan, layout: CheckpointLayout,
                          read_table: Callable[[str], np.ndarray],
                          read_slot: Callable[[str, str], Optional[np.ndarray]]) -> Dict[str, Any]:
    """Places logical tables into the built SparseCore stacks of `model`: `read_table(table)` the
    [rows, dim] values, `read_slot(table, keras slot name)` a slot's [rows, dim] values (None: the
    slot keeps what the optimizer initialized, for every table of its stack). Returns a report."""
    mid = sparse_core_object(model)
    if mid is None:
        raise LayoutMismatch("the model has no SparseCore (TPUEmbeddingV2) object to place tables into")
    layouts = plan_sparse_core_layouts(plan, int(layout.num_replicas), int(layout.sparse_cores_per_chip),
                                       int(layout.per_replica_batch_size))
    stacks: Dict[str, list] = {}
    for name, lay in layouts.items():
        stacks.setdefault(lay.stacked_table_name, []).append(name)
    variables = mid.variables  # builds the stacks if they are not yet
    report: Dict[str, Any] = {"stacks": {}}
    optimizers = list(model._embedding_optimizers().values())  # pylint: disable=protected-access
    for stacked, names in stacks.items():
        if stacked not in variables:
            raise LayoutMismatch(
                f"SparseCore stack {stacked!r} (recomputed from the plan) is not among the stacks TensorFlow "
                f"built ({sorted(variables)}); the plan's topology is not this run's")
        parameters = variables[stacked]["parameters"]
        _assign_stacked(parameters, stacked_variables({n: read_table(n) for n in names},
                                                      {n: layouts[n] for n in names})[stacked], f"stack {stacked!r}")
        slots_done = []
        for optimizer, _ in optimizers:
            for slot in optimizer.get_slot_names():
                try:
                    variable = optimizer.get_slot(parameters, slot)
                except KeyError:
                    continue
                values = {n: read_slot(n, slot) for n in names}
                if any(v is None for v in values.values()):
                    continue  # fresh, as the optimizer initialized it
                _assign_stacked(variable, stacked_variables(values, {n: layouts[n] for n in names})[stacked],
                                f"slot {slot!r} of stack {stacked!r}")
                slots_done.append(slot)
        report["stacks"][stacked] = {"tables": names, "slots": sorted(slots_done)}
    return report


def restore_all_but_tpu_embedding(model, prefix: str, root: str) -> None:
    """Restores everything of `model` from `prefix` except its TPU embedding layer (whose tables
    `assign_logical_tables` places): the dense network, TensorCore tables, optimizers and their
    counters. Every object restored must match (assert_existing_objects_matched)."""
    children = {k: v for k, v in model._trackable_children().items() if k != "embedding_layer"}  # pylint: disable=protected-access
    status = tf.train.Checkpoint(**{root: tf.train.Checkpoint(**children)}).restore(prefix)
    status.assert_existing_objects_matched()
    status.expect_partial()  # the TPU embedding layer's variables (placed through the layout instead)


def layout_record(layout: CheckpointLayout) -> Dict[str, Any]:
    """What must agree for a checkpoint to be restored (B: the stacks depend on all of it)."""
    if layout.kind != "B":
        return {"kind": layout.kind}
    return {"kind": "B", "num_replicas": layout.num_replicas, "sparse_cores_per_chip": layout.sparse_cores_per_chip,
            "per_replica_batch_size": layout.per_replica_batch_size}


def write_layout(state_dir: str, layout: CheckpointLayout) -> None:
    tf.io.gfile.makedirs(state_dir)
    with tf.io.gfile.GFile(os.path.join(state_dir, LAYOUT_FILE), "w") as fh:
        fh.write(json.dumps(dict(layout_record(layout), embedding_api=layout.embedding_api), sort_keys=True))


def check_resumable(state_dir: str, checkpoint: str, layout: CheckpointLayout) -> None:
    """Refuses to resume `checkpoint` (in `state_dir`) under another table layout than it was
    written with. A state without a record was written before records existed, by a run with one
    variable per table (A): resumable under A only."""
    path = os.path.join(state_dir, LAYOUT_FILE)
    if tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as fh:
            saved = json.loads(fh.read())
    else:
        saved = {"kind": "A", "embedding_api": "unrecorded (one variable per table)"}
    wanted = layout_record(layout)
    if {k: saved.get(k) for k in wanted} == wanted:
        return
    raise LayoutMismatch(
        f"checkpoint {checkpoint} holds the embedding tables as {saved.get('embedding_api')} wrote them "
        f"({json.dumps({k: v for k, v in saved.items() if k != 'embedding_api'}, sort_keys=True)}), but this run is "
        f"{layout.embedding_api} ({json.dumps(wanted, sort_keys=True)}). TensorFlow 2.16 cannot restore SparseCore "
        "stacks into another layout (they would start fresh or come back permuted): resume on the platform and "
        f"topology that wrote it, or remove {state_dir} (training.checkpoint_dir) to train from the start")
