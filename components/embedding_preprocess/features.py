"""Turning raw tf.Example columns (as Arrow record batches) into tokens, dense values and labels.

Pure functions over pyarrow arrays: no Beam, no TensorFlow. They implement the rulebook,
`components.rules.rulebook` (rules T1-T7 for tokens, D1-D5 for dense values, L1 for labels; its module
docstring states them and its case table is what `tests/test_rulebook.py` runs through this module
and through the serving graph, `components.embedding_exporter.serving`). The kinds and the reasons
are the rulebook's constants (import them from `components.rules.rulebook`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.rules.rulebook import (
    INVALID_FLOAT_IN_CATEGORICAL,
    INVALID_INFINITE,
    INVALID_LINE_BREAK,
    INVALID_MULTI_VALUED,
    INVALID_NAN,
    INVALID_NEGATIVE_INT,
    INVALID_NOT_NUMERIC,
    INVALID_NOT_UTF8,
    INVALID_WEIGHT,
    KIND_BYTES,
    KIND_FLOAT,
    KIND_INT,
    KIND_NONE,
    binary_label,
)


def kind_of(arr: Optional[pa.Array]) -> str:
    if arr is None:
        return KIND_NONE
    t = arr.type
    while pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t):
        return KIND_BYTES
    if pa.types.is_integer(t):
        return KIND_INT
    if pa.types.is_floating(t):
        return KIND_FLOAT
    return KIND_NONE


@dataclass
class Tokens:
    """The valid tokens of one categorical feature over a batch, in row order."""

    row: np.ndarray  # int64 row index of each token (ascending)
    values: pa.Array  # binary tokens
    num_rows: int
    truncated: int = 0  # tokens dropped by max_length
    invalid: Dict[str, int] = field(default_factory=dict)

    def ids_per_row(self) -> np.ndarray:
        return np.bincount(self.row, minlength=self.num_rows)


def _flatten(arr: pa.Array):
    """(row index of each value, values) of a list array, or of a flat array (nulls = missing)."""
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        return np.asarray(pc.list_parent_indices(arr)).astype(np.int64), arr.flatten()
    rows = np.arange(len(arr), dtype=np.int64)
    if arr.null_count:
        valid = np.asarray(pc.is_valid(arr))
        return rows[valid], arr.filter(pa.array(valid))
    return rows, arr


def extract_tokens(
    arr: Optional[pa.Array], num_rows: int, separator: Optional[str], max_length: Optional[int],
    id_filter: Optional[Callable[[pa.Array], Tuple[np.ndarray, Dict[str, int]]]] = None,
    row_weights: Optional[np.ndarray] = None,
) -> Tokens:
    """Rulebook T1-T7 over a batch: the valid tokens, the truncated ones and the invalid ones by reason.

    Each step filters the (row, value) pairs with one boolean mask, vectorised over the batch.

    Args:
      arr: the feature's column (a list or flat array), or None when the batch lacks it.
      num_rows: the batch's rows.
      separator: T4's separator, or None.
      max_length: T7's tokens kept per row, or None for all.
      id_filter: `id_filter(tokens) -> (keep, dropped by reason)`: the table's own rule (an identity
        column's tokens that are no IDs, V4), applied with T5-T6, before T7.
      row_weights: float32 per row (`extract_weights`, a weighted feature's): rows whose weight is
        NaN keep no token (W1, `invalid_weight`).

    Returns:
      The tokens: `row` int64 of shape [tokens] (ascending), `values` binary of the same length,
      the truncated count and the invalid counts by reason.
    """
    if arr is None or kind_of(arr) == KIND_NONE:
        return Tokens(np.zeros(0, np.int64), pa.array([], pa.binary()), num_rows)
    invalid: Dict[str, int] = {}
    row, values = _flatten(arr)
    kind = kind_of(arr)
    if kind == KIND_FLOAT:
        invalid[INVALID_FLOAT_IN_CATEGORICAL] = len(values) - values.null_count
        return Tokens(np.zeros(0, np.int64), pa.array([], pa.binary()), num_rows, invalid=invalid)
    row, values = _as_binary_tokens(row, values, kind, invalid)
    if separator is not None:
        parts = pc.split_pattern(values, separator)
        row = row[np.asarray(pc.list_parent_indices(parts))]
        values = parts.flatten()
    row, values = _drop_empty_and_malformed(row, values, invalid)
    if row_weights is not None and len(values):
        row, values = _drop_unweighted_rows(row, values, row_weights, invalid)
    if id_filter is not None and len(values):
        row, values = _drop_filtered_ids(row, values, id_filter, invalid)
    row, values, truncated = _truncate_rows(row, values, max_length)
    return Tokens(row, values, num_rows, truncated, invalid)


def _as_binary_tokens(row: np.ndarray, values: pa.Array, kind: str, invalid: Dict[str, int]):
    """T1-T2: (row, values) with values as binary text; negative integers dropped and counted in `invalid`."""
    if kind == KIND_INT:
        # Integer categorical values are vocabulary keys (their decimal text); a negative one is
        # almost always a sentinel for "missing" (-1) or an overflowed hash, so it is invalid.
        negative = np.asarray(pc.fill_null(pc.less(values, 0), False))
        if negative.any():
            invalid[INVALID_NEGATIVE_INT] = int(negative.sum())
            row, values = row[~negative], values.filter(pa.array(~negative))
        values = pc.cast(pc.cast(values, pa.string()), pa.binary())
    elif not pa.types.is_binary(values.type):
        values = pc.cast(values, pa.binary())
    return row, values


def _drop_empty_and_malformed(row: np.ndarray, values: pa.Array, invalid: Dict[str, int]):
    """T5-T6: (row, values) without empty tokens, nor ones that are not UTF-8 or hold a line break
    (those two counted in `invalid`)."""
    keep = np.asarray(pc.fill_null(pc.greater(pc.binary_length(values), 0), False))
    bad_utf8 = _invalid_utf8_mask(values)
    bad_break = _line_break_mask(values)
    n_utf8 = int(np.count_nonzero(keep & bad_utf8))
    n_break = int(np.count_nonzero(keep & bad_break & ~bad_utf8))
    if n_utf8:
        invalid[INVALID_NOT_UTF8] = n_utf8
    if n_break:
        invalid[INVALID_LINE_BREAK] = n_break
    keep &= ~bad_utf8 & ~bad_break
    return row[keep], values.filter(pa.array(keep))


def _drop_unweighted_rows(row: np.ndarray, values: pa.Array, row_weights: np.ndarray, invalid: Dict[str, int]):
    """W1: (row, values) without the tokens of rows whose weight is NaN (counted in `invalid`)."""
    weighed = ~np.isnan(row_weights[row])
    if not weighed.all():
        invalid[INVALID_WEIGHT] = int(np.count_nonzero(~weighed))
        row, values = row[weighed], values.filter(pa.array(weighed))
    return row, values


def _drop_filtered_ids(row: np.ndarray, values: pa.Array, id_filter, invalid: Dict[str, int]):
    """V4: (row, values) with only the tokens `id_filter` keeps; its drops added to `invalid`."""
    ids_kept, dropped = id_filter(values)
    for reason, count in dropped.items():
        invalid[reason] = invalid.get(reason, 0) + count
    if not ids_kept.all():
        row, values = row[ids_kept], values.filter(pa.array(ids_kept))
    return row, values


def _truncate_rows(row: np.ndarray, values: pa.Array, max_length: Optional[int]):
    """T7: (row, values, truncated): each row's first `max_length` tokens, and how many were dropped."""
    truncated = 0
    if max_length is not None and len(row):
        # position of each token within its row: rows are ascending, so subtract the row's first index
        first = np.searchsorted(row, row, side="left")
        position = np.arange(len(row)) - first
        within = position < max_length
        truncated = int(len(row) - np.count_nonzero(within))
        if truncated:
            row = row[within]
            values = values.filter(pa.array(within))
    return row, values, truncated


def _line_break_mask(values: pa.Array) -> np.ndarray:
    """Which tokens hold a line break. One numpy scan of the data buffer decides the common case
    (none anywhere); only then is each token checked."""
    data = values.buffers()[2] if len(values) else None
    if data is None or data.size == 0:
        return np.zeros(len(values), dtype=bool)
    offsets = np.frombuffer(values.buffers()[1], np.int32, len(values) + 1, values.offset * 4)
    raw = np.frombuffer(data, np.uint8)[offsets[0] : offsets[-1]]  # this (maybe sliced) array's bytes only
    if not ((raw == 10) | (raw == 13)).any():
        return np.zeros(len(values), dtype=bool)
    return np.asarray(
        pc.fill_null(pc.or_(pc.match_substring(values, "\n"), pc.match_substring(values, "\r")), False)
    )


def _invalid_utf8_mask(values: pa.Array) -> np.ndarray:
    try:
        pc.cast(values, pa.string())
        return np.zeros(len(values), dtype=bool)
    except pa.ArrowInvalid:
        # rare: find the culprits one by one (Arrow has no per-element UTF-8 check for binary)
        out = np.zeros(len(values), dtype=bool)
        for i, v in enumerate(values.to_pylist()):
            if v is not None:
                try:
                    v.decode("utf-8")
                except UnicodeDecodeError:
                    out[i] = True
        return out


@dataclass
class DenseValues:
    values: np.ndarray  # float32, one per row, missing/NaN filled
    missing: int = 0
    invalid: Dict[str, int] = field(default_factory=dict)


def extract_dense(arr: Optional[pa.Array], num_rows: int, fill_value: float) -> DenseValues:
    """Rulebook D1-D5 over a batch: one float32 per row, missing and invalid ones filled and counted."""
    out = np.full(num_rows, fill_value, dtype=np.float32)
    if arr is None or kind_of(arr) == KIND_NONE:
        return DenseValues(out, missing=num_rows)
    invalid: Dict[str, int] = {}
    kind = kind_of(arr)
    row, values = _flatten(arr)
    if kind == KIND_BYTES:
        invalid[INVALID_NOT_NUMERIC] = len(values) - values.null_count
        return DenseValues(out, missing=num_rows, invalid=invalid)
    vals = np.asarray(pc.cast(values, pa.float32(), safe=False).to_numpy(zero_copy_only=False), dtype=np.float32)
    if len(row):
        if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):  # flat columns hold one value per row
            first = np.searchsorted(row, row, side="left") == np.arange(len(row))
            multi = int(len(row) - np.count_nonzero(first))
            if multi:
                invalid[INVALID_MULTI_VALUED] = multi
            row, vals = row[first], vals[first]
        nan = np.isnan(vals)
        infinite = np.isinf(vals)  # after the float32 cast: numbers beyond float32 are inf here
        if nan.any():
            invalid[INVALID_NAN] = int(nan.sum())
        if infinite.any():
            invalid[INVALID_INFINITE] = int(infinite.sum())
        if nan.any() or infinite.any():
            ok = ~nan & ~infinite
            row, vals = row[ok], vals[ok]
        out[row] = vals
    return DenseValues(out, missing=num_rows - len(row), invalid=invalid)


