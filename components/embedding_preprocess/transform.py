"""Raw RecordBatch -> transformed RecordBatch of embedding IDs, without Beam.

What the Beam pipeline's `TransformSplit` applies to every batch of every split, and what the
exporter applies to the eval rows it scores with the trained model (so both read the same code).
The transformed batch has the label and every dense feature as one float32 per row and every
categorical feature as a list of int64 embedding IDs: what the trainer reads.
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.config.schema import PipelineConfig
from components.contracts.manifest import ROW_LENGTHS_SUFFIX, row_lengths_key, weights_key
from components.embedding_preprocess import features
from components.embedding_preprocess import partials
from components.embedding_preprocess import statistics
from components.embedding_preprocess import vocabulary


def column(rb: pa.RecordBatch, name: str) -> Optional[pa.Array]:
    """The column `name` of `rb`, or None when the batch has none (no example held the feature)."""
    i = rb.schema.get_field_index(name)
    return rb.column(i) if i >= 0 else None


def as_list_array(values, lengths: np.ndarray) -> pa.Array:
    """A ListArray of `values` (numpy or Arrow) cut into consecutive lists of `lengths`."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), values if isinstance(values, pa.Array) else pa.array(values))


def read_batch_rows(batch_size: int) -> int:
    """Rows per RecordBatch read: a multiple of the training batch size (per-batch statistics slice
    it into consecutive training batches), large enough that Arrow work dominates per-batch overhead:
    preprocessing 5M rows (Parquet, 2 workers) took 80.6 s at 4,096 rows, 59.5 s at 16,384 and
    59.0 s at whole 38k-row Parquet row groups, at the same peak memory (2.65 / 2.53 / 2.50 GB)."""
    return batch_size * max(1, -(-16384 // batch_size))


def make_lookups(cfg: PipelineConfig, vocabularies: Dict[str, Sequence[bytes]]) -> Dict[str, vocabulary.VocabularyLookup]:
    """One lookup per table: its vocabulary as written in the vocabulary directory (counted, or
    the given lines of a list / file vocabulary; a table without one gets an empty vocabulary),
    a hashed table's num_buckets OOV rows (V3), or an identity table's IDs (V4)."""
    out: Dict[str, vocabulary.VocabularyLookup] = {}
    for t in cfg.tables:
        v = t.vocabulary
        if v.kind == "identity":
            out[t.name] = vocabulary.IdentityLookup(v.num_buckets, v.default_value)
            continue
        tokens = vocabularies.get(t.name, [])
        _, oov = vocabulary.table_layout(v, len(tokens))
        out[t.name] = vocabulary.VocabularyLookup(tokens, oov)
    return out


# Lookups built in this worker process, by vocabulary directory: every transform DoFn (one per
# split) and every bundle of a process share one copy instead of each receiving the vocabularies
# through a side input (which the portable runners re-send per bundle).
# Keyed by a per-pipeline run id too, so that a later run into the same directory never sees them.
_LOOKUP_CACHE: Dict[Tuple[str, str], Dict[str, vocabulary.VocabularyLookup]] = {}


def load_lookups(
    cfg: PipelineConfig, vocabulary_dir: str, sizes: Dict[str, int], run_id: str = ""
) -> Dict[str, vocabulary.VocabularyLookup]:
    """Lookups over the vocabulary files just written; `sizes` (from the writer) guards against stale files."""
    key = (vocabulary_dir, run_id)
    if key not in _LOOKUP_CACHE:
        # Given vocabularies were written before the pipeline (run_preprocessing), also for a
        # table the train split never fed (then absent from `sizes`).
        given = [t.name for t in cfg.tables if t.vocabulary.kind in vocabulary.GIVEN_KINDS]
        vocabularies = {name: vocabulary.read_vocabulary_tokens(vocabulary_dir, name) for name in [*sizes, *given]}
        for name, size in sizes.items():
            if len(vocabularies[name]) != size:
                raise RuntimeError(
                    f"{vocabulary.vocabulary_file(vocabulary_dir, name)} has {len(vocabularies[name])} tokens, the writer "
                    f"wrote {size}: another run is writing to the same output directory"
                )
        _LOOKUP_CACHE.clear()  # one run per process at a time: earlier runs' lookups are no longer needed
        _LOOKUP_CACHE[key] = make_lookups(cfg, vocabularies)
    return _LOOKUP_CACHE[key]


def transform_record_batch(
    cfg: PipelineConfig, lookups: Dict[str, vocabulary.VocabularyLookup], rb: pa.RecordBatch, split: str
) -> Tuple[Optional[pa.RecordBatch], np.ndarray, Dict[str, float]]:
    """Raw RecordBatch -> (transformed RecordBatch of the labelled rows or None, kept-row mask, stats).

    The transformed batch has the label and every dense feature as one float32 per row and every
    categorical feature as a list of int64 embedding IDs: what the trainer reads. `stats` is the
    batch's statistics partial (see statistics.py for how partials merge).
    """
    stats: Counter = Counter()
    stats[partials.examples_read(split)] += rb.num_rows
    for i, name in enumerate(rb.schema.names):
        stats[partials.raw_kind(name, features.kind_of(rb.column(i)))] += 1
    labels = features.extract_label(column(rb, cfg.label), rb.num_rows)
    keep = labels.keep
    label = labels.values
    # Rows without a usable label are dropped (counted here by reason); every other statistic
    # describes the kept rows, which are what training reads.
    rb = rb.filter(pa.array(keep)) if not keep.all() else rb
    n = kept = rb.num_rows
    stats[partials.dropped(split, features.DROP_MISSING_LABEL)] += int(labels.missing.sum())
    stats[partials.dropped(split, features.DROP_INVALID_LABEL)] += int(labels.invalid.sum())
    stats[partials.positives(split)] += float(label[keep].sum())
    ones = np.ones(n, np.int64)
    columns: Dict[str, pa.Array] = {cfg.label: as_list_array(label[keep], ones)}
    for d in cfg.dense_features:
        dense = features.extract_dense(column(rb, d.source), n, d.fill_value)
        stats[partials.dense_missing(split, d.name)] += int(dense.missing)
        # Mean and spread of what the model reads (model.dense_input), for drift between runs.
        values = dense.values.astype(np.float64)
        model_input = np.sign(values) * np.log1p(np.abs(values))
        stats[partials.dense_sum(split, d.name, 1)] += float(model_input.sum())
        stats[partials.dense_sum(split, d.name, 2)] += float(np.square(model_input).sum())
        for reason, c in dense.invalid.items():
            stats[partials.dense_invalid(split, d.name, reason)] += c
        if split == "train":  # the distribution the plan's bucket boundaries come from
            sample = statistics.quantile_sample(dense.values)
            stats[partials.dense_quantiles(split, d.name)] = statistics.quantiles_sketch(sample)
            stats[partials.dense_quantile_values(split, d.name)] += len(sample)
        columns[d.name] = as_list_array(dense.values, ones)
    table_ids: Dict[str, List[Tuple[np.ndarray, np.ndarray]]] = {}
    for f in cfg.categorical_features:
        table = cfg.feature_table(f).name
        lookup = lookups[table]
        weights = features.extract_weights(column(rb, f.weight_column), n) if f.weight_column else None
        toks = features.extract_tokens(column(rb, f.source), n, f.separator, f.max_length, getattr(lookup, "id_filter", None),
                                weights)
        ids, oov = lookup.lookup(toks.values)
        per_row = toks.ids_per_row()
        stats[partials.ids_per_example_histogram(split, f.name)] = np.bincount(per_row).astype(np.int64)
        stats[partials.feature(split, f.name, "present")] += int(np.count_nonzero(per_row))
        stats[partials.feature(split, f.name, "ids")] += int(len(ids))
        stats[partials.feature(split, f.name, "oov")] += oov
        stats[partials.feature(split, f.name, "truncated")] += toks.truncated
        for reason, c in toks.invalid.items():
            stats[partials.feature_invalid(split, f.name, reason)] += c
        table_ids.setdefault(table, []).append((ids, toks.row))
        columns[f.name] = as_list_array(ids, per_row)
        if weights is not None:  # W1: each ID weighs its row's weight
            columns[weights_key(f.name)] = as_list_array(weights[toks.row].astype(np.float32), per_row)
    if split == "train":  # batch and shard statistics size the tables: computed on what training reads
        bs = cfg.training.batch_size
        num_batches = -(-n // bs)
        batch_is_full = np.array([min(bs, n - k * bs) == bs for k in range(num_batches)], dtype=bool)
        stats[partials.partial_batches("train")] += int(num_batches - batch_is_full.sum())
        for table, parts in table_ids.items():
            ids = np.concatenate([i for i, _ in parts])
            batch_of_id = np.concatenate([r for _, r in parts]) // bs
            for k, v in statistics.batch_table_stats(
                split, table, ids, batch_of_id, batch_is_full, lookups[table].rows, cfg.statistics.shard_counts
            ).items():
                stats[k] = v
    out = pa.RecordBatch.from_arrays(list(columns.values()), list(columns.keys())) if kept else None
    return out, keep, dict(stats)


def to_blocks(cfg: PipelineConfig, rb: pa.RecordBatch, block_rows: int) -> pa.RecordBatch:
    """A transformed batch (`transform_record_batch`'s) -> one row per block of `block_rows`
    consecutive rows (the last block holds the rest), in the `blocks` layout of
    `contracts.manifest`: each column's values of the block's rows as one list, plus each
    categorical feature's IDs per row (`row_lengths_key`). Encoded, each row is one tf.Example.
    Vectorised: the block boundaries only re-cut the columns' offsets; no value is copied per row."""
    n = rb.num_rows
    starts = np.unique(np.minimum(np.arange(0, n + block_rows, block_rows), n))  # [0, b, 2b, ..., n]
    row_cuts = pa.array(starts.astype(np.int32))
    categorical = {f.name: weights_key(f.name) if f.weight_column else None for f in cfg.categorical_features}
    # A categorical feature's cuts serve its weights too (transform_record_batch puts the weights after it).
    cuts_of: Dict[str, np.ndarray] = {}
    names, arrays = [], []
    for name in rb.schema.names:
        col = rb.column(rb.schema.get_field_index(name))
        if name in categorical:
            lengths = np.asarray(pc.list_value_length(col), dtype=np.int64)
            cuts_of[name] = cuts = np.concatenate([[0], np.cumsum(lengths)])[starts]
            if categorical[name]:
                cuts_of[categorical[name]] = cuts
            names.append(row_lengths_key(name))
            arrays.append(pa.ListArray.from_arrays(row_cuts, pa.array(lengths)))
        names.append(name)
        cuts = cuts_of.get(name, starts)  # label and dense values: one per row
        arrays.append(pa.ListArray.from_arrays(pa.array(cuts.astype(np.int32)), col.flatten()))
    return pa.RecordBatch.from_arrays(arrays, names)


def from_blocks(cfg_or_manifest, blocks: pa.RecordBatch) -> pa.RecordBatch:
    """`to_blocks`' inverse: decoded blocks (one row per block) -> one row per transformed row,
    the columns `transform_record_batch` writes. `cfg_or_manifest`: a PipelineConfig or a
    VocabularyManifest (both name the categorical features)."""
    cats = cfg_or_manifest.categorical_features
    weights_of = {weights_key(f.name): f.name for f in cats if f.weight_column}
    categorical = {f.name for f in cats}
    names, arrays = [], []
    for name in blocks.schema.names:
        if name.endswith(ROW_LENGTHS_SUFFIX):
            continue
        values = blocks.column(blocks.schema.get_field_index(name)).flatten()
        owner = weights_of.get(name, name)
        if owner in categorical:
            lengths = np.asarray(blocks.column(blocks.schema.get_field_index(row_lengths_key(owner))).flatten(),
                                 dtype=np.int64)
        else:  # label and dense values: one per row
            lengths = np.ones(len(values), np.int64)
        arrays.append(as_list_array(values, lengths))
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names)
