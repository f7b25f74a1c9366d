"""The train/eval split: a hash of each row's content, vectorized over a RecordBatch.

A row's split depends on its typed content only (the configured columns and the label, by column
name, in name order), never on the batch, range, worker or run it was read in, so the same row
lands in the same split with any worker count or range size, locally, on Kubeflow and on
Dataflow. `row_hashes` takes a RecordBatch of list columns (as `records.type_rows` writes them)
and returns one uint64 per row; `assign_splits` turns hashes into split indices by hash buckets,
as TFX's ExampleGen does with its `hash_buckets`.

Written by hand because nothing at the pinned versions hashes Arrow rows in bulk: pyarrow 10 has
no hash kernel in `pyarrow.compute`, and pandas' `hash_pandas_object` turns every value into a
Python object first. TFX's own split (`base_example_gen_executor._PartitionFn`) hashes each
record's serialized tf.Example, which needs a protobuf per row (about 85 us per row here).

The hash, per column:
- a text value: a polynomial over its bytes modulo 2**64 (prefix sums over the column's data
  buffer, so one pass of numpy over all values), plus its length;
- a number: the bits of its float64 value (every NaN the same), tagged by type (int or float);
- each value mixed with its position in the row's list (splitmix64's finalizer), the row's values
  added up and mixed again with the list length and the column name.
Columns are then chained in name order. Missing and empty lists hash alike.
"""
from __future__ import annotations

import hashlib
from typing import Iterable, List, Sequence, Tuple

import numpy as np
import pyarrow as pa

from components.example_gen.records import as_list_column

_P = np.uint64(0x100000001B3)  # odd: invertible modulo 2**64
_P_INV = np.uint64(pow(0x100000001B3, -1, 1 << 64))
_K_POS = np.uint64(0x9E3779B97F4A7C15)
_K_LEN = np.uint64(0xC2B2AE3D27D4EB4F)
_K_TEXT = np.uint64(0x27D4EB2F165667C5)
_K_INT = np.uint64(0x165667B19E3779F9)
_K_FLOAT = np.uint64(0x85EBCA77C2B2AE63)
_K_ROW = np.uint64(0xFF51AFD7ED558CCD)
_NAN_BITS = np.uint64(0x7FF8000000000000)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (a bijection of uint64 that spreads every input bit)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


# base -> base**0 .. base**(m-1), kept so that every batch's hashing reuses it instead of
# recomputing it; up to _POWERS_KEPT entries (32 MB a base). Longer buffers are hashed in pieces
# of _CHUNK_BYTES; only a single value longer than the kept table gets its own, not kept.
_POWERS: dict = {}
_POWERS_KEPT = 1 << 22
_CHUNK_BYTES = 1 << 20  # binary_value_hashes hashes longer buffers in pieces of about this many bytes


def _powers(base: np.uint64, n: int) -> np.ndarray:
    """base**0 .. base**(n-1) modulo 2**64 (read-only)."""
    table = _POWERS.get(int(base))
    if table is None or len(table) < n:
        m = max(n, 2 * len(table) if table is not None else 0, 1)
        if n <= _POWERS_KEPT:
            m = min(m, _POWERS_KEPT)
        table = np.full(m, base, np.uint64)
        table[0] = 1
        table = np.cumprod(table, dtype=np.uint64)
        table.flags.writeable = False
        if m <= _POWERS_KEPT:
            _POWERS[int(base)] = table
    return table[:n]