def extract_weights(arr: Optional[pa.Array], num_rows: int) -> np.ndarray:
    """Rulebook W1 over a batch: each row's ID weight (float32), NaN where the row's tokens are
    dropped (missing, NaN, infinite or negative weight)."""
    w = extract_dense(arr, num_rows, float("nan")).values
    w[~np.isfinite(w) | (w < 0)] = np.nan
    return w


@dataclass
class Labels:
    values: np.ndarray  # float32 0/1 where usable
    missing: np.ndarray  # bool per row
    invalid: np.ndarray  # bool per row

    @property
    def keep(self) -> np.ndarray:
        return ~self.missing & ~self.invalid


def extract_label(arr: Optional[pa.Array], num_rows: int) -> Labels:
    """Each row's label (rulebook L1, `rulebook.binary_label`): rows without a usable 0/1 label are dropped."""
    if arr is None or kind_of(arr) == KIND_NONE:
        none = np.ones(num_rows, bool)
        return Labels(np.zeros(num_rows, np.float32), none, ~none)
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        lengths = np.asarray(pc.fill_null(pc.list_value_length(arr), 0), dtype=np.int64)
    else:
        lengths = np.asarray(pc.is_valid(arr), dtype=np.int64)
    if kind_of(arr) == KIND_BYTES:  # text is no number: every present label is invalid
        first = np.full(num_rows, np.nan, np.float32)
    else:
        first = extract_dense(arr, num_rows, float("nan")).values
    return Labels(*binary_label(first, lengths))
