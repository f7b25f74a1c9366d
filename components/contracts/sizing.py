"""Row and memory rules for embedding tables, defined once.

- rows = vocabulary size + OOV buckets (IDs 0..size-1 are the vocabulary, then the buckets);
- a float32 table holds rows x dim x 4 bytes of weights, and the embedding optimizer keeps
  `OPTIMIZER_SLOTS[name]` more row-shaped slot variables (TF's TPU embedding optimizers: Adagrad
  keeps its accumulator, Adam its two moments, FTRL its accumulator and linear term);
- a table sharded over the chips (TPU embedding) holds ceil(rows / chips) rows on each chip; a
  table on the TensorCore is replicated on every chip.
Preprocessing's statistics, the trainer's plan and the exporter's report all use these functions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

FLOAT32_BYTES = 4
OPTIMIZER_SLOTS = {"sgd": 0, "adagrad": 1, "adam": 2, "ftrl": 2}
PLACEMENTS = ("tpu_embedding", "tensor_core")


def table_rows(vocabulary_size: int, num_oov_buckets: int) -> int:
    """Rows of a table: its vocabulary, then its OOV buckets."""
    return int(vocabulary_size) + int(num_oov_buckets)


def optimizer_slots(optimizer: str) -> int:
    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"optimizer {optimizer!r} is not one of {', '.join(OPTIMIZER_SLOTS)}")
    return OPTIMIZER_SLOTS[optimizer]


@dataclass(frozen=True)
class TableMemory:
    """A float32 table's memory while training (weights + optimizer slots), in total and per chip."""

    weight_bytes: int
    slots_per_row: int
    total_bytes: int
    per_chip_bytes: int

    def to_dict(self) -> dict:
        return {
            "weight_bytes": self.weight_bytes,
            "slots_per_row": self.slots_per_row,
            "total_bytes": self.total_bytes,
            "per_chip_bytes": self.per_chip_bytes,
        }


def table_memory(rows: int, dim: int, optimizer: str, placement: str = "tensor_core", num_chips: int = 1) -> TableMemory:
    """Training memory of a float32 table with `optimizer`'s slots, placed as `placement`."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement {placement!r} is not one of {', '.join(PLACEMENTS)}")
    slots = optimizer_slots(optimizer)
    weight_bytes = int(rows) * int(dim) * FLOAT32_BYTES
    total = weight_bytes * (1 + slots)
    if placement == "tpu_embedding":  # sharded: each chip holds whole rows of its shard
        per_chip = math.ceil(rows / num_chips) * int(dim) * FLOAT32_BYTES * (1 + slots)
    else:  # replicated on every chip
        per_chip = total
    return TableMemory(weight_bytes, slots, total, per_chip)