def _column_salt(name: str) -> np.uint64:
    return np.uint64(int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little"))


def binary_buffers(values: pa.Array) -> Tuple[np.ndarray, np.ndarray]:
    """(the n + 1 offsets of a non-empty binary/string array's values, as int64; its whole data
    buffer as uint8), read in place (a large binary/string array is cast first)."""
    if pa.types.is_large_binary(values.type) or pa.types.is_large_string(values.type):
        values = values.cast(pa.binary())
    offsets_buf, data_buf = values.buffers()[1], values.buffers()[2]
    offsets = np.frombuffer(offsets_buf, np.int32)[values.offset : values.offset + len(values) + 1].astype(np.int64)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets, data


def binary_value_hashes(values: pa.Array) -> np.ndarray:
    """One uint64 per value of a binary/string array: polynomial over its bytes, mixed with its length."""
    n = len(values)
    if n == 0:
        return np.zeros(0, np.uint64)
    offsets, data = binary_buffers(values)
    if offsets[-1] - offsets[0] <= _CHUNK_BYTES:
        return _hash_values(offsets, data)
    # A value's hash depends on its own bytes only, so pieces hash alike; each piece's temporaries
    # (four uint64 per byte) stay near 32 MB instead of 32x a whole vocabulary's bytes.
    cuts = np.searchsorted(offsets, np.arange(offsets[0], offsets[-1], _CHUNK_BYTES)[1:], side="right") - 1
    bounds = np.unique(np.concatenate([[0], cuts, [n]]))
    return np.concatenate([_hash_values(offsets[a : b + 1], data) for a, b in zip(bounds[:-1], bounds[1:])])


def _hash_values(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """binary_value_hashes of the values whose bounds in `data` are `offsets` (int64, n + 1)."""
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = data[lo:hi].astype(np.uint64)
    starts, ends = offsets[:-1] - lo, offsets[1:] - lo
    prefix = np.zeros(len(data) + 1, np.uint64)
    np.cumsum(data * _powers(_P, len(data)), dtype=np.uint64, out=prefix[1:])
    inverse = _powers(_P_INV, len(data) + 1)
    poly = (prefix[ends] - prefix[starts]) * inverse[starts]
    return _mix(poly + (ends - starts).astype(np.uint64) * _K_LEN + _K_TEXT)


def _number_value_hashes(values: pa.Array) -> np.ndarray:
    floats = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float64)
    bits = floats.view(np.uint64).copy()
    bits[np.isnan(floats)] = _NAN_BITS
    tag = _K_INT if pa.types.is_integer(values.type) else _K_FLOAT
    return _mix(bits + tag)


def _value_hashes(values: pa.Array) -> np.ndarray:
    t = values.type
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        return binary_value_hashes(values)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return _number_value_hashes(values)
    if pa.types.is_null(t):
        return np.zeros(len(values), np.uint64)
    raise TypeError(f"split hash: a column of type {t} cannot be hashed (expected text or numbers)")


def column_row_hashes(column: pa.Array, name: str) -> np.ndarray:
    """One uint64 per row of a list column (or a flat column, read as lists of one value)."""
    n = len(column)
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        column = as_list_column(column)
    lengths = np.asarray(column.value_lengths().fill_null(0), dtype=np.int64) if n else np.zeros(0, np.int64)
    values = column.flatten()  # the values of the (non-null) lists, in row order
    ends = np.cumsum(lengths)
    starts = ends - lengths
    hashed = _value_hashes(values)
    if len(hashed) and n and int(lengths.max()) <= 1:
        # Every list holds at most one value (a CSV column, nearly every tf.Example feature): each
        # value is at position 0 and its row's sum, so the general path's repeat, positions and
        # prefix sums (about a third of the split's cost) give what this gives, bit for bit.
        sums = np.zeros(n, np.uint64)
        sums[lengths == 1] = _mix(hashed + _K_POS)
        return _mix(sums + lengths.astype(np.uint64) * _K_LEN + _column_salt(name))
    if len(hashed):
        row_of = np.repeat(np.arange(n), lengths)
        position = np.arange(len(hashed), dtype=np.int64) - starts[row_of]
        hashed = _mix(hashed + (position.astype(np.uint64) + np.uint64(1)) * _K_POS)
    prefix = np.zeros(len(hashed) + 1, np.uint64)
    np.cumsum(hashed, dtype=np.uint64, out=prefix[1:])
    sums = prefix[ends] - prefix[starts]
    return _mix(sums + lengths.astype(np.uint64) * _K_LEN + _column_salt(name))


def row_hashes(rb: pa.RecordBatch, columns: Sequence[str]) -> np.ndarray:
    """One uint64 per row of `rb` from `columns` (in name order; a column `rb` lacks counts as missing)."""
    h = np.zeros(rb.num_rows, np.uint64)
    with np.errstate(over="ignore"):
        for name in sorted(set(columns)):
            i = rb.schema.get_field_index(name)
            col = rb.column(i) if i >= 0 else pa.nulls(rb.num_rows, pa.list_(pa.binary()))
            h = _mix(h * _K_ROW + column_row_hashes(col, name))
    return h


def bucket_bounds(hash_buckets: Iterable[int]) -> List[int]:
    """Cumulative bucket ends of the splits, e.g. [4, 1] -> [4, 5]."""
    out, total = [], 0
    for b in hash_buckets:
        if b < 1:
            raise ValueError(f"split hash: every split needs at least one hash bucket, got {list(hash_buckets)}")
        total += b
        out.append(total)
    return out


def assign_splits(hashes: np.ndarray, bounds: Sequence[int]) -> np.ndarray:
    """The split index of each hash: bucket = hash % total buckets, split = first bound above it."""
    bucket = hashes % np.uint64(bounds[-1])
    return np.searchsorted(np.asarray(bounds, np.uint64), bucket, side="right").astype(np.int64)
