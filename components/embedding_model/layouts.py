"""Trained embedding tables, in every layout TPU training leaves them, read back as logical tables.

Layouts (see shared notes "tpu-embedding.md" and docs/export.md):
- A: one logical table per table config (`TPUEmbedding` on TPU v2-v4, and CPU/GPU training): the
  checkpoint key holds the [rows, dim] table as is.
- B: SparseCore (`TPUEmbeddingV2`): tables with the same padded dim and optimizer are stacked into
  one variable named by joining their names with '_'; rows padded to a multiple of
  8 x num_sparse_cores, columns to a multiple of 8; rows mod-sharded over the N SparseCores with a
  per-table rotation. The per-table `SparseCoreTableLayout` comes from the checkpoint's
  `_sparse_core_table_layouts` record when present (TensorFlow >= 2.17 writes it), else it is
  recomputed with TensorFlow's own stacking function and the rules of tpu_embedding_v3.py from
  the plan's tables and the training topology.
- C: host-partitioned tables (`partition_strategy` div or mod): either one key saved as slices of
  the full table (how partitioned and sharded variables save) or one key per partition
  (`<table>/part_<i>`). With `mod`, partition i holds logical rows i, i+P, i+2P, ...; with `div`, a
  contiguous block (the first rows % P partitions one row longer, TensorFlow's rule).

Every table is read on its own, and B and C tables one shard/partition at a time with
`RestoreV2` slice reads, so peak memory stays near the largest single table (TensorFlow's own
`unshuffle_from_sc_to_cpu` needs the whole stacked variable in memory: a stack of many tables
would cost several times the largest one). Any disagreement between the checkpoint and the plan
(a missing table, rows that disagree with the vocabulary, an inconsistent layout) raises
`LayoutError` naming the table, the key and what was expected.

Here: locating each table (which layout, which keys) and reading it. The checkpoint `.index`
reader is checkpoint_index.py, the SparseCore layout maths sparsecore_layout.py, and the checkpoint
paths of the model's tables are the model's own (checkpoint_keys.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import numpy as np
import tensorflow as tf

from components.config.schema import ExportLayoutConfig
from components.contracts.plan import CheckpointLayout, EmbeddingPlan, TablePlan
from components.embedding_model.checkpoint_index import BundleIndex, restore_rows
from components.embedding_model.checkpoint_keys import (
    TPU_EMBEDDING_CHECKPOINT_PATH, VARIABLE_VALUE, checkpoint_name, table_checkpoint_key, tpu_embedding_checkpoint_key,
)
from components.embedding_model.sparsecore_layout import parse_layout_record, plan_sparse_core_layouts

# Where the model keeps its tables in a checkpoint: the model's own published paths (checkpoint_keys.py).
ATTR = VARIABLE_VALUE
TPU_PREFIX = TPU_EMBEDDING_CHECKPOINT_PATH + "/"
escape_name = checkpoint_name
table_key = table_checkpoint_key  # layout-A key of a plan table
# tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY (TensorFlow's name for the record).
SPARSECORE_LAYOUTS_KEY = "_sparse_core_table_layouts"
LAYOUT_RECORD_KEY = tpu_embedding_checkpoint_key(SPARSECORE_LAYOUTS_KEY)


class LayoutError(ValueError):
    """The checkpoint's tables cannot be read as the plan describes them; says which and why."""


@dataclass
class TableSource:
    """Where a plan table is in a checkpoint, and in which layout.

    Attributes:
      table: the plan table's name.
      kind: the layout, A, B or C.
      key: the checkpoint key read (B: the stacked variable's; C: the first partition's or the sliced key).
      rows: the table's rows (vocabulary entries + OOV buckets).
      dim: its embedding dimension.
      source: how the layout was determined, for the report.
      shard: B only: num_sparse_cores, offset, size, rotation, padded_cols, stacked_rows.
      partitions: C only: (key, rows) per partition (the same key when sliced).
      strategy: C only: div or mod.
    """

    table: str
    kind: str  # A | B | C
    key: str
    rows: int
    dim: int
    source: str  # how the layout was determined, for the report
    shard: Optional[Dict[str, int]] = None  # B: num_sparse_cores, offset, size, rotation, padded_cols, stacked_rows
    partitions: Optional[List[Tuple[str, int]]] = None  # C: (key, rows) per partition (same key when sliced)
    strategy: Optional[str] = None  # C


