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
  table; B: SparseCore stacks at a topology) and one plan (`plan_signature`: every table's rows,
  dim, placement and optimizer, the wide part, the SparseCore stacks, the dense network) is resumed
  only under the same ones, else the run stops before training and names both, instead of starting
  tables fresh without a word or failing on TensorFlow's own assertion; and only on the data it was
  trained on (the record's data fingerprint), so that a state left from other data (a set
  `training.checkpoint_dir`, a finished run) is not taken as this run's training.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Optional

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import numpy as np
import tensorflow as tf
# Private modules: TF has no public API that names a checkpoint's nodes by their paths
# (ObjectGraphProtoPrettyPrinter) or lists the objects a restore walked (list_objects).
from tensorflow.python.checkpoint import checkpoint as checkpoint_lib
from tensorflow.python.checkpoint import util as checkpoint_util

from components.config.choices import BucketsInto
from components.contracts.plan import CheckpointLayout, EmbeddingPlan
from components.embedding_model.sparsecore_layout import plan_sparse_core_layouts, stacked_variables

LAYOUT_FILE = "checkpoint_layout.json"  # in a training state directory: the layout its checkpoints have


class LayoutMismatch(RuntimeError):
    """A checkpoint cannot be restored into this run's table layout; says what to do."""


def sparse_core_object(model) -> Optional[Any]:
    """The model's TPUEmbeddingV2 (SparseCore) object.

    Args:
      model: the embedding model.

    Returns:
      Its TPUEmbeddingV2, or None (CPU/GPU, TPUEmbedding, TensorCore tables only).
    """
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
    """Places logical tables, and their optimizer slots, into the built SparseCore stacks of `model`.

    Args:
      model: the embedding model, on SparseCore.
      plan: the embedding plan.
      layout: the run's checkpoint layout (B: replicas, SparseCores per chip, per-replica batch).
      read_table: table name -> its float32 [rows, dim] values.
      read_slot: (table name, Keras slot name) -> the slot's float32 [rows, dim] values, or None:
        the slot keeps what the optimizer initialized, for every table of its stack.

    Returns:
      {"stacks": {stack name: {"tables": [names], "slots": [slot names placed]}}}.

    Raises:
      LayoutMismatch: the model has no SparseCore object, or the stacks TensorFlow built are not
        the plan's.
    """
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


def restore_all_but_tpu_embedding(model, prefix: str, root: str):
    """Restores everything of `model` but its TPU embedding layer from a checkpoint.

    That is the dense network, TensorCore tables, optimizers and their counters;
    `assign_logical_tables` places the TPU embedding tables.

    Args:
      model: the embedding model.
      prefix: the checkpoint's path prefix.
      root: the name the model is saved under in the checkpoint.

    Returns:
      The restore status: what exists now is matched; the dense network, created at the first step
      on a TPU, is restored then (the trainer checks it was: training_state.require_consumed).

    Raises:
      AssertionError: an object restored does not match (assert_existing_objects_matched).
    """
    children = {k: v for k, v in tf.train.TrackableView.children(model).items() if k != "embedding_layer"}
    status = tf.train.Checkpoint(**{root: tf.train.Checkpoint(**children)}).restore(prefix)
    status.assert_existing_objects_matched()
    status.expect_partial()  # the TPU embedding layer's variables (placed through the layout instead)
    return status


