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

from components.config.schema import CategoricalFeature, PipelineConfig
from components.contracts.manifest import weights_key
from components.data_io.blocks import as_list_array
from components.embedding_preprocess import features
from components.contracts import artifacts
from components.planning.sizing import table_layout
from components.embedding_preprocess import vocabulary
from components.config.choices import VocabularyKind


def column(rb: pa.RecordBatch, name: str) -> Optional[pa.Array]:
    """The column `name` of `rb`, or None when the batch has none (no example held the feature)."""
    i = rb.schema.get_field_index(name)
    return rb.column(i) if i >= 0 else None


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


