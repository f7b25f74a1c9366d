"""The CPU serving graph: raw feature values in, click probability out.

`RawFeatureTransform` implements the rulebook (`components.rules.rulebook`, whose case table
`tests/test_rulebook.py` runs through this graph's two signatures and through preprocessing's
pyarrow code) with TensorFlow ops: tokens (T1-T7: kinds, multi-hot splitting, empty and invalid
tokens dropped, truncation to `max_length`), JSON strings (J1-J3: integer columns normalised as
int64 values), IDs (V1-V2: a `tf.lookup.StaticHashTable` of the vocabulary, then farmhash
Fingerprint64 buckets for the misses, as `tf.lookup.StaticVocabularyTable` computes them) and
dense values (D1-D5: missing, NaN and infinite values filled). Vocabulary files become SavedModel
assets. Its ragged row operations live in `ragged_rows`, its token checks (T5-T6, J2, V4) in
`token_checks`.

`ServingModule` wraps the transform and a `RankingModel` built without optimizer (so no slot
variables exist) and exposes two signatures:
- `serving_default(examples)`: a batch of serialized tf.Examples with the raw columns as
  ExampleGen stored them: each column parsed as the type preprocessing read it as (the
  manifest's `raw_feature_kinds`), so a stock ExampleGen's int64 columns parse as int64; a batch
  with tf.Examples that hold none of the model's columns (misnamed keys: each scores the same
  constant) prints a warning to the server's stderr (`log_featureless`);
- `serve_features(**columns)`: one tensor per raw column for JSON/REST clients: categorical
  columns as strings (multi-hot values joined by the separator, '' when missing), dense columns
  as float32 (NaN when missing); each input named by the one rule of
  `components.rules.names` (the column itself when it is a valid name; `Class Name` is sent
  as `Class_Name`), which the exporter records with the model;
- `serve_typed_features(**columns)` (models with int64 categorical columns): the same, with those
  columns as int64 numbers, one per row (a negative number when missing, dropped as T2 drops it).
Both return {"probabilities": float32 [batch, 1]}.
"""
from __future__ import annotations

import functools
import math
import os
import sys
import uuid
from typing import Any, Dict, List, Set, Tuple

import components  # noqa: F401
import tensorflow as tf

from components.rules import rulebook
from components.contracts.manifest import CategoricalFeatureEntry, VocabularyManifest, weights_key
from components.contracts.serving_inputs import ServingInput
from components.embedding_model.dense_tower import BATCH_KEY, DENSE_KEY
from components.embedding_model.serving_model import fused_key
from components.embedding_exporter.ragged_rows import (first_or_nan, keep_values, present_rows, searchsorted,
                                                       split_values, stack_rows)
from components.embedding_exporter.token_checks import (decimal_int64_lines, identity_ids, int_texts, plain_tokens,
                                                        unless_valid)
from components.config.choices import VocabularyKind

_DTYPES = {rulebook.KIND_BYTES: tf.string, rulebook.KIND_INT: tf.int64, rulebook.KIND_FLOAT: tf.float32}
_JSON_DTYPES = {"string": tf.string, "float32": tf.float32, "int64": tf.int64}  # ServingInput.dtype / typed_dtype


