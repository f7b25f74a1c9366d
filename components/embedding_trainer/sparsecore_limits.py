"""IDs per chip on SparseCore: preprocessing's statistics checked against TF 2.16's static buffer.

What the bound is (TensorFlow 2.16.2, `tensorflow/python/tpu/tpu_embedding_v3.py`):
- `TPUEmbeddingV2.__init__` hard-codes `max_ids_per_chip_per_sample = 64` and
  `max_minibatches_per_sc = 64` (lines 335-336, "provided by the FDO. Currently hardcode here just
  for testing"); nothing in TF 2.16 lets a user change them.
- Both go, unchanged, as attributes into `GetMinibatchesInCsrWithPhysicalReplica` (line 1174), one
  call per stacked table (tables of equal padded dim and optimizer share one variable), with
  `sample_count` = the stack's samples per replica: the sum of its features' `output_shape`
  products (lines 651-664), here per-replica batch x the stack's features (every SparseCore feature
  has `output_shape=[per_replica_batch]`, tf_objects.feature_configs).
- The op runs on the host (outside compilation, line 1319) for one replica: its input is every ID
  of that replica's batch for that stack, for all SparseCores of the slice. The kernel (libtpu's,
  source in tensorflow/core/tpu/kernels/sparse_core_preprocess_ops.cc; the CPU wheel registers no
  kernel for it) allocates `sorted_token_ids`, `sorted_sample_ids` and `sorted_gains` of
  `max_ids_per_chip = max_ids_per_chip_per_sample x sample_count` entries and packs the IDs into them
  by (SparseCore, minibatch, physical replica) partition, rounding each partition up to the TPU's
  XLA pad size. So the bound is one buffer per chip, per stacked table and per step: 64 IDs per
  sample *on average over the replica batch and the stack's features*, padding included. It is not
  a per-example limit: one example may hold more if others hold fewer.
- Past it the step fails: "Got N ids after padding but the max_ids_per_chip is set to be M which
  is smaller" (kernel versions of early 2024), or "The max_ids_per_chip is set to be M which is not
  going to fit all ids ... consider setting sparse_core_allow_id_dropping_for_minibatching" (later
  ones), which with that libtpu flag drops the IDs that do not fit, with a warning. Nothing resizes.
  Which text a run gets depends on the libtpu under TF 2.16.2; either way the step does not train
  every ID. The kernel also refuses a `sample_count` that is not a multiple of the SparseCores per
  chip ("sample_count ... is not divisible by the number of sparsecores per chip").
- `max_minibatches_per_sc` caps the minibatches a SparseCore splits a step into; minibatches are
  formed when a partition exceeds libtpu's `max_ids_per_partition` (an FDO figure the CPU wheel
  cannot read). Each minibatch adds up to (pad size - 1) padding slots per partition.

What the statistics can certify (docs/tpu.md, "IDs per chip"):
- IDs per example (train split, after `max_length`) are order-free: whatever the shuffle, the
  input sharding or the topology, a replica batch of B examples holds at most B x the features'
  maxima and, over an epoch, B x their means on average. So:
  - certified: B x sum of maxima, plus the worst padding, fits the buffer;
  - refused: B x sum of means, plus the worst padding, exceeds it (the average step is over the
    bound, so steps over it are certain). The padding counts: up to pad size - 1 slots for every
    non-empty partition, and there are SparseCores per chip x replicas x SparseCores per chip
    partitions per minibatch, so on a large slice padding alone can fill the buffer (4 SparseCores
    per chip, 64 replicas: 1,024 partitions, up to 7,168 padding slots against a buffer of 64 x the
    samples). IDs are counted as preprocessing wrote them; SparseCore merges an ID repeated within
    one example, so a feature with many repeats is counted high here;
  - neither: not certified, reported (with the `max_length` that would certify it), not refused.
- The per-batch and per-shard figures are not used to certify: they count consecutive global
  batches in preprocessing's order (training shuffles), and the per-shard ones bound a SparseCore
  partition (libtpu's minibatching), not this buffer.
- The XLA pad size comes from the TPU topology at run time (`TpuUtil_GetXlaPadSizeFromTpuTopologyFn`);
  8 is assumed here (`ASSUMED_XLA_PAD_SIZE`).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)

from components.config.choices import Placement
from components.contracts.plan import EmbeddingPlan, PlanError
from components.contracts.statistics import EmbeddingStatistics
from components.embedding_model.sparsecore_layout import plan_sparse_core_layouts

# TF 2.16.2 tpu_embedding_v3.py:335-336, hard-coded in TPUEmbeddingV2.__init__.
MAX_IDS_PER_CHIP_PER_SAMPLE = 64
MAX_MINIBATCHES_PER_SC = 64
# The kernel rounds every partition up to the TPU's XLA pad size (read from the topology at run
# time); 8 is an assumption, not read from anything.
ASSUMED_XLA_PAD_SIZE = 8

CERTIFIED = "certified"
EXCEEDS = "exceeds"
FAILS = "fails"
NOT_CERTIFIED = "not_certified"
UNKNOWN = "unknown"


class IdsPerChipError(PlanError):
    """A SparseCore stack would overflow TF 2.16's IDs-per-chip buffer; names the features and the way out."""