def restore_mismatches(status, exempt=(), exempt_names=()) -> List[str]:
    """What a checkpoint restore left unmatched, in both directions.

    TF's `assert_consumed` makes the same two checks (tensorflow/python/checkpoint/checkpoint.py,
    CheckpointLoadStatus) but has no exemption and reports only the first kind it meets. The
    exemptions are Keras optimizers' hyperparameters, which the config sets and which only the
    platform whose Keras optimizer applied updates has created.

    Args:
      status: the load status `tf.train.Checkpoint.restore` returned.
      exempt: variables of the model not to report.
      exempt_names: checkpoint values named `<...optimizer...>.<name>` with one of these names are
        not reported.

    Returns:
      One line each: "in the checkpoint only: <path>" for values no object of the model took,
      "in the model only: <name>" for variables no checkpoint value set.
    """
    # Private: a load status exposes neither the checkpoint's object graph nor the objects it bound
    # through a public API, and both directions of the check need them.
    c = status._checkpoint  # pylint: disable=protected-access
    names = checkpoint_lib.ObjectGraphProtoPrettyPrinter(c.object_graph_proto).node_names

    def hyperparameter(path: str) -> bool:
        parent, _, last = path.rpartition(".")
        return last in exempt_names and "optimizer" in parent

    out = [f"in the checkpoint only: {names[i]}" for i, node in enumerate(c.object_graph_proto.nodes)
           if node.attributes and c.object_by_proto_id.get(i) is None and not hyperparameter(names[i])]
    bound = {id(o) for o in c.object_by_proto_id.values()}
    skip = {id(v) for v in exempt}
    for obj in checkpoint_util.list_objects(status._object_graph_view):  # pylint: disable=protected-access  (as above)
        if isinstance(obj, tf.Variable) and id(obj) not in bound and id(obj) not in skip:
            out.append(f"in the model only: {obj.name}")
    return out


def layout_record(layout: CheckpointLayout) -> Dict[str, Any]:
    """What must agree for a checkpoint to be restored.

    Args:
      layout: a checkpoint layout.

    Returns:
      {"kind": A or C}, or for B also num_replicas, sparse_cores_per_chip and
      per_replica_batch_size (the stacks depend on all of them).
    """
    if layout.kind != "B":
        return {"kind": layout.kind}
    return {"kind": "B", "num_replicas": layout.num_replicas, "sparse_cores_per_chip": layout.sparse_cores_per_chip,
            "per_replica_batch_size": layout.per_replica_batch_size}


def plan_signature(plan: EmbeddingPlan, layout: CheckpointLayout, cfg, dense_features: List[str]) -> Dict[str, Any]:
    """What a training checkpoint's variables are, as far as the plan and the config decide them.

    Two runs with equal signatures build the same variables; a learning rate may change between
    them, except where it regroups SparseCore stacks (the stacks then differ).

    Args:
      plan: the embedding plan.
      layout: the run's checkpoint layout.
      cfg: the pipeline config (its `training` section).
      dense_features: the dense feature names.

    Returns:
      A JSON-shaped dict: every table's rows, dim, placement and optimizer (its slots) and wide
      part, the features' tables, the dense buckets, the dense network's shape and optimizers,
      and under layout B the SparseCore stacks TF builds ({stack name: tables},
      `plan_sparse_core_layouts`).
    """
    t = cfg.training
    tables = {n: {"rows": int(p.rows), "dim": int(p.dim), "placement": p.placement,
                  "optimizer": p.optimizer["name"], "wide_of": p.wide_of} for n, p in plan.tables.items()}
    signature: Dict[str, Any] = {
        "tables": tables,
        "features": {n: f.table for n, f in plan.features.items()},
        "dense_features": list(dense_features),
        "dense_buckets": None if plan.dense_buckets is None else {
            "dim": plan.dense_buckets.dim, "encoding": plan.dense_buckets.encoding,
            "buckets": {f: len(b) + 1 for f, b in plan.dense_buckets.boundaries.items()}},
        "model": {"model": t.model, "cross_layers": t.cross_layers, "cross_projection_dim": t.cross_projection_dim,
                  "bottom_mlp": list(t.bottom_mlp), "top_mlp": list(t.top_mlp),
                  "dense_optimizer": t.dense_optimizer.name, "embedding_optimizer": t.embedding_optimizer.name},
    }
    if plan.dense_buckets is not None and t.dense_buckets.into != BucketsInto.INTERACTION:
        # where the bucket vectors enter changes the dense kernels' shapes; the default is left out,
        # so the records of runs written before the option compare equal
        signature["model"]["dense_buckets_into"] = t.dense_buckets.into
    if layout.kind == "B":
        stacks: Dict[str, List[str]] = {}
        layouts = plan_sparse_core_layouts(plan, int(layout.num_replicas), int(layout.sparse_cores_per_chip),
                                           int(layout.per_replica_batch_size))
        for name, lay in layouts.items():
            stacks.setdefault(lay.stacked_table_name, []).append(name)
        signature["stacks"] = stacks
    return json.loads(json.dumps(signature))  # as it reads back from the state record


