"""The CPU serving graph: raw feature values in, click probability out.

`RawFeatureTransform` implements the rulebook (`components.rulebook`, whose case table
`tests/test_rulebook.py` runs through this graph's two signatures and through preprocessing's
pyarrow code) with TensorFlow ops: tokens (T1-T7: kinds, multi-hot splitting, empty and invalid
tokens dropped, truncation to `max_length`), JSON strings (J1-J3: integer columns normalised as
int64 values), IDs (V1-V2: a `tf.lookup.StaticHashTable` of the vocabulary, then farmhash
Fingerprint64 buckets for the misses, as `tf.lookup.StaticVocabularyTable` computes them) and
dense values (D1-D5: missing, NaN and infinite values filled). Vocabulary files become SavedModel
assets.

`ServingModule` wraps the transform and a `RankingModel` built without optimizer (so no slot
variables exist) and exposes two signatures:
- `serving_default(examples)`: a batch of serialized tf.Examples with the raw columns as
  ExampleGen stored them;
- `serve_features(**columns)`: one tensor per raw column for JSON/REST clients: categorical
  columns as strings (multi-hot values joined by the separator, '' when missing), dense columns
  as float32 (NaN when missing).
Both return {"probabilities": float32 [batch, 1]}.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Dict

import components  # noqa: F401
import tensorflow as tf

from components import rulebook as R
from components.contracts.manifest import CategoricalFeatureEntry, VocabularyManifest

_DTYPES = {R.KIND_BYTES: tf.string, R.KIND_INT: tf.int64, R.KIND_FLOAT: tf.float32}


def _keep(values: tf.RaggedTensor, mask: tf.Tensor) -> tf.RaggedTensor:
    """The values of a [batch, None] ragged tensor where `mask` (one bool per flat value) is true,
    row by row: what `tf.ragged.boolean_mask(values, values.with_flat_values(mask))` returns.
    Written out because the library ops (ragged and dense boolean_mask, value_rowids), general
    over ranks and shapes, add hundreds of graph ops per call, and tracing the two serving
    signatures (every feature, several masks each) made up most of the export's save time;
    this is a handful of ops on the row splits."""
    kept_before = tf.concat([[0], tf.cumsum(tf.cast(mask, tf.int64))], 0)  # kept values before each position
    return tf.RaggedTensor.from_row_splits(
        tf.gather(values.flat_values, tf.where(mask)[:, 0]),
        tf.gather(kept_before, values.row_splits),
        validate=False,
    )


def _first_or_nan(values: tf.RaggedTensor) -> tf.Tensor:
    """float32 [batch, 1]: each row's first value, NaN for an empty row (what
    `values[:, :1].to_tensor(default_value=nan)` gives, in a handful of ops)."""
    flat = tf.concat([tf.cast(values.flat_values, tf.float32), [float("nan")]], 0)  # [-1]: an empty row
    starts = tf.where(values.row_lengths() > 0, values.row_starts(), tf.shape(flat, out_type=tf.int64)[0] - 1)
    return tf.expand_dims(tf.gather(flat, starts), 1)


def _first_n(values: tf.RaggedTensor, n: int) -> tf.RaggedTensor:
    """The first `n` values of each row (what `values[:, :n]` gives)."""
    index = tf.range(tf.size(values.flat_values, out_type=tf.int64))
    row = tf.searchsorted(values.row_splits, index, side="right") - 1  # the row of each flat value
    return _keep(values, index - tf.gather(values.row_splits, row) < n)


def _split(values: tf.RaggedTensor, separator: str) -> tf.RaggedTensor:
    """Every value split at `separator`, the pieces kept in their row (what
    `tf.strings.split(values, separator).merge_dims(1, 2)` gives, without the general merge)."""
    pieces = tf.strings.split(values.flat_values, separator)
    return tf.RaggedTensor.from_row_splits(
        pieces.flat_values, tf.gather(pieces.row_splits, values.row_splits), validate=False
    )


def _valid_tokens(flat: tf.Tensor) -> tf.Tensor:
    """Rulebook T5-T6: non-empty, valid UTF-8, no line break (one bool per token)."""
    nonempty = tf.strings.length(flat) > 0
    utf8 = tf.equal(tf.strings.unicode_transcode(flat, "UTF-8", "UTF-8", errors="ignore"), flat)
    no_break = tf.logical_not(tf.strings.regex_full_match(flat, "(?s).*[\r\n].*"))
    return nonempty & utf8 & no_break


def _fits_int64(digits: tf.Tensor) -> tf.Tensor:
    """Whether decimal digits without leading zeros are at most INT64_MAX, without converting a
    longer number (tf.strings.to_number fails on overflow): the first 18 digits and the 19th."""
    n = tf.strings.length(digits)
    head = tf.strings.to_number(tf.strings.substr(digits, 0, 18), tf.int64)  # never overflows
    nineteenth = tf.strings.to_number(tf.strings.substr(tf.strings.join([digits, "0" * 19]), 18, 1), tf.int64)
    top, last = divmod(R.INT64_MAX, 10)
    return (n < 19) | ((n == 19) & ((head < top) | ((head == top) & (nineteenth <= last))))


def _int_texts(values: tf.RaggedTensor) -> tf.RaggedTensor:
    """Rulebook J2: JSON strings of an int64 column -> the decimal text preprocessing makes of the
    int64 value each stands for (`rulebook.int_text_value`); no value, `negative_int` and
    `not_integer` strings are dropped."""
    values = values.with_flat_values(tf.strings.strip(values.flat_values))
    values = _keep(values, tf.strings.regex_full_match(values.flat_values, R.INTEGER_TEXT.decode()))
    negative = tf.strings.regex_full_match(values.flat_values, "-0*[1-9][0-9]*")
    digits = tf.strings.regex_replace(values.flat_values, "^[+-]?0*([0-9])", r"\1")  # sign and leading zeros off
    return _keep(values.with_flat_values(digits), tf.logical_not(negative) & _fits_int64(digits))


class RawFeatureTransform(tf.Module):
    """Raw columns -> model inputs (dense float32 [B,1], categorical int64 SparseTensor [B, None])."""

    def __init__(self, manifest: VocabularyManifest, vocabulary_dir: str):
        super().__init__(name="raw_feature_transform")
        self._manifest = manifest
        self.kinds = dict(manifest.raw_feature_kinds)
        self.tables = {}
        for name, v in manifest.vocabularies.items():
            initializer = tf.lookup.TextFileInitializer(
                os.path.join(vocabulary_dir, v.file),
                key_dtype=tf.string,
                key_index=tf.lookup.TextFileIndex.WHOLE_LINE,
                value_dtype=tf.int64,
                value_index=tf.lookup.TextFileIndex.LINE_NUMBER,
            )
            # The vocabulary part of V1-V2; OOV buckets are computed in `_ids` for the misses only
            # (what StaticVocabularyTable.lookup computes for every token, hashing them all).
            self.tables[name] = tf.lookup.StaticHashTable(initializer, default_value=-1)

    def raw_columns(self):
        return self._manifest.raw_columns()

    def dense_columns(self):
        return {d.column for d in self._manifest.dense_features}

    def example_spec(self) -> Dict[str, Any]:
        """Every raw column as a [batch, None] ragged feature (a missing feature: an empty row)."""
        return {c: tf.io.RaggedFeature(_DTYPES[self.kinds[c]], row_splits_dtype=tf.int64) for c in self.raw_columns()}

    def from_examples(self, serialized: tf.Tensor) -> Dict[str, Any]:
        return self._to_model_inputs(tf.io.parse_example(serialized, self.example_spec()))

    def from_feature_tensors(self, columns: Dict[str, tf.Tensor]) -> Dict[str, Any]:
        """One value per row: strings for categorical ('' = missing), floats for dense (NaN = missing)."""
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
        if raw_kind == R.KIND_FLOAT:  # T3, J3: floats are invalid categorical values: no tokens
            return tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.string), tf.zeros([values.nrows()], tf.int64)), False
        if raw_kind == R.KIND_INT and from_json:  # J2: each string stands for an int64 value
            if f.separator is not None:
                values = _split(values, f.separator)
            values = _int_texts(values)
        elif raw_kind == R.KIND_INT:  # T2: the decimal text; negative integers are invalid
            values = _keep(values, values.flat_values >= 0)
            values = values.with_flat_values(tf.strings.as_string(values.flat_values))
        if f.separator is not None:
            values = _split(values, f.separator)
        return values, raw_kind != R.KIND_INT or f.separator is not None

    def _ids(self, tokens: tf.RaggedTensor, f: CategoricalFeatureEntry, check: bool) -> tf.RaggedTensor:
        """Tokens -> embedding IDs: V1 (vocabulary line), V2 (OOV bucket), T5-T6 (invalid tokens
        dropped) and T7 (the first `max_length` valid tokens). A token found in the vocabulary is
        valid (preprocessing counts valid tokens only), so the validity checks and the OOV hash
        run on the tokens the vocabulary misses, not on every token: on raw eval rows of the demo
        model they were most of the transform's time at batch 1024."""
        table = self.tables[f.table]
        flat = tokens.flat_values
        ids = table.lookup(flat)
        miss = tf.where(ids < 0)
        missed = tf.gather(flat, miss[:, 0])
        oov = table.size() + tf.strings.to_hash_bucket_fast(missed, self._manifest.vocabularies[f.table].num_oov_buckets)
        ids = tokens.with_flat_values(tf.tensor_scatter_nd_update(ids, miss, oov))
        if check:
            ids = _keep(ids, tf.tensor_scatter_nd_update(tf.ones(tf.shape(flat), tf.bool), miss, _valid_tokens(missed)))
        if f.max_length is not None:
            ids = _first_n(ids, f.max_length)
        return ids

    def _to_model_inputs(self, raw: Dict[str, tf.RaggedTensor], from_json: bool = False) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for d in self._manifest.dense_features:
            values = raw[d.column]
            kind = R.KIND_FLOAT if from_json else self.kinds[d.column]
            if kind == R.KIND_BYTES:  # D5: non-numeric column: every value is filled
                first = tf.fill([values.nrows(), 1], tf.constant(float("nan"), tf.float32))
            else:
                first = _first_or_nan(values)
            # D1-D4: the first value; NaN, inf and numbers beyond float32 are filled.
            out[d.name] = tf.where(tf.math.is_finite(first), first, tf.constant(d.fill_value, tf.float32))
        for f in self._manifest.categorical_features:
            tokens, check = self._tokens(raw[f.column], f, from_json)
            out[f.name] = self._ids(tokens, f, check).to_sparse()
        return out


