"""The rulebook: how a raw tf.Example value becomes a token and an embedding ID, a dense value or a label.

The rules are stated once, here: in words (this docstring), in plain Python one row at a time
(`row_tokens`, `json_row_tokens`, `int_text_value`, `embedding_id`, `dense_value`, `binary_label`)
and as one table of cases (`components.rules.rulebook_cases`: `TOKEN_CASES`, `INT_TEXT_CASES`,
`DENSE_CASES`, `LABEL_CASES`, `OOV_CASES`, `BUCKET_CASES`: raw values in, expected tokens, IDs,
values, buckets and counted reasons out). Two vectorised implementations follow it, and
`tests/test_rulebook.py` runs every case through each of them:
- preprocessing, in pyarrow: `components.embedding_preprocess.features` (tokens, dense values,
  labels) and `components.embedding_preprocess.vocabulary` (IDs); ExampleGen's label check
  (`components.example_gen.records`) calls `binary_label` from here;
- serving, in TensorFlow: `components.embedding_exporter.serving.RawFeatureTransform`, through the
  signatures of the saved model (`serving_default`: serialized tf.Examples; `serve_features`: one
  JSON tensor per column; `serve_typed_features`: the same with int64 ID columns as numbers).
No TensorFlow and no Beam here, so the rules load anywhere.

Raw kinds
  R1. A tf.Example feature holds bytes, int64 or float values (`KIND_BYTES`, `KIND_INT`,
      `KIND_FLOAT`); a column with no value in a whole batch is `KIND_NONE`. A feature absent from
      a row, or present without values, is missing: no token, nothing counted as invalid.

Categorical values -> tokens, per row and in order
  T1. bytes: the value is the token, byte for byte (no stripping, no case folding: " a " is " a ").
  T2. int64: the value's decimal text (`str(v)`: "7", never "07" or "+7"). A negative value is
      invalid (`negative_int`): it is a sentinel for "missing" (-1) or an overflowed hash. Any
      non-negative int64 is a key: looked up in the vocabulary, never used as a row index.
  T3. float: every value is invalid (`float_in_categorical`): no tokens.
  T4. With a separator, each text is split on it (the literal string, not a pattern).
  T5. Empty tokens are no tokens and are not counted: "x||y" -> x, y.
  T6. A token that is not valid UTF-8 is invalid (`not_utf8`); otherwise one holding a line break
      ("\\n" or "\\r") is invalid (`line_break`): a vocabulary file holds one token per line.
  T7. With `max_length`, a row keeps its first `max_length` valid tokens; the rest are counted as
      truncated (invalid tokens take no place).

JSON columns (`serve_features`: one string per row, '' = missing)
  J1. A bytes column: the string is the row's value (T1), then T4-T7.
  J2. An int64 column: with a separator the string is first split on it (several values). Each
      part, stripped of ASCII whitespace (space, \\t, \\n, \\v, \\f, \\r), is empty (no value,
      not counted) or must be an integer: an optional sign and ASCII digits. It then stands for
      that int64 value and T2 applies: "07", " 7", "+7" -> "7"; "-0" -> "0"; "-3" -> `negative_int`
      (whatever its size). Anything else is no int64 value and gives no token (`not_integer`):
      "abc", "7.5", "1e3", "0x1f", "7 8", and numbers above the int64 maximum. Such a string is
      never looked up as typed: preprocessing never saw it as a key.
  J3. A float column: every string is `float_in_categorical` (T3).

Tokens -> embedding IDs
  V1. The token on line i of the vocabulary file (0-based) -> i.
  V2. Any other token -> vocabulary_size + Fingerprint64(token) % num_oov_buckets: farmhash
      Fingerprint64 of the token's bytes, what `tf.strings.to_hash_bucket_fast` and
      `tf.lookup.StaticVocabularyTable` compute (`oov_bucket`). A vocabulary given as a list or
      a file (`vocabulary.kind: list | file`) is V1-V2 with its lines in the given order.
  V3. A hashed column (`kind: hashed`, no vocabulary): every token -> Fingerprint64(token) %
      num_buckets, V2 with an empty vocabulary (TF's categorical_column_with_hash_bucket).
  V4. An identity column (`kind: identity`): a token that is the decimal text of an integer i,
      0 <= i < num_buckets, written as T2 writes int64 values (no sign, no leading zero: "7",
      not "07" or "+7") -> row i (`identity_id`). Any other token -> `default_value` when the
      config sets one (counted as oov), else no ID: dropped and counted, `out_of_range` (an
      integer text >= num_buckets) or `not_an_id` (any other text: "07", "-3", "abc").

Weighted IDs (a categorical feature's `weight_column`)
  W1. Each ID of a row weighs the row's weight: the first value of the weight column as float32
      (D1, D4). A row whose weight is missing, NaN, infinite or negative keeps none of its
      tokens: each valid one is counted `invalid_weight` (checked with T5-T6, before T7). The
      combiner then pools sum(w x) / sum(w) (mean), sum(w x) (sum) or sum(w x) / sqrt(sum(w^2))
      (sqrtn); a row whose weights sum to 0 pools to zeros (`row_weight`).

Dense values (one float32 per row)
  D1. A row's value is its first value as float32; further values are counted
      (`multi_valued_dense`) and ignored.
  D2. A missing value -> the feature's `fill_value`, counted as missing.
  D3. NaN (`nan`), inf and -inf (`infinite`), and numbers beyond float32 (1e39 is inf as float32,
      also `infinite`) -> `fill_value`, counted as invalid and as missing.
  D4. Integers become the nearest float32, rounded once from the int64 value (16777217 ->
      16777216.0; 2**60 + 2**36 + 1 -> 2**60 + 2**37, where rounding to float64 first would give
      2**60): what pyarrow's and TensorFlow's int64 -> float32 casts compute. A stock
      ExampleGen stores integer-valued columns as int64 (CsvExampleGen infers the type), and the
      serving model parses each column as the examples preprocessing read hold it.
  D5. A dense column stored as bytes is not numeric: every value is counted (`not_numeric`) and
      every row filled. (ExampleGen already parsed the numeric text columns the config names into
      float32: decimal, exponent, inf, nan.) JSON clients send dense columns as float32, NaN =
      missing.

Dense buckets (`training.dense_buckets`)
  B1. A dense value (after D1-D4: a float32) is in bucket k, the number of the feature's
      boundaries (non-decreasing, float32; the plan's, from the train split's quantiles, repeats
      kept) that are <= the value: below the first boundary -> 0, equal to a boundary -> the bucket
      above it (and above every boundary equal to it), at or above the last -> len(boundaries)
      (`dense_bucket`). Compared as float32, so a value beyond float32's
      precision is bucketed as the float32 it became (D4).
  B2. With `encoding: piecewise_linear`, the value is encoded over the bins between consecutive
      boundaries, one number per bin: 0 below the bin's lower boundary, 1 at or above its upper
      one, (value - lower) / (upper - lower) inside it; a bin of width zero (a repeated boundary)
      is 1 at or above it and 0 below, as B1 puts a value equal to a boundary above it
      (`dense_piecewise_linear`). The count of 1s beside a value's bucket k (B1) is k - 1 when
      k >= 1: only the bin the value is inside can hold a fraction.

Labels
  L1. A row's label is its one value when that is exactly 0 or 1. A row without a value is dropped
      as `missing_label`; any other label (2, -1, 0.5, NaN, inf, text, several values) is dropped
      as `invalid_label` (`binary_label`). ExampleGen parses a text label to a number first (or
      derives it with `label_rule`) and writes int64 0/1; preprocessing checks again what it wrote.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Sequence, Tuple

import farmhash  # pyfarmhash: the Fingerprint64 TensorFlow's to_hash_bucket_fast uses
import numpy as np

# R1: raw kinds of a tf.Example feature, as recorded in the vocabulary manifest for the serving graph.
KIND_BYTES = "bytes"
KIND_INT = "int64"
KIND_FLOAT = "float"
KIND_NONE = "none"  # every value in the batch was missing

# Why a value is not used (counted per reason in the statistics).
INVALID_NOT_UTF8 = "not_utf8"  # T6
INVALID_LINE_BREAK = "line_break"  # T6
INVALID_FLOAT_IN_CATEGORICAL = "float_in_categorical"  # T3, J3
INVALID_NEGATIVE_INT = "negative_int"  # T2, J2
INVALID_NOT_INTEGER = "not_integer"  # J2 (JSON strings for an int64 column only)
INVALID_OUT_OF_RANGE = "out_of_range"  # V4: an integer ID >= num_buckets, no default_value
INVALID_WEIGHT = "invalid_weight"  # W1: the row's weight is missing, NaN, infinite or negative
INVALID_NOT_AN_ID = "not_an_id"  # V4: not the canonical text of a non-negative integer, no default_value
INVALID_NAN = "nan"  # D3
INVALID_INFINITE = "infinite"  # D3: inf, -inf, or a number beyond float32
INVALID_MULTI_VALUED = "multi_valued_dense"  # D1
INVALID_NOT_NUMERIC = "not_numeric"  # D5

# L1: why a row is dropped.
DROP_MISSING_LABEL = "missing_label"
DROP_INVALID_LABEL = "invalid_label"

INT64_MAX = 2**63 - 1
ASCII_WHITESPACE = b" \t\n\v\f\r"  # J2: what tf.strings.strip removes
INTEGER_TEXT = rb"[+-]?[0-9]+"  # J2


# ---- the rules, one row at a time ---------------------------------------------------------------


@dataclass(frozen=True)
class RowTokens:
    """The tokens of one categorical row (T1-T7), with what was counted instead of kept.

    Attributes:
      tokens: the row's valid tokens, in order, after truncation.
      invalid: count of dropped values per reason (`INVALID_*`).
      truncated: how many valid tokens `max_length` cut off.
    """

    tokens: Tuple[bytes, ...]
    invalid: Mapping[str, int] = field(default_factory=dict)
    truncated: int = 0


def token_invalid_reason(token: bytes) -> Optional[str]:
    """T6: says why a non-empty token cannot be looked up.

    Args:
      token: one non-empty token.

    Returns:
      `INVALID_NOT_UTF8`, `INVALID_LINE_BREAK`, or None for a valid token.
    """
    try:
        token.decode("utf-8")
    except UnicodeDecodeError:
        return INVALID_NOT_UTF8
    if b"\n" in token or b"\r" in token:
        return INVALID_LINE_BREAK
    return None


def row_tokens(kind: str, values: Optional[Sequence], separator: Optional[str] = None,
               max_length: Optional[int] = None) -> RowTokens:
    """T1-T7: turns one row of a categorical column into its tokens.

    Args:
      kind: the column's raw kind (`KIND_BYTES`, `KIND_INT`, `KIND_FLOAT` or `KIND_NONE`).
      values: the row's raw values (bytes or int), or None when missing.
      separator: splits each text into several tokens (a literal string), or None.
      max_length: keeps at most this many valid tokens, or None for all.

    Returns:
      The row's tokens, invalid counts by reason and truncated count.
    """
    invalid: Counter = Counter()
    if not values or kind == KIND_NONE:
        return RowTokens(())
    if kind == KIND_FLOAT:
        return RowTokens((), {INVALID_FLOAT_IN_CATEGORICAL: len(values)})
    out = []
    for v in values:
        if kind == KIND_INT:
            if v < 0:
                invalid[INVALID_NEGATIVE_INT] += 1
                continue
            v = str(v).encode()
        for token in v.split(separator.encode()) if separator is not None else [v]:
            if not token:
                continue
            reason = token_invalid_reason(token)
            if reason:
                invalid[reason] += 1
            else:
                out.append(token)
    truncated = max(0, len(out) - max_length) if max_length is not None else 0
    return RowTokens(tuple(out[: len(out) - truncated]), dict(invalid), truncated)


def tokens_by_reason(rows: Sequence[RowTokens]) -> Tuple[Dict[str, int], int]:
    """Adds up the invalid and truncated counts of several rows.

    Args:
      rows: the rows' tokens.

    Returns:
      (invalid, truncated): invalid counts by reason, and the total truncated count.
    """
    invalid: Counter = Counter()
    for r in rows:
        invalid.update(r.invalid)
    return dict(invalid), sum(r.truncated for r in rows)


def int_text_value(text: bytes) -> Tuple[Optional[int], Optional[str]]:
    """J2: parses a JSON string sent for an int64 column into its int64 value.

    Args:
      text: one part of the string (after splitting on the separator).

    Returns:
      (value, None) for a valid non-negative integer; (None, reason) with `INVALID_NOT_INTEGER`
      or `INVALID_NEGATIVE_INT`; (None, None) when the text is empty after stripping ASCII
      whitespace (no value).
    """
    s = text.strip(ASCII_WHITESPACE)
    if not s:
        return None, None
    if not re.fullmatch(INTEGER_TEXT, s):
        return None, INVALID_NOT_INTEGER
    v = int(s)
    if v < 0:
        return None, INVALID_NEGATIVE_INT
    if v > INT64_MAX:
        return None, INVALID_NOT_INTEGER
    return v, None


def json_row_tokens(kind: str, text: bytes, separator: Optional[str] = None,
                    max_length: Optional[int] = None) -> RowTokens:
    """J1-J3: turns one JSON string sent to `serve_features` into its tokens.

    Args:
      kind: the column's raw kind (`KIND_BYTES`, `KIND_INT` or `KIND_FLOAT`).
      text: the row's string; b"" is missing.
      separator: splits the string into several values (a literal string), or None.
      max_length: keeps at most this many valid tokens, or None for all.

    Returns:
      The row's tokens, invalid counts by reason and truncated count.
    """
    if not text:
        return RowTokens(())
    if kind == KIND_FLOAT:
        return RowTokens((), {INVALID_FLOAT_IN_CATEGORICAL: 1})
    if kind != KIND_INT:
        return row_tokens(KIND_BYTES, [text], separator, max_length)
    values, invalid = [], Counter()
    for part in text.split(separator.encode()) if separator is not None else [text]:
        v, reason = int_text_value(part)
        if reason:
            invalid[reason] += 1
        elif v is not None:
            values.append(v)
    out = row_tokens(KIND_INT, values, separator, max_length)
    return RowTokens(out.tokens, dict(invalid + Counter(out.invalid)), out.truncated)


def oov_bucket(token: bytes, num_oov_buckets: int) -> int:
    """V2: computes an out-of-vocabulary token's bucket, Fingerprint64(token) % num_oov_buckets.

    Args:
      token: a valid UTF-8 token (T6).
      num_oov_buckets: the number of OOV buckets, > 0.

    Returns:
      The bucket, in [0, num_oov_buckets).
    """
    return farmhash.fingerprint64(token.decode("utf-8")) % num_oov_buckets


def embedding_id(token: bytes, vocabulary: Sequence[bytes], num_oov_buckets: int) -> int:
    """V1-V2: looks up a token's row in the embedding table.

    Args:
      token: a valid token.
      vocabulary: the vocabulary's tokens, in file order.
      num_oov_buckets: the number of OOV buckets after the vocabulary.

    Returns:
      The token's index in `vocabulary`, else len(vocabulary) + its OOV bucket.
    """
    if token in vocabulary:
        return list(vocabulary).index(token)
    return len(vocabulary) + oov_bucket(token, num_oov_buckets)


IDENTITY_TEXT = rb"0|[1-9][0-9]*"  # V4: the texts T2 gives non-negative int64 values


def identity_id(token: bytes, num_buckets: int, default_value: Optional[int] = None) -> Tuple[Optional[int], Optional[str]]:
    """V4: looks up a token's row in an identity table.

    Args:
      token: the token, the canonical decimal text of an ID.
      num_buckets: the table's row count.
      default_value: the row for any other token, or None to drop it.

    Returns:
      (row, None) for an ID below `num_buckets`; (default_value, None) for any other token when
      it is set; else (None, reason) with `INVALID_OUT_OF_RANGE` or `INVALID_NOT_AN_ID`.
    """
    if re.fullmatch(IDENTITY_TEXT, token):
        if int(token) < num_buckets:
            return int(token), None
        reason = INVALID_OUT_OF_RANGE
    else:
        reason = INVALID_NOT_AN_ID
    return (default_value, None) if default_value is not None else (None, reason)


def as_float32(kind: str, value) -> np.float32:
    """D4: converts a numeric value to float32, rounding an int64 value once.

    `np.float32(int)` would round through float64 first, twice; this does not.

    Args:
      kind: the value's raw kind (`KIND_INT` or `KIND_FLOAT`).
      value: the int or float value.

    Returns:
      The nearest float32 (inf for a number beyond float32).
    """
    if kind == KIND_INT:
        return np.array([value], np.int64).astype(np.float32)[0]
    with np.errstate(over="ignore"):
        return np.float32(value)


def row_weight(kind: str, values: Optional[Sequence]) -> Optional[float]:
    """W1: reads a row's ID weight from its weight column.

    Args:
      kind: the weight column's raw kind.
      values: the row's raw weight values, or None when missing.

    Returns:
      The first value as float32 (as a Python float), or None when the row's tokens are dropped
      (missing, not numeric, NaN, infinite or negative).
    """
    if not values or kind not in (KIND_INT, KIND_FLOAT):
        return None
    w = as_float32(kind, values[0])
    return float(w) if np.isfinite(w) and w >= 0 else None


@dataclass(frozen=True)
class DenseRow:
    """One row's dense value (D1-D5).

    Attributes:
      value: the float32 value, or the fill value when missing.
      missing: whether the fill value was used.
      invalid: count of rejected values per reason (`INVALID_*`).
    """

    value: float  # float32
    missing: bool
    invalid: Mapping[str, int] = field(default_factory=dict)


def dense_value(kind: str, values: Optional[Sequence], fill_value: float) -> DenseRow:
    """D1-D5: reads one row's dense value.

    Args:
      kind: the column's raw kind.
      values: the row's raw values, or None when missing.
      fill_value: the value of a missing or invalid row (rounded to float32).

    Returns:
      The row's value, whether it is missing, and invalid counts by reason.
    """
    fill = float(np.float32(fill_value))
    if not values or kind == KIND_NONE:
        return DenseRow(fill, True)
    if kind == KIND_BYTES:
        return DenseRow(fill, True, {INVALID_NOT_NUMERIC: len(values)})
    invalid = {INVALID_MULTI_VALUED: len(values) - 1} if len(values) > 1 else {}
    v = as_float32(kind, values[0])
    if np.isnan(v):
        return DenseRow(fill, True, {**invalid, INVALID_NAN: 1})
    if np.isinf(v):
        return DenseRow(fill, True, {**invalid, INVALID_INFINITE: 1})
    return DenseRow(float(v), False, invalid)


def binary_label(first: np.ndarray, counts: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """L1, vectorised: checks binary labels (the one implementation; ExampleGen and preprocessing call it).

    Args:
      first: each row's first value as a number (NaN where it is none, e.g. text), shape [n].
      counts: how many values each row holds, shape [n].

    Returns:
      (label, missing, invalid): float32 0/1 labels (0 where dropped), and bool masks of rows
      dropped as missing and as invalid; each of shape [n].
    """
    first = np.asarray(first, dtype=np.float64)
    counts = np.asarray(counts)
    binary = (first == 0.0) | (first == 1.0)
    missing = counts == 0
    invalid = ~missing & ((counts != 1) | ~binary)
    return np.where(binary, first, 0.0).astype(np.float32), missing, invalid


def dense_bucket(value: float, boundaries: Sequence[float]) -> int:
    """B1: finds a dense value's bucket among the feature's boundaries.

    Args:
      value: the dense value (compared as float32).
      boundaries: non-decreasing boundaries (compared as float32).

    Returns:
      The number of boundaries <= the value, in [0, len(boundaries)].
    """
    v = np.float32(value)
    return sum(1 for b in boundaries if np.float32(b) <= v)


def dense_piecewise_linear(value: float, boundaries: Sequence[float]) -> Tuple[float, ...]:
    """B2: encodes a dense value piecewise-linearly over the bins between boundaries.

    Computed in float64 from the float32 value and boundaries.

    Args:
      value: the dense value (rounded to float32).
      boundaries: non-decreasing boundaries (rounded to float32).

    Returns:
      One number in [0, 1] per bin, len(boundaries) - 1 of them.
    """
    v, b = float(np.float32(value)), [float(np.float32(x)) for x in boundaries]
    out = []
    for lower, upper in zip(b[:-1], b[1:]):
        if upper == lower:
            out.append(1.0 if v >= upper else 0.0)
        else:
            out.append(min(1.0, max(0.0, (v - lower) / (upper - lower))))
    return tuple(out)
