"""Memory a configuration needs, judged before any data is read: what can never fit is refused
before the data stages run, in one line.

Only what the configuration fixes is counted, so each figure is a lower bound and a refusal is
never wrong:
- **Table rows** (`config_rows`): a hashed or identity table has `num_buckets` rows and a `list`
  vocabulary its values plus OOV buckets (planning.sizing.table_layout, the rule preprocessing
  writes the manifest with); a counted or file vocabulary's size is known only after
  preprocessing, so it counts with its OOV buckets alone.
- **TPU memory** (`check_tpu_floor`): those tables sized for `training.embedding.topology` by the
  plan's own rules (contracts.plan `table_dim`, `table_placement`, `sized_table_memory`), against
  the plan's per-chip budget. The Trainer's plan check (contracts.plan `check_fits`) judges the
  whole plan again after preprocessing, initialization transient included.
- **Host memory** (`check_host_floor`): a CPU or GPU trainer keeps every table whole in host
  memory with its optimizer's slots (sizing.table_memory, replicated), and tf.data holds at least
  two batches of input (`BATCHES_HELD`: the one being built and the one being trained on) of
  `EXAMPLE_BYTES` per value, and its shuffle buffer `training.shuffle_buffer_rows` examples of as
  many bytes; the dense network's weights with their gradients and Adam's two slots
  (`DENSE_COPIES` float32 copies of each: the cross layers over the categorical features' vectors
  beside the bottom MLP's output, the MLPs), buckets and biases left out; against the memory the
  machine has free for this process (`available_host_bytes`: the cgroup's limit, or the kernel's
  MemAvailable). A `cross_projection_dim` of millions or a shuffle buffer of 2**40 rows, which
  were killed for memory or crashed TensorFlow, are refused here in one line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from components.config.choices import ModelType, Placement, VocabularyKind
from components.config.binding import table_optimizer
from components.config.schema import ConfigError, PipelineConfig
from components.planning import sizing
from components.planning.derivation import resolve_topology, table_dim, table_placement
from components.planning.fitting import sized_table_memory

BATCHES_HELD = 2  # tf.data: the batch being built and the batch being trained on
DENSE_COPIES = 4  # a dense weight, its gradient and two optimizer slots (Adam), float32 each
EXAMPLE_BYTES = 8  # per input value: int64 IDs, float32 dense values and weights padded to 8 (a floor)
_GIB = float(1 << 30)
# (limit, usage) of the process's memory cgroup: v2, then v1
_CGROUPS = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def config_rows(cfg: PipelineConfig, name: str) -> int:
    """The rows of a table that the configuration alone fixes (a lower bound of its rows).

    Args:
      cfg: a resolved configuration.
      name: the table.

    Returns:
      Its rows: exact for hashed, identity and list tables; the OOV buckets alone otherwise.
    """
    options = cfg.table(name).vocabulary
    known = len(options.values or []) if options.kind == VocabularyKind.LIST else 0
    return sizing.table_rows(*sizing.table_layout(options, known))


@dataclass(frozen=True)
class MemoryFloor:
    """What a configuration needs at least, in bytes.

    Attributes:
      rows: {table: rows the configuration fixes}.
      host_table_bytes: {table: its weights and optimizer slots, whole (CPU/GPU training)}.
      tpu_chip_bytes: {table: what each chip holds of it, as the plan sizes it}.
      tpu_budget_bytes: the bytes a chip may give the tables (the plan's budget).
      batch_bytes: the input tf.data holds (`BATCHES_HELD` batches).
      shuffle_bytes: the training shuffle buffer's examples.
      dense_bytes: the dense network's weights, gradients and slots (`dense_parameters`).
    """

    rows: Dict[str, int]
    host_table_bytes: Dict[str, int]
    tpu_chip_bytes: Dict[str, int]
    tpu_budget_bytes: int
    batch_bytes: int
    shuffle_bytes: int = 0
    dense_bytes: int = 0

    @property
    def host_bytes(self) -> int:
        """The host memory a CPU or GPU trainer needs at least."""
        return sum(self.host_table_bytes.values()) + self.batch_bytes + self.shuffle_bytes + self.dense_bytes

    def largest(self, per_table: Dict[str, int], k: int = 3) -> str:
        """At most `k` of the largest tables of `per_table` (those with a tenth of the largest's bytes
        or more), in words: `C3 (120,000,000 rows: 14.31 GiB)`."""
        top = sorted(per_table.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        most = top[0][1] if top else 0
        return ", ".join(f"{n} ({self.rows[n]:,} rows: {b / _GIB:.2f} GiB)" for n, b in top if b and b * 10 >= most)


def memory_floor(cfg: PipelineConfig) -> MemoryFloor:
    """The memory a configuration needs at least (module docstring).

    Args:
      cfg: a resolved configuration.

    Returns:
      Its floor.
    """
    topology = resolve_topology(cfg)
    rows, host, chip = {}, {}, {}
    for t in cfg.tables:
        n = rows[t.name] = config_rows(cfg, t.name)
        dim, _ = table_dim(cfg, t.name, n)
        optimizer = table_optimizer(cfg, t.name).name
        host[t.name] = sizing.table_memory(n, dim, optimizer, Placement.TENSOR_CORE).total_bytes
        chip[t.name] = sized_table_memory(n, dim, optimizer, table_placement(cfg, n), topology).per_chip_bytes
    values = 1 + len(cfg.dense_features) + sum(f.max_length or 1 for f in cfg.categorical_features)
    budget = int(topology.hbm_gib_per_chip * (1 << 30) * topology.usable_hbm_fraction)
    dims = {t.name: table_dim(cfg, t.name, rows[t.name])[0] for t in cfg.tables}
    example = values * EXAMPLE_BYTES
    return MemoryFloor(rows, host, chip, budget, BATCHES_HELD * cfg.training.batch_size * example,
                       shuffle_bytes=cfg.training.shuffle_buffer_rows * example,
                       dense_bytes=DENSE_COPIES * 4 * dense_parameters(cfg, dims))


def dense_parameters(cfg: PipelineConfig, table_dims: Dict[str, int]) -> int:
    """The dense network's weights a configuration fixes, at least (module docstring).

    Args:
      cfg: a resolved configuration.
      table_dims: {table: its dim}.

    Returns:
      The count of weights.
    """
    t = cfg.training
    dense_in = len(cfg.dense_features)
    bottom = [dense_in] + list(t.bottom_mlp) if dense_in else []
    width = sum(table_dims.get(f.table or f.name, 0) for f in cfg.categorical_features)  # a feature's table
    width += bottom[-1] if bottom else 0
    weights = sum(a * b for a, b in zip(bottom, bottom[1:]))
    if t.model == ModelType.DCN_V2:
        rank = t.cross_projection_dim
        weights += t.cross_layers * (2 * width * rank if rank else width * width)
        top = [width] + list(t.top_mlp) + [1]
    else:  # DLRM: the pairwise dot products beside the bottom MLP's output; the latter alone is a floor
        top = [bottom[-1] if bottom else 1] + list(t.top_mlp) + [1]
    return weights + sum(a * b for a, b in zip(top, top[1:]))


def check_tpu_floor(cfg: PipelineConfig) -> None:
    """Refuses a configuration whose fixed-size tables alone exceed a chip's budget.

    Args:
      cfg: a resolved configuration.

    Raises:
      ConfigError: they do not fit; one line with the figures, the largest tables and what to change.
    """
    floor = memory_floor(cfg)
    need = sum(floor.tpu_chip_bytes.values())
    if need <= floor.tpu_budget_bytes:
        return
    topo = resolve_topology(cfg)
    raise ConfigError(
        f"training.embedding.topology: the tables whose size the config fixes already need {need / _GIB:.2f} GiB "
        f"per chip, and a chip gives the tables {floor.tpu_budget_bytes / _GIB:.2f} GiB ({topo.hbm_gib_per_chip:.4g} "
        f"GiB x {topo.usable_hbm_fraction} on each of {topo.num_chips} chips); largest: "
        f"{floor.largest(floor.tpu_chip_bytes)}. Lower their vocabulary.num_buckets or dim, or use more chips")


def check_host_floor(cfg: PipelineConfig, available_bytes: Optional[int]) -> None:
    """Refuses a configuration that a CPU or GPU trainer cannot hold in this machine's memory.

    Args:
      cfg: a resolved configuration.
      available_bytes: the memory free for the run (`available_host_bytes`); None: unknown, nothing
        is refused.

    Raises:
      ConfigError: it cannot fit; one line with the figures, the largest tables and what to change.
    """
    if available_bytes is None:
        return
    floor = memory_floor(cfg)
    if floor.host_bytes <= available_bytes:
        return
    tables = sum(floor.host_table_bytes.values())
    parts = [f"tables with their optimizer slots {tables / _GIB:.2f} GiB"
             + (f" (largest: {floor.largest(floor.host_table_bytes)})" if tables else "")]
    parts.append(f"{BATCHES_HELD} batches of training.batch_size {cfg.training.batch_size:,} examples "
                 f"{floor.batch_bytes / _GIB:.2f} GiB")
    parts.append(f"training.shuffle_buffer_rows {cfg.training.shuffle_buffer_rows:,} examples "
                 f"{floor.shuffle_bytes / _GIB:.2f} GiB")
    parts.append(f"the dense network (training.bottom_mlp, cross_layers, cross_projection_dim, top_mlp) "
                 f"{floor.dense_bytes / _GIB:.2f} GiB")
    largest = max(("tables", tables), ("batches", floor.batch_bytes), ("shuffle", floor.shuffle_bytes),
                  ("dense", floor.dense_bytes), key=lambda kv: kv[1])[0]
    raise ConfigError(
        f"training needs at least {floor.host_bytes / _GIB:.2f} GiB of memory on this machine ({'; '.join(parts)}), "
        f"and {available_bytes / _GIB:.2f} GiB is available; lower {_WAYS_OUT[largest]}, or train on a larger "
        "machine or a TPU (docs/kubeflow.md)")


# What to lower, by the largest part of the floor.
_WAYS_OUT = {
    "tables": "the largest tables' vocabulary.num_buckets or dim",
    "batches": "training.batch_size",
    "shuffle": "training.shuffle_buffer_rows",
    "dense": "training.cross_projection_dim, cross_layers or the MLPs' widths",
}


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def available_host_bytes() -> Optional[int]:
    """The memory this process may still use: the smaller of what its cgroup's limit leaves (v2
    `memory.max` less `memory.current`, v1 likewise) and the kernel's MemAvailable; None where
    neither can be read."""
    found = []
    for limit_path, usage_path in _CGROUPS:
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and limit < (1 << 60):  # v1 writes a huge number for "no limit"
            found.append(max(limit - (usage or 0), 0))
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return min(found) if found else None