def div_partition_sizes(rows: int, parts: int) -> List[int]:
    """Rows per partition under `div` (and, equally, the count of r % parts == i under `mod`).

    Args:
      rows: the table's rows.
      parts: the partitions.

    Returns:
      [parts] row counts: the first rows % parts partitions one row longer (TensorFlow's rule).
    """
    return [rows // parts + (1 if i < rows % parts else 0) for i in range(parts)]


# ---- reading -------------------------------------------------------------------------------------


class CheckpointTables:
    """The plan's tables in a training checkpoint: locate each (and its layout), then read each.

    Args:
      checkpoint_prefix: the training checkpoint's path prefix.
      plan: the embedding plan the checkpoint was trained with.
      options: the config's `export.layout` (checked there): what the checkpoint cannot say.

    Raises:
      LayoutError: a table cannot be located, or its layout disagrees with the plan.
    """

    def __init__(self, checkpoint_prefix: str, plan: EmbeddingPlan, options: Optional[ExportLayoutConfig] = None):
        self.prefix = checkpoint_prefix
        self.plan = plan
        self.options = options or ExportLayoutConfig()
        reader = tf.train.load_checkpoint(checkpoint_prefix)
        self.shapes: Dict[str, List[int]] = reader.get_variable_to_shape_map()
        self.dtypes = reader.get_variable_to_dtype_map()
        self._reader = reader
        self.index = BundleIndex(checkpoint_prefix)
        self._record: Optional[Dict[str, Any]] = None
        if LAYOUT_RECORD_KEY in self.shapes:
            raw = reader.get_tensor(LAYOUT_RECORD_KEY)
            raw = raw.item() if hasattr(raw, "item") else raw
            if raw:
                self._record = parse_layout_record(raw)
        self._recomputed: Optional[Dict[str, Any]] = None
        self._recompute_note = ""
        self.sources = {name: self._locate(name, t) for name, t in plan.tables.items()}

    # -- locating --
    def _locate(self, name: str, t: TablePlan) -> TableSource:
        o = self.options
        rows, dim, placement = int(t.rows), int(t.dim), t.placement
        key = o.table_keys.get(name) or table_key(name, placement)
        base = key[: -len(ATTR)] if key.endswith(ATTR) else key
        part_re = re.compile(re.escape(base) + r"/part_(\d+)(" + re.escape(ATTR) + ")?$")
        parts = sorted(
            ((int(m.group(1)), k) for k in self.shapes if (m := part_re.match(k))), key=lambda p: p[0]
        )
        # Host partitioning applies to sharded tables (TPU-embedding ones, or tables named in
        # table_keys); TensorCore tables are replicated, so saved whole.
        sharded = placement == "tpu_embedding" or name in o.table_keys
        want_c = bool(parts) or (sharded and (o.kind == "C" or (o.kind == "auto" and o.partition_strategy is not None)))
        if o.kind in ("auto", "B") and placement == "tpu_embedding" and not parts and not want_c:
            # A stack of one table is named like the table, so the record (or the recorded
            # layout kind) decides before the table's own key does.
            if self._record is not None and name in self._record:
                return self._source_b(name, rows, dim, self._record[name], "checkpoint record _sparse_core_table_layouts")
            run = self.plan.checkpoint_layout
            trained_b = o.kind == "B" or (run is not None and run.kind == "B")
            # Trained on SparseCore without a record (TF 2.16 writes none): always the recomputed
            # layout. A lone table that needs no padding keeps its own name and shape, but its rows
            # are still mod-sharded and rotated: read as A they would come out permuted.
            # Not known to be B: a key that holds the table as is is read as A.
            own_fits = key in self.shapes and list(self.shapes[key]) == [rows, dim]
            if self._record is None and (trained_b or (not own_fits and key not in self.shapes
                                                       and self._stacked_keys(foreign=True))):
                layouts = self._recompute()
                if name in layouts:
                    return self._source_b(name, rows, dim, layouts[name], self._recompute_note)
        if o.kind == "B" and placement == "tpu_embedding":
            raise LayoutError(
                f"table {name!r}: export.layout.kind is B but the checkpoint {self.prefix} has no stacked "
                f"SparseCore variable holding it (stacked keys: {sorted(self._stacked_keys())[:5]})"
            )
        if want_c and (parts or key in self.shapes):
            return self._source_c(name, rows, dim, key, parts)
        if key in self.shapes:
            return self._source_a(name, rows, dim, key)
        looked = [key, f"{base}/part_<i>"]
        if placement == "tpu_embedding":
            looked.append("a stacked SparseCore variable under " + TPU_PREFIX)
        raise LayoutError(
            f"table {name!r} is missing from checkpoint {self.prefix} (looked for {', '.join(looked)}); "
            "the checkpoint is not from a model trained with this plan, or set export.layout.table_keys"
        )

    def _check_shape(self, name: str, key: str, shape: List[int], rows: int, dim: int) -> None:
        if len(shape) != 2 or shape[1] != dim:
            raise LayoutError(f"table {name!r}: checkpoint key {key} has shape {shape}, expected [{rows}, {dim}] (dim {dim})")
        if shape[0] != rows:
            raise LayoutError(
                f"table {name!r}: checkpoint key {key} has {shape[0]} rows but the vocabulary has {rows} "
                "(vocabulary entries + OOV buckets); the model was trained with another vocabulary"
            )

    def _source_a(self, name, rows, dim, key) -> TableSource:
        self._check_shape(name, key, self.shapes[key], rows, dim)
        return TableSource(name, "A", key, rows, dim, "one logical table per table config")

    def _source_c(self, name, rows, dim, key, parts) -> TableSource:
        strategy = self.options.partition_strategy
        if strategy is None:
            raise LayoutError(
                f"table {name!r} is saved in {len(parts) or '?'} host partitions ({key}); set "
                "export.layout.partition_strategy (CLI --partition-strategy) to div or mod, the strategy "
                "training used: it cannot be read from the checkpoint"
            )
        if parts:
            if [i for i, _ in parts] != list(range(len(parts))):
                raise LayoutError(f"table {name!r}: partitions {[i for i, _ in parts]} are not 0..{len(parts) - 1}")
            sizes = [self.shapes[k][0] for _, k in parts]
            for _, k in parts:
                if len(self.shapes[k]) != 2 or self.shapes[k][1] != dim:
                    raise LayoutError(f"table {name!r}: partition {k} has shape {self.shapes[k]}, expected [*, {dim}]")
            if sum(sizes) != rows:
                raise LayoutError(
                    f"table {name!r}: its {len(parts)} partitions hold {sum(sizes)} rows but the vocabulary "
                    f"has {rows} (vocabulary entries + OOV buckets)"
                )
            if sizes != div_partition_sizes(rows, len(parts)):
                raise LayoutError(
                    f"table {name!r}: partition sizes {sizes} are not how {strategy} partitioning splits {rows} "
                    f"rows over {len(parts)} hosts ({div_partition_sizes(rows, len(parts))}); inconsistent layout"
                )
            partitions = [(k, s) for (_, k), s in zip(parts, sizes)]
            where = f"{len(parts)} partition keys {parts[0][1]}..."
        else:
            n = self.options.num_partitions
            if not n and strategy == "div":
                n = 1  # div slices in order are the table itself; the slice count does not matter
            if not n:
                raise LayoutError(
                    f"table {name!r}: key {key} holds the table as partition slices; set "
                    "export.layout.num_partitions (CLI --num-partitions) to the number of hosts it was split over"
                )
            self._check_shape(name, key, self.shapes[key], rows, dim)
            partitions = [(key, s) for s in div_partition_sizes(rows, n)]
            where = f"{n} slices of {key}"
        return TableSource(
            name, "C", key, rows, dim, f"host-partitioned ({strategy}, {where})", partitions=partitions, strategy=strategy
        )

    def _stacked_keys(self, foreign: bool = False) -> List[str]:
        """Variables directly under the TPU embedding object (`foreign`: other than a plan table's
        own key; a one-table stack has the table's name)."""
        own = {table_key(n, "tpu_embedding") for n in self.plan.tables} if foreign else set()
        return [
            k for k in self.shapes if k not in own and
            k.startswith(TPU_PREFIX) and k.endswith(ATTR) and "/" not in k[len(TPU_PREFIX): -len(ATTR)]
            and k != LAYOUT_RECORD_KEY and not k[len(TPU_PREFIX): -len(ATTR)].startswith(SPARSECORE_LAYOUTS_KEY)
        ]

    def _recompute(self) -> Dict[str, Any]:
        if self._recomputed is not None:
            return self._recomputed
        topo = self.plan.topology
        run = self.plan.checkpoint_layout or CheckpointLayout(kind="A", embedding_api="unknown")
        self._check_override(run)
        per_chip = self.options.sparse_cores_per_chip or run.sparse_cores_per_chip or topo.sparse_cores_per_chip
        if self.options.num_sparse_cores:
            replicas = self.options.num_sparse_cores // per_chip
        else:
            replicas = run.num_replicas or topo.num_chips
        per_replica = run.per_replica_batch_size or (self.plan.global_batch_size // max(replicas, 1))
        self._recomputed = plan_sparse_core_layouts(self.plan, int(replicas), int(per_chip), int(per_replica))
        self._recompute_note = (
            f"recomputed (no _sparse_core_table_layouts record): TensorFlow's stack_tables over "
            f"{replicas} replicas x {per_chip} SparseCores per chip, per-replica batch {per_replica}"
        )
        expected = {tpu_embedding_checkpoint_key(l.stacked_table_name) for l in self._recomputed.values()}
        present = set(self._stacked_keys())
        if not expected <= present:
            raise LayoutError(
                f"layout inconsistent: the recomputed SparseCore stacks {sorted(expected - present)} are not in "
                f"checkpoint {self.prefix} (it has {sorted(present)[:6]}); the topology used for the recompute "
                f"({replicas} replicas x {per_chip} SparseCores per chip) must be the one training ran on: set "
                "export.layout.num_sparse_cores / sparse_cores_per_chip"
            )
        return self._recomputed

    def _check_override(self, run: CheckpointLayout) -> None:
        """Refuses an `export.layout` SparseCore topology (`--num-sparse-cores`, `--sparse-cores-per-chip`)
        that contradicts what the training run recorded (the plan's checkpoint_layout): where padded
        shapes coincide, another shard count reads the same stacked variable with its rows permuted
        and no shape to refuse it. Without a record, the override is what there is."""
        o = self.options
        per_chip = o.sparse_cores_per_chip or run.sparse_cores_per_chip
        recorded = (f"the training run recorded {run.num_replicas} replicas x {run.sparse_cores_per_chip} SparseCores "
                    "per chip (the model's embedding_plan.json, checkpoint_layout)")
        fix = "remove the override: the record is the topology training ran on"
        if o.sparse_cores_per_chip and run.sparse_cores_per_chip and o.sparse_cores_per_chip != run.sparse_cores_per_chip:
            raise LayoutError(f"export.layout.sparse_cores_per_chip {o.sparse_cores_per_chip} contradicts what "
                              f"{recorded}; {fix}")
        cores = int(run.num_replicas or 0) * int(per_chip or 0)
        if o.num_sparse_cores and cores and int(o.num_sparse_cores) != cores:
            raise LayoutError(f"export.layout.num_sparse_cores {o.num_sparse_cores} contradicts what {recorded}: "
                              f"{cores} SparseCores; {fix}")

    def _source_b(self, name, rows, dim, layout, how) -> TableSource:
        key = tpu_embedding_checkpoint_key(layout.stacked_table_name)
        if key not in self.shapes:
            raise LayoutError(f"table {name!r}: its stacked variable {key} (from the layout) is not in the checkpoint")
        n = int(layout.num_sparse_cores)
        p_rows, p_cols = (int(x) for x in layout.unsharded_padded_shape)
        u_rows, u_cols = (int(x) for x in layout.unsharded_shape)
        stacked = self.shapes[key]
        per_shard = int(layout.total_rows_per_sparse_core_shard)
        size = p_rows // n if n else 0
        problems = []
        if (u_rows, u_cols) != (rows, dim):
            problems.append(f"the layout's unsharded shape [{u_rows}, {u_cols}] is not the plan's [{rows}, {dim}]")
        if n <= 0 or p_rows % n or p_rows < u_rows or p_cols < u_cols:
            problems.append(f"padded shape [{p_rows}, {p_cols}] does not hold [{u_rows}, {u_cols}] in {n} equal shards")
        if list(stacked) != [n * per_shard, p_cols]:
            problems.append(f"stacked variable shape {stacked} is not [{n} x {per_shard}, {p_cols}]")
        if layout.sparse_core_shard_row_offset + size > per_shard:
            problems.append(f"rows {layout.sparse_core_shard_row_offset}+{size} overrun the {per_shard}-row shard")
        if problems:
            hint = ""
            if "recomputed" in how:
                hint = (
                    f" ({how}: the topology must be the one training ran on; set export.layout.num_sparse_cores"
                    " and sparse_cores_per_chip)"
                )
            raise LayoutError(f"table {name!r} in {key}: layout inconsistent: " + "; ".join(problems) + hint)
        shard = {
            "num_sparse_cores": n, "offset": int(layout.sparse_core_shard_row_offset), "size": size,
            "rotation": int(layout.sparse_core_shard_rotation), "padded_cols": p_cols, "stacked_rows": n * per_shard,
        }
        return TableSource(name, "B", key, rows, dim, f"SparseCore stack {layout.stacked_table_name} ({how})", shard=shard)

    # -- reading --
    def read(self, name: str) -> np.ndarray:
        """Reads one logical table.

        Args:
          name: the plan table's name.

        Returns:
          float32 [rows, dim]: row i is vocabulary entry i, then the OOV buckets.

        Raises:
          LayoutError: what was read does not have the table's shape.
        """
        s = self.sources[name]
        if s.kind == "A":
            mapped = self.index.rows(s.key, [s.rows, s.dim])
            table = np.array(mapped) if mapped is not None else self._reader.get_tensor(s.key)
        elif s.kind == "B":
            table = self._read_b(s)
        else:
            table = self._read_c(s)
        if table.shape != (s.rows, s.dim):
            raise LayoutError(f"table {name!r}: read {table.shape} from {s.key}, expected ({s.rows}, {s.dim})")
        return np.asarray(table, dtype=np.float32)

    def _read_b(self, s: TableSource) -> np.ndarray:
        # Inverse of the forward map p = ((r % N) + rotation) % N, position offset + r // N
        # (tpu_embedding_v3_utils.map_indices_in_shard), one shard at a time.
        sh = s.shard
        n, size, rot = sh["num_sparse_cores"], sh["size"], sh["rotation"]
        per_shard = sh["stacked_rows"] // n
        out = np.empty((size, n, s.dim), np.float32)
        full = [sh["stacked_rows"], sh["padded_cols"]]
        mapped = self.index.rows(s.key, full)  # saved whole: read only this table's rows
        for p in range(n):
            lo = p * per_shard + sh["offset"]
            if mapped is not None:
                out[:, (p - rot) % n, :] = mapped[lo: lo + size, : s.dim]
            else:  # saved in slices (per TPU device, as TPUEmbeddingV2 saves): RestoreV2 reads one
                out[:, (p - rot) % n, :] = restore_rows(self.prefix, s.key, full, lo, size)[:, : s.dim]
        return out.reshape(size * n, s.dim)[: s.rows]

    def _read_c(self, s: TableSource) -> np.ndarray:
        n = len(s.partitions)
        out = np.empty((s.rows, s.dim), np.float32)
        start = 0
        for i, (key, size) in enumerate(s.partitions):
            if self.shapes[key][0] != size:  # one partition's slice of a sliced key
                block = restore_rows(self.prefix, key, self.shapes[key], start, size)
            else:
                block = self._reader.get_tensor(key)
            if s.strategy == "mod":
                out[i::n] = block
            else:
                out[start: start + size] = block
            start += size
        return out

    def summary(self) -> Dict[str, Any]:
        """The layouts found, for the export report.

        Returns:
          {"kinds": sorted layout kinds, "detected": tables per kind as text,
          "tables": {table: {"layout", "key", "source"}}}.
        """
        kinds = sorted({s.kind for s in self.sources.values()})
        return {
            "kinds": kinds,
            "detected": "; ".join(
                f"{k}: {sum(1 for s in self.sources.values() if s.kind == k)} tables" for k in kinds
            ),
            "tables": {n: {"layout": s.kind, "key": s.key, "source": s.source} for n, s in self.sources.items()},
        }
