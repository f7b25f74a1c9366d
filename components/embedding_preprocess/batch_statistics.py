"""The statistics partial of one transformed batch: what only preprocessing computes.

`transform.transform_batch` gives the trainer's columns and the extraction results behind them;
`batch_statistics` turns those results into the batch's partial (row counts, drop reasons, dense
drift moments and quantile sketches, per-feature presence and OOV, per-batch and per-shard ID
loads). Partials merge by their keys' rules (partials.py, statistics.StatisticsAccumulator).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Dict, List, Tuple

import numpy as np
import pyarrow as pa

from components.config.schema import PipelineConfig
from components.embedding_preprocess import features
from components.rules.rulebook import DROP_INVALID_LABEL, DROP_MISSING_LABEL
from components.embedding_preprocess import partials
from components.embedding_preprocess import statistics
from components.embedding_preprocess import vocabulary
from components.embedding_preprocess.transform import CategoricalColumn, TransformedBatch


def _count_rows(stats: Counter, raw: pa.RecordBatch, transformed: TransformedBatch, split: str) -> None:
    """Rows read, each raw column's value kind, rows dropped by reason and positive labels."""
    stats[partials.examples_read(split)] += raw.num_rows
    for i, name in enumerate(raw.schema.names):
        stats[partials.raw_kind(name, features.kind_of(raw.column(i)))] += 1
    labels, keep = transformed.labels, transformed.keep
    stats[partials.dropped(split, DROP_MISSING_LABEL)] += int(labels.missing.sum())
    stats[partials.dropped(split, DROP_INVALID_LABEL)] += int(labels.invalid.sum())
    stats[partials.positives(split)] += float(labels.values[keep].sum())


def _count_dense(stats: Counter, split: str, name: str, dense: features.DenseValues) -> None:
    """One dense feature: missing and invalid values, the model input's moments, and (train) its quantiles."""
    stats[partials.dense_missing(split, name)] += int(dense.missing)
    # Mean and spread of what the model reads (model.dense_input), for drift between runs.
    values = dense.values.astype(np.float64)
    model_input = np.sign(values) * np.log1p(np.abs(values))
    stats[partials.dense_sum(split, name, 1)] += float(model_input.sum())
    stats[partials.dense_sum(split, name, 2)] += float(np.square(model_input).sum())
    for reason, c in dense.invalid.items():
        stats[partials.dense_invalid(split, name, reason)] += c
    if split == "train":  # the distribution the plan's bucket boundaries come from
        sample = statistics.quantile_sample(dense.values)
        stats[partials.dense_quantiles(split, name)] = statistics.quantiles_sketch(sample)
        stats[partials.dense_quantile_values(split, name)] += len(sample)


def _count_categorical(stats: Counter, split: str, name: str, c: CategoricalColumn) -> None:
    """One categorical feature: IDs per row, presence, IDs, OOV, truncated and invalid tokens."""
    stats[partials.ids_per_example_histogram(split, name)] = np.bincount(c.ids_per_row).astype(np.int64)
    stats[partials.feature(split, name, "present")] += int(np.count_nonzero(c.ids_per_row))
    stats[partials.feature(split, name, "ids")] += int(len(c.ids))
    stats[partials.feature(split, name, "oov")] += c.oov
    stats[partials.feature(split, name, "truncated")] += c.tokens.truncated
    for reason, count in c.tokens.invalid.items():
        stats[partials.feature_invalid(split, name, reason)] += count


def _count_batches_and_shards(
    stats: Counter, cfg: PipelineConfig, lookups: Dict[str, vocabulary.VocabularyLookup],
    transformed: TransformedBatch, split: str,
) -> None:
    """Partial training batches, and each table's IDs per full training batch and per shard,
    on the kept rows in their order: what sizes the tables (train split only)."""
    n = transformed.num_kept
    bs = cfg.training.batch_size
    num_batches = -(-n // bs)
    batch_is_full = np.array([min(bs, n - k * bs) == bs for k in range(num_batches)], dtype=bool)
    stats[partials.partial_batches("train")] += int(num_batches - batch_is_full.sum())
    table_ids: Dict[str, List[Tuple[np.ndarray, np.ndarray]]] = {}
    for f in cfg.categorical_features:
        c = transformed.categorical[f.name]
        table_ids.setdefault(c.table, []).append((c.ids, c.tokens.row))
    for table, parts in table_ids.items():
        ids = np.concatenate([i for i, _ in parts])
        batch_of_id = np.concatenate([r for _, r in parts]) // bs
        for k, v in statistics.batch_table_stats(
            split, table, ids, batch_of_id, batch_is_full, lookups[table].rows, cfg.statistics.shard_counts
        ).items():
            stats[k] = v


def batch_statistics(
    cfg: PipelineConfig,
    lookups: Dict[str, vocabulary.VocabularyLookup],
    raw: pa.RecordBatch,
    transformed: TransformedBatch,
    split: str,
) -> Dict[str, Any]:
    """The statistics partial of one batch (see statistics.py for how partials merge).

    Rows read and dropped count the raw rows; every other figure describes the kept rows, which
    are what training reads.

    Args:
      cfg: the pipeline configuration.
      lookups: table name -> its lookup (the table's rows size its shards).
      raw: the raw batch `transformed` came from, shape [num_raw] rows.
      transformed: `transform.transform_batch(cfg, lookups, raw)`.
      split: the split's name; "train" adds quantile sketches, partial batches and per-batch and
        per-shard ID loads.

    Returns:
      partial key (partials.py) -> value: int or float counts, int64 vectors (histograms, shard
      loads), or a quantiles sketch.
    """
    stats: Counter = Counter()
    _count_rows(stats, raw, transformed, split)
    for d in cfg.dense_features:
        _count_dense(stats, split, d.name, transformed.dense[d.name])
    for f in cfg.categorical_features:
        _count_categorical(stats, split, f.name, transformed.categorical[f.name])
    if split == "train":  # batch and shard statistics size the tables: computed on what training reads
        _count_batches_and_shards(stats, cfg, lookups, transformed, split)
    return dict(stats)
