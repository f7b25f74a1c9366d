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
    padding, of the parameters, every slot and the gradient accumulators (`v1_gradient_accumulators`:
    one more variable of the table's shape, which the trainer's optimizers always have). The
    embedding engine shards over TPU cores (two per chip on v2/v3); the exact per-core rule is not
    read here from TF (the tables live in the TPU runtime, not in Python).
  - `none` (v5e: no embedding engine): TFRS builds TPUEmbeddingV0, which keeps every table whole
    on every chip (replicated), as TensorCore tables are;
- a TensorCore table (Keras embedding) is replicated on every chip.
- SparseCore initialization transient (`sparse_core_init_transient`): TF builds the stacks one
  at a time, and an initializer that does not take `shard_info` (the trainer's do not: plain Keras
  initializers) builds the whole padded table of every table in the stack on each chip and slices
  that chip's shard out of it (`table_initialize_fn`), with the slices collected before their
  concatenation; while it builds one table, the initializer itself holds `INITIALIZER_COPIES`
  full-size tensors (a truncated normal: the raw draw, draw x stddev and that + mean). So while a
  stack is initialized a chip holds, beyond what it keeps, the stack's full padded parameters plus
  the larger of one more shard of them and the initializer's extra copies of its largest table.
Preprocessing's statistics, the trainer's plan and the exporter's report all use these functions.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, Optional, Tuple

from components.config.choices import OptimizerName, Placement, VocabularyKind
from components.config.schema import VocabularyOptions
from components.contracts.plan import TableMemory
from components.rules.chips import (DEFAULT_EMBEDDING_API, DEFAULT_SPARSE_CORES_PER_CHIP, EMBEDDING_APIS, SPARSE_CORE,
                                    TPU_EMBEDDING_V1)

FLOAT32_BYTES = 4
OPTIMIZER_SLOTS = {OptimizerName.SGD: 0, OptimizerName.ADAGRAD: 1, OptimizerName.ADAM: 2, OptimizerName.FTRL: 2}

# SparseCore pads columns and (per SparseCore) rows to multiples of this (tpu_embedding_v3.py).
SPARSE_CORE_PADDING = 8


def table_rows(vocabulary_size: int, num_oov_buckets: int) -> int:
    """Rows of a table: its vocabulary, then its OOV buckets.

    Args:
      vocabulary_size: values in the vocabulary.
      num_oov_buckets: rows that out-of-vocabulary values hash into.

    Returns:
      Their sum.
    """
    return int(vocabulary_size) + int(num_oov_buckets)


def table_layout(options: VocabularyOptions, vocabulary_size: int) -> Tuple[int, int]:
    """(size, num_oov_buckets) of a table whose vocabulary file has `vocabulary_size` lines: rows
    are size + num_oov_buckets (`table_rows`). Hashed: no vocabulary, num_buckets hash rows (V3);
    identity: the num_buckets IDs, no OOV rows (V4).

    Args:
      options: the table's vocabulary options.
      vocabulary_size: lines of its vocabulary file (unused for hashed and identity tables).

    Returns:
      (size, num_oov_buckets).
    """
    if options.kind == VocabularyKind.HASHED:
        return 0, int(options.num_buckets)
    if options.kind == VocabularyKind.IDENTITY:
        return int(options.num_buckets), 0
    return vocabulary_size, options.num_oov_buckets


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


# TPUEmbedding (V1) keeps a `gradient_accumulators` state variable of the table's shape beside the
# parameters and slots when gradient accumulation is on. TF's optimizers default to it
# (`use_gradient_accumulation=True`, tpu_embedding_v2_utils.py ~239, ~356, ~489, ~639, ~814) and write
# GradientAccumulationStatus.ENABLED into the table's OptimizationParameters (~113-118); the TPU
# runtime then appends the state variable (tensorflow/core/tpu/
# tpu_embedding_optimization_parameters_utils.cc: UseGradientAccumulation is true for ENABLED or
# UNSPECIFIED when the algorithm supports it, i.e. its base auxiliary parameter count + 1 <=
# kMaxAuxiliaryParameterCount = 7, which SGD (0), Adagrad (1), Adam (2) and FTRL (2) all meet;
# GetOptimizationAlgorithmStateVariables appends "gradient_accumulators" last). Clipping
# (`clipvalue`) requires it (`_Optimizer.__init__` refuses clipping without). The trainer's
# optimizers (components/embedding_model/optimizers.py tpu_optimizer) never turn it off.
MAX_AUXILIARY_PARAMETERS = 7


def v1_gradient_accumulators(optimizer: str, use_gradient_accumulation: bool = True) -> int:
    """State variables of the table's shape that TPUEmbedding (V1) adds for gradient accumulation.

    Args:
      optimizer: the optimizer's name.
      use_gradient_accumulation: the TPU optimizer's setting (TF's default and the trainer's: True).

    Returns:
      1 when accumulation is on and the algorithm supports it, else 0 (see `MAX_AUXILIARY_PARAMETERS`).
    """
    return int(bool(use_gradient_accumulation) and optimizer_slots(optimizer) + 1 <= MAX_AUXILIARY_PARAMETERS)


