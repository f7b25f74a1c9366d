"""SparseCore (`TPUEmbeddingV2`) table layout maths: layout B of layouts.py.

Tables with the same padded dim and optimizer are stacked into one variable named by joining their
names with '_'; rows are padded to a multiple of 8 x num_sparse_cores, columns to a multiple of 8,
and mod-sharded over the N SparseCores with a per-table rotation. `parse_layout_record` reads the
per-table `SparseCoreTableLayout`s TensorFlow >= 2.17 saves; `recompute_sparse_core_layouts` derives
them as TensorFlow 2.16 lays tables out; `stack_table_to_shards` / `stacked_variables` are the
forward map (logical tables -> stacked checkpoint values), for tests and benchmarks.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import numpy as np
import tensorflow as tf
from tensorflow.core.tpu.kernels import sparse_core_layout_pb2
# Private modules: TF's own SparseCore stacking and row placement have no public API, and the
# layouts must be exactly TF's.
from tensorflow.python.tpu import _pywrap_tpu_embedding
from tensorflow.python.tpu import tpu_embedding_v3_utils

from components.planning.sizing import sparse_core_padded_shape


def parse_layout_record(record: bytes) -> Dict[str, sparse_core_layout_pb2.SparseCoreTableLayout]:
    """Reads the SparseCore layouts TensorFlow >= 2.17 saves in a checkpoint.

    Args:
      record: a serialized SparseCoreTableLayouts proto.

    Returns:
      {table name: its SparseCoreTableLayout}.
    """
    layouts = sparse_core_layout_pb2.SparseCoreTableLayouts()
    layouts.ParseFromString(record)
    return {t.table_name: t for t in layouts.tables}


def recompute_sparse_core_layouts(
    tables: List[Dict[str, Any]], num_replicas: int, sparse_cores_per_chip: int
) -> Dict[str, sparse_core_layout_pb2.SparseCoreTableLayout]:
    """SparseCoreTableLayouts as TPUEmbeddingV2 (TF 2.16, tpu_embedding_v3.py) lays tables out.

    Stacking is TensorFlow's own C++ `stack_tables`; padding (`_round_table_sizes`), offsets and
    rotations (`_stack_tables_with_same_table_dim_and_optimizer`) follow the Python code there.

    Args:
      tables: in the order TPUEmbeddingV2 sees them (first appearance over the features sorted by
        name), each {name, rows, dim, group, samples}: `group` equal for equal optimizers and
        quantization, `samples` = IDs per replica batch (per-replica batch x the table's features).
      num_replicas: the TPU chips trained on.
      sparse_cores_per_chip: SparseCores per chip.

    Returns:
      {table name: its SparseCoreTableLayout}.
    """
    n = num_replicas * sparse_cores_per_chip
    padded = {t["name"]: sparse_core_padded_shape(t["rows"], t["dim"], n) for t in tables}  # the plan's sizing rule
    groups: Dict[Any, int] = {}
    group_ids = [groups.setdefault((padded[t["name"]][1], t["group"]), len(groups)) for t in tables]
    stacks = _pywrap_tpu_embedding.stack_tables(
        [padded[t["name"]][0] for t in tables],
        [padded[t["name"]][1] for t in tables],
        [int(t["samples"]) for t in tables],
        group_ids,
        [t["name"] for t in tables],
        num_replicas,
    )
    by_name = {t["name"]: t for t in tables}
    out = {}
    for stack in stacks:
        stacked_name = "_".join(stack)
        total = sum(padded[name][0] for name in stack)
        offset = 0
        for index, name in enumerate(stack):
            p_rows, p_cols = padded[name]
            layout = sparse_core_layout_pb2.SparseCoreTableLayout(
                table_name=name,
                stacked_table_name=stacked_name,
                num_sparse_cores=n,
                num_partitions=num_replicas,
                total_rows_per_sparse_core_shard=total // n,
                unsharded_shape=[by_name[name]["rows"], by_name[name]["dim"]],
                unsharded_padded_shape=[p_rows, p_cols],
                sparse_core_shard_row_offset=offset // n,
                sparse_core_shard_rotation=sparse_cores_per_chip * index,
            )
            out[name] = layout
            offset += p_rows
    return out


def plan_sparse_core_layouts(plan, num_replicas: int, sparse_cores_per_chip: int, per_replica_batch: int):
    """The SparseCore layout of a plan's TPU-embedding tables, as TPUEmbeddingV2 lays out the
    model's feature configs (model.EmbeddingLayer, tf_objects.feature_configs).

    Tables come in their first appearance over the features sorted by name (nest.flatten of the
    feature dict), each feature `per_replica_batch` samples (its output_shape), grouped by
    optimizer spec (tables with equal specs share one TPU optimizer object,
    model_building.table_optimizers). One source for the exporter's reader and the trainer's warm
    start; tests/test_sparsecore_real.py checks it against TF's own constructor.

    Args:
      plan: the embedding plan.
      num_replicas: the TPU chips trained on.
      sparse_cores_per_chip: SparseCores per chip.
      per_replica_batch: the per-replica batch size.

    Returns:
      {table name: its SparseCoreTableLayout}.
    """
    tpu_tables = set(plan.tables_placed("tpu_embedding"))
    order: List[str] = []
    for fname in sorted(plan.features):
        tname = plan.features[fname].table
        if tname in tpu_tables and tname not in order:
            order.append(tname)
    samples = {n: 0 for n in order}
    for f in plan.features.values():
        if f.table in samples:
            samples[f.table] += per_replica_batch
    tables = [
        {"name": n, "rows": int(plan.tables[n].rows), "dim": int(plan.tables[n].dim),
         "group": json.dumps(dict(plan.tables[n].optimizer), sort_keys=True), "samples": samples[n]}
        for n in order
    ]
    return recompute_sparse_core_layouts(tables, num_replicas, sparse_cores_per_chip)


def stack_table_to_shards(table: np.ndarray, layout) -> Dict[int, np.ndarray]:
    """A logical table's rows in each SparseCore shard (the forward map of layout B).

    For tests and benchmarks that build layout-B checkpoints: TensorFlow's `map_indices_in_shard`
    places each row; rows and columns are zero-padded to the layout's padded shape.

    Args:
      table: [rows, dim] values.
      layout: the table's SparseCoreTableLayout.

    Returns:
      {shard: [padded rows / num_sparse_cores, padded cols]} of the table's dtype.
    """
    n = layout.num_sparse_cores
    p_rows, p_cols = layout.unsharded_padded_shape
    padded = np.zeros((p_rows, p_cols), table.dtype)
    padded[: table.shape[0], : table.shape[1]] = table
    shard, pos = tpu_embedding_v3_utils.map_indices_in_shard(
        n, 0, layout.sparse_core_shard_rotation, tf.range(p_rows, dtype=tf.int64)
    )
    shard, pos = shard.numpy(), pos.numpy()
    size = p_rows // n
    out = {s: np.zeros((size, p_cols), table.dtype) for s in range(n)}
    for s in range(n):
        rows = np.nonzero(shard == s)[0]
        out[s][pos[rows]] = padded[rows]
    return out


def stacked_variables(values: Dict[str, np.ndarray], layouts: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """The layout-B checkpoint values of logical tables, for tests and benchmarks.

    Args:
      values: {table name: [rows, dim] values}.
      layouts: {table name: SparseCoreTableLayout}, whole stacks.

    Returns:
      {stacked variable name: float32 [N x rows per shard, padded cols]}, N the SparseCores.

    Raises:
      ValueError: a row of some shard comes from no table (the layouts are not whole stacks).
    """
    stacks: Dict[str, List[str]] = {}
    for name, layout in layouts.items():
        stacks.setdefault(layout.stacked_table_name, []).append(name)
    out = {}
    for stacked, names in stacks.items():
        first = layouts[names[0]]
        n, per_shard, cols = first.num_sparse_cores, first.total_rows_per_sparse_core_shard, first.unsharded_padded_shape[1]
        full = np.full((n, per_shard, cols), np.nan, np.float32)  # NaN: any row not written shows up
        for name in names:
            lo = layouts[name].sparse_core_shard_row_offset
            for shard, rows in stack_table_to_shards(values[name], layouts[name]).items():
                full[shard, lo: lo + rows.shape[0]] = rows
        if np.isnan(full).any():
            raise ValueError(f"layouts of {names} leave rows of the stacked variable {stacked} unwritten")
        out[stacked] = full.reshape(n * per_shard, cols)
    return out
