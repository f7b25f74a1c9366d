"""The keys of the statistics partials: one definition, used by every producer and the consumer.

A statistics partial is a flat dict `{key: value}` that one piece of the Beam pipeline counted (a
record batch of the transform pass, the vocabulary pass's row counts, a CSV block, a vocabulary's
description). `MergeStatsFn` (statistics.StatisticsAccumulator) merges all of them into one, and
run.build_statistics reads that merged partial back into `statistics.json`. A key names one figure,
`/`-separated from the general to the particular, e.g. `train/feature/<feature>/oov` (OOV IDs of a
feature on the train split). Its first segment says how two partials holding it merge:

- `max/<key>`: the maximum of the values (e.g. the most IDs in any one batch);
- `vec/<key>`: element-wise sum of numpy int vectors, the shorter zero-padded to the longer
  (histograms, per-shard loads);
- `info/<key>`: a whole dict computed once per key (a vocabulary's or a feature's value
  distribution); when two partials hold the key, the first is kept, never added to;
- `sketch/<key>`: a quantiles sketch (tfx_bsl's `QuantilesSketch`), merged by the sketch's own
  merge and written out as its quantiles (`statistics.jsonable`);
- anything else: the sum of the values (counters).

Key families (split is `train`, `eval`, ...):
- rows: `<split>/examples_read`, `<split>/dropped/<reason>`, `<split>/positives`,
  `<split>/partial_batches` (train only); rows and files found in the written output, counted by
  reading each file back after the write finished: `<split>/written/rows`, `<split>/written/files`;
- raw column kinds (per record batch that holds the column): `kind/<column>/<kind>`;
- dense features: `<split>/dense/<feature>/missing`, `<split>/dense/<feature>/invalid/<reason>`,
  `sketch/train/dense/<feature>/quantiles` (the filled values' distribution, train split only);
- categorical features: `<split>/feature/<feature>/{present,ids,oov,truncated}`,
  `<split>/feature/<feature>/invalid/<reason>`, `vec/<split>/feature/<feature>/ids_per_example_histogram`;
- tables per full batch: `<split>/table/<table>/{batches,batch_ids,batch_unique_ids}` and
  `max/<split>/table/<table>/{batch_ids,batch_unique_ids}`;
- tables per shard: `vec/<split>/table/<table>/<strategy>/<n>/load`,
  `max/<split>/table/<table>/<strategy>/<n>/{max_ids_per_shard,max_unique_ids_per_shard}`;
- value distributions: `info/vocab/<table>`, `info/feature_values/<feature>`;
- CSV input: `input/malformed_rows`, `input/not_numeric/<column>`.

Only this module builds or parses these strings.
"""
from __future__ import annotations

from typing import Optional, Tuple

SEP = "/"

# Merge-rule prefixes (statistics.StatisticsAccumulator); any other key is summed.
MAX = "max/"
VEC = "vec/"
INFO = "info/"
SKETCH = "sketch/"

KIND = "kind/"
INPUT = "input/"
VOCABULARY_INFO = INFO + "vocab/"
FEATURE_VALUES_INFO = INFO + "feature_values/"

MALFORMED_ROWS = INPUT + "malformed_rows"
NOT_NUMERIC = INPUT + "not_numeric/"  # + column

# What a categorical feature counts per split (`feature(split, feature, what)`).
FEATURE_COUNTS = ("present", "ids", "oov", "truncated")
# What a table counts over full batches (`table_batch`); the last two also have a `max/` maximum.
TABLE_BATCH_COUNTS = ("batches", "batch_ids", "batch_unique_ids")
TABLE_BATCH_MAXIMA = ("batch_ids", "batch_unique_ids")
# Per-shard maxima (`shard_max`).
SHARD_MAXIMA = ("max_ids_per_shard", "max_unique_ids_per_shard")


def _join(*parts: object) -> str:
    return SEP.join(str(p) for p in parts)


def maximum(key: str) -> str:
    """The key merged as a maximum."""
    return MAX + key


def vector(key: str) -> str:
    """The key merged as an element-wise vector sum."""
    return VEC + key


def merge_rule(key: str) -> str:
    """How `key` merges: "max", "vec", "info" or "sum"."""
    for prefix, rule in ((MAX, "max"), (VEC, "vec"), (INFO, "info")):
        if key.startswith(prefix):
            return rule
    return "sum"


# rows


def examples_read(split: str) -> str:
    return _join(split, "examples_read")


def dropped(split: str, reason: str) -> str:
    return _join(split, "dropped", reason)


def written_rows(split: str) -> str:
    """Rows found in a split's written files of transformed examples (read back, for the ledger)."""
    return _join(split, "written", "rows")