def _feature_figures(plan: EmbeddingPlan, statistics: Optional[EmbeddingStatistics], feature: str
                     ) -> Tuple[str, Optional[Dict[str, Any]], str]:
    """(the feature whose IDs it reads, {max, mean} of its train IDs per example or None, source)."""
    source = plan.features[feature].wide_of or feature
    if statistics is not None:
        s = statistics.ids_per_example(source, "train")
        if s.get("max") is not None and s.get("mean") is not None:
            return source, {"max": int(s["max"]), "mean": float(s["mean"])}, "statistics"
    p = plan.features[source].ids_per_example if source in plan.features else None
    if p and p.get("max") is not None and p.get("mean") is not None:
        return source, {"max": int(p["max"]), "mean": float(p["mean"])}, "plan"
    return source, None, "none"


def _padded(ids: int, minibatches: int, partitions_per_minibatch: int, pad_size: int) -> int:
    """IDs after the kernel's padding, at worst: every non-empty partition rounded up to `pad_size`."""
    return ids + min(ids, minibatches * partitions_per_minibatch) * (pad_size - 1)


def _minibatches_covered(ids: int, bound: int, partitions_per_minibatch: int, pad_size: int, most: int) -> int:
    """The most minibatches per SparseCore (up to `most`) whose worst padding still leaves `ids` within `bound`."""
    covered = 0
    for m in range(1, most + 1):
        if _padded(ids, m, partitions_per_minibatch, pad_size) > bound:
            break
        covered = m
    return covered


def _max_length_cap(maxima: List[Tuple[str, int]], batch: int, bound: int, partitions: int, pad_size: int
                    ) -> Optional[int]:
    """The largest L >= 1 for which capping every feature at L IDs per example certifies the stack
    (one minibatch); None when even L = 1 does not, or no cap is needed."""
    top = max((m for _, m in maxima), default=0)

    def fits(cap: int) -> bool:
        return _padded(batch * sum(min(m, cap) for _, m in maxima), 1, partitions, pad_size) <= bound

    if top < 1 or fits(top) or not fits(1):
        return None
    lo, hi = 1, top  # fits(lo), not fits(hi): fewer IDs never pad to more
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _stacks(plan: EmbeddingPlan, num_replicas: int, sparse_cores_per_chip: int, per_replica_batch: int
            ) -> Dict[str, List[str]]:
    """{stacked table name: its tables}, as TF 2.16 stacks the plan's TPU-embedding tables."""
    stacks: Dict[str, List[str]] = {}
    for name, layout in plan_sparse_core_layouts(plan, num_replicas, sparse_cores_per_chip, per_replica_batch).items():
        stacks.setdefault(layout.stacked_table_name, []).append(name)
    return {s: sorted(t) for s, t in sorted(stacks.items())}


