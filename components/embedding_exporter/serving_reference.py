"""The serving transform feature by feature: every categorical feature through its own ops
(split, lookup, validity, truncation, to_sparse), every dense column through its own.

Kept as the oracle `tests/test_serving_transform.py` compares the fused transform of
`components.embedding_exporter.serving` against, value for value, on every rulebook case and on
messy rows of every kind, and as the baseline `bench/trace_bench.py` and
`bench/export_bench.py latency` measure it against. Not used by the exporter.
"""
from __future__ import annotations

from typing import Any, Dict

import components  # noqa: F401
import tensorflow as tf

from components.rules import rulebook
from components.contracts.manifest import CategoricalFeatureEntry, VocabularyManifest
from components.embedding_exporter.ragged_rows import first_or_nan, keep_values
from components.embedding_exporter.serving import RawFeatureTransform
from components.embedding_exporter.token_checks import int_texts, valid_tokens
from components.config.choices import VocabularyKind


def _split(values: tf.RaggedTensor, separator: str) -> tf.RaggedTensor:
    """Every value split at `separator`, the pieces kept in their row: TensorFlow's own ragged
    split and merge (the oracle for ragged_rows.split_values)."""
    return tf.strings.split(values, separator).merge_dims(1, 2)


def _first_n(values: tf.RaggedTensor, n: int) -> tf.RaggedTensor:
    """The first `n` values of each row (what `values[:, :n]` gives)."""
    index = tf.range(tf.size(values.flat_values, out_type=tf.int64))
    row = tf.searchsorted(values.row_splits, index, side="right") - 1  # the row of each flat value
    return keep_values(values, index - tf.gather(values.row_splits, row) < n)



class FeatureByFeatureTransform(RawFeatureTransform):
    """Raw columns -> model inputs (dense float32 [B,1], categorical int64 SparseTensor [B, None]),
    feature by feature. The columns and parsing spec are the fused transform's; every table is
    looked up by string.

    Args:
      manifest: the vocabulary manifest (features, tables, raw column kinds).
      vocabulary_dir: the directory holding the vocabulary files.
    """

    def __init__(self, manifest: VocabularyManifest, vocabulary_dir: str):
        super().__init__(manifest, vocabulary_dir, integer_tables=False)

    def from_examples(self, serialized: tf.Tensor) -> Dict[str, Any]:
        """Transforms serialized raw tf.Examples.

        Args:
          serialized: string [batch].

        Returns:
          {feature name: float32 [batch, 1] (dense) or int64 SparseTensor [batch, None] (categorical)}.
        """
        return self._to_model_inputs(tf.io.parse_example(serialized, self.example_spec()))

    def from_feature_tensors(self, columns: Dict[str, tf.Tensor]) -> Dict[str, Any]:
        """Transforms one tensor per raw column, as the JSON signature takes them.

        Args:
          columns: {column: [batch]}: strings for categorical ('' = missing), float32 for dense
            (NaN = missing).

        Returns:
          {feature name: float32 [batch, 1] (dense) or int64 SparseTensor [batch, None] (categorical)}.
        """
        ragged = {}
        for c, t in columns.items():
            if t.dtype == tf.string:
                present = tf.strings.length(t) > 0
            else:
                present = tf.logical_not(tf.math.is_nan(t))
            ragged[c] = tf.RaggedTensor.from_row_lengths(
                tf.boolean_mask(t, present), tf.cast(present, tf.int64), validate=False
            )
        return self._to_model_inputs(ragged, from_json=True)

    def _tokens(self, values: tf.RaggedTensor, f: CategoricalFeatureEntry, from_json: bool):
        """Raw values (or JSON strings) of one categorical column -> its tokens per row, rulebook
        T1-T4 (J1-J3), and whether they still need T5-T6 (decimal texts of integers, unsplit, are
        valid by construction). `_ids` applies T5-T7."""
        raw_kind = self.kinds[f.column]
        if raw_kind == rulebook.KIND_FLOAT:  # T3, J3: floats are invalid categorical values: no tokens
            return tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.string), tf.zeros([values.nrows()], tf.int64)), False
        if raw_kind == rulebook.KIND_INT and from_json:  # J2: each string stands for an int64 value
            if f.separator is not None:
                values = _split(values, f.separator)
            values = int_texts(values)
        elif raw_kind == rulebook.KIND_INT:  # T2: the decimal text; negative integers are invalid
            values = keep_values(values, values.flat_values >= 0)
            values = values.with_flat_values(tf.strings.as_string(values.flat_values))
        if f.separator is not None:
            values = _split(values, f.separator)
        return values, raw_kind != rulebook.KIND_INT or f.separator is not None

    def _ids(self, tokens: tf.RaggedTensor, f: CategoricalFeatureEntry, check: bool) -> tf.RaggedTensor:
        """Tokens -> embedding IDs: V1 (vocabulary line), V2 (OOV bucket), T5-T6 (invalid tokens
        dropped) and T7 (the first `max_length` valid tokens). A token found in the vocabulary is
        valid (preprocessing counts valid tokens only), so the validity checks and the OOV hash
        run on the tokens the vocabulary misses, not on every token."""
        v = self._manifest.vocabularies[f.table]
        flat = tokens.flat_values
        ids = self.lookup(f.table, flat)
        miss = tf.where(ids < 0)
        missed = tf.gather(flat, miss[:, 0])
        if v.kind == VocabularyKind.IDENTITY:  # V4: the default row, or dropped (checked with T5-T6, before T7)
            oov = tf.fill(tf.shape(missed, out_type=tf.int64), tf.constant(v.default_value or 0, tf.int64))
            if v.default_value is None:
                check = True
        else:
            oov = v.size + tf.strings.to_hash_bucket_fast(missed, v.num_oov_buckets)
        ids = tokens.with_flat_values(tf.tensor_scatter_nd_update(ids, miss, oov))
        if check:
            valid = valid_tokens(missed) if missed.dtype == tf.string else tf.ones(tf.shape(missed), tf.bool)
            if v.kind == VocabularyKind.IDENTITY and v.default_value is None:
                valid = tf.zeros(tf.shape(missed), tf.bool)
            ids = keep_values(ids, tf.tensor_scatter_nd_update(tf.ones(tf.shape(flat), tf.bool), miss, valid))
        if f.max_length is not None:
            ids = _first_n(ids, f.max_length)
        return ids

    def _to_model_inputs(self, raw: Dict[str, tf.RaggedTensor], from_json: bool = False) -> Dict[str, Any]:
        if self._manifest.weighted_names:
            raise NotImplementedError("the feature-by-feature reference has no weighted IDs (W1); "
                                      "tests/test_rulebook.py checks RawFeatureTransform's weights")
        out: Dict[str, Any] = {}
        for d in self._manifest.dense_features:
            values = raw[d.column]
            kind = rulebook.KIND_FLOAT if from_json else self.kinds[d.column]
            if kind == rulebook.KIND_BYTES:  # D5: non-numeric column: every value is filled
                first = tf.fill([values.nrows(), 1], tf.constant(float("nan"), tf.float32))
            else:
                first = first_or_nan(values)
            # D1-D4: the first value; NaN, inf and numbers beyond float32 are filled.
            out[d.name] = tf.where(tf.math.is_finite(first), first, tf.constant(d.fill_value, tf.float32))
        for f in self._manifest.categorical_features:
            tokens, check = self._tokens(raw[f.column], f, from_json)
            out[f.name] = self._ids(tokens, f, check).to_sparse()
        return out