class ServingModule(tf.Module):
    """What the serving SavedModel holds: the raw-feature transform and the CPU model."""

    def __init__(self, model: tf.keras.Model, transform: RawFeatureTransform):
        super().__init__(name="serving_module")
        self.model = model
        self.transform = transform
        columns = transform.raw_columns()
        dense_columns = transform.dense_columns()
        feature_spec = {
            c: tf.TensorSpec([None], tf.float32 if c in dense_columns else tf.string, name=c) for c in columns
        }

        # autograph off: the graph is plain ops over static Python loops, and converting the Keras
        # model code costs most of the export time.
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")], autograph=False)
        def serve_examples(examples):
            return {"probabilities": self.model(self.transform.from_examples(examples))}

        @tf.function(input_signature=[feature_spec], autograph=False)
        def serve_features(columns):
            return {"probabilities": self.model(self.transform.from_feature_tensors(columns))}

        self.serve_examples = serve_examples
        self.serve_features = serve_features

    def signatures(self) -> Dict[str, Any]:
        """The tf.functions themselves, not concrete functions: `tf.saved_model.save` traces them
        inside its save context, and a trace made outside it is not reused there (the save
        context's variable policy is part of tf.function's cache key,
        tensorflow/python/eager/polymorphic_function/function_context.py), so each signature
        would be traced twice."""
        return {"serving_default": self.serve_examples, "serve_features": self.serve_features}


def save_serving_model(module: ServingModule, path: str) -> None:
    """tf.saved_model.save without Keras' per-layer call traces (`save_traces=False`, what
    `model.save(save_traces=False)` does): the serving signatures are the module's own functions,
    and tracing every Keras layer again took most of the export time (52 s of 110 s on the demo).
    The scope is tf-keras' own (private) switch; without it the save is only slower."""
    try:
        from tf_keras.src.saving.legacy.saved_model.utils import keras_option_scope

        scope = keras_option_scope(save_traces=False, in_tf_saved_model_scope=True)
    except ImportError:  # another tf-keras layout: same result, slower
        scope = contextlib.nullcontext()
    with scope:
        tf.saved_model.save(module, path, signatures=module.signatures())
