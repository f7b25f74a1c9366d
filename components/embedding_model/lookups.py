"""Pooled lookups of embedding IDs in a table's rows, shared by the training tables, the serving
tables and the dense tower's sequence pooling.

Each computes what TPUEmbeddingForServing's CPU lookup computes (safe_embedding_lookup_sparse: the
rows of a batch row's IDs combined in order, zeros for a row without IDs), so the training model on
CPU, the serving model and a TPU agree.
"""
from __future__ import annotations

from typing import Optional

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.embedding_model.input import to_dense_ids
from components.config.choices import Combiner

# One sparse segment reduction per combiner: a batch row's IDs are one segment.
POOL = {"mean": tf.sparse.segment_mean, "sum": tf.sparse.segment_sum, "sqrtn": tf.sparse.segment_sqrt_n}


def sequence_ids(ids, length: int) -> tf.Tensor:
    """A sequence feature's first `length` IDs per row.

    Args:
      ids: row-major int64 SparseTensor [batch, None], or padded dense IDs [batch, width] (-1 as padding).
      length: the feature's max_sequence_length.

    Returns:
      int64 [batch, length]: the IDs, -1 after a row's last one.
    """
    return to_dense_ids(ids, length) if isinstance(ids, tf.SparseTensor) else tf.convert_to_tensor(ids)[:, :length]


def sequence_positions(rows: tf.Tensor, ids, length: int, offset: int = 0, scale: Optional[tf.Tensor] = None) -> tf.Tensor:
    """A sequence feature's IDs looked up one vector per position.

    What TPUEmbeddingForServing's CPU lookup of a feature with max_sequence_length gives.

    Args:
      rows: the table's rows [rows, dim] (float32, float16 or int8), or a stack of tables.
      ids: row-major int64 SparseTensor [batch, None] or padded dense IDs [batch, width].
      length: the feature's max_sequence_length.
      offset: the table's first row in `rows` (a stack of tables).
      scale: int8 rows' float32 per-row scales [rows], or None.

    Returns:
      float32 [batch, length, dim]: one vector per position, zeros after a row's last ID.
    """
    dense = sequence_ids(ids, length)
    valid = dense >= 0
    at = tf.where(valid, dense + offset, offset) if offset else tf.maximum(dense, 0)
    values = tf.cast(tf.gather(rows, at), tf.float32) if rows.dtype != tf.float32 else tf.gather(rows, at)
    if scale is not None:
        values = values * tf.gather(scale, at)[..., None]
    return values * tf.cast(valid, values.dtype)[..., None]


def sequence_mask(ids, length: int, lengths: Optional[tf.Tensor] = None) -> tf.Tensor:
    """Where a sequence feature's rows have an ID.

    Args:
      ids: row-major int64 SparseTensor [batch, None] or padded dense IDs [batch, width].
      length: the feature's max_sequence_length.
      lengths: int [batch], the input's `length_key` computed on the host, or None. Given, the mask
        comes from them alone, without sparse ops (the TPU step's form).

    Returns:
      float32 [batch, length]: 1 where the row has an ID at that position, else 0.
    """
    if lengths is not None:
        return tf.cast(tf.range(length)[None, :] < tf.cast(lengths, tf.int32)[:, None], tf.float32)
    return tf.cast(sequence_ids(ids, length) >= 0, tf.float32)


def pool_sparse(rows: tf.Tensor, ids: tf.SparseTensor, combiner: str, positions: Optional[tf.Tensor] = None,
                weights: Optional[tf.SparseTensor] = None) -> tf.Tensor:
    """Each batch row's IDs looked up and combined in one sparse segment op.

    safe_embedding_lookup_sparse's result for valid IDs, bit for bit (the same sums in the same
    order). Weighted IDs (W1) pool sum(w x) / sum(w) (mean), sum(w x) (sum) or
    sum(w x) / sqrt(sum(w^2)) (sqrtn), as embedding_lookup_sparse weighs; a row whose weights sum
    to 0 pools to zeros.

    Args:
      rows: float [rows, dim], the rows to look up in.
      ids: row-major int64 SparseTensor [batch, None], no negative ID.
      combiner: `mean`, `sum` or `sqrtn`.
      positions: int [nnz], the rows of `rows` to use instead of the IDs themselves, or None.
      weights: float SparseTensor of the IDs' shape, one weight per ID, or None.

    Returns:
      [batch, dim] of `rows`' dtype: zeros for a row without IDs.
    """
    where = ids.values if positions is None else positions
    segments, n = ids.indices[:, 0], ids.dense_shape[0]
    if weights is None:
        return POOL[combiner](rows, where, segments, num_segments=n)
    w = tf.cast(weights.values, rows.dtype)
    total = tf.math.unsorted_segment_sum(tf.gather(rows, where) * w[:, None], segments, n)
    if combiner == Combiner.SUM:
        return total
    if combiner == Combiner.MEAN:
        return tf.math.divide_no_nan(total, tf.math.unsorted_segment_sum(w, segments, n)[:, None])
    return tf.math.divide_no_nan(total, tf.sqrt(tf.math.unsorted_segment_sum(w * w, segments, n))[:, None])
