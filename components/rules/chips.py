"""The facts of each TPU chip, defined once: its embedding API (what TF 2.16 reports), SparseCores,
HBM and the TensorFlow devices one chip is; and the defaults a plan is sized for until a TPU says.

A fact the configuration checks (`training.embedding.topology.chip`), the planning sizes by
(components.planning) and the trainer compares with the TPU it runs on (embedding_trainer.hardware).
Imports nothing of the project.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

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
# The chips a plan is sized for when training.embedding.topology.num_chips is not set, until a TPU
# says how many it has (components.embedding_trainer.hardware re-sizes the plan for it).
DEFAULT_NUM_CHIPS = 8
# TF's EmbeddingFeature names -> the API.
EMBEDDING_FEATURE_APIS = {"V2": SPARSE_CORE, "V1": TPU_EMBEDDING_V1, "UNSUPPORTED": NO_EMBEDDING_API}
API_NAMES = {SPARSE_CORE: "SparseCore (TPUEmbeddingV2)", TPU_EMBEDDING_V1: "TPUEmbedding (V1 embedding engine)",
             NO_EMBEDDING_API: "no embedding engine"}


GIB = 1 << 30


@dataclass(frozen=True)
class Chip:
    """A TPU generation: its embedding API, SparseCores per chip, HBM per chip (bytes) and the
    TensorFlow devices (TPUStrategy replicas, one core each) a chip is."""

    name: str
    embedding_api: str
    sparse_cores_per_chip: int
    hbm_bytes_per_chip: int
    devices_per_chip: int = 1

    @property
    def hbm_gib_per_chip(self) -> float:
        """HBM per chip in GiB (2**30 bytes), as training.embedding.topology.hbm_gib_per_chip takes it."""
        return self.hbm_bytes_per_chip / GIB


# Google Cloud's TPU system architecture pages, in the unit each lists: v2 16 GiB, v3 and v4 32 GiB,
# v5p 95 GiB, but v5e 16 GB and v6e 32 GB (10**9 bytes: 14.9 and 29.8 GiB). The API is what TF 2.16 reports for the chip (v5e:
# EmbeddingFeature.UNSUPPORTED). Devices per chip: v2 and v3 chips are two TensorFlow devices (one
# per TensorCore, a v3-8 runs 8 replicas on 4 chips); v4 and v5p (megacore) and v5e and v6e (one
# TensorCore) are one.
CHIPS: Dict[str, Chip] = {c.name: c for c in (
    Chip("v2", TPU_EMBEDDING_V1, 0, 16 * GIB, devices_per_chip=2),
    Chip("v3", TPU_EMBEDDING_V1, 0, 32 * GIB, devices_per_chip=2),
    Chip("v4", TPU_EMBEDDING_V1, 0, 32 * GIB),
    Chip("v5e", NO_EMBEDDING_API, 0, 16 * 10**9),
    Chip("v5p", SPARSE_CORE, 4, 95 * GIB),
    Chip("v6e", SPARSE_CORE, 2, 32 * 10**9),
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


def devices_per_chip(api: str, chip: Optional[str] = None) -> Tuple[int, ...]:
    """How many TensorFlow devices (TPUStrategy replicas) one chip can be.

    Args:
      api: the embedding API the TPU reports (one of `EMBEDDING_APIS`).
      chip: the chip named in the config, or None.

    Returns:
      The named chip's count, else every count a chip of `api` has, ascending (V1: (1, 2), v4 or
      v2/v3; the others: (1,)).
    """
    if chip:
        return (chip_facts(chip).devices_per_chip,)
    return tuple(sorted({c.devices_per_chip for c in CHIPS.values() if c.embedding_api == api})) or (1,)