SIGNATURE_ORDER = ("tables", "stacks", "model", "dense_buckets", "dense_features", "features")


def signature_differences(saved: Dict[str, Any], wanted: Dict[str, Any]) -> List[str]:
    """What differs between a checkpoint's plan signature and this run's.

    Args:
      saved: the checkpoint's `plan_signature`.
      wanted: this run's.

    Returns:
      One phrase per difference, most telling section first, e.g. `tables only in this run:
      C1__wide, C2__wide`, `tables.C1.dim 16 -> 8`, `stacks only in the checkpoint: C1_C2`.
    """
    out: List[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            only_a, only_b = [k for k in a if k not in b], [k for k in b if k not in a]
            if only_b:
                out.append(f"{path} only in this run: {', '.join(sorted(only_b))}")
            if only_a:
                out.append(f"{path} only in the checkpoint: {', '.join(sorted(only_a))}")
            for k in sorted(k for k in a if k in b):
                walk(a[k], b[k], f"{path}.{k}")
        elif a != b:
            out.append(f"{path} {json.dumps(a)} -> {json.dumps(b)}")

    for section in sorted(set(saved) | set(wanted), key=lambda k: (SIGNATURE_ORDER + (k,)).index(k)):
        walk(saved.get(section), wanted.get(section), section)
    return out


def _summary(signature: Dict[str, Any]) -> str:
    tables = signature.get("tables", {})
    wide = sum(1 for t in tables.values() if t.get("wide_of"))
    text = f"{len(tables) - wide} tables" + (f" + {wide} wide" if wide else ", wide part off")
    if "stacks" in signature:
        text += f", {len(signature['stacks'])} SparseCore stacks"
    return text


def write_layout(state_dir: str, layout: CheckpointLayout, signature: Optional[Dict[str, Any]] = None,
                 data: Optional[Dict[str, Any]] = None, **more: Any) -> None:
    """Writes the state's record: its checkpoints' table layout, and the plan signature and the data they were written under.

    Args:
      state_dir: the training state directory (LAYOUT_FILE is written there).
      layout: the run's checkpoint layout.
      signature: the run's `plan_signature`, or None.
      data: what identifies the run's training data (components/data_io/data_identity.py: a
        `fingerprint`, with the examples' location, files and bytes for the message), or None.
      **more: further JSON fields (the trainer's training config and steps: resume_rule.py).
    """
    tf.io.gfile.makedirs(state_dir)
    record = dict(layout_record(layout), embedding_api=layout.embedding_api, **more)
    if signature is not None:
        record["plan"] = signature
    if data is not None:
        record["data"] = data
    _write_record(state_dir, record)


def _write_record(state_dir: str, record: Dict[str, Any]) -> None:
    with tf.io.gfile.GFile(os.path.join(state_dir, LAYOUT_FILE), "w") as fh:
        fh.write(json.dumps(record, sort_keys=True))


def read_record(state_dir: str) -> Optional[Dict[str, Any]]:
    """The state's record (`write_layout`), or None where there is none."""
    path = os.path.join(state_dir, LAYOUT_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as fh:
        return json.loads(fh.read())


def update_record(state_dir: str, **fields: Any) -> None:
    """Sets fields of the state's record (one written by `write_layout`)."""
    _write_record(state_dir, dict(read_record(state_dir) or {}, **fields))


class PlanMismatch(LayoutMismatch):
    """A checkpoint was written under another plan than this run's; says what differs."""


class DataMismatch(LayoutMismatch):
    """A checkpoint was trained on other data than this run's: resuming would not train on this run's data."""


def _data_summary(data: Dict[str, Any]) -> str:
    return (f"{data.get('from', 'examples')} {data.get('examples')} ({data.get('files')} files, "
            f"{data.get('bytes', 0):,} bytes, fingerprint {str(data.get('fingerprint'))[:12]})")


def check_resumable(state_dir: str, checkpoint: str, layout: CheckpointLayout,
                    signature: Optional[Dict[str, Any]] = None, data: Optional[Dict[str, Any]] = None) -> None:
    """Refuses to resume a checkpoint under another table layout, plan or data than it was written with.

    A state without a record is taken as one variable per table (A): resumable under A only.

    Args:
      state_dir: the training state directory holding the record.
      checkpoint: the checkpoint to resume, for the message.
      layout: this run's checkpoint layout.
      signature: this run's `plan_signature`; None skips the plan check (as does a record without one).
      data: what identifies this run's training data (`write_layout`); None skips the data check (as
        does a record without one: a state written before the record held it).

    Raises:
      LayoutMismatch: the recorded layout is not this run's.
      PlanMismatch: the recorded plan signature is not this run's.
      DataMismatch: the recorded data's fingerprint is not this run's.
    """
    path = os.path.join(state_dir, LAYOUT_FILE)
    saved = read_record(state_dir) or {"kind": "A", "embedding_api": "unrecorded (one variable per table)"}
    wanted = layout_record(layout)
    if {k: saved.get(k) for k in wanted} != wanted:
        raise LayoutMismatch(
            f"checkpoint {checkpoint} holds the embedding tables as {saved.get('embedding_api')} wrote them "
            f"({json.dumps({k: v for k, v in saved.items() if k not in ('embedding_api', 'plan')}, sort_keys=True)}), "
            f"but this run is {layout.embedding_api} ({json.dumps(wanted, sort_keys=True)}). TensorFlow 2.16 cannot "
            "restore SparseCore stacks into another layout (they would start fresh or come back permuted): resume on "
            f"the platform and topology that wrote it, or remove {state_dir} (training.checkpoint_dir) to train from "
            "the start")
    # Compared under one rule only: a record of the transformed examples' bytes (one written before
    # ExampleGen recorded its input, or examples from a stock ExampleGen) says nothing of input files.
    if (data is not None and "data" in saved and saved["data"].get("from") == data.get("from")
            and saved["data"].get("fingerprint") != data.get("fingerprint")):
        # Checked first: a finished state from other data resumes at its last step and trains nothing.
        raise DataMismatch(
            f"checkpoint {checkpoint} (step {checkpoint.rsplit('-', 1)[-1]}) was trained on other data than this "
            f"run's (checkpoint: {_data_summary(saved['data'])}; this run: {_data_summary(data)}; recorded in "
            f"{path}): resuming would continue that training, not train on this data. To start from its weights "
            "on this data, warm-start from the last blessed model (continuous.warm_start); to train from the start, "
            f"point training.checkpoint_dir at a fresh directory (or remove {state_dir})")
    if signature is None or "plan" not in saved:
        return
    differences = signature_differences(saved["plan"], signature)
    if not differences:
        return
    shown = "; ".join(differences[:6]) + (f"; and {len(differences) - 6} more" if len(differences) > 6 else "")
    raise PlanMismatch(
        f"checkpoint {checkpoint} was written under another embedding plan than this run's (checkpoint: "
        f"{_summary(saved['plan'])}; this run: {_summary(signature)}; recorded in {path}): {shown}. Resuming would "
        "restore some variables and start others fresh: run with the config that wrote it, or point "
        f"training.checkpoint_dir at an empty directory (or remove {state_dir}) to train from the start; to carry "
        "the trained tables into the new plan, warm-start from the last blessed model (continuous.warm_start)")
