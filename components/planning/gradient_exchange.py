"""How one training step sums a TensorCore table's sparse gradient over the replicas, and its size.

Each replica's gradient of a table it looks up with `tf.gather` is an IndexedSlices: one row per ID
its batch looked up (its batch x the features' IDs per example, padded: a static count on a TPU)
and their values. The step (`embedding_model.model.sum_over_replicas`) sums it over the replicas
one of two ways:
- `all_gather`: every replica gathers every replica's rows and values, replicas x IDs x (dim float32
  values + one int64 index) on each replica, and the row rules then sum the duplicates (a sort of
  that many entries, xla_updates.occurrence_sums);
- `all_reduce`: each replica sums its rows into a table-shaped gradient and a per-row count, one
  all-reduce of rows x (dim + 1) float32 (the size of the table itself), and the rows some replica
  looked up are taken back out, so a lazy optimizer still moves only those.
The gather is taken while it holds no more bytes than the all-reduce, the all-reduce beyond: what
is exchanged per step is then at most one table-sized all-reduce, whatever the replicas. One rule
(`exchange_method`) for the step and for the plan's memory.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping

from components.config.choices import Placement
from components.contracts.plan import EmbeddingPlan

ALL_GATHER, ALL_REDUCE = "all_gather", "all_reduce"
FLOAT_BYTES, INDEX_BYTES = 4, 8  # float32 values and counts; int64 row indices


def gathered_bytes(replicas: int, ids_per_replica: int, dim: int) -> int:
    """Every replica's rows and values of a table's gradient, as each replica holds them gathered."""
    return replicas * ids_per_replica * (dim * FLOAT_BYTES + INDEX_BYTES)


def all_reduce_bytes(rows: int, dim: int) -> int:
    """A table-shaped gradient and its per-row counts, as each replica holds them all-reduced."""
    return rows * (dim + 1) * FLOAT_BYTES


def exchange_method(replicas: int, ids_per_replica: int, rows: int, dim: int) -> str:
    """How a table's sparse gradient is summed over the replicas.

    Args:
      replicas: the replicas in sync.
      ids_per_replica: the rows one replica's gradient holds (its batch x IDs per example).
      rows, dim: the table's shape (dim: a row's values).

    Returns:
      ALL_GATHER while the gathered gradient holds no more bytes than the all-reduce, else ALL_REDUCE.
    """
    if gathered_bytes(replicas, ids_per_replica, dim) > all_reduce_bytes(rows, dim):
        return ALL_REDUCE
    return ALL_GATHER


@dataclasses.dataclass(frozen=True)
class GradientExchange:
    """One table's gradient exchange per step: the chosen method and both methods' bytes on each replica."""

    method: str
    ids_per_replica: int
    gathered_bytes: int
    all_reduce_bytes: int

    @property
    def bytes(self) -> int:
        """What the chosen method holds on each replica per step."""
        return self.all_reduce_bytes if self.method == ALL_REDUCE else self.gathered_bytes

    def to_dict(self) -> Dict[str, Any]:
        """The exchange as plain data (with `bytes`, the chosen method's)."""
        return dict(dataclasses.asdict(self), bytes=self.bytes)


def gradient_exchange(replicas: int, ids_per_replica: int, rows: int, dim: int) -> GradientExchange:
    """A table's exchange per step (`exchange_method`) and both methods' bytes on each replica.

    Args:
      replicas: the replicas in sync (more than one).
      ids_per_replica: the rows one replica's gradient holds.
      rows, dim: the table's shape.

    Returns:
      The exchange.
    """
    return GradientExchange(
        method=exchange_method(replicas, ids_per_replica, rows, dim), ids_per_replica=ids_per_replica,
        gathered_bytes=gathered_bytes(replicas, ids_per_replica, dim), all_reduce_bytes=all_reduce_bytes(rows, dim))


def ids_per_replica(plan: EmbeddingPlan, table: str, per_replica_batch: int) -> int:
    """The rows one replica's gradient of a TensorCore table holds: its batch x the padded IDs per
    example of every feature looking the table up (a wide feature reads its feature's IDs).

    Raises:
      ValueError: a feature of the table has no planned width (input.make_dataset needs one too).
    """
    total = 0
    for name, f in plan.features.items():
        if f.table != table:
            continue
        width = plan.features[f.wide_of].dense_width if f.wide_of else f.dense_width
        if not width:
            raise ValueError(f"feature {name!r} of TensorCore table {table!r} has no planned width (max_length)")
        total += int(width)
    return per_replica_batch * total


def plan_gradient_exchanges(plan: EmbeddingPlan, replicas: int) -> Dict[str, GradientExchange]:
    """Every TensorCore table's exchange per step on `replicas` replicas ({} on one replica).

    Args:
      plan: the embedding plan (its global batch and the features' widths).
      replicas: the replicas in sync.

    Returns:
      {table: GradientExchange}.
    """
    if replicas <= 1:
        return {}
    per_replica = plan.global_batch_size // replicas
    return {n: gradient_exchange(replicas, ids_per_replica(plan, n, per_replica), t.rows, t.dim)
            for n, t in plan.tables.items() if t.placement == Placement.TENSOR_CORE}


def with_gradient_exchange(plan: EmbeddingPlan, replicas: int) -> EmbeddingPlan:
    """The plan whose memory holds the TensorCore tables' gradient exchange on `replicas` replicas:
    `gradient_exchange` per table, `gradient_exchange_bytes` their sum on each replica, counted in
    the peak beside the steady bytes (as the initialization transient is; they do not meet).

    Args:
      plan: the embedding plan.
      replicas: the run's replicas in sync.

    Returns:
      The plan itself on one replica or without TensorCore tables, else a copy.
    """
    exchanges = plan_gradient_exchanges(plan, replicas)
    if not exchanges:
        return plan
    memory = plan.memory
    total = sum(e.bytes for e in exchanges.values())
    peak = memory.per_chip_bytes + max(memory.init_transient_bytes, total)
    return dataclasses.replace(plan, memory=dataclasses.replace(
        memory, gradient_exchange_bytes=total, gradient_exchange_replicas=replicas, peak_per_chip_bytes=peak,
        gradient_exchange={n: e.to_dict() for n, e in exchanges.items()}))


def describe_exchanges(exchanges: Mapping[str, GradientExchange], replicas: int) -> str:
    """One line: how the TensorCore tables' gradients are summed over the replicas and their bytes per step."""
    by = {m: sorted(n for n, e in exchanges.items() if e.method == m) for m in (ALL_GATHER, ALL_REDUCE)}
    total = sum(e.bytes for e in exchanges.values())
    return (f"TensorCore gradients summed over {replicas} replicas: {len(by[ALL_GATHER])} tables by all-gather, "
            f"{len(by[ALL_REDUCE])} by a table-sized all-reduce ({', '.join(by[ALL_REDUCE]) or '-'}); "
            f"{total / 2**20:.2f} MiB per replica and step")