def _preprocessing_order(plan: EmbeddingPlan, statistics: Optional[EmbeddingStatistics], tables: List[str],
                         run_global_batch: int) -> Dict[str, Any]:
    """What the per-batch statistics say of a stack, and why they certify nothing."""
    if statistics is None:
        return {"used": False, "note": "no statistics given: the plan's IDs per example were used"}
    maxima = [(statistics.tables.get(plan.vocabulary_table(t), {}).get("batches") or {}).get("ids_per_batch_max")
              for t in tables]
    out: Dict[str, Any] = {
        "used": False,
        "statistics_global_batch": statistics.global_batch_size,
        "run_global_batch": run_global_batch,
        "note": ("per-batch figures count consecutive global batches in preprocessing's order, and training "
                 "shuffles: they describe batches the run does not see, so they certify nothing here"),
    }
    if all(m is not None for m in maxima):
        # a wide table repeats its table's IDs; the tables' maxima may come from different batches
        out["busiest_global_batch_ids_at_most"] = int(sum(maxima))
    return out


def _stack_report(plan: EmbeddingPlan, statistics: Optional[EmbeddingStatistics], tables: List[str],
                  num_replicas: int, sparse_cores_per_chip: int, per_replica_batch: int, per_sample: int,
                  max_minibatches: int, pad_size: int) -> Dict[str, Any]:
    features = sorted(f for f, p in plan.features.items() if p.table in tables)
    samples = per_replica_batch * len(features)
    bound = per_sample * samples
    partitions = sparse_cores_per_chip * num_replicas * sparse_cores_per_chip  # per minibatch, per chip
    figures = {f: _feature_figures(plan, statistics, f) for f in features}
    report: Dict[str, Any] = {
        "tables": tables,
        "features": features,
        "sample_count": samples,
        "bound": bound,
        "partitions_per_minibatch": partitions,
        "ids_per_example": {f: dict(fig or {}, reads=src, source=where) for f, (src, fig, where) in figures.items()},
        "preprocessing_order": _preprocessing_order(plan, statistics, tables, per_replica_batch * num_replicas),
    }
    if samples % sparse_cores_per_chip:
        report.update(verdict=FAILS, reason=(
            f"{len(features)} feature(s) x {per_replica_batch} examples per replica = {samples} samples, not a "
            f"multiple of the {sparse_cores_per_chip} SparseCores per chip: TensorFlow's SparseCore preprocessing "
            "refuses it (\"sample_count ... is not divisible by the number of sparsecores per chip\")"),
            way_out=f"a per-replica batch (training.batch_size / {num_replicas} replicas) that is a multiple of "
                    f"{sparse_cores_per_chip}")
        return report
    missing = sorted({src for src, fig, _ in figures.values() if fig is None})
    if missing:
        report.update(verdict=UNKNOWN, reason=(
            f"no train-split IDs per example for {', '.join(missing)} (statistics or plan): the bound of "
            f"{bound} IDs per chip and step is not checked; rerun preprocessing with this config"))
        return report
    worst = per_replica_batch * sum(fig["max"] for _, fig, _ in figures.values())
    mean = per_replica_batch * sum(fig["mean"] for _, fig, _ in figures.values())
    covered = _minibatches_covered(worst, bound, partitions, pad_size, max_minibatches)
    maxima = [(f, figures[f][1]["max"]) for f in features]
    cap = _max_length_cap(maxima, per_replica_batch, bound, partitions, pad_size)
    mean_padded = _padded(math.ceil(mean), 1, partitions, pad_size)
    report.update(ids_per_replica_batch_max=worst, ids_per_replica_batch_mean=mean,
                  worst_padded_one_minibatch=_padded(worst, 1, partitions, pad_size),
                  mean_padded_one_minibatch=mean_padded, minibatches_certified=covered, max_length_to_certify=cap)
    if mean_padded > bound:
        report.update(verdict=EXCEEDS, reason=(
            f"a train example carries {mean / per_replica_batch:.1f} IDs on average over these {len(features)} "
            f"feature(s) (the buffer allows {per_sample} x {len(features)} = {per_sample * len(features)}), "
            f"{mean:.0f} per replica batch of {per_replica_batch}, {mean_padded} with the padding of "
            f"{partitions} partitions (pad size {pad_size} assumed) > the buffer's {bound} "
            f"(max_ids_per_chip_per_sample {per_sample} x {samples} samples): the average step is over the "
            "bound, so steps over it are certain; TensorFlow's SparseCore preprocessing "
            "(GetMinibatchesInCsrWithPhysicalReplica) then fails the step, or drops the IDs that do not fit "
            "where libtpu allows ID dropping"))
    elif covered >= 1:
        report.update(verdict=CERTIFIED, reason=(
            f"at most {worst} IDs per replica batch (per-example maxima x {per_replica_batch}), "
            f"{_padded(worst, covered, partitions, pad_size)} with the worst padding of {covered} minibatch(es) "
            f"per SparseCore (pad size {pad_size} assumed), within {bound}"
            + ("" if covered >= max_minibatches else
               "; more minibatches (libtpu forms them from its max_ids_per_partition, which the statistics "
               "do not measure per replica batch) could overflow it")))
    else:
        report.update(verdict=NOT_CERTIFIED, reason=(
            f"on average {mean:.0f} IDs per replica batch fit the buffer's {bound}, but the per-example maxima "
            f"allow {worst} (+ up to {_padded(worst, 1, partitions, pad_size) - worst} padding): the statistics "
            "cannot say no step exceeds it"))
    if report["verdict"] in (EXCEEDS, NOT_CERTIFIED):
        report["way_out"] = _way_out(plan, features, figures, cap)
    return report