def written_files(split: str) -> str:
    """Files of transformed examples written for a split (each read back for `written_rows`)."""
    return _join(split, "written", "files")


def positives(split: str) -> str:
    return _join(split, "positives")


def partial_batches(split: str = "train") -> str:
    return _join(split, "partial_batches")


# raw column kinds


def raw_kind(column: str, kind: str) -> str:
    return KIND + _join(column, kind)


def parse_raw_kind(key: str) -> Optional[Tuple[str, str]]:
    """`(column, kind)` of a `raw_kind` key, None for any other key."""
    if not key.startswith(KIND):
        return None
    column, kind = key[len(KIND):].rsplit(SEP, 1)
    return column, kind


# dense features


def dense_missing(split: str, feature: str) -> str:
    return _join(split, "dense", feature, "missing")


def dense_sum(split: str, feature: str, power: int) -> str:
    """Sum of the model's dense input (signed log1p of the filled value) to `power` 1 or 2."""
    return _join(split, "dense", feature, f"input_sum_{power}")


def dense_invalid_prefix(split: str, feature: str) -> str:
    """The prefix of `dense_invalid` keys (`<prefix><reason>`)."""
    return _join(split, "dense", feature, "invalid") + SEP


def dense_invalid(split: str, feature: str, reason: str) -> str:
    return dense_invalid_prefix(split, feature) + reason


def dense_quantile_values(split: str, feature: str) -> str:
    """How many values the `dense_quantiles` sketch was given (a counter: what a compacted sketch's
    points weigh, statistics.compact_sketches)."""
    return _join(split, "dense", feature, "quantile_values")


def sketch_count_key(sketch_key: str) -> str:
    """The `dense_quantile_values` key of a `dense_quantiles` key."""
    split, rest = sketch_key[len(SKETCH):].split(SEP, 1)  # rest: dense/<feature>/quantiles (a name may hold "/")
    feature = rest[len("dense" + SEP): -len(SEP + "quantiles")]
    return dense_quantile_values(split, feature)


def dense_quantiles(split: str, feature: str) -> str:
    """The quantiles sketch of a dense feature's filled values (what the model reads before its
    signed log1p), from which the plan takes the feature's bucket boundaries."""
    return SKETCH + _join(split, "dense", feature, "quantiles")


# categorical features


def feature(split: str, feature: str, what: str) -> str:
    """One of FEATURE_COUNTS of a categorical feature on a split."""
    if what not in FEATURE_COUNTS:
        raise ValueError(f"unknown feature count {what!r}; one of {FEATURE_COUNTS}")
    return _join(split, "feature", feature, what)


def feature_invalid_prefix(split: str, feature: str) -> str:
    """The prefix of `feature_invalid` keys (`<prefix><reason>`)."""
    return _join(split, "feature", feature, "invalid") + SEP


def feature_invalid(split: str, feature: str, reason: str) -> str:
    return feature_invalid_prefix(split, feature) + reason


def ids_per_example_histogram(split: str, feature: str) -> str:
    return vector(_join(split, "feature", feature, "ids_per_example_histogram"))


# tables


def table_batch(split: str, table: str, what: str) -> str:
    """One of TABLE_BATCH_COUNTS of a table over a split's full batches (summed)."""
    if what not in TABLE_BATCH_COUNTS:
        raise ValueError(f"unknown table batch count {what!r}; one of {TABLE_BATCH_COUNTS}")
    return _join(split, "table", table, what)


def table_batch_max(split: str, table: str, what: str) -> str:
    """The maximum over full batches of one of TABLE_BATCH_MAXIMA."""
    if what not in TABLE_BATCH_MAXIMA:
        raise ValueError(f"unknown table batch maximum {what!r}; one of {TABLE_BATCH_MAXIMA}")
    return maximum(_join(split, "table", table, what))


def shard_load(split: str, table: str, strategy: str, shards: int) -> str:
    """IDs per shard (a vector of `shards` counts) under a sharding strategy."""
    return vector(_join(split, "table", table, strategy, shards, "load"))


def shard_max(split: str, table: str, strategy: str, shards: int, what: str) -> str:
    """The busiest shard's IDs (or unique IDs) in any full batch: one of SHARD_MAXIMA."""
    if what not in SHARD_MAXIMA:
        raise ValueError(f"unknown shard maximum {what!r}; one of {SHARD_MAXIMA}")
    return maximum(_join(split, "table", table, strategy, shards, what))


# value distributions


def vocabulary_info(table: str) -> str:
    return VOCABULARY_INFO + table


def feature_values_info(feature: str) -> str:
    return FEATURE_VALUES_INFO + feature


# CSV input


def not_numeric(column: str) -> str:
    return NOT_NUMERIC + column
