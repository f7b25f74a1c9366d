"""Raw RecordBatch -> transformed RecordBatch of embedding IDs, without Beam.

What the Beam pipeline's `TransformSplit` applies to every batch of every split, and what the
exporter applies to the eval rows it scores with the trained model (so both read the same code).
The transformed batch has the label and every dense feature as one float32 per row and every
categorical feature as a list of int64 embedding IDs: what the trainer reads. The batch's
statistics are a separate step that only preprocessing runs (batch_statistics.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.config.schema import CategoricalFeature, PipelineConfig
from components.contracts.manifest import ROW_LENGTHS_SUFFIX, row_lengths_key, weights_key
from components.embedding_preprocess import features
from components.contracts import artifacts
from components.contracts.sizing import table_layout
from components.embedding_preprocess import vocabulary
from components.config.choices import VocabularyKind


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
    it into consecutive training batches), about 16,384 rows so that Arrow work dominates the
    per-batch overhead (larger batches gained nothing measurable, bench/README.md).

    Args:
      batch_size: the global training batch size.

    Returns:
      The smallest multiple of `batch_size` that is at least 16,384.
    """
    return batch_size * max(1, -(-16384 // batch_size))


def make_lookups(cfg: PipelineConfig, vocabularies: Dict[str, Sequence[bytes]]) -> Dict[str, vocabulary.VocabularyLookup]:
    """One lookup per table: its vocabulary as written in the vocabulary directory (counted, or
    the given lines of a list / file vocabulary; a table without one gets an empty vocabulary),
    a hashed table's num_buckets OOV rows (V3), or an identity table's IDs (V4)."""
    out: Dict[str, vocabulary.VocabularyLookup] = {}
    for t in cfg.tables:
        v = t.vocabulary
        if v.kind == VocabularyKind.IDENTITY:
            out[t.name] = vocabulary.IdentityLookup(v.num_buckets, v.default_value)
            continue
        tokens = vocabularies.get(t.name, [])
        _, oov = table_layout(v, len(tokens))
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
                    f"{artifacts.vocabulary_file(vocabulary_dir, name)} has {len(vocabularies[name])} tokens, the writer "
                    f"wrote {size}: another run is writing to the same output directory"
                )
        _LOOKUP_CACHE.clear()  # one run per process at a time: earlier runs' lookups are no longer needed
        _LOOKUP_CACHE[key] = make_lookups(cfg, vocabularies)
    return _LOOKUP_CACHE[key]


@dataclass(frozen=True, eq=False)
class CategoricalColumn:
    """One categorical feature extracted from a batch's kept rows.

    Attributes:
      table: the name of the feature's table.
      tokens: the feature's valid tokens (`features.Tokens`), with their truncated and invalid counts.
      ids: int64 embedding row IDs, one per token, shape [num_tokens].
      oov: how many of `ids` fell out of the vocabulary.
      ids_per_row: int64 IDs per kept row, shape [num_kept].
      weights: float32 weight per kept row (NaN: its tokens dropped), shape [num_kept]; None
        when the feature has no weight column.
    """

    table: str
    tokens: features.Tokens
    ids: np.ndarray
    oov: int
    ids_per_row: np.ndarray
    weights: Optional[np.ndarray]


@dataclass(frozen=True, eq=False)
class TransformedBatch:
    """A raw batch transformed into what the trainer reads, with the extraction results behind it.

    Attributes:
      batch: the labelled rows, or None when no row has a usable label: the label and every dense
        feature as list<float32> of one value per row, every categorical feature as list<int64>
        embedding IDs, and a weighted feature's weights (`weights_key`) as list<float32>.
      keep: bool per raw row, shape [num_raw]: the row has a usable label (it is in `batch`).
      labels: the label extraction over the raw rows (`features.Labels`, shape [num_raw] each).
      dense: dense feature name -> its `features.DenseValues` over the kept rows.
      categorical: categorical feature name -> its `CategoricalColumn` over the kept rows.
    """

    batch: Optional[pa.RecordBatch]
    keep: np.ndarray
    labels: features.Labels
    dense: Dict[str, features.DenseValues]
    categorical: Dict[str, CategoricalColumn]

    @property
    def num_kept(self) -> int:
        """The number of labelled rows (the rows of `batch`)."""
        return int(np.count_nonzero(self.keep))


def _extract_categorical(
    cfg: PipelineConfig, lookups: Dict[str, vocabulary.VocabularyLookup], feature: CategoricalFeature,
    rb: pa.RecordBatch,
) -> CategoricalColumn:
    """One categorical feature of the kept rows `rb`: its tokens (weighed), their IDs and OOV count."""
    n = rb.num_rows
    table = cfg.feature_table(feature).name
    lookup = lookups[table]
    weights = features.extract_weights(column(rb, feature.weight_column), n) if feature.weight_column else None
    tokens = features.extract_tokens(column(rb, feature.source), n, feature.separator, feature.max_length,
                                     getattr(lookup, "id_filter", None), weights)
    ids, oov = lookup.lookup(tokens.values)
    return CategoricalColumn(table, tokens, ids, oov, tokens.ids_per_row(), weights)


def transform_batch(
    cfg: PipelineConfig, lookups: Dict[str, vocabulary.VocabularyLookup], rb: pa.RecordBatch
) -> TransformedBatch:
    """Transforms a raw batch into the trainer's columns; computes no statistics.

    Rows without a usable label are dropped (rulebook L1); dense values are filled (D1-D5),
    categorical values split into tokens and looked up (T1-T7, W1).

    Args:
      cfg: the pipeline configuration (label, features, tables).
      lookups: table name -> its lookup (`make_lookups`, `load_lookups`).
      rb: raw rows as tf.Examples decode (list columns) or as the CLI's CSV reader gives them
        (flat columns), shape [num_raw] rows.

    Returns:
      The `TransformedBatch`: `batch` holds the labelled rows (None when there is none), `keep`
      says which raw rows they are.
    """
    labels = features.extract_label(column(rb, cfg.label), rb.num_rows)
    keep = labels.keep
    kept = rb.filter(pa.array(keep)) if not keep.all() else rb
    n = kept.num_rows
    ones = np.ones(n, np.int64)
    columns: Dict[str, pa.Array] = {cfg.label: as_list_array(labels.values[keep], ones)}
    dense: Dict[str, features.DenseValues] = {}
    for d in cfg.dense_features:
        dense[d.name] = features.extract_dense(column(kept, d.source), n, d.fill_value)
        columns[d.name] = as_list_array(dense[d.name].values, ones)
    categorical: Dict[str, CategoricalColumn] = {}
    for f in cfg.categorical_features:
        c = categorical[f.name] = _extract_categorical(cfg, lookups, f, kept)
        columns[f.name] = as_list_array(c.ids, c.ids_per_row)
        if c.weights is not None:  # W1: each ID weighs its row's weight
            columns[weights_key(f.name)] = as_list_array(c.weights[c.tokens.row].astype(np.float32), c.ids_per_row)
    batch = pa.RecordBatch.from_arrays(list(columns.values()), list(columns.keys())) if n else None
    return TransformedBatch(batch, keep, labels, dense, categorical)


def to_blocks(cfg: PipelineConfig, rb: pa.RecordBatch, block_rows: int) -> pa.RecordBatch:
    """A transformed batch (`transform_batch`'s) -> one row per block of `block_rows`
    consecutive rows (the last block holds the rest), in the `blocks` layout of
    `contracts.manifest`: each column's values of the block's rows as one list, plus each
    categorical feature's IDs per row (`row_lengths_key`). Encoded, each row is one tf.Example.
    Vectorised: the block boundaries only re-cut the columns' offsets; no value is copied per row."""
    n = rb.num_rows
    starts = np.unique(np.minimum(np.arange(0, n + block_rows, block_rows), n))  # [0, b, 2b, ..., n]
    row_cuts = pa.array(starts.astype(np.int32))
    categorical = {f.name: weights_key(f.name) if f.weight_column else None for f in cfg.categorical_features}
    # A categorical feature's cuts serve its weights too (transform_batch puts the weights after it).
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
    the columns `transform_batch` writes. `cfg_or_manifest`: a PipelineConfig or a
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
