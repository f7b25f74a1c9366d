"""Embedding-ID statistics: partial sums computed per batch in Beam, merged, then summarised.

Partials are flat dicts whose keys partials.py defines. The key prefix says how two partials merge:
- `max/...` (partials.MAX): maximum;  `vec/...` (partials.VEC): element-wise sum of numpy vectors
  (zero-padded to the longer);
- `info/...` (partials.INFO): values computed once per key (per vocabulary), taken as they are;
- `sketch/...` (partials.SKETCH): quantiles sketches, merged by the sketch (written out as
  `QUANTILE_POINTS` + 1 quantiles, `jsonable`);
- anything else: sum.
The summary (`summarize`) is the versioned `statistics.json` the trainer reads and the HTML report
renders. Everything is exact (counts over all rows, no sampling) but the dense features' quantiles:
a sketch (QUANTILE_EPSILON) of a stride sample (QUANTILE_SAMPLE a batch), compacted per worker
bundle (QUANTILE_COMPACT), within about 0.5% of the true rank (tests/test_statistics.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from components.config.training_schema import DENSE_QUANTILE_POINTS
from components.embedding_preprocess import partials as partials_lib
from components.config.choices import PartitionStrategy

SHARDING_STRATEGIES = ("div", "mod")
# Dense features' quantiles: the sketch's rank error (a share of the rows) and the number of
# quantile intervals written (the plan takes its bucket boundaries from these 101 points).
QUANTILE_EPSILON = 0.001
QUANTILE_POINTS = DENSE_QUANTILE_POINTS


# At most this many values of a record batch go into its sketch: every k-th row (k = ceil(rows /
# QUANTILE_SAMPLE)). Sketching every value was a visible share of preprocessing's CPU; the stride
# sample costs an eighth of it and keeps each percentile within a fraction of a percent of rank
# (figures: bench/README.md, "Figures behind the code").
QUANTILE_SAMPLE = 2048


def quantile_sample(values: np.ndarray) -> np.ndarray:
    """The values a batch's sketch takes: all of them up to QUANTILE_SAMPLE, else every k-th."""
    stride = -(-len(values) // QUANTILE_SAMPLE)
    return values[::stride] if stride > 1 else values


def quantiles_sketch(values: np.ndarray = None):
    """A quantiles sketch (tfx_bsl's, the one TFDV's statistics use: C++, mergeable, bounded
    memory whatever the rows), with `values` added."""
    from tfx_bsl import (sketches)  # lazy: tfx_bsl only where a sketch is built, not on counting's and the statistics readers' import path

    sketch = sketches.QuantilesSketch(QUANTILE_EPSILON, 1 << 32, 1)
    if values is not None and len(values):
        sketch.AddValues(pa.array(values))
    return sketch


# A sketch leaving a worker (a lifted combine's accumulator, `compact_sketches`) is replaced by
# this many + 1 of its quantiles, each weighing an equal share of its values: ~17 KB whatever the
# rows behind it. Uncompacted, a sketch grows with the batches behind it, and the runner holds
# every bundle's accumulator until the merge, so its peak memory grew with the rows (figures:
# bench/README.md, "Figures behind the code").
QUANTILE_COMPACT = 512


def compact_sketches(values: Dict[str, Any]) -> Dict[str, Any]:
    """A merged partial with every sketch of more than QUANTILE_COMPACT + 1 values replaced by its
    QUANTILE_COMPACT + 1 quantiles weighted by the values behind them (partials.dense_quantile_values):
    a bounded accumulator (adds at most 1 / (2 QUANTILE_COMPACT) of rank error, once per worker
    bundle). The other keys are kept as they are."""
    out = dict(values)
    for k, sketch in values.items():
        if not k.startswith(partials_lib.SKETCH):
            continue
        count = float(values.get(partials_lib.sketch_count_key(k), 0))
        if count <= QUANTILE_COMPACT + 1:
            continue
        points = sketch_quantiles(sketch, QUANTILE_COMPACT)
        compact = quantiles_sketch()
        compact.AddValues(pa.array(points, pa.float64()), pa.array(np.full(len(points), count / len(points))))
        out[k] = compact
    return out


def sketch_quantiles(sketch, points: int = QUANTILE_POINTS) -> List[float]:
    """The sketch's `points` + 1 quantiles (minimum, ..., maximum); [] for an empty one. Reads a
    copy: a sketch that gave its quantiles can no longer be merged."""
    copy = quantiles_sketch()
    copy.Merge(sketch)
    flat = copy.GetQuantiles(points).flatten()
    return [float(v) for v in flat.to_numpy(zero_copy_only=False)] if len(flat) else []


@dataclass
class StatisticsAccumulator:
    """Statistics partials merged so far (`MergeStatsFn`'s accumulator): `values` is the merged partial.

    Merges in place; every numpy vector in `values` is its own copy, so the partials added are
    never modified."""

    values: Dict[str, Any] = field(default_factory=dict)

    def add(self, partial: Mapping[str, Any]) -> "StatisticsAccumulator":
        out = self.values
        for k, v in partial.items():
            if k not in out and k.startswith(partials_lib.SKETCH):  # a copy: the partial's own sketch stays as it is
                out[k] = quantiles_sketch()
                out[k].Merge(v)
            elif k not in out:
                out[k] = v.copy() if isinstance(v, np.ndarray) else v
            elif k.startswith(partials_lib.MAX):
                out[k] = max(out[k], v)
            elif k.startswith(partials_lib.VEC):
                a, b = out[k], v
                if len(a) < len(b):
                    a, b = b.copy(), a
                a[: len(b)] += b
                out[k] = a
            elif k.startswith(partials_lib.INFO):
                continue
            elif k.startswith(partials_lib.SKETCH):
                out[k].Merge(v)
            else:
                out[k] = out[k] + v
        return self

    def merge(self, others: Iterable["StatisticsAccumulator"]) -> "StatisticsAccumulator":
        for other in others:
            self.add(other.values)
        return self


def merge_stats(partials: Iterable[Mapping[str, Any]]) -> Dict[str, Any]:
    """The merge of statistics partials (rules in the module docstring); the partials are not modified."""
    acc = StatisticsAccumulator()
    for partial in partials:
        acc.add(partial)
    return acc.values


def jsonable(stats: Dict[str, Any]) -> Dict[str, Any]:
    """The merged partial as JSON values: vectors as lists, sketches as their quantiles."""
    return {k: (v.tolist() if isinstance(v, np.ndarray) else sketch_quantiles(v) if k.startswith(partials_lib.SKETCH) else v)
            for k, v in stats.items()}


def div_shard(ids: np.ndarray, rows: int, shards: int) -> np.ndarray:
    """`div` sharding: contiguous blocks of ceil(rows / shards) rows."""
    return ids // max(1, math.ceil(rows / shards))


def mod_shard(ids: np.ndarray, shards: int) -> np.ndarray:
    """`mod` sharding: row r on shard r % shards (as SparseCore and Estimator `mod` do)."""
    return ids % shards


_PRESENCE_LIMIT = 1 << 20  # (batches x table rows) up to which unique pairs are found by counting
_MOD_LCM_LIMIT = 4096  # shard counts whose least common multiple is larger are counted one by one


def batch_table_stats(
    split: str,
    table: str,
    ids: np.ndarray,
    batch_of_id: np.ndarray,
    batch_is_full: np.ndarray,
    rows: int,
    shard_counts: Sequence[int],
) -> Dict[str, Any]:
    """Statistics of one table's IDs (all its features together) over consecutive training batches.

    Only full batches count towards per-batch figures (a partial batch says nothing about a
    training step); every ID counts towards the whole-data load per shard. Vectorised over
    batches: one bincount per (strategy, shards).

    Args:
      split: the split's name (in the keys).
      table: the table's name (in the keys).
      ids: int64 row IDs of shape [n].
      batch_of_id: the batch of each ID, int64 of shape [n] (`batch_of_id[i]` is `ids[i]`'s).
      batch_is_full: bool per batch, shape [batches].
      rows: the table's rows.
      shard_counts: the shard counts to count loads for, under each of SHARDING_STRATEGIES.

    Returns:
      The statistics partial: the load per shard (int64 vectors of shape [shards]), the busiest
      shard's IDs and unique IDs per full batch, and the full batches' ID totals and maxima.
    """
    batches = _TableBatches.of(ids, batch_of_id, batch_is_full, rows)
    out = _shard_stats(split, table, batches, shard_counts)
    if batch_is_full.any():
        out.update(_full_batch_totals(split, table, batches))
    return out


def _unique_pairs(keys: np.ndarray, num_batches: int, rows: int) -> np.ndarray:
    """The distinct (batch * rows + id) keys, sorted: by a presence count when the table is small (a
    sort-free pass; half the tables of a typical config have at most a few thousand rows)."""
    if num_batches * rows <= _PRESENCE_LIMIT:
        return np.flatnonzero(np.bincount(keys, minlength=num_batches * rows))
    if num_batches * rows < 2**31:  # sorting int32 keys is markedly faster than int64 ones
        return np.unique(keys.astype(np.int32)).astype(np.int64)
    return np.unique(keys)


@dataclass(frozen=True, eq=False)
class _TableBatches:
    """One table's IDs over consecutive batches, with the unique (batch, ID) pairs of the full ones."""

    ids: np.ndarray  # every ID, [n]
    batch_of_id: np.ndarray  # [n]
    batch_is_full: np.ndarray  # bool, [batches]
    rows: int  # the table's rows
    batch_full: np.ndarray  # the batch of each ID in a full batch
    u_batch: np.ndarray  # unique (batch, ID) pairs of the full batches: their batches
    u_ids: np.ndarray  # ... and their IDs
    all_full: bool
    any_full: bool

    @classmethod
    def of(cls, ids: np.ndarray, batch_of_id: np.ndarray, batch_is_full: np.ndarray, rows: int) -> "_TableBatches":
        full = batch_is_full[batch_of_id] if len(ids) else np.zeros(0, bool)
        ids_full, batch_full = ids[full], batch_of_id[full]
        keys = batch_full.astype(np.int64) * rows + ids_full
        pairs = _unique_pairs(keys, len(batch_is_full), rows)
        return cls(ids, batch_of_id, batch_is_full, rows, batch_full, pairs // rows, pairs % rows,
                   bool(full.all()), bool(batch_is_full.any()))

    @property
    def num_batches(self) -> int:
        return len(self.batch_is_full)

    def counts(self, shards: np.ndarray, u_shards: Optional[np.ndarray], n: int):
        """(load per shard, IDs and unique IDs per (full batch, shard) as [batches, n] or None).
        One bincount over every (batch, shard) gives both the load (its column sums) and the full
        batches' rows (a partial batch's row zeroed)."""
        num_batches = self.num_batches
        grid = np.bincount(self.batch_of_id * n + shards, minlength=num_batches * n).reshape(num_batches, n)
        load = grid.sum(axis=0).astype(np.int64)
        if not self.any_full:
            return load, None, None
        per = grid if self.all_full else grid * self.batch_is_full[:, None]
        uper = np.bincount(self.u_batch * n + u_shards, minlength=num_batches * n)
        return load, per, uper.reshape(num_batches, n)


def _shard_stats(split: str, table: str, batches: _TableBatches, shard_counts: Sequence[int]) -> Dict[str, Any]:
    """The load per shard and the busiest shard per full batch, for each shard count and strategy."""
    # `mod` for every shard count at once: counted at the counts' least common multiple M, a count n
    # that divides M sums M's shards s, s + n, s + 2n, ... (ID % n == (ID % M) % n). One set of
    # bincounts instead of one per count (the defaults 8, 32, 128: a third of the passes).
    lcm = int(np.lcm.reduce(np.asarray(list(shard_counts), np.int64))) if len(shard_counts) else 1
    mod_at_lcm = (batches.counts(mod_shard(batches.ids, lcm), mod_shard(batches.u_ids, lcm), lcm)
                  if 0 < lcm <= _MOD_LCM_LIMIT else None)
    out: Dict[str, Any] = {}
    for n in shard_counts:
        for strategy in SHARDING_STRATEGIES:
            if strategy == PartitionStrategy.DIV:
                load, per, uper = batches.counts(
                    div_shard(batches.ids, batches.rows, n), div_shard(batches.u_ids, batches.rows, n), n)
            elif mod_at_lcm is not None:
                load, per, uper = (None if a is None else a.reshape(*a.shape[:-1], lcm // n, n).sum(axis=-2)
                                   for a in mod_at_lcm)
            else:
                load, per, uper = batches.counts(mod_shard(batches.ids, n), mod_shard(batches.u_ids, n), n)
            out[partials_lib.shard_load(split, table, strategy, n)] = load
            if batches.any_full:
                out[partials_lib.shard_max(split, table, strategy, n, "max_ids_per_shard")] = int(per.max())
                out[partials_lib.shard_max(split, table, strategy, n, "max_unique_ids_per_shard")] = int(uper.max())
    return out


def _full_batch_totals(split: str, table: str, batches: _TableBatches) -> Dict[str, Any]:
    """The full batches' count, IDs and unique IDs (their sums, and the largest of one batch)."""
    ids_per_batch = np.bincount(batches.batch_full, minlength=batches.num_batches)[batches.batch_is_full]
    unique_per_batch = np.bincount(batches.u_batch, minlength=batches.num_batches)[batches.batch_is_full]
    return {
        partials_lib.table_batch(split, table, "batches"): int(batches.batch_is_full.sum()),
        partials_lib.table_batch(split, table, "batch_ids"): int(ids_per_batch.sum()),
        partials_lib.table_batch(split, table, "batch_unique_ids"): int(unique_per_batch.sum()),
        partials_lib.table_batch_max(split, table, "batch_ids"): int(ids_per_batch.max()),
        partials_lib.table_batch_max(split, table, "batch_unique_ids"): int(unique_per_batch.max()),
    }


DISTRIBUTION_KEYS = ("distinct_values", "occurrences", "coverage_curve", "hottest_values", "skew")


@dataclass(frozen=True)
class CountHistogram:
    """The counts of a distribution's distinct values, compacted: `values[i]` is a count (ascending,
    distinct) and `multiplicity[i]` how many distinct values have it. Everything `distribution_stats`
    reports is exact from it, two histograms merge by adding multiplicities, and its size is the
    number of distinct counts, not of values (for integer counts; weighted counts are floats,
    nearly all distinct, and then it is as long as the values)."""

    values: np.ndarray
    multiplicity: np.ndarray

    @classmethod
    def of(cls, counts: Sequence[float]) -> "CountHistogram":
        counts = np.asarray(counts)
        if counts.dtype.kind not in "if":
            counts = counts.astype(np.int64)
        values, mult = np.unique(counts, return_counts=True)
        return cls(values, mult.astype(np.int64))

    @classmethod
    def merge(cls, parts: Iterable["CountHistogram"]) -> "CountHistogram":
        parts = list(parts)
        if len(parts) == 1:
            return parts[0]
        values = np.concatenate([p.values for p in parts]) if parts else np.zeros(0, np.int64)
        mult = np.concatenate([p.multiplicity for p in parts]) if parts else np.zeros(0, np.int64)
        uniq, where = np.unique(values, return_inverse=True)
        summed = np.zeros(len(uniq), np.int64)
        np.add.at(summed, where, mult)
        return cls(uniq, summed)

    @property
    def distinct(self) -> int:
        return int(self.multiplicity.sum())

    def occurrences(self):
        """The sum of all counts (a Python int for integer counts)."""
        return (self.values * self.multiplicity).sum().item() if len(self.values) else 0

    def top_sums(self, n: np.ndarray) -> np.ndarray:
        """The occurrences of the `n` most frequent values, for each n (0 <= n <= distinct)."""
        desc_v, desc_m = self.values[::-1], self.multiplicity[::-1]
        cum_m = np.concatenate([[0], np.cumsum(desc_m)])
        cum_s = np.concatenate([[0], np.cumsum(desc_v * desc_m)])
        n = np.asarray(n, np.int64)
        run = np.clip(np.searchsorted(cum_m, n, side="left") - 1, 0, max(len(desc_v) - 1, 0))
        if not len(desc_v):
            return np.zeros(len(n), cum_s.dtype)
        return cum_s[run] + (n - cum_m[run]) * desc_v[run]

    def gini(self) -> float:
        """The Gini coefficient of the counts (0: all equal; near 1: a few values hold everything),
        from the ascending order: 2 * sum(k * c_k) / (n * total) - (n + 1) / n, with a run of m
        equal counts at positions a+1..a+m adding c * (m * a + m (m + 1) / 2). In float64, where
        an int64 sum of k * c_k would overflow past ~10^18 (10M values of count 10^5)."""
        n, total = self.distinct, float(self.occurrences())
        if not total:
            return 0.0
        m = self.multiplicity.astype(np.float64)
        a = np.concatenate([[0.0], np.cumsum(m)[:-1]])
        weighted = float(np.sum(self.values.astype(np.float64) * (m * a + m * (m + 1) / 2)))
        return 2 * weighted / (n * total) - (n + 1) / n


def distribution_stats(
    histogram: CountHistogram, top: Sequence[Tuple[bytes, int]], kept: Optional[int] = None
) -> Dict[str, Any]:
    """Distinct values, coverage curve, hottest values and skew of a distribution's counts; with
    `kept` (a vocabulary of the `kept` most frequent values) also its size and the share of
    occurrences it covers. `top`: the hottest (value, count) pairs, most frequent first."""
    distinct = histogram.distinct
    total = histogram.occurrences()
    tops = [1 << i for i in range(max(distinct - 1, 0).bit_length())]  # 1, 2, 4, ... < distinct
    top1 = max(1, distinct // 100)
    sums = histogram.top_sums(np.array([*tops, top1, kept or 0], np.int64))
    coverage = [{"top": n, "share": float(s / total)} for n, s in zip(tops, sums)]  # share of occurrences
    if distinct:
        coverage.append({"top": int(distinct), "share": 1.0})
    out = {
        "distinct_values": int(distinct),
        "occurrences": total,
        "coverage_curve": coverage,
        "hottest_values": [{"value": t.decode("utf-8", "replace"), "count": c, "share": c / total} for t, c in top],
        "skew": {"gini": histogram.gini(), "top_1pct_share": float(sums[-2] / total) if total else 0.0},
    }
    if kept is not None:
        out["vocabulary_size"] = int(kept)
        out["covered_by_vocabulary"] = float(sums[-1] / total) if kept and total else 0.0
    return out


def vocabulary_stats(name: str, histogram: CountHistogram, kept: int, top: Sequence[Tuple[bytes, int]],
                     covered: Optional[float] = None):
    """`distribution_stats` of one vocabulary's values, with its size after pruning and coverage.
    `covered`: the occurrences the table gives rows of their own when that is not its `kept` most
    frequent values (a given vocabulary, a hashed or identity column)."""
    if covered is None:
        return {partials_lib.vocabulary_info(name): distribution_stats(histogram, top, kept)}
    out = distribution_stats(histogram, top)
    total = out["occurrences"]
    out["vocabulary_size"] = int(kept)
    out["covered_by_vocabulary"] = float(covered / total) if total else 0.0
    return {partials_lib.vocabulary_info(name): out}


def feature_value_stats(feature: str, histogram: CountHistogram, top: Sequence[Tuple[bytes, int]]):
    """`distribution_stats` of one feature's own values (features sharing a table; see beam_pipeline)."""
    return {partials_lib.feature_values_info(feature): distribution_stats(histogram, top)}


def _percentile(hist: List[int], q: float) -> Optional[int]:
    """Exact q-quantile (lower) of a histogram whose index is the value."""
    total = sum(hist)
    if not total:
        return None
    target = q * total
    running = 0
    for value, count in enumerate(hist):
        running += count
        if running >= target:
            return value
    return len(hist) - 1


def pooling_summary(hist: List[int]) -> Dict[str, Any]:
    total = sum(hist)
    return {
        "mean": sum(i * c for i, c in enumerate(hist)) / total if total else None,
        "max": max((i for i, c in enumerate(hist) if c), default=0),
        "p50": _percentile(hist, 0.5),
        "p90": _percentile(hist, 0.9),
        "p99": _percentile(hist, 0.99),
        "histogram": hist,
    }


def shard_summary(raw: Dict[str, Any], split: str, table: str, shard_counts, headroom: float) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for n in shard_counts:
        per: Dict[str, Any] = {}
        for strategy in SHARDING_STRATEGIES:
            load = np.asarray(raw.get(partials_lib.shard_load(split, table, strategy, n), [0] * n), dtype=np.float64)
            mean = load.sum() / n
            per[strategy] = {
                "load_per_shard": load.astype(int).tolist(),
                "max_over_mean_load": float(load.max() / mean) if mean else None,
                "max_ids_per_shard_per_batch": raw.get(partials_lib.shard_max(split, table, strategy, n, "max_ids_per_shard")),
                "max_unique_ids_per_shard_per_batch": raw.get(partials_lib.shard_max(split, table, strategy, n, "max_unique_ids_per_shard")),
            }
        mod = per["mod"]
        # SparseCore shards rows with `mod`; its per-table limits bound what one SparseCore gets in a batch.
        per["suggested_sparsecore_limits"] = {
            "max_ids_per_table": _with_headroom(mod["max_ids_per_shard_per_batch"], headroom),
            "max_unique_ids_per_table": _with_headroom(mod["max_unique_ids_per_shard_per_batch"], headroom),
            "headroom": headroom,
            "basis": "busiest SparseCore in any full batch of the train split under mod sharding",
        }
        out[str(n)] = per
    return out


def _with_headroom(value: Optional[int], headroom: float) -> Optional[int]:
    return None if value is None else int(math.ceil(value * (1.0 + headroom)))
