"""Ragged [batch, None] rows of the serving graph, each operation in a handful of graph ops: a
column's present values as rows (`present_rows`), values kept by a mask (`keep_values`), split at
a separator (`split_values`), stacked part after part (`stack_rows`), each row's first value
(`first_or_nan`) and a sorted search (`searchsorted`).

TensorFlow's own forms (ragged and dense boolean_mask, ragged split and merge, concat,
searchsorted), general over ranks and shapes, add tens to hundreds of graph ops per call, and the
per-op overhead dominates small serving batches. Each function names the library form whose
result it gives.
"""
from __future__ import annotations

from typing import List

import components  # noqa: F401
import tensorflow as tf


def present_rows(column: tf.Tensor, present: tf.Tensor) -> tf.RaggedTensor:
    """A [batch] column as [batch, None] rows holding its value where `present`, none elsewhere:
    what `tf.RaggedTensor.from_row_lengths(tf.boolean_mask(column, present), present)` gives, in 7
    graph ops (constants included) for the mask where boolean_mask builds 27, for every column of
    every signature (about a fifth of the exporter's SavedModel save on the demo's features)."""
    return tf.RaggedTensor.from_row_lengths(_kept(column, present), tf.cast(present, tf.int64), validate=False)


def _kept(values: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """The 1-D `values` where `mask`, in order (`tf.boolean_mask(values, mask)`)."""
    return tf.gather(values, tf.where(mask)[:, 0])


def keep_values(values: tf.RaggedTensor, mask: tf.Tensor) -> tf.RaggedTensor:
    """The values of a [batch, None] ragged tensor where `mask` (one bool per flat value) is true,
    row by row: what `tf.ragged.boolean_mask(values, values.with_flat_values(mask))` returns.
    Written out because the library ops (ragged and dense boolean_mask, value_rowids), general
    over ranks and shapes, add hundreds of graph ops per call, and tracing the two serving
    signatures (every feature, several masks each) made up most of the export's save time;
    this is a handful of ops on the row splits."""
    kept_before = tf.concat([[0], tf.cumsum(tf.cast(mask, tf.int64))], 0)  # kept values before each position
    return tf.RaggedTensor.from_row_splits(
        _kept(values.flat_values, mask),
        tf.gather(kept_before, values.row_splits),
        validate=False,
    )


def first_or_nan(values: tf.RaggedTensor) -> tf.Tensor:
    """float32 [batch, 1]: each row's first value, NaN for an empty row (what
    `values[:, :1].to_tensor(default_value=nan)` gives, in a handful of ops)."""
    flat = tf.concat([tf.cast(values.flat_values, tf.float32), [float("nan")]], 0)  # [-1]: an empty row
    starts = tf.where(values.row_lengths() > 0, values.row_starts(), tf.shape(flat, out_type=tf.int64)[0] - 1)
    return tf.expand_dims(tf.gather(flat, starts), 1)


def searchsorted(sorted_sequence: tf.Tensor, values: tf.Tensor, side: str) -> tf.Tensor:
    """`tf.searchsorted` for 1-D int64 tensors in 4 ops: the library's reshapes its inputs to
    2-D through their dynamic shapes (about 10 ops a call), which at batch 1 cost more than the
    search. int64 positions."""
    op = tf.raw_ops.LowerBound if side == "left" else tf.raw_ops.UpperBound
    found = op(sorted_inputs=tf.reshape(sorted_sequence, [1, -1]), values=tf.reshape(values, [1, -1]), out_type=tf.int64)
    return tf.reshape(found, [-1])


def split_values(values: tf.RaggedTensor, separator: str) -> tf.RaggedTensor:
    """Every value split at `separator`, the pieces kept in their row (what
    `tf.strings.split(values, separator).merge_dims(1, 2)` gives, the reference transform's form).
    The op's pieces come with the index of the value each came from, sorted, so a row's first piece
    is found by binary search at the row's first value: 3 ops, where building the ragged pieces
    (`RaggedTensor.from_value_rowids`) and merging them took about 17 per split feature."""
    pieces = tf.raw_ops.StringSplitV2(input=values.flat_values, sep=separator, maxsplit=-1)
    row_splits = searchsorted(pieces.indices[:, 0], values.row_splits, "left")
    return tf.RaggedTensor.from_row_splits(pieces.values, row_splits, validate=False)


def stack_rows(parts: List[tf.RaggedTensor]) -> tf.RaggedTensor:
    """k ragged tensors of the same [batch, None] shape -> one of k * batch rows, part after part
    (what `tf.concat(parts, 0)` gives, in a fixed handful of ops whatever k is)."""
    if len(parts) == 1:
        return parts[0]
    splits = tf.stack([p.row_splits for p in parts])  # [k, batch + 1]
    offsets = tf.cumsum(splits[:, -1], exclusive=True)  # where each part's values start
    # each row's end, offset by its part's start (cheaper than a cumsum over all rows)
    ends = tf.reshape(splits[:, 1:] + tf.reshape(offsets, [-1, 1]), [-1])
    row_splits = tf.concat([tf.zeros([1], tf.int64), ends], 0)
    return tf.RaggedTensor.from_row_splits(tf.concat([p.flat_values for p in parts], 0), row_splits, validate=False)
