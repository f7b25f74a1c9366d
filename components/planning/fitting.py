"""The plan fitted to a slice: every table sized for an embedding API and a number of chips (the
row and memory rules of sizing.py), the plan's memory per chip against the HBM budget, and the
checks that refuse what does not fit or cannot be trained there.

- `sized_for(plan, api, sparse_cores_per_chip, num_chips)`: the plan re-sized for the TPU a run
  has (embedding_trainer.hardware calls it with what the TPU reports);
- `with_run(plan, checkpoint_layout, vocabulary_dir)`: the plan with what one training run adds,
  re-sized for the TPU its layout names, so the plan recorded with a model says what TensorFlow
  allocated;
- `hardware_num_chips`: the chips a TPU's replicas are, refusing a configured num_chips they
  contradict; `check_fits` and `check_embedding_api`: the refusals, one line naming the tables;
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, Mapping, Optional

from components.config.choices import Placement
from components.contracts.plan import (CHIPS_FROM_CONFIG, CHIPS_FROM_HARDWARE, CheckpointLayout, EmbeddingPlan,
                                       PlanError, PlanMemory, TableMemory, TablePlan, Topology)
from components.planning import sizing
from components.planning.gradient_exchange import with_gradient_exchange
from components.planning.sizing import table_memory
from components.rules.chips import (DEFAULT_SPARSE_CORES_PER_CHIP, NO_EMBEDDING_API, SPARSE_CORE, TPU_EMBEDDING_V1,
                                    chips_with, devices_per_chip)


def sized_table_memory(rows: int, dim: int, optimizer: str, placement: str, topology: Topology) -> TableMemory:
    """A table's training memory sized for a topology (sizing.table_memory with its chips, API and
    SparseCores); a plan that does not record its API is sized as TPUEmbedding (V1) tables are."""
    api = topology.embedding_api or TPU_EMBEDDING_V1
    return table_memory(rows, dim, optimizer, placement, topology.num_chips, api, topology.sparse_cores_per_chip)


def size_tables(tables: Mapping[str, TablePlan], topology: Topology) -> Dict[str, TablePlan]:
    """The tables with their memory sized for a topology (its chips, API and SparseCores).

    Args:
      tables: {name: TablePlan}.
      topology: what to size them for.

    Returns:
      {name: TablePlan} with new `memory`.
    """
    return {n: dataclasses.replace(t, memory=sized_table_memory(t.rows, t.dim, t.optimizer["name"], t.placement, topology))
            for n, t in tables.items()}


def _limits_for(t: TablePlan, measured_for: int, num_sparse_cores: int) -> TablePlan:
    """A table whose SparseCore limits were derived for `measured_for` shards, re-sized for
    `num_sparse_cores`: the numbers stay (TF 2.16 does not take them), the source says so."""
    limits = t.sparsecore_limits
    if limits.max_ids_per_table is None and limits.max_unique_ids_per_table is None:
        return t
    note = (f"{limits.source}; measured for {measured_for} SparseCores, the TPU has {num_sparse_cores}: add "
            f"{num_sparse_cores} to statistics.shard_counts and rerun preprocessing")
    return dataclasses.replace(t, sparsecore_limits=dataclasses.replace(limits, source=note))


def hardware_num_chips(topology: Topology, embedding_api: str, replicas: int) -> int:
    """The chips a TPU running `replicas` replicas has, which the plan must be sized for.

    TPUEmbeddingV2 pads and shards every stack over num_replicas_in_sync x SparseCores per chip
    (tpu_embedding_v3.py ~319, ~354), one shard per replica device, and a SparseCore chip (v5p, v6e)
    is one device; a v2/v3 chip is two (one per TensorCore), a v4 chip one
    (devices_per_chip). So the TPU's chips are `replicas` / devices per chip: the named
    chip's count, else each count a chip of that API has. A configured num_chips must be one of
    them; a plan whose num_chips was not configured takes the fewest (most rows per chip: on TPU
    v2-v4 without `topology.chip` that is v2/v3's two devices per chip).

    Args:
      topology: the plan's topology.
      embedding_api: the API the TPU reports (EMBEDDING_APIS).
      replicas: the TPU strategy's num_replicas_in_sync.

    Returns:
      The chips to size the plan for.

    Raises:
      PlanError: the configured num_chips is not what the TPU has, or no chip count fits the
        replicas; the message names both.
    """
    per_chip = devices_per_chip(embedding_api, topology.chip)
    candidates = sorted({replicas // d for d in per_chip if replicas % d == 0 and replicas >= d})
    configured = topology.num_chips_source in (None, CHIPS_FROM_CONFIG)
    if candidates and (not configured or topology.num_chips in candidates):
        return topology.num_chips if configured else candidates[0]
    what = " or ".join(str(c) for c in candidates) or "no whole number of"
    how = (f"TPUEmbeddingV2 pads and shards every table over {replicas} replicas x SparseCores per chip, one "
           "replica a chip" if embedding_api == SPARSE_CORE else
           f"a {topology.chip + ' ' if topology.chip else ''}chip is {' or '.join(str(d) for d in per_chip)} replica(s)")
    if not configured:
        raise PlanError(f"the TPU runs {replicas} replicas, which is {what} chips ({how}); the plan cannot be "
                        "sized for it")
    raise PlanError(
        f"training.embedding.topology.num_chips is {topology.num_chips}, but the TPU runs {replicas} replicas: "
        f"{what} chips ({how}); set num_chips to the TPU's chips, or remove it to size the plan for the TPU")


def _optimizer_key(spec: Mapping[str, Any]) -> str:
    # Tables with equal specs share one TPU optimizer (model_building.table_optimizers), which is
    # what TPUEmbeddingV2 compares when it stacks them.
    return json.dumps(dict(spec), sort_keys=True)


def plan_memory(tables: Mapping[str, TablePlan], topology: Topology, budget_per_chip_bytes: int) -> PlanMemory:
    """Total and per-chip bytes of sized tables, with SparseCore's initialization transient on top.

    The transient is that of the largest group of TPU-embedding tables that could share a stack
    (equal padded dim and equal optimizer spec): its whole padded tables plus the larger of one
    shard of them and its initializers' extra full-size copies of its largest table
    (sizing.sparse_core_init_transient, a safe upper bound of any stack TF forms).

    Args:
      tables: {name: TablePlan}, sized.
      topology: what they are sized for.
      budget_per_chip_bytes: the bytes a chip may give the tables.

    Returns:
      The plan's memory; `fits` says whether the per-chip peak is within the budget.
    """
    steady = sum(t.memory.per_chip_bytes for t in tables.values())
    transient, names = 0, ()
    if topology.embedding_api == SPARSE_CORE:
        tpu = {n: t for n, t in tables.items() if t.placement == Placement.TPU_EMBEDDING}
        groups = sizing.sparse_core_stack_groups((n, t.dim, _optimizer_key(t.optimizer)) for n, t in tpu.items())
        transient, names = sizing.sparse_core_init_transient(
            {n: t.memory.weight_bytes for n, t in tpu.items()}, groups.values(), topology.num_chips,
            {n: sizing.initializer_copies(t.initializer.name) for n, t in tpu.items()})
    peak = steady + transient
    return PlanMemory(
        total_bytes=sum(t.memory.total_bytes for t in tables.values()),
        per_chip_bytes=steady,
        budget_per_chip_bytes=int(budget_per_chip_bytes),
        fits=peak <= budget_per_chip_bytes,
        init_transient_bytes=transient,
        init_transient_tables=tuple(names),
        peak_per_chip_bytes=peak,
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_fits(plan: "EmbeddingPlan") -> None:
    """Refuses a plan whose per-chip peak (steady + initialization transient) exceeds its budget.

    Args:
      plan: the plan.

    Raises:
      PlanError: it does not fit; the message names the tables that take most per chip, largest
        first, with their allocated shapes, and what to change.
    """
    memory, topo = plan.memory, plan.topology
    if memory.fits:
        return
    biggest = sorted(plan.tables.items(), key=lambda kv: (-kv[1].memory.per_chip_bytes, kv[0]))[:5]
    names = ", ".join(
        f"{n} ({t.memory.padded_rows or t.rows}x{t.memory.padded_dim or t.dim} padded from {t.rows}x{t.dim}, "
        f"{t.optimizer['name']}, {_gib(t.memory.per_chip_bytes)}/chip, {t.placement})"
        for n, t in biggest)
    transient = ""
    if memory.init_transient_bytes:
        transient = (f" + {_gib(memory.init_transient_bytes)} while SparseCore initializes the stack of "
                     f"{', '.join(memory.init_transient_tables)} (whole padded tables and the initializer's "
                     "temporaries on every chip)")
    raise PlanError(
        f"embedding tables need {_gib(memory.peak_per_chip_bytes or memory.per_chip_bytes)} per chip "
        f"({_gib(memory.per_chip_bytes)} kept{transient}) sized for {topo.embedding_api}"
        f"{' on ' + topo.chip if topo.chip else ''}, but training.embedding.topology allows "
        f"{_gib(memory.budget_per_chip_bytes)} ({topo.hbm_gib_per_chip:.4g} GiB x {topo.usable_hbm_fraction} on each of "
        f"{topo.num_chips} chips); largest: {names}. Use more chips, smaller dims, a vocabulary top_k/min_frequency, "
        "or a lower size_threshold so large tables are sharded"
    )


def check_embedding_api(plan: "EmbeddingPlan", hardware: str) -> None:
    """Refuses TPU-embedding tables where the chip has no embedding engine.

    Args:
      plan: the plan.
      hardware: how the chip was named, e.g. "training.embedding.topology.chip v5e".

    Raises:
      PlanError: the chip has no embedding engine and some table is placed in TPU embedding.
    """
    if plan.topology.embedding_api != NO_EMBEDDING_API:
        return
    tpu = sorted(plan.tables_placed(Placement.TPU_EMBEDDING))
    if tpu:
        raise PlanError(
            f"{hardware} has no embedding engine (TFRS would replicate every table on every chip), but "
            f"{len(tpu)} table(s) are placed in tpu_embedding ({', '.join(tpu[:5])}{', ...' if len(tpu) > 5 else ''}); "
            "set training.embedding.size_threshold: null (every table on the TensorCore, replicated and sized so) "
            f"or train on a {'/'.join(chips_with(SPARSE_CORE))} (SparseCore) or "
            f"{chips_with(TPU_EMBEDDING_V1)[-1]} (TPUEmbedding) slice"
        )


def sized_for(plan: EmbeddingPlan, embedding_api: str, sparse_cores_per_chip: Optional[int] = None,
              num_chips: Optional[int] = None) -> EmbeddingPlan:
    """A copy whose tables and memory are sized for an embedding API and a number of chips.

    The budget and chip stay; the copy is not checked against the budget (`check_fits`). A table's
    SparseCore limits measured for another shard count keep their numbers and say so.

    Args:
      embedding_api: one of EMBEDDING_APIS.
      sparse_cores_per_chip: on SparseCore, the SparseCores per chip; default the topology's.
      num_chips: the chips the TPU has (`hardware_num_chips`); default the topology's. Given, the
        copy records them as the hardware's unless they are the configured ones.

    Returns:
      The copy, or the plan itself when nothing changes.
    """
    topo = plan.topology
    if embedding_api == SPARSE_CORE:
        per_chip = int(sparse_cores_per_chip or topo.sparse_cores_per_chip or DEFAULT_SPARSE_CORES_PER_CHIP)
    else:
        per_chip = int(topo.sparse_cores_per_chip)
    chips, source = topo.num_chips, topo.num_chips_source
    if num_chips is not None:
        chips = int(num_chips)
        if not (chips == topo.num_chips and source in (None, CHIPS_FROM_CONFIG)):
            source = CHIPS_FROM_HARDWARE
    if (embedding_api, per_chip, chips, source) == (topo.embedding_api, topo.sparse_cores_per_chip,
                                                    topo.num_chips, topo.num_chips_source):
        return plan
    topology = dataclasses.replace(topo, embedding_api=embedding_api, sparse_cores_per_chip=per_chip,
                                   num_chips=chips, num_sparse_cores=chips * per_chip, num_chips_source=source)
    tables = size_tables(plan.tables, topology)
    if topology.num_sparse_cores != topo.num_sparse_cores:
        tables = {n: _limits_for(t, topo.num_sparse_cores, topology.num_sparse_cores) for n, t in tables.items()}
    return dataclasses.replace(plan, topology=topology, tables=tables,
                               memory=plan_memory(tables, topology, plan.memory.budget_per_chip_bytes))


def with_run(plan: EmbeddingPlan, checkpoint_layout: Optional[CheckpointLayout] = None,
             vocabulary_dir: Optional[str] = None, replicas: Optional[int] = None) -> EmbeddingPlan:
    """A copy with what one training run adds; the plan itself is never changed in place.

    A layout from a TPU (`hardware_api` set) also re-sizes the copy for that API, the SparseCores
    the TPU reported and the chips its replicas are (`hardware_num_chips`), as the trainer checked
    it (components.embedding_trainer.hardware), so the recorded plan says what was allocated.

    Args:
      checkpoint_layout: how the run's checkpoint holds the tables, or None.
      vocabulary_dir: where the run's vocabulary files are, or None.
      replicas: the run's replicas in sync, or None: on several, the memory holds the TensorCore
        tables' gradient exchange per step (gradient_exchange.with_gradient_exchange).

    Returns:
      The copy.

    Raises:
      PlanError: the layout's replicas contradict a configured num_chips (`hardware_num_chips`).
    """
    if checkpoint_layout is not None and checkpoint_layout.hardware_api:
        api, replicas = checkpoint_layout.hardware_api, checkpoint_layout.num_replicas
        chips = hardware_num_chips(plan.topology, api, int(replicas)) if replicas else None
        plan = sized_for(plan, api, checkpoint_layout.sparse_cores_per_chip, chips)
    changes: Dict[str, Any] = {}
    if checkpoint_layout is not None:
        changes["checkpoint_layout"] = checkpoint_layout
    if vocabulary_dir is not None:
        changes["vocabulary_dir"] = vocabulary_dir
    if replicas:
        plan = with_gradient_exchange(plan, replicas)
    return dataclasses.replace(plan, **changes)
