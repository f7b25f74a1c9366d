"""Row and memory rules for embedding tables, and the facts of each TPU chip, defined once.

- rows = vocabulary size + OOV buckets (IDs 0..size-1 are the vocabulary, then the buckets);
- a float32 table holds rows x dim x 4 bytes of weights, and its optimizer keeps
  `OPTIMIZER_SLOTS[name]` more variables of the same shape (TF's TPU embedding optimizers,
  `_slot_names` in tpu_embedding_v2_utils.py: SGD none, Adagrad `accumulators`, FTRL
  `accumulators` and `linears`, Adam `momenta` and `velocities`; the Keras optimizers of
  TensorCore tables keep as many);
- where a TPU-embedding table lives depends on the chip's embedding API (`CHIPS`, `EMBEDDING_APIS`):
  - `sparse_core` (TPUEmbeddingV2: v5p, v6e), as TF 2.16 allocates it (tpu_embedding_v3.py,
    `_round_table_sizes`, `_create_variables`): columns padded to a multiple of 8, rows to a
    multiple of 8 x the SparseCores (chips x SparseCores per chip); tables of equal padded dim and
    optimizer are stacked into one variable, and every slot is a variable of the stack's padded
    shape, sharded evenly over the chips: each chip holds padded rows / chips rows of the table
    and of each slot;
  - `tpu_embedding_v1` (TPUEmbedding: v2, v3, v4): ceil(rows / chips) whole rows per chip, no
    padding. The embedding engine shards over TPU cores (two per chip on v2/v3); the exact
    per-core rule is not read here from TF (the tables live in the TPU runtime, not in Python).
  - `none` (v5e: no embedding engine): TFRS builds TPUEmbeddingV0, which keeps every table whole
    on every chip (replicated), as TensorCore tables are;
- a TensorCore table (Keras embedding) is replicated on every chip.
- SparseCore initialization transient (`sparse_core_init_transient`): TF builds the stacks one
  at a time, and an initializer that does not take `shard_info` (the trainer's do not: plain Keras
  initializers) builds the whole padded table of every table in the stack on each chip and slices
  that chip's shard out of it (`table_initialize_fn`), with the slices collected before their
  concatenation. So while a stack is initialized a chip holds, beyond what it keeps, the stack's
  full padded parameters plus one more shard of them.
Preprocessing's statistics, the trainer's plan and the exporter's report all use these functions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple

from components.config.choices import OptimizerName, Placement

FLOAT32_BYTES = 4
OPTIMIZER_SLOTS = {OptimizerName.SGD: 0, OptimizerName.ADAGRAD: 1, OptimizerName.ADAM: 2, OptimizerName.FTRL: 2}

# The embedding API a chip's TPU-embedding tables go through (TF's HardwareFeature.EmbeddingFeature:
# V2, V1, UNSUPPORTED).
SPARSE_CORE = "sparse_core"
TPU_EMBEDDING_V1 = "tpu_embedding_v1"
NO_EMBEDDING_API = "none"
EMBEDDING_APIS = (SPARSE_CORE, TPU_EMBEDDING_V1, NO_EMBEDDING_API)
# What a plan is sized for when training.embedding.topology.chip is not set.
DEFAULT_EMBEDDING_API = SPARSE_CORE
DEFAULT_HBM_GIB_PER_CHIP = 16.0
DEFAULT_SPARSE_CORES_PER_CHIP = 4
# TF's EmbeddingFeature names -> the API.
EMBEDDING_FEATURE_APIS = {"V2": SPARSE_CORE, "V1": TPU_EMBEDDING_V1, "UNSUPPORTED": NO_EMBEDDING_API}
API_NAMES = {SPARSE_CORE: "SparseCore (TPUEmbeddingV2)", TPU_EMBEDDING_V1: "TPUEmbedding (V1 embedding engine)",
             NO_EMBEDDING_API: "no embedding engine"}
# SparseCore pads columns and (per SparseCore) rows to multiples of this (tpu_embedding_v3.py).
SPARSE_CORE_PADDING = 8


@dataclass(frozen=True)
class Chip:
    """A TPU generation: its embedding API, SparseCores per chip and HBM per chip (GiB)."""

    name: str
    embedding_api: str
    sparse_cores_per_chip: int
    hbm_gib_per_chip: float


# Google Cloud's TPU system architecture pages; the API is what TF 2.16 reports for the chip
# (v5e: EmbeddingFeature.UNSUPPORTED).
CHIPS: Dict[str, Chip] = {c.name: c for c in (
    Chip("v2", TPU_EMBEDDING_V1, 0, 16.0),
    Chip("v3", TPU_EMBEDDING_V1, 0, 32.0),
    Chip("v4", TPU_EMBEDDING_V1, 0, 32.0),
    Chip("v5e", NO_EMBEDDING_API, 0, 16.0),
    Chip("v5p", SPARSE_CORE, 4, 95.0),
    Chip("v6e", SPARSE_CORE, 2, 32.0),
)}


def chip_facts(name: str) -> Chip:
    """A TPU generation's facts.

    Args:
      name: the chip, one of `CHIPS` (e.g. "v5p").

    Returns:
      Its `Chip`.

    Raises:
      ValueError: `name` is not one of `CHIPS`.
    """
    if name not in CHIPS:
        raise ValueError(f"chip {name!r} is not one of {', '.join(CHIPS)}")
    return CHIPS[name]


def chips_with(api: str) -> Tuple[str, ...]:
    """The chips whose embedding API is `api`.

    Args:
      api: one of `EMBEDDING_APIS`.

    Returns:
      The chips' names, in `CHIPS` order.
    """
    return tuple(n for n, c in CHIPS.items() if c.embedding_api == api)


def table_rows(vocabulary_size: int, num_oov_buckets: int) -> int:
    """Rows of a table: its vocabulary, then its OOV buckets.

    Args:
      vocabulary_size: values in the vocabulary.
      num_oov_buckets: rows that out-of-vocabulary values hash into.

    Returns:
      Their sum.
    """
    return int(vocabulary_size) + int(num_oov_buckets)


def optimizer_slots(optimizer: str) -> int:
    """Slot variables the optimizer keeps beside a table (each of the table's shape).

    Args:
      optimizer: the optimizer's name.

    Returns:
      0 (sgd), 1 (adagrad) or 2 (adam, ftrl).

    Raises:
      ValueError: the optimizer is not one of `OPTIMIZER_SLOTS`.
    """
    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"optimizer {optimizer!r} is not one of {', '.join(OPTIMIZER_SLOTS)}")
    return OPTIMIZER_SLOTS[optimizer]


def _round_up(n: int, m: int) -> int:
    return -(-int(n) // m) * m


def sparse_core_padded_shape(rows: int, dim: int, num_sparse_cores: int) -> Tuple[int, int]:
    """The shape of a table as TPUEmbeddingV2 allocates it (`_round_table_sizes`).

    Args:
      rows: the table's rows.
      dim: the table's dim.
      num_sparse_cores: chips x SparseCores per chip.

    Returns:
      (rows, dim): rows rounded up to a multiple of 8 x `num_sparse_cores`, dim up to a multiple of 8.

    Raises:
      ValueError: `num_sparse_cores` is below 1.
    """
    if num_sparse_cores < 1:
        raise ValueError(f"num_sparse_cores must be >= 1, got {num_sparse_cores}")
    return (_round_up(rows, SPARSE_CORE_PADDING * num_sparse_cores), _round_up(dim, SPARSE_CORE_PADDING))


@dataclass(frozen=True)
class TableMemory:
    """A float32 table's memory while training (weights + optimizer slots), in total and per chip,
    as allocated: `weight_bytes` = padded_rows x padded_dim x 4 (the parameters), `total_bytes`
    = that x (1 + slots_per_row), `per_chip_bytes` = what each chip holds of it (its shard, or
    the whole table where replicated), `per_chip_rows` rows of it. `padded_rows`/`padded_dim`
    equal the table's rows/dim where nothing is padded."""

    weight_bytes: int
    slots_per_row: int
    total_bytes: int
    per_chip_bytes: int
    padded_rows: Optional[int] = None
    padded_dim: Optional[int] = None
    per_chip_rows: Optional[int] = None

    def to_dict(self) -> dict:
        """The memory as plain data.

        Returns:
          Every field by name.
        """
        return {
            "weight_bytes": self.weight_bytes,
            "slots_per_row": self.slots_per_row,
            "total_bytes": self.total_bytes,
            "per_chip_bytes": self.per_chip_bytes,
            "padded_rows": self.padded_rows,
            "padded_dim": self.padded_dim,
            "per_chip_rows": self.per_chip_rows,
        }


def table_memory(rows: int, dim: int, optimizer: str, placement: str = Placement.TENSOR_CORE, num_chips: int = 1,
                 embedding_api: str = DEFAULT_EMBEDDING_API,
                 sparse_cores_per_chip: int = DEFAULT_SPARSE_CORES_PER_CHIP) -> TableMemory:
    """Training memory of a float32 table with its optimizer's slots (module docstring).

    Args:
      rows: the table's rows.
      dim: the table's dim.
      optimizer: the optimizer's name (its slots count).
      placement: a `Placement` value.
      num_chips: chips the table is sharded over, or replicated on.
      embedding_api: the chips' embedding API, one of `EMBEDDING_APIS`.
      sparse_cores_per_chip: SparseCores per chip (SparseCore padding).

    Returns:
      The table's memory, in total and per chip.

    Raises:
      ValueError: the placement, embedding API or optimizer is unknown.
    """
    if placement not in Placement.values():
        raise ValueError(f"placement {placement!r} is not one of {', '.join(Placement.values())}")
    if embedding_api not in EMBEDDING_APIS:
        raise ValueError(f"embedding API {embedding_api!r} is not one of {', '.join(EMBEDDING_APIS)}")
    slots = optimizer_slots(optimizer)
    rows, dim, num_chips = int(rows), int(dim), int(num_chips)
    p_rows, p_dim = rows, dim
    if placement == Placement.TPU_EMBEDDING and embedding_api == SPARSE_CORE:
        p_rows, p_dim = sparse_core_padded_shape(rows, dim, num_chips * int(sparse_cores_per_chip))
        chip_rows = p_rows // num_chips  # a multiple of 8 x SparseCores: even over the chips
    elif placement == Placement.TPU_EMBEDDING and embedding_api == TPU_EMBEDDING_V1:
        chip_rows = math.ceil(rows / num_chips)  # whole rows of each chip's shard
    else:  # replicated: TensorCore tables, and every table where there is no embedding engine
        chip_rows = rows
    weight_bytes = p_rows * p_dim * FLOAT32_BYTES
    per_chip = chip_rows * p_dim * FLOAT32_BYTES * (1 + slots)
    return TableMemory(weight_bytes, slots, weight_bytes * (1 + slots), per_chip, p_rows, p_dim, chip_rows)


def sparse_core_stack_groups(tables: Iterable[Tuple[str, int, str]]) -> Dict[Tuple[int, str], Tuple[str, ...]]:
    """The tables TPUEmbeddingV2 may stack together.

    `_stack_tables_with_same_table_dim_and_optimizer` groups by padded dim and optimizer; its C++
    `stack_tables` may split a group into several stacks, never join two.

    Args:
      tables: (name, dim, optimizer key) of the SparseCore tables, the key equal for equal optimizers.

    Returns:
      {(padded dim, optimizer key): table names}.
    """
    groups: Dict[Tuple[int, str], Tuple[str, ...]] = {}
    for name, dim, key in tables:
        g = (_round_up(dim, SPARSE_CORE_PADDING), key)
        groups[g] = groups.get(g, ()) + (name,)
    return groups


def sparse_core_init_transient(padded_bytes: Dict[str, int], groups: Iterable[Tuple[str, ...]],
                               num_chips: int) -> Tuple[int, Tuple[str, ...]]:
    """The most a chip holds beyond its steady bytes while TPUEmbeddingV2 initializes its stacks.

    With initializers that are not sharding-aware, a chip holds the full padded parameters of every
    table of the stack being initialized plus one more shard of them (the slices collected before
    the concatenation). Taken over the groups that could share a stack (`sparse_core_stack_groups`),
    which is a safe upper bound of any stack TF forms.

    Args:
      padded_bytes: padded rows x padded dim x 4 per table.
      groups: the table names of each group.
      num_chips: chips the stacks are sharded over.

    Returns:
      (bytes, tables): the transient of the largest group, and its tables.
    """
    best: Tuple[int, Tuple[str, ...]] = (0, ())
    for names in groups:
        full = sum(padded_bytes[n] for n in names)
        transient = full + full // int(num_chips)
        if transient > best[0]:
            best = (transient, tuple(names))
    return best