class _OwnTableInitializer(tf.lookup.TextFileInitializer):
    """A vocabulary file's initializer whose table has a shared name of its own.

    Not TF's default name: it is made of the file name (hash_table_<file>_<key index>_<value
    index>), so in eager mode a table would be shared with every other table of that file in the
    process, whatever its key dtype. Not an anonymous table either: an anonymous table's op makes a
    new, empty table each time a session runs it, and session-based loaders (TFX's BulkInferrer,
    through tfx_bsl's RunInference; TF Serving's C++ loader) run the SavedModel's init op and each
    lookup in separate runs: every lookup fails with `Table not initialized`
    (tests/test_bulk_inferrer.py). A name of its own behaves as the anonymous table does in eager
    mode and is one table per session. (TextFileInitializer has no argument for the name; TF reads
    this property when the table is built.)
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._own_name = f"vocabulary_table_{uuid.uuid4().hex}"

    @property
    def _shared_name(self) -> str:
        return self._own_name


def vocabulary_lines(v) -> int:
    """Counts the lines of a table's vocabulary file.

    Args:
      v: the table's manifest entry.

    Returns:
      Its vocabulary's lines; 0 for hashed and identity tables, which have none (V3-V4).
    """
    return 0 if v.kind in (VocabularyKind.HASHED, VocabularyKind.IDENTITY) else v.size


# A fused group's IDs are pooled in this many parts (contiguous runs of features, one segment op
# each), which two threads run side by side.
_POOL_PARTS = 2

# Categorical features are cut into this many shards, each fused on its own: the shards' ops are
# independent, so two inter-op threads can run them side by side (at the cost of twice the fused
# ops, which small batches feel).
_SHARDS = 2


def _stack_offsets(order, fused) -> List[int]:
    """Each feature's table offset in its stack (`fused`: `_categorical`'s pair); 0 unfused."""
    offset = {n: o for part in fused[1] for n, o in zip(part.features, part.offsets)} if fused else {}
    return [offset.get(f.name, 0) for f in order]


class RawFeatureTransform(tf.Module):
    """Raw columns -> model inputs (dense float32 [B,1], categorical int64 SparseTensor [B, None]).

    Only what depends on a feature's own column, kind, separator and table runs feature by
    feature (parsing, T1-T4, the vocabulary lookup: one op each for a plain string column); the
    rest runs once for all features on their IDs stacked into one ragged tensor of (features x
    batch) rows: misses, validity (T5-T6), OOV buckets (V2, one hash per bucket count), truncation
    (T7) and the cut into per-feature SparseTensors; dense columns are stacked the same way. So
    the number of ops, whose per-op overhead dominates at small batches, does not grow with every
    feature. The feature-by-feature form is the test oracle:
    `serving_reference.FeatureByFeatureTransform`.

    Args:
      manifest: the vocabulary manifest (features, tables, raw column kinds).
      vocabulary_dir: the directory holding the vocabulary files (they become SavedModel assets).
      integer_tables: look tables up by int64 value where every feature reading them allows it;
        False: every table by string.
    """

    def __init__(self, manifest: VocabularyManifest, vocabulary_dir: str, integer_tables: bool = True):
        super().__init__(name="raw_feature_transform")
        self._manifest = manifest
        self.kinds = dict(manifest.raw_feature_kinds)
        features_of: Dict[str, List[CategoricalFeatureEntry]] = {}
        for f in manifest.categorical_features:
            features_of.setdefault(f.table, []).append(f)
        # Tables looked up by int64 value: every feature of the table reads an int64 column, and no
        # separator has a digit (so T2's decimal text is never split, and T1-T4 leave the value
        # as it is). Their vocabulary lines are the decimal texts of those values (T2).
        # Checked against the file: the table must map each value to the line its text has.
        self.integer_tables = {
            t for t, fs in features_of.items()
            if integer_tables and all(
                self.kinds[f.column] == rulebook.KIND_INT and not any(c.isdigit() for c in f.separator or "") for f in fs)
            and decimal_int64_lines(os.path.join(vocabulary_dir, manifest.vocabularies[t].file))
        }
        self._vocabulary_dir = vocabulary_dir
        self.tables = {name: self._table(name) for name, v in manifest.vocabularies.items() if vocabulary_lines(v)}
        # (table, offset) -> the table with `offset` added to every row (`fuse`: fused features
        # look their IDs up as rows of their stack, with no per-ID add).
        self.offset_tables: Dict[str, Any] = {}
        # tf.Module's private `_no_dependency` (TF has no public NoDependency wrapper): these
        # containers point at tables tracked in `tables` / `offset_tables`, and tracking them again
        # would add second paths to the same objects in the SavedModel's object graph.
        self._offset_of: Dict[Tuple[str, int], str] = self._no_dependency({})
        # Per table, what a token that misses its vocabulary gets (V2-V4): the first OOV row
        # (size; default_value for an identity table), the number of OOV buckets, and whether
        # it is dropped instead (an identity table without default_value).
        self._miss_row = {t: (v.default_value or 0) if v.kind == VocabularyKind.IDENTITY else v.size for t, v in manifest.vocabularies.items()}
        self._miss_buckets = {t: 1 if v.kind == VocabularyKind.IDENTITY else v.num_oov_buckets for t, v in manifest.vocabularies.items()}
        self._miss_dropped = {t: v.kind == VocabularyKind.IDENTITY and v.default_value is None for t, v in manifest.vocabularies.items()}
        # Stacked in this order: features of string tables, then of integer tables.
        self._order = self._ordered(manifest.categorical_features)
        # Per fused group: the chunks the model pools (contiguous parts) and the group's entries, in
        # stacking order (set by `fuse`).
        self._chunks: List[Tuple[Any, List[CategoricalFeatureEntry]]] = self._no_dependency([])  # as above

    def _table(self, name: str, offset: int = 0) -> tf.lookup.StaticHashTable:
        """A vocabulary table: each line's row (plus `offset`), -1 for other tokens."""
        v = self._manifest.vocabularies[name]
        initializer = _OwnTableInitializer(
            os.path.join(self._vocabulary_dir, v.file),
            key_dtype=tf.int64 if name in self.integer_tables else tf.string,
            key_index=tf.lookup.TextFileIndex.WHOLE_LINE,
            value_dtype=tf.int64,
            value_index=tf.lookup.TextFileIndex.LINE_NUMBER,
            value_index_offset=offset,
        )
        # The vocabulary part of V1-V2; OOV buckets are computed for the misses only (what
        # StaticVocabularyTable.lookup computes for every token, hashing them all). A shared name
        # of its own (_OwnTableInitializer), not an anonymous table: see there.
        return tf.lookup.StaticHashTable(initializer, default_value=-1)

    def _ordered(self, features) -> List[CategoricalFeatureEntry]:
        """Features of string tables, then of integer tables (the order `_categorical` stacks)."""
        return [f for f in features if f.table not in self.integer_tables] + [
            f for f in features if f.table in self.integer_tables]

    def fuse(self, groups) -> list:
        """Fuses the features the model pools together: one transform pass per group.

        A group's features go in stacking order (those with `max_length` first), cut into
        `_POOL_PARTS` contiguous parts (chunks). From then on their IDs leave as one (rows,
        segments) pair per chunk (`model.fused_key`) instead of a SparseTensor per feature,
        looked up as rows of the stack: each (table, offset) gets a table whose rows start at the
        offset (no per-ID add), and the tables no feature reads at offset 0 any more are dropped.

        Args:
          groups: the model's serving fusion groups (`FusedChunk`s: stack, combiner, features,
            table offsets).

        Returns:
          The chunks (`FusedChunk`s), for the model's `set_serving_chunks`.
        """
        entries = {f.name: f for f in self._manifest.categorical_features}
        fused = []
        for group in groups:
            offset = dict(zip(group.features, group.offsets))
            # limited features (max_length) first, so T7 runs over a prefix of the chunk's IDs
            ordered = self._ordered(sorted((entries[n] for n in group.features), key=lambda f: f.max_length is None))
            size = -(-len(ordered) // _POOL_PARTS)
            parts = [ordered[i:i + size] for i in range(0, len(ordered), size)]
            fused.append(([group._replace(features=tuple(f.name for f in part),
                                          offsets=tuple(offset[f.name] for f in part)) for part in parts], ordered))
        self._chunks = self._no_dependency(fused)  # private, as in __init__: no second path
        offsets = {n: o for parts, _ in fused for part in parts for n, o in zip(part.features, part.offsets)}
        for f in self._manifest.categorical_features:
            o = offsets.get(f.name, 0)
            if o and f.table in self.tables and (f.table, o) not in self._offset_of:
                key = f"{f.table}@{o}"
                self._offset_of[(f.table, o)] = key
                self.offset_tables[key] = self._table(f.table, o)
        unused = {t for t in self.tables} - {f.table for f in self._manifest.categorical_features if not offsets.get(f.name)}
        for t in unused:  # every feature of the table reads it at an offset
            del self.tables[t]
        return [c for parts, _ in fused for c in parts]

    def lookup(self, table: str, flat: tf.Tensor, offset: int = 0) -> tf.Tensor:
        """Looks tokens up in a table's vocabulary (V1, V4).

        Args:
          table: the table's name.
          flat: tokens, string (or int64 for an integer or identity table), shape [n].
          offset: added to every found row (the table's offset in its stack); `fuse` must have
            made a table for a non-zero offset.

        Returns:
          int64 [n]: each found token's row plus `offset`; -1 for the others.
        """
        v = self._manifest.vocabularies[table]
        if v.kind == VocabularyKind.IDENTITY:
            ids = identity_ids(flat, v.size)  # an identity table's size is its num_buckets
            return tf.where(ids >= 0, ids + offset, ids) if offset else ids
        if not vocabulary_lines(v):  # no vocabulary lines: every token misses
            return tf.fill(tf.shape(flat, out_type=tf.int64), tf.constant(-1, tf.int64))
        # (a KeyError here: `fuse` made no table for this offset, or dropped the offset-0 one)
        handle = (self.offset_tables[self._offset_of[(table, offset)]] if offset else self.tables[table]).resource_handle
        # The table op itself with the default in the graph: `StaticHashTable.lookup` passes its
        # default as an eager tensor, which every signature captures and every call feeds in
        # (one input per table, bound in Python at each call).
        ids = tf.raw_ops.LookupTableFindV2(table_handle=handle, keys=flat, default_value=tf.constant(-1, tf.int64))
        ids.set_shape(flat.shape)  # what the table's own lookup sets (the op's shape function does not know it)
        return ids

    def raw_columns(self) -> List[str]:
        """Lists the raw columns the model reads.

        Returns:
          The manifest's raw columns: the serving signatures' inputs.
        """
        return self._manifest.raw_columns()

    def dense_columns(self) -> Set[str]:
        """Finds the numeric columns: dense features and ID weights.

        Returns:
          The set of their names (float32 inputs of the JSON signature).
        """
        return self._manifest.numeric_columns()

    def serving_inputs(self) -> List[ServingInput]:
        """The JSON signatures' inputs: each raw column's input name, dtype and features.

        Returns:
          The manifest's `serving_inputs` (the one naming rule, `components.rules.names`),
          `integer_columns` typed int64 for `serve_typed_features`.
        """
        return self._manifest.serving_inputs(self.integer_columns())

    def integer_columns(self) -> List[str]:
        """Finds the int64 columns read only by categorical features.

        `serve_typed_features` takes them as int64 numbers: one value per row then holds what a
        JSON client sends.

        Returns:
          Their names, sorted.
        """
        return sorted({f.column for f in self._manifest.categorical_features if self.kinds[f.column] == rulebook.KIND_INT}
                      - self.dense_columns())

    def _oov_buckets(self, missed: tf.Tensor, feature: tf.Tensor, order) -> tf.Tensor:
        """V2: each missed token's OOV bucket in its table (`feature`: its index in `order`), with
        one hash for every bucket count: Fingerprint64 mod n is (Fingerprint64 mod L) mod n for
        every n dividing L, so one `to_hash_bucket_fast` by the counts' least common multiple
        serves them all (one hash per count if that multiple is beyond int64)."""
        counts = [self._miss_buckets[f.table] for f in order]
        if set(counts) == {1}:  # one OOV bucket: the row after the vocabulary
            return tf.zeros_like(feature)
        if len(set(counts)) == 1:
            return tf.strings.to_hash_bucket_fast(missed, counts[0])
        per_miss = tf.gather(tf.constant(counts, tf.int64), feature)
        lcm = math.lcm(*set(counts))
        if lcm <= rulebook.INT64_MAX:
            return tf.math.floormod(tf.strings.to_hash_bucket_fast(missed, lcm), per_miss)
        buckets = tf.zeros_like(feature)
        for count in sorted(set(counts) - {1}):
            buckets = tf.where(per_miss == count, tf.strings.to_hash_bucket_fast(missed, count), buckets)
        return buckets

    def _row_weights(self, column, f: CategoricalFeatureEntry, from_json: bool) -> tf.Tensor:
        """W1: float32 [batch], each row's ID weight (its weight column's first value), NaN where
        the row's tokens are dropped (missing, NaN, infinite, negative, or a text column)."""
        values = column(f.weight_column)
        if not from_json and self.kinds[f.weight_column] == rulebook.KIND_BYTES:  # not numeric
            return tf.fill(tf.reshape(values.nrows(), [1]), float("nan"))
        w = first_or_nan(values)[:, 0]
        return tf.where(tf.math.is_finite(w) & (w >= 0), w, float("nan"))

    def example_spec(self) -> Dict[str, Any]:
        """Builds the parsing spec of the raw tf.Examples.

        Each column is parsed as the type the examples preprocessing read hold it as (the
        manifest's kinds: int64 where a stock ExampleGen wrote int64, float where it wrote float,
        bytes for text); `from_examples` casts numeric columns to float32 after parsing.

        Returns:
          {column: tf.io.RaggedFeature}: each a [batch, None] ragged feature (a missing feature:
          an empty row).
        """
        return {c: tf.io.RaggedFeature(_DTYPES[self.kinds[c]], row_splits_dtype=tf.int64) for c in self.raw_columns()}

    def from_examples(self, serialized: tf.Tensor) -> Dict[str, Any]:
        """Transforms serialized raw tf.Examples into the model's inputs (`serving_default`).

        Args:
          serialized: string [batch].

        Returns:
          The model's inputs: dense float32 [batch, 1] per feature (or one [batch, features]
          matrix under `model.DENSE_KEY`), categorical int64 SparseTensor [batch, None] per
          feature (fused: each chunk's rows and segments, and `model.BATCH_KEY`).
        """
        parsed = tf.io.parse_example(serialized, self.example_spec())

        def stacked(columns: List[str]) -> tf.RaggedTensor:
            return stack_rows([tf.cast(parsed[c], tf.float32) for c in columns])

        batch = tf.shape(serialized, out_type=tf.int64)[0]
        self.log_featureless(parsed, batch)
        return self._to_model_inputs(parsed.__getitem__, stacked, batch, False)

    def log_featureless(self, parsed: Dict[str, tf.RaggedTensor], batch: tf.Tensor) -> None:
        """Prints a warning to the server's stderr (PrintV2, a stock kernel) for a batch
        with tf.Examples that hold no value of any of the model's raw columns (misnamed keys, an
        empty Example): such a row is scored as every feature missing, the same constant for all,
        and nothing else would say so. One AddN of the columns' row splits and one reduction per
        batch; the log line only when there is such a row.

        Args:
          parsed: the parsed columns, [batch, None] ragged each (`example_spec`).
          batch: the batch size.
        """
        columns = self.raw_columns()
        if not columns:
            return
        splits = tf.add_n([parsed[c].row_splits for c in columns])  # values of any column before each row
        featureless = tf.reduce_sum(tf.cast(tf.equal(splits[1:], splits[:-1]), tf.int64))
        shown = ", ".join(columns[:5]) + (f", ... ({len(columns)} in all)" if len(columns) > 5 else "")

        def warn():
            tf.print("serving_default:", featureless, "of", batch, "tf.Examples hold none of the model's features "
                     f"({shown}): each is scored as a row with every feature missing (a constant); check the "
                     "request's feature keys", output_stream=sys.stderr)

        tf.cond(featureless > 0, warn, lambda: None)

    def from_feature_tensors(self, columns: Dict[str, tf.Tensor]) -> Dict[str, Any]:
        """Transforms one tensor per raw column into the model's inputs (the JSON signatures).

        Args:
          columns: {column: [batch]}, one value per row: strings for categorical ('' = missing),
            float32 for dense (NaN = missing), int64 for `integer_columns` in `serve_typed_features`
            (negative = missing).

        Returns:
          The model's inputs, as `from_examples` gives them.
        """

        def ragged(values: tf.Tensor) -> tf.RaggedTensor:
            if values.dtype == tf.int64:  # an integer column sent as numbers: every row one value
                # (a negative one, the way to send none, is dropped by T2 as in a tf.Example)
                return tf.RaggedTensor.from_row_lengths(values, tf.ones_like(values), validate=False)
            if values.dtype == tf.string:
                present = tf.strings.length(values) > 0
            else:
                present = tf.logical_not(tf.math.is_nan(values))
            return present_rows(values, present)

        def stacked(names: List[str]) -> tf.RaggedTensor:
            return ragged(tf.reshape(tf.stack([columns[c] for c in names]), [-1]))  # column after column

        batch = tf.shape(next(iter(columns.values())), out_type=tf.int64)[0]
        return self._to_model_inputs(lambda c: ragged(columns[c]), stacked, batch, True)

    def dense_from_feature_tensors(self, columns: Dict[str, tf.Tensor], batch: tf.Tensor) -> Dict[str, tf.Tensor]:
        """The dense features' model inputs alone (rulebook D1-D5, as `from_feature_tensors`
        applies them), for the dense store model (store_model.py): no table is reached.

        Args:
          columns: {dense column: float32 [batch]} (NaN = missing).
          batch: the batch size, int64 scalar.
        """
        def stacked(names: List[str]) -> tf.RaggedTensor:
            values = tf.reshape(tf.stack([columns[c] for c in names]), [-1])
            present = tf.logical_not(tf.math.is_nan(values))
            return present_rows(values, present)

        return self._dense(stacked, batch, True) if self._manifest.dense_features else {}

    def _tokens(self, values: tf.RaggedTensor, f: CategoricalFeatureEntry, from_json: bool) -> tf.RaggedTensor:
        """Raw values (or JSON strings) of one categorical column -> its tokens per row, rulebook
        T1-T4 (J1-J3): strings, or int64 values for a feature of an integer table (negative
        values kept: they miss the table and `_categorical` drops them, T2). T5-T7 follow in
        `_categorical`."""
        raw_kind = self.kinds[f.column]
        if raw_kind == rulebook.KIND_FLOAT:  # T3, J3: floats are invalid categorical values: no tokens
            return tf.RaggedTensor.from_row_splits(
                tf.zeros([0], tf.string), tf.zeros_like(values.row_splits), validate=False
            )
        integer_table = f.table in self.integer_tables
        if raw_kind == rulebook.KIND_INT and from_json and values.dtype == tf.string:  # J2: each string stands for an int64 value
            if f.separator is not None:
                values = split_values(values, f.separator)
            values = int_texts(values)
            if integer_table:  # the value itself (int_texts checked that it fits int64)
                return values.with_flat_values(tf.strings.to_number(values.flat_values, tf.int64))
        elif raw_kind == rulebook.KIND_INT:
            if integer_table:
                return values
            # T2: the decimal text; negative integers are invalid
            values = keep_values(values, values.flat_values >= 0)
            values = values.with_flat_values(tf.strings.as_string(values.flat_values))
        if f.separator is not None:
            values = split_values(values, f.separator)
        return values

    def _categorical(self, column, batch: tf.Tensor, from_json: bool, order, fused=None) -> Dict[str, Any]:
        """Every categorical feature's IDs: V1 (vocabulary line), V2 (OOV bucket), T5-T6 (invalid
        tokens dropped) and T7 (the first `max_length` valid tokens). A token found in the
        vocabulary is valid (preprocessing counts valid tokens only), so validity checks and OOV
        hashing run on the tokens the vocabulary misses. `fused` ((first chunk index, the group's
        chunks), `fuse`): the IDs leave as each chunk's (rows, segments) instead of a SparseTensor
        per feature."""
        tokens, row_weights = self._weighed_tokens(column, from_json, order)
        ids = self._stacked_ids(tokens, order, fused)
        flat, splits = ids.flat_values, ids.row_splits  # n * batch rows: feature after feature
        bounds = tf.gather(splits, tf.range(len(order) + 1, dtype=tf.int64) * batch)  # each feature's first ID
        miss = tf.where(flat < 0)
        missed = self._missed_tokens(tokens, order, bounds, miss)
        feature = searchsorted(bounds, miss[:, 0], "right") - 1  # of each missed token
        flat = self._with_miss_rows(flat, miss, missed, feature, order, fused)
        # T5-T6 (and V4's drops), in the ops a batch needs: when every missed token is plain ASCII
        # (valid for sure) and no table drops its misses, one regex; else the full checks on the
        # others, and the drop when some token is invalid.
        plain = plain_tokens(missed)
        dropped = [self._miss_dropped[f.table] for f in order]
        kept = tf.logical_not(tf.gather(tf.constant(dropped), feature)) if any(dropped) else None  # V4, before T7
        limits = [f.max_length for f in order]
        finish = functools.partial(self._finish, batch=batch, limits=limits, fused=fused)
        if fused is not None:
            # The index work from the splits, beside the miss handling; a batch with drops plans again.
            fast = finish(flat, splits, plan=self._fused_plan(ids.flat_values, splits, batch, limits, *fused))
        else:
            fast = (flat, splits)
        result = unless_valid(fast, flat, splits, miss, missed, plain, kept, finish)
        if fused is not None:
            return result
        return self._per_feature_sparse(*result, batch, order, limits, row_weights)

    def _weighed_tokens(self, column, from_json: bool, order) -> Tuple[List[tf.RaggedTensor], Dict[str, tf.Tensor]]:
        """Each feature's tokens per row (T1-T4), the rows without a usable weight emptied (W1).

        Returns:
          (tokens, row_weights): one [batch, None] ragged tensor per feature of `order`, and
          {feature name: float32 [batch] row weights} for the weighted features.
        """
        tokens = [self._tokens(column(f.column), f, from_json) for f in order]
        row_weights = {}
        for i, f in enumerate(order):
            if f.weight_column:  # W1: a row without a usable weight keeps no token
                row_weights[f.name] = self._row_weights(column, f, from_json)
                weighed = tf.logical_not(tf.math.is_nan(row_weights[f.name]))
                tokens[i] = keep_values(tokens[i], tf.repeat(weighed, tokens[i].row_lengths()))
        return tokens, row_weights

    def _stacked_ids(self, tokens: List[tf.RaggedTensor], order, fused) -> tf.RaggedTensor:
        """The features' tokens looked up (V1, V4; -1 for a miss), stacked feature after feature
        into one ragged tensor of [n * batch, None]; fused, as rows of their stack (the table's
        offset in it)."""
        offsets = _stack_offsets(order, fused)
        return stack_rows([t.with_flat_values(self.lookup(f.table, t.flat_values, o)) for f, t, o in zip(order, tokens, offsets)])

    def _missed_tokens(self, tokens: List[tf.RaggedTensor], order, bounds: tf.Tensor, miss: tf.Tensor) -> tf.Tensor:
        """The missed tokens as text (what OOV hashing and T5-T6 read), string [misses]: strings,
        then the decimal texts of integer tables' missed values; a negative value's text is empty,
        so T5 drops it. `bounds`: each feature's first position in the stack; `miss`: [misses, 1]
        positions, ascending."""
        n_strings = sum(f.table not in self.integer_tables for f in order)
        strings, integers = [t.flat_values for t in tokens[:n_strings]], [t.flat_values for t in tokens[n_strings:]]
        if strings and integers:
            first_integer = bounds[n_strings]
            in_strings = tf.reduce_sum(tf.cast(miss[:, 0] < first_integer, tf.int32))
        missed = []
        if strings:
            missed.append(tf.gather(tf.concat(strings, 0), miss[:in_strings, 0] if integers else miss[:, 0]))
        if integers:
            values = tf.gather(tf.concat(integers, 0), miss[in_strings:, 0] - first_integer if strings else miss[:, 0])
            missed.append(tf.where(values >= 0, tf.strings.as_string(values), ""))
        return tf.concat(missed, 0) if len(missed) > 1 else missed[0]

    def _with_miss_rows(self, flat: tf.Tensor, miss: tf.Tensor, missed: tf.Tensor, feature: tf.Tensor, order,
                        fused) -> tf.Tensor:
        """The stacked IDs with each miss given its table's OOV row (V2-V4); fused, offset in the
        stack as the found IDs are. `feature`: each missed token's index in `order`."""
        offsets = _stack_offsets(order, fused)
        rows = tf.gather(tf.constant([self._miss_row[f.table] + o for f, o in zip(order, offsets)], tf.int64), feature)
        return tf.tensor_scatter_nd_update(flat, miss, rows + self._oov_buckets(missed, feature, order))

    def _finish(self, ids: tf.Tensor, row_splits: tf.Tensor, batch: tf.Tensor, limits, fused, plan=None):
        """The stacked IDs as `_categorical` returns them before the per-feature cut: fused, the
        chunks' (rows, segments) by `plan` (planned from `row_splits` when not given); else the
        (ids, row_splits) pair itself."""
        if fused is None:
            return ids, row_splits
        return self._fused_apply(ids, plan if plan is not None else self._fused_plan(ids, row_splits, batch, limits, *fused), fused[0])

    @staticmethod
    def _per_feature_sparse(flat: tf.Tensor, splits: tf.Tensor, batch: tf.Tensor, order, limits,
                            row_weights: Dict[str, tf.Tensor]) -> Dict[str, tf.SparseTensor]:
        """The stacked valid IDs cut into one int64 SparseTensor [batch, longest row] per feature,
        as RaggedTensor.to_sparse gives, T7 applied; a weighted feature's weights beside its IDs."""
        n = len(order)
        # (feature, row, place in row) of every ID: RaggedTensorToSparse over [features, batch, None].
        features = tf.range(n + 1, dtype=tf.int64) * batch
        position = tf.RaggedTensor.from_nested_row_splits(flat, [features, splits], validate=False).to_sparse().indices
        bounds = tf.gather(splits, features)
        lengths = tf.reshape(splits[1:] - splits[:-1], [n, batch])
        if any(m is not None for m in limits):  # T7 in the shapes
            lengths = tf.minimum(lengths, tf.constant([rulebook.INT64_MAX if m is None else m for m in limits], tf.int64)[:, None])
        # The cut per feature keeps T7 off features without max_length, and lets both cores work.
        # int32: Eigen reduces int64 rows several times slower.
        widths = tf.cast(tf.maximum(tf.reduce_max(tf.cast(lengths, tf.int32), axis=1), 0), tf.int64)  # 0: empty batch
        shapes = tf.unstack(tf.stack([tf.fill([n], batch), widths], 1), num=n)
        out = {}
        pieces = zip(order, tf.split(position, bounds[1:] - bounds[:-1], num=n), tf.split(flat, bounds[1:] - bounds[:-1], num=n), shapes)
        for f, where, ids, shape in pieces:
            if f.max_length is not None:  # T7: the first max_length (valid) IDs of a row
                kept = tf.where(where[:, 2] < f.max_length)[:, 0]
                where, ids = tf.gather(where, kept), tf.gather(ids, kept)
            out[f.name] = tf.SparseTensor(where[:, 1:], ids, shape)
            if f.weight_column:  # each ID weighs its row's weight
                out[weights_key(f.name)] = tf.SparseTensor(where[:, 1:], tf.gather(row_weights[f.name], where[:, 1]), shape)
        return out

    @staticmethod
    def _fused_plan(flat: tf.Tensor, splits: tf.Tensor, batch: tf.Tensor, limits, first: int, parts) -> Dict[str, Any]:
        """The index work of `_fused_apply`, from the row splits alone (`flat`: any values of the
        IDs' length), so that it runs beside the miss handling instead of after it: each ID's
        segment in its part (feature x batch + batch row), T7 (which IDs of the prefix of limited
        features stay) and the parts' sizes. `first` is unused (the chunk numbering is
        `_fused_apply`'s); it is here so both take `_categorical`'s `fused` pair."""
        position = tf.RaggedTensor.from_row_splits(flat, splits, validate=False).to_sparse().indices  # (segment, place)
        segments = position[:, 0]
        plan: Dict[str, Any] = {}
        limited = [i for i, m in enumerate(limits) if m is not None]
        if limited:  # T7: the first max_length (valid) IDs of a row, over the features up to the last limited one
            k = limited[-1] + 1  # `fuse` puts the limited features first where it can
            plan["prefix"] = tf.stack([tf.gather(splits, k * batch), -1])  # the prefix's IDs, the rest
            head_at, rest_at = tf.split(position, plan["prefix"], num=2)
            caps = tf.constant([[rulebook.INT64_MAX if m is None else m] for m in limits[:k]], tf.int64)
            head_segments = head_at[:, 0]
            cap = tf.gather(tf.reshape(tf.tile(caps, tf.stack([1, batch])), [-1]), head_segments)  # per ID
            plan["kept"] = tf.where(head_at[:, 1] < cap)[:, 0]
            segments = tf.concat([tf.gather(head_segments, plan["kept"]), rest_at[:, 0]], 0)
        if len(parts) == 1:
            plan["segments"] = [segments]
            return plan
        starts = [0]
        for part in parts[:-1]:
            starts.append(starts[-1] + len(part.features))  # each part's first feature
        cuts = searchsorted(segments, tf.constant(starts[1:], tf.int64) * batch, "left")
        bounds = tf.concat([[0], cuts, tf.shape(segments, out_type=tf.int64)], 0)
        plan["sizes"] = bounds[1:] - bounds[:-1]
        plan["segments"] = [segs - start * batch if start else segs
                            for segs, start in zip(tf.split(segments, plan["sizes"], num=len(parts)), starts)]
        return plan

    @staticmethod
    def _fused_apply(flat: tf.Tensor, plan: Dict[str, Any], first: int) -> Dict[str, tf.Tensor]:
        """A group's IDs (`flat`: rows of their stack, feature after feature, batch rows each) as
        the model's fused inputs by `plan` (`_fused_plan`), one (rows, segments) pair per part
        (chunk `first` on), T7 applied; in row-major order, as a SparseTensor per feature would
        hold them. The parts are contiguous runs of features, so the two threads can pool them
        side by side."""
        if "kept" in plan:
            head, rest = tf.split(flat, plan["prefix"], num=2)
            flat = tf.concat([tf.gather(head, plan["kept"]), rest], 0)
        parts = tf.split(flat, plan["sizes"], num=len(plan["segments"])) if "sizes" in plan else [flat]
        out = {}
        for i, (rows, segments) in enumerate(zip(parts, plan["segments"])):
            out[fused_key(first + i, "rows")] = rows
            out[fused_key(first + i, "segments")] = segments
        return out

    def _dense(self, stacked, batch: tf.Tensor, from_json: bool) -> Dict[str, tf.Tensor]:
        """Rulebook D1-D5 for every dense column at once."""
        out: Dict[str, tf.Tensor] = {}
        numeric = []
        for d in self._manifest.dense_features:
            kind = rulebook.KIND_FLOAT if from_json else self.kinds[d.column]
            if kind == rulebook.KIND_BYTES:  # D5: non-numeric column: every value is filled
                out[d.name] = tf.fill(tf.stack([batch, 1]), tf.constant(d.fill_value, tf.float32))
            else:
                numeric.append(d)
        if numeric:
            # D1-D4: the first value; NaN, inf and numbers beyond float32 are filled.
            first = tf.reshape(first_or_nan(stacked([d.column for d in numeric])), [len(numeric), -1, 1])
            fill = tf.constant([[[d.fill_value]] for d in numeric], tf.float32)
            filled = tf.where(tf.math.is_finite(first), first, fill)
            if self._chunks and len(numeric) == len(self._manifest.dense_features):
                # the fused form: one [batch, features] matrix for the model (`model.DENSE_KEY`)
                matrix = tf.transpose(tf.reshape(filled, [len(numeric), -1]))
                matrix.set_shape([None, len(numeric)])  # static width, as a concat of [batch, 1] tensors has
                return {DENSE_KEY: matrix}
            out.update(zip([d.name for d in numeric], tf.unstack(filled, num=len(numeric))))
        return {d.name: out[d.name] for d in self._manifest.dense_features}

    def _to_model_inputs(self, column, stacked, batch: tf.Tensor, from_json: bool) -> Dict[str, Any]:
        """`column(name)`: a raw column's values, [batch, None] ragged; `stacked(names)`: the float32
        values of numeric columns, column after column, one [len(names) * batch, None] ragged."""
        out: Dict[str, Any] = self._dense(stacked, batch, from_json)
        first = 0
        for parts, features in self._chunks:
            out.update(self._categorical(column, batch, from_json, features, fused=(first, parts)))
            first += len(parts)
        if self._chunks:
            out[BATCH_KEY] = batch
        fused = {f.name for _, features in self._chunks for f in features}
        rest = [f for f in self._order if f.name not in fused]
        for shard in (rest[i::_SHARDS] for i in range(_SHARDS)):
            if shard:
                out.update(self._categorical(column, batch, from_json, shard))
        return out


class ServingModule(tf.Module):
    """What the serving SavedModel holds: the raw-feature transform and the CPU model.

    Args:
      model: the serving model (no optimizer); when it stacks its serving tables, its fusion
        groups are fused into the transform.
      transform: the raw-feature transform of the model's manifest.
    """

    def __init__(self, model: tf.keras.Model, transform: RawFeatureTransform):
        super().__init__(name="serving_module")
        self.model = model
        self.transform = transform
        if getattr(model, "stack_serving_tables", False):
            # Stacked tables: features pooled together take their IDs fused (one segment op per chunk).
            model.set_serving_chunks(transform.fuse(model.serving_fusion_groups()))
        # One input per raw column, named by the one rule (components/rules/names.py): the
        # column itself when it is a valid name, else its serving name. `serving_default` reads
        # the columns themselves as tf.Example keys.
        inputs = transform.serving_inputs()
        self._inputs = self._no_dependency(list(inputs))  # plain records, nothing to track
        column_of = {i.input: i.column for i in inputs}
        feature_spec = {i.input: tf.TensorSpec([None], _JSON_DTYPES[i.dtype], name=i.input) for i in inputs}

        def columns_of(tensors: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
            return {column_of[name]: t for name, t in tensors.items()}

        # autograph off: the graph is plain ops over static Python loops, and converting the Keras
        # model code costs most of the export time.
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")], autograph=False)
        def serve_examples(examples):
            return {"probabilities": self.model(self.transform.from_examples(examples))}

        @tf.function(input_signature=[feature_spec], autograph=False)
        def serve_features(columns):
            return {"probabilities": self.model(self.transform.from_feature_tensors(columns_of(columns)))}

        self.serve_examples = serve_examples
        self.serve_features = serve_features
        self.serve_typed_features = None
        typed = [i for i in inputs if i.typed_dtype is not None]
        if typed:
            # The same, with integer ID columns sent as JSON numbers (int64, one per row; a negative
            # one for none): no decimal text parsed (J2), tables of int64 values looked up by value.
            typed_spec = dict(feature_spec, **{
                i.input: tf.TensorSpec([None], _JSON_DTYPES[i.typed_dtype], name=i.input) for i in typed})

            @tf.function(input_signature=[typed_spec], autograph=False)
            def serve_typed_features(columns):
                return {"probabilities": self.model(self.transform.from_feature_tensors(columns_of(columns)))}

            self.serve_typed_features = serve_typed_features

    def serving_inputs(self) -> List[ServingInput]:
        """The JSON signatures' inputs, as recorded with the model (`contracts.serving_inputs.ServingInput`).

        Returns:
          One entry per raw column, in the model's raw column order.
        """
        return list(self._inputs)

    def signatures(self) -> Dict[str, Any]:
        """Lists the signatures to save.

        The tf.functions themselves, not concrete functions: `tf.saved_model.save` traces them
        inside its save context, and a trace made outside it is not reused there (the save
        context's variable policy is part of tf.function's cache key,
        tensorflow/python/eager/polymorphic_function/function_context.py), so each signature
        would be traced twice.

        Returns:
          {signature name: tf.function}: `serving_default`, `serve_features` and, with integer
          columns, `serve_typed_features`; each returns {"probabilities": float32 [batch, 1]}.
        """
        out = {"serving_default": self.serve_examples, "serve_features": self.serve_features}
        if self.serve_typed_features is not None:
            out["serve_typed_features"] = self.serve_typed_features
        return out