# Full-size tensors alive at once while the trainer's initializer builds one table
# (components/embedding_model/tf_objects.py tf_initializer: tf_keras initializers, which draw with
# the stateless ops, tf_keras/src/backend.py RandomGenerator): TF's
# stateless_truncated_normal / stateless_random_normal (tensorflow/python/ops/stateless_random_ops.py)
# return math_ops.add(rnd * stddev, mean) and stateless_random_uniform
# math_ops.add(rnd * (maxval - minval), minval): the raw draw, its product and the sum are alive
# together when the sum is allocated (3); Zeros is one tf.zeros (Fill) (1).
INITIALIZER_COPIES = {"truncated_normal": 3, "random_normal": 3, "random_uniform": 3, "zeros": 1}


def initializer_copies(name: str) -> int:
    """Full-size tensors the trainer's initializer `name` holds at once while building one table.

    Args:
      name: the initializer's name (the plan's `Initializer.name`).

    Returns:
      `INITIALIZER_COPIES[name]`.

    Raises:
      ValueError: an initializer this code does not know.
    """
    name = str(getattr(name, "value", name))
    if name not in INITIALIZER_COPIES:
        raise ValueError(f"initializer {name!r} is not one of {', '.join(INITIALIZER_COPIES)}")
    return INITIALIZER_COPIES[name]


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




def table_memory(rows: int, dim: int, optimizer: str, placement: str = Placement.TENSOR_CORE, num_chips: int = 1,
                 embedding_api: str = DEFAULT_EMBEDDING_API,
                 sparse_cores_per_chip: int = DEFAULT_SPARSE_CORES_PER_CHIP,
                 use_gradient_accumulation: bool = True) -> TableMemory:
    """Training memory of a float32 table with its optimizer's slots (module docstring).

    Args:
      rows: the table's rows.
      dim: the table's dim.
      optimizer: the optimizer's name (its slots count).
      placement: a `Placement` value.
      num_chips: chips the table is sharded over, or replicated on.
      embedding_api: the chips' embedding API, one of `EMBEDDING_APIS`.
      sparse_cores_per_chip: SparseCores per chip (SparseCore padding).
      use_gradient_accumulation: the TPU optimizer's setting; on TPUEmbedding (V1) it adds the
        gradient accumulators (`v1_gradient_accumulators`).

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
    p_rows, p_dim, accumulators = rows, dim, 0
    if placement == Placement.TPU_EMBEDDING and embedding_api == SPARSE_CORE:
        p_rows, p_dim = sparse_core_padded_shape(rows, dim, num_chips * int(sparse_cores_per_chip))
        chip_rows = p_rows // num_chips  # a multiple of 8 x SparseCores: even over the chips
    elif placement == Placement.TPU_EMBEDDING and embedding_api == TPU_EMBEDDING_V1:
        chip_rows = math.ceil(rows / num_chips)  # whole rows of each chip's shard
        accumulators = v1_gradient_accumulators(optimizer, use_gradient_accumulation)
    else:  # replicated: TensorCore tables, and every table where there is no embedding engine
        chip_rows = rows
    weight_bytes = p_rows * p_dim * FLOAT32_BYTES
    variables = 1 + slots + accumulators
    per_chip = chip_rows * p_dim * FLOAT32_BYTES * variables
    return TableMemory(weight_bytes, slots, weight_bytes * variables, per_chip, p_rows, p_dim, chip_rows, accumulators)


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
                               num_chips: int, copies: Optional[Dict[str, int]] = None) -> Tuple[int, Tuple[str, ...]]:
    """The most a chip holds beyond its steady bytes while TPUEmbeddingV2 initializes its stacks.

    TF's `table_initialize_fn` (tpu_embedding_v3.py ~455-520), for each of the chip's S SparseCores
    in turn, builds every table of the stack whole (an initializer without `shard_info`), keeps
    them until the next SparseCore, and slices that SparseCore's rows out of each; the slices (the
    chip's shard of the stack, F / chips over all S) are concatenated at the end. With F the
    stack's padded parameters and f_k a table's, while table k is built a chip holds beyond the
    stacks already made at most (S - 1) F / N + (F - f_k)(1 + 1/N) + copies_k f_k
    <= F + F / chips + (copies_k - 1) f_k (N = chips x S), and at the concatenation F + 2 F / chips,
    of which F / chips becomes the stack's parameters. So the transient over the steady bytes is
    F + max(F / chips, max_k (copies_k - 1) f_k). Taken over the groups that could share a stack
    (`sparse_core_stack_groups`), a safe upper bound of any stack TF forms.

    Args:
      padded_bytes: padded rows x padded dim x 4 per table.
      groups: the table names of each group.
      num_chips: chips the stacks are sharded over.
      copies: full-size tensors each table's initializer holds at once (`initializer_copies`);
        default 1 (the table itself only).

    Returns:
      (bytes, tables): the transient of the largest group, and its tables.
    """
    copies = copies or {}
    best: Tuple[int, Tuple[str, ...]] = (0, ())
    for names in groups:
        full = sum(padded_bytes[n] for n in names)
        temporaries = max((copies.get(n, 1) - 1) * padded_bytes[n] for n in names) if names else 0
        transient = full + max(full // int(num_chips), temporaries)
        if transient > best[0]:
            best = (transient, tuple(names))
    return best