def _way_out(plan: EmbeddingPlan, features: List[str], figures, cap: Optional[int]) -> str:
    """`max_length` on the stack's heaviest features (their configured names), or their tables on the TensorCore."""
    heavy = [f for f in features if cap is None or figures[f][1]["max"] > cap]
    names = sorted({figures[f][0] for f in heavy})
    tables = sorted({plan.vocabulary_table(plan.features[f].table) for f in heavy})
    rows = max(plan.tables[t].rows for t in tables)
    options = []
    if cap is not None:
        options.append(f"max_length <= {cap} on {', '.join(names)} (preprocessing keeps an example's first "
                       "max_length IDs; rerun preprocessing)")
    options.append(f"place {', '.join(tables)} on the TensorCore (training.embedding.size_threshold >= {rows}: "
                   f"every table of at most {rows} rows moves there)")
    options.append("train on a TPU with TPUEmbedding (v2-v4), which does not use this SparseCore buffer")
    return "; or ".join(options)


def check_ids_per_chip(
    plan: EmbeddingPlan,
    statistics: Optional[EmbeddingStatistics],
    num_replicas: int,
    sparse_cores_per_chip: int,
    per_replica_batch: int,
    *,
    max_ids_per_chip_per_sample: int = MAX_IDS_PER_CHIP_PER_SAMPLE,
    max_minibatches_per_sc: int = MAX_MINIBATCHES_PER_SC,
    pad_size: int = ASSUMED_XLA_PAD_SIZE,
    raise_on_violation: bool = True,
) -> Dict[str, Any]:
    """Checks every SparseCore stack's IDs per chip and step against TF 2.16's buffer (module docstring).

    Args:
      plan: the embedding plan (its TPU-embedding tables train on SparseCore).
      statistics: preprocessing's statistics of the training data, or None: then the plan's
        IDs per example (the same statistics' train-split mean and max, recorded in the plan).
      num_replicas: the TPU chips trained on (`strategy.num_replicas_in_sync`).
      sparse_cores_per_chip: SparseCores per chip (what the TPU reports, else 4 as TF assumes).
      per_replica_batch: each replica's batch (the features' output_shape).
      max_ids_per_chip_per_sample: TF's value (64 in TF 2.16.2, hard-coded).
      max_minibatches_per_sc: TF's value (64 in TF 2.16.2, hard-coded).
      pad_size: the XLA pad size the kernel rounds partitions up to (the TPU's; assumed 8).
      raise_on_violation: False returns the report instead of raising.

    Returns:
      {"passed", "bound", "topology", "stacks": {stacked table: {verdict, reason, tables, features,
      sample_count, bound, ids_per_example, ... , way_out}}, "violations", "not_certified",
      "certifies", "does_not_certify"}; a stack's verdict is certified, exceeds, fails,
      not_certified or unknown; only exceeds and fails are violations.

    Raises:
      IdsPerChipError: some stack exceeds the buffer on average or would be refused by the kernel
        (each named with its features, their measured maxima and means, the bound and the way
        out), unless `raise_on_violation` is False.
    """
    tpu_tables = plan.tables_placed(Placement.TPU_EMBEDDING)
    stacks = _stacks(plan, num_replicas, sparse_cores_per_chip, per_replica_batch) if tpu_tables else {}
    reports = {
        s: _stack_report(plan, statistics, t, num_replicas, sparse_cores_per_chip, per_replica_batch,
                         max_ids_per_chip_per_sample, max_minibatches_per_sc, pad_size)
        for s, t in stacks.items()
    }
    violations = [_violation(s, r, per_replica_batch) for s, r in reports.items() if r["verdict"] in (EXCEEDS, FAILS)]
    report = {
        "passed": not violations,
        "bound": {"max_ids_per_chip_per_sample": max_ids_per_chip_per_sample,
                  "max_minibatches_per_sc": max_minibatches_per_sc, "pad_size_assumed": pad_size,
                  "source": "TF 2.16.2 tpu_embedding_v3.py (hard-coded), one buffer of max_ids_per_chip_per_sample x "
                            "sample_count IDs per chip, stacked table and step"},
        "topology": {"num_replicas": num_replicas, "sparse_cores_per_chip": sparse_cores_per_chip,
                     "per_replica_batch": per_replica_batch},
        "stacks": reports,
        "violations": violations,
        "not_certified": sorted(s for s, r in reports.items() if r["verdict"] in (NOT_CERTIFIED, UNKNOWN)),
        "certifies": "per-example maxima and means of the train split (after max_length): order-free, so they "
                     "bound every replica batch whatever the shuffle, input sharding and topology",
        "does_not_certify": "per-batch and per-shard figures (preprocessing's order, training shuffles; the shards "
                            "bear on libtpu's max_ids_per_partition, not on this buffer); repeated IDs within an "
                            "example, which SparseCore merges; more minibatches than minibatches_certified; the "
                            "TPU's real pad size",
    }
    if violations and raise_on_violation:
        raise IdsPerChipError(
            "SparseCore's IDs per chip (TF 2.16: max_ids_per_chip_per_sample = "
            f"{max_ids_per_chip_per_sample}) would overflow before training:\n  - " + "\n  - ".join(violations))
    return report


def _violation(stacked: str, r: Mapping[str, Any], per_replica_batch: int) -> str:
    shown = ", ".join(
        f"{f}: max {fig['max']}, mean {fig['mean']:.1f}" + (f" (reads {fig['reads']})" if fig.get("reads") != f else "")
        for f, fig in sorted(r["ids_per_example"].items(), key=lambda kv: -kv[1].get("max", 0)) if "max" in fig)
    measured = f" (IDs per example: {shown})" if shown else ""
    return (f"stack {stacked!r} (tables {', '.join(r['tables'])}; features {', '.join(r['features'])}; "
            f"{r['sample_count']} samples per replica, bound {r['bound']} IDs){measured}: {r['reason']}. "
            f"Way out: {r['way_out']}")
