"""Ranking models (DLRM, DCN-v2) whose embeddings follow the embedding plan.

Tables the plan places in `tpu_embedding` go through tensorflow-recommenders' `TPUEmbedding`: under
`TPUStrategy` it builds TF's `TPUEmbedding` (tables sharded in TPU HBM, the step's lookups done by
the TPU embedding engine); anywhere else it builds `TPUEmbeddingForServing` (plain variables), so
the CPU/GPU model is the same model and checkpoint-compatible. Tables the plan places on the
`tensor_core` (at most `size_threshold` rows) are ordinary variables replicated on every replica
and looked up in the step, as tensorflow-recommenders' `PartialTPUEmbedding` does. That layer's
Keras path only accepts dense single-valued IDs, so `TensorCoreTable` below does the same lookup
with the table's combiner for SparseTensor IDs (`tf.nn.safe_embedding_lookup_sparse`, the CPU
lookup TF's own embedding code uses; empty rows give zeros, as on TPU) and for padded dense IDs
(the trainer's input for these tables, static-shaped for the TPU step; see input.py).

Both models share the inputs (a float32 [batch, 1] tensor per dense feature, an int64 SparseTensor
[batch, None] or padded [batch, width] IDs per categorical feature) and the output (click
probability [batch, 1]):
- `dlrm`: bottom MLP on the dense features, dot interaction of the bottom output with every pooled
  embedding (tables of another width are projected), top MLP on [bottom, interactions];
- `dcn_v2`: the bottom output and the embeddings concatenated, `cross_layers` DCN-v2 cross layers
  (tfrs.layers.dcn.Cross, low-rank when `cross_projection_dim` is set), then the top MLP.
`dropout` (training only) follows each hidden top-MLP layer, and `input_dropout` applies to the
features' and buckets' vectors that enter the cross layers or the interaction (not the bottom
MLP's output); their masks are stateless in the step.
"""
from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf
import tensorflow_recommenders as tfrs

from components.config.schema import TABLE_DTYPES, TrainingConfig
from components.contracts.manifest import VocabularyManifest, weights_key
from components.contracts.plan import EmbeddingPlan, TablePlan
from components.embedding_model import optimizers as optimizers_lib
from components.embedding_model.input import length_key, to_dense_ids
from components.embedding_model import tf_objects

_V2 = tf.tpu.experimental.HardwareFeature.EmbeddingFeature.V2


class SparseCoreUnsupported(ValueError):
    """The model asks of SparseCore (TF 2.16's TPUEmbeddingV2) what it cannot do; says what to change."""


def check_sparsecore_features(feature_configs: Dict[str, Any]) -> None:
    """Refuses sequence features on TPU-embedding tables on SparseCore, before TF does worse.
    TF 2.16's `TPUEmbeddingV2` multiplies out every feature's `output_shape` in its constructor
    (tpu_embedding_v3.py, `_stack_tables_with_same_table_dim_and_optimizer`): a sequence feature
    leaves it unset (tf_objects.feature_configs), so the constructor raises "Cannot iterate over a
    shape with unknown rank"; and given a shape, V2 pools every feature with its table's combiner
    (`_convert_input_feature_to_coo`), so there is no per-position output to attend over."""
    bad = sorted((n, c.table.name, c.max_sequence_length) for n, c in feature_configs.items() if c.max_sequence_length)
    if bad:
        listed = ", ".join(f"{n!r} (table {t!r}, length {length})" for n, t, length in bad)
        raise SparseCoreUnsupported(
            f"sequence features on TPU-embedding tables cannot train on SparseCore (TPUEmbeddingV2, TensorFlow "
            f"2.16 has no sequence output there): {listed}. Keep their tables on the TensorCore "
            "(training.embedding.size_threshold at or above the tables' rows), drop `sequence` from these "
            "features, or train on a TPU with TPUEmbedding (v2-v4)")


class EmbeddingLayer(tfrs.layers.embedding.TPUEmbedding):
    """tensorflow-recommenders' TPUEmbedding layer with the SparseCore constructor fixed for the
    installed TensorFlow. TFRS 0.7.7 builds `TPUEmbeddingV2(feature_config, optimizer,
    pipeline_execution_with_tensor_core, sparse_core_embedding_config)`, four positional arguments,
    while TF 2.16.2's `TPUEmbeddingV2.__init__` takes three (tpu_embedding_v3.py): a TypeError on
    every SparseCore chip. Here the V2 object is built with the installed signature, by keyword;
    SparseCore settings TF 2.16 does not take (`SparseCoreEmbeddingConfig`, TF >= 2.17) are
    refused, and optimizer settings its kernels ignore are refused
    (optimizers.check_sparsecore_optimizer). Everything else (V1 TPUEmbedding, the CPU/GPU
    TPUEmbeddingForServing, the lookup and gradient trap) is TFRS's."""

    def _create_tpu_embedding_mid_level_api(
        self, using_tpu, embedding_feature, pipeline_execution_with_tensor_core, sparse_core_embedding_config
    ):
        if using_tpu and embedding_feature == _V2:
            if sparse_core_embedding_config is not None:
                raise ValueError(
                    "sparse_core_embedding_config needs TensorFlow >= 2.17; TF 2.16's TPUEmbeddingV2 takes no SparseCore config"
                )
            check_sparsecore_features(dict(self._feature_config))
            optimizers_lib.check_sparsecore_optimizer(self._optimizer)
            for table in {id(f.table): f.table for f in tf.nest.flatten(self._feature_config)}.values():
                if table.optimizer is not None:  # a table's own optimizer (tables[].optimizer)
                    optimizers_lib.check_sparsecore_optimizer(table.optimizer, f"the optimizer of table {table.name!r}")
            return tf.tpu.experimental.embedding.TPUEmbeddingV2(
                feature_config=self._feature_config,
                optimizer=self._optimizer,
                pipeline_execution_with_tensor_core=pipeline_execution_with_tensor_core,
            )
        return super()._create_tpu_embedding_mid_level_api(
            using_tpu, embedding_feature, pipeline_execution_with_tensor_core, sparse_core_embedding_config
        )


class StepDropout(tf.keras.layers.Layer):
    """Dropout whose mask is a function of (seed, layer, replica, training step): stateless, so a
    run resumed from a checkpoint draws the same masks as an uninterrupted one (Keras' Dropout keeps
    its random state outside the checkpoint). `step_fn` returns the step counter; RankingModel
    points it at the dense optimizer's `iterations`."""

    def __init__(self, rate: float, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.rate, self.seed = rate, seed
        self.step_fn = None

    def call(self, x, training=False):
        if not training or not self.rate:
            return x
        replica = tf.distribute.get_replica_context()
        replica_id = replica.replica_id_in_sync_group if replica is not None else 0
        step = tf.cast(self.step_fn(), tf.int64) if self.step_fn is not None else tf.constant(0, tf.int64)
        key = tf.cast(self.seed, tf.int64) * 1_000_003 + tf.cast(replica_id, tf.int64)
        return tf.nn.experimental.stateless_dropout(x, self.rate, seed=tf.stack([key, step]))


def _mlp(
    widths: List[int], name: str, last_activation: Optional[str] = "relu", dropout: float = 0.0, seed: int = 0
) -> tf.keras.Sequential:
    layers: List[tf.keras.layers.Layer] = []
    for i, w in enumerate(widths):
        last = i == len(widths) - 1
        layers.append(tf.keras.layers.Dense(w, activation=last_activation if last else "relu"))
        if dropout and not last:
            layers.append(StepDropout(dropout, seed=seed * 100 + i, name=f"{name}_dropout_{i}"))
    return tf.keras.Sequential(layers, name=name)


class TensorCoreTable(tf.keras.layers.Layer):
    """A small table kept on the TensorCore: [rows, dim] variable, pooled lookup of SparseTensor IDs."""

    def __init__(self, table: TablePlan, name: str):
        super().__init__(name=f"table_{name}")
        self.rows, self.dim, self.combiner = table.rows, table.dim, table.combiner
        self._initializer = tf_objects.tf_initializer(table.initializer)

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings", shape=[self.rows, self.dim], initializer=self._initializer, trainable=True
        )
        super().build(input_shape)

    def call(self, ids, safe: bool = True, weights=None, sequence_length: int = 0) -> tf.Tensor:
        """`safe` (the feature's use_safe_embedding_lookup): SparseTensor IDs through
        safe_embedding_lookup_sparse (negative IDs dropped), else pooled as given. `weights`
        (a weighted feature's, W1): one per ID, in the IDs' form (SparseTensor / padded).
        `sequence_length` (a sequence feature's): [batch, length, dim], one vector per position."""
        if sequence_length:
            return sequence_positions(self.embeddings, ids, sequence_length)
        if isinstance(ids, tf.SparseTensor):
            if not safe:
                return pool_sparse(self.embeddings, ids, self.combiner, weights=weights)
            return tf.nn.safe_embedding_lookup_sparse(self.embeddings, ids, weights, combiner=self.combiner)
        # Padded dense IDs ([batch, width], PAD_ID < 0 as padding: the TPU step's static form).
        # Hand-written because no Keras/TF lookup pools padded rows by a combiner; it matches
        # safe_embedding_lookup_sparse (negative IDs skipped, empty rows give zeros).
        ids = tf.convert_to_tensor(ids)
        if ids.shape.rank == 1:
            ids = tf.expand_dims(ids, 1)
        mask = tf.cast(ids >= 0, self.embeddings.dtype)
        if weights is not None:  # padded weights are 0
            weights = tf.convert_to_tensor(weights)
            mask = mask * tf.reshape(weights, tf.shape(mask))
        vectors = tf.gather(self.embeddings, tf.maximum(ids, 0)) * mask[..., None]
        total = tf.reduce_sum(vectors, axis=1)
        if self.combiner == "sum":
            return total
        if self.combiner == "mean":
            return tf.math.divide_no_nan(total, tf.reduce_sum(mask, axis=1, keepdims=True))
        return tf.math.divide_no_nan(total, tf.sqrt(tf.reduce_sum(mask * mask, axis=1, keepdims=True)))  # sqrtn


def sequence_ids(ids, length: int) -> tf.Tensor:
    """int64 [batch, length]: a sequence feature's first `length` IDs per row, -1 after its last.
    `ids`: a row-major SparseTensor or padded dense IDs."""
    return to_dense_ids(ids, length) if isinstance(ids, tf.SparseTensor) else tf.convert_to_tensor(ids)[:, :length]


def sequence_positions(rows: tf.Tensor, ids, length: int, offset: int = 0, scale: Optional[tf.Tensor] = None) -> tf.Tensor:
    """[batch, length, dim]: a sequence feature's first `length` IDs looked up in `rows`, one
    vector per position, zeros after a row's last ID (what TPUEmbeddingForServing's CPU lookup of
    a feature with max_sequence_length gives). `offset`: the table's first row in `rows` (a stack
    of tables); `scale`: int8 rows' per-row scales (rows other than float32 come back as float32)."""
    dense = sequence_ids(ids, length)
    valid = dense >= 0
    at = tf.where(valid, dense + offset, offset) if offset else tf.maximum(dense, 0)
    values = tf.cast(tf.gather(rows, at), tf.float32) if rows.dtype != tf.float32 else tf.gather(rows, at)
    if scale is not None:
        values = values * tf.gather(scale, at)[..., None]
    return values * tf.cast(valid, values.dtype)[..., None]


def sequence_mask(ids, length: int, lengths: Optional[tf.Tensor] = None) -> tf.Tensor:
    """float32 [batch, length]: 1 where a sequence feature's row has an ID at that position.
    `lengths` ([batch], the input's `length_key`, computed on the host): the mask from them alone,
    without sparse ops (the TPU step's form)."""
    if lengths is not None:
        return tf.cast(tf.range(length)[None, :] < tf.cast(lengths, tf.int32)[:, None], tf.float32)
    return tf.cast(sequence_ids(ids, length) >= 0, tf.float32)


class SequencePooling(tf.keras.layers.Layer):
    """A sequence feature's [batch, length, dim] vectors -> [batch, dim]. `mean`: the mean over the
    row's positions (zeros for an empty row). `attention` (target attention in the style of DIN,
    Zhou et al. 2018): each position's score is an MLP of [query, key, query - key, query * key],
    softmax-normalised over the row's positions; the output is the score-weighted sum of keys, so
    a user's past items count by their relevance to the candidate. Hand-written: neither Keras 2
    nor TFRS 0.7.7 has a masked target-attention pooling."""

    def __init__(self, pooling: str, name: str, hidden: int = 32):
        super().__init__(name=name)
        self.pooling = pooling
        if pooling == "attention":
            self.score = tf.keras.Sequential(
                [tf.keras.layers.Dense(hidden, activation="relu"), tf.keras.layers.Dense(1)], name="score")

    def call(self, keys: tf.Tensor, mask: tf.Tensor, query: Optional[tf.Tensor] = None) -> tf.Tensor:
        if self.pooling == "mean":
            return tf.math.divide_no_nan(tf.reduce_sum(keys * mask[..., None], 1), tf.reduce_sum(mask, 1, keepdims=True))
        q = tf.broadcast_to(query[:, None, :], tf.shape(keys))
        scores = tf.squeeze(self.score(tf.concat([q, keys, q - keys, q * keys], -1)), -1)
        # Numerically safe exp: subtract the maximum over the row's real positions only. A padding
        # position scoring far above them must not drive every real weight to exp(-large) = 0.
        valid = mask > 0
        masked = tf.where(valid, scores, tf.fill(tf.shape(scores), scores.dtype.min))
        top = tf.stop_gradient(tf.reduce_max(masked, 1, keepdims=True))
        top = tf.where(tf.reduce_any(valid, 1, keepdims=True), top, tf.zeros_like(top))  # an empty row
        e = tf.exp(tf.where(valid, scores - top, tf.fill(tf.shape(scores), scores.dtype.min))) * mask
        attention = tf.math.divide_no_nan(e, tf.reduce_sum(e, 1, keepdims=True))  # an empty row: zeros
        return tf.reduce_sum(attention[..., None] * keys, 1)


_POOL = {"mean": tf.sparse.segment_mean, "sum": tf.sparse.segment_sum, "sqrtn": tf.sparse.segment_sqrt_n}


def pool_sparse(rows: tf.Tensor, ids: tf.SparseTensor, combiner: str, positions: Optional[tf.Tensor] = None,
                weights: Optional[tf.SparseTensor] = None) -> tf.Tensor:
    """[batch, dim]: each batch row's IDs (row-major SparseTensor, no negative ID) looked up in
    `rows` and combined, zeros for a row without IDs: safe_embedding_lookup_sparse's result for
    valid IDs, bit for bit (the same sums in the same order), in one sparse segment op.
    `positions`: the rows of `rows` to use instead of the IDs themselves. `weights` (W1, one per
    ID): sum(w x) / sum(w), sum(w x), sum(w x) / sqrt(sum(w^2)), as embedding_lookup_sparse
    weighs (div_no_nan: a row whose weights sum to 0 pools to zeros)."""
    where = ids.values if positions is None else positions
    segments, n = ids.indices[:, 0], ids.dense_shape[0]
    if weights is None:
        return _POOL[combiner](rows, where, segments, num_segments=n)
    w = tf.cast(weights.values, rows.dtype)
    total = tf.math.unsorted_segment_sum(tf.gather(rows, where) * w[:, None], segments, n)
    if combiner == "sum":
        return total
    if combiner == "mean":
        return tf.math.divide_no_nan(total, tf.math.unsorted_segment_sum(w, segments, n)[:, None])
    return tf.math.divide_no_nan(total, tf.sqrt(tf.math.unsorted_segment_sum(w * w, segments, n))[:, None])


class FusedChunk(NamedTuple):
    """Serving features pooled by one segment op: a stack of `RankingModel.serving_stacks`, their
    combiner, the features (their order is the segments' order) and each one's table offset."""

    stack: str
    combiner: str
    features: Tuple[str, ...]
    offsets: Tuple[int, ...]


BATCH_KEY = "__batch"  # int64 scalar: the batch size, with fused inputs
DENSE_KEY = "__dense"  # float32 [batch, dense features]: the dense features in one matrix, with fused inputs


def fused_key(chunk: int, part: str) -> str:
    """Input key of a fused chunk's `rows` (IDs offset into the stack) or `segments`."""
    return f"__fused_{chunk}_{part}"


class ServingTables(tf.keras.layers.Layer):
    """Trained tables of one dim held for CPU serving, stacked row-wise in one variable (table after
    table, `offsets` each table's first row): float32, float16, or int8 with a float32 scale per
    row (row r = int8 row x scale[r]). Two lookups, each what TPUEmbeddingForServing computes
    (safe_embedding_lookup_sparse: the rows of a batch row's IDs summed in order, divided by their
    count or its square root; zeros for a row without IDs):
    - `lookup(table, ids)`: one feature's SparseTensor IDs pooled with the table's combiner, one
      sparse segment reduction instead of safe_embedding_lookup_sparse's ~25 ops per feature
      (SparseFillEmptyRows, unique, masks, reshapes), which were a third of the serving model's
      ops at batch 1 (issue 17);
    - `pool_fused(rows, segments, ...)`: many features at once, their IDs already offset into the
      stack and each (feature, batch row) a segment: one segment op for all of them instead of one
      per feature (and the per-feature SparseTensors the raw-feature transform no longer cuts).
      A segment's sum runs over its rows in the same order either way, so the two are bit-identical
      for float32 tables (tests/test_serving_transform.py).
    Stacked because a graph op cannot gather from several variables at once. Compressed tables
    are gathered for the batch's unique rows and dequantized before pooling, so the combiner runs
    in float32.
    `wide` {table: its wide table} (training.wide): the wide part's one weight per row, held beside
    the stack in a float32 [rows, 1] variable of the same rows (never compressed: 4 bytes a row),
    pooled from the same positions and segments as the rows, so the wide part adds one segment
    op per lookup and no index work; `assign` / `read` take a wide table's name too."""

    def __init__(self, tables: Dict[str, Any], name: str, storage: str = "float32",
                 wide: Optional[Dict[str, str]] = None):
        super().__init__(name=name)
        if storage not in TABLE_DTYPES:
            raise ValueError(f"table dtype {storage!r} is not one of {', '.join(TABLE_DTYPES)}")
        dims = {t.dim for t in tables.values()}
        if len(dims) != 1:
            raise ValueError(f"{name}: stacked tables need one dim, got {sorted(dims)}")
        self.dim, self.storage = dims.pop(), storage
        self.combiners = {n: t.combiner for n, t in tables.items()}
        self.table_rows = {n: t.rows for n, t in tables.items()}
        self.offsets, total = {}, 0
        for n, t in tables.items():
            self.offsets[n], total = total, total + t.rows
        self.rows = total
        self.wide_tables = {w: n for n, w in (wide or {}).items() if n in self.offsets}  # wide table -> its table

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings", shape=[self.rows, self.dim], dtype=tf.as_dtype(self.storage),
            initializer="zeros", trainable=False,
        )
        self.scale = None
        if self.storage == "int8":
            self.scale = self.add_weight(name="scale", shape=[self.rows], initializer="ones", trainable=False)
        self.wide = None
        if self.wide_tables:
            self.wide = self.add_weight(name="wide", shape=[self.rows, 1], initializer="zeros", trainable=False)
        super().build(input_shape)

    def _built(self) -> None:
        """Variables created on first use: the model calls `lookup` / `pool_fused`, not the layer."""
        if not self.built:
            with tf.name_scope(self.name):
                self.build()

    def _span(self, table: str):
        return slice(self.offsets[table], self.offsets[table] + self.table_rows[table])

    def assign(self, table: str, values, scale=None) -> None:
        """A table's stored rows (and int8 scales) into its place in the stack; a wide table's
        [rows, 1] weights into the wide column beside its table's rows."""
        self._built()
        if table in self.wide_tables:
            self.wide[self._span(self.wide_tables[table])].assign(values)
            return
        self.embeddings[self._span(table)].assign(values)
        if scale is not None:
            self.scale[self._span(table)].assign(scale)

    def read(self, table: str):
        """A table's stored rows (a wide table's weights), as numpy."""
        self._built()
        if table in self.wide_tables:
            return self.wide[self._span(self.wide_tables[table])].numpy()
        return self.embeddings[self._span(table)].numpy()

    def _float_rows(self, rows: tf.Tensor):
        """(float32 rows, positions, wide weights): the rows to pool from, each ID's place in them
        and the wide weights at the same places (None without a wide part): the stack itself for
        float32, else the batch's unique rows dequantized."""
        if self.storage == "float32":
            return self.embeddings, rows, self.wide
        unique, position = tf.unique(rows)
        values = tf.cast(tf.gather(self.embeddings, unique), tf.float32)
        if self.scale is not None:
            values = values * tf.gather(self.scale, unique)[:, None]
        return values, position, (tf.gather(self.wide, unique) if self.wide is not None else None)

    def lookup(self, table: str, ids, weights=None, sequence_length: int = 0):
        """One feature's pooled vectors ([batch, dim]; [batch, length, dim] for a sequence feature)
        and, with a wide part, its pooled wide weights ([batch, 1]; [batch, length, 1]) beside
        them: (vectors, wide or None)."""
        self._built()
        offset = self.offsets[table]
        if sequence_length:  # a sequence feature: [batch, length, dim] (float32, dequantized)
            vectors = sequence_positions(self.embeddings, ids, sequence_length, offset, self.scale)
            wide = sequence_positions(self.wide, ids, sequence_length, offset) if self.wide is not None else None
            return vectors, wide
        if not isinstance(ids, tf.SparseTensor):
            raise TypeError(f"{self.name}: serving lookups take SparseTensor IDs (the raw-feature transform's output)")
        stacked = ids.values + offset if offset else ids.values
        rows, position, wide = self._float_rows(stacked)
        combiner = self.combiners[table]
        vectors = pool_sparse(rows, ids, combiner, positions=position, weights=weights)
        return vectors, (pool_sparse(wide, ids, combiner, positions=position, weights=weights) if wide is not None else None)

    def pool_fused(self, rows: tf.Tensor, segments: tf.Tensor, features: int, batch: tf.Tensor, combiner: str):
        """`features` features' pooled vectors, [features, batch, dim], and with a wide part their
        pooled wide weights, [features, batch, 1] (else None): `rows` (int64, into the stack) and
        `segments` (feature x batch + batch row, non-decreasing) of all their IDs."""
        self._built()
        values, position, wide = self._float_rows(rows)
        pooled = _POOL[combiner](values, position, segments, num_segments=features * batch)
        if wide is not None:
            wide = tf.reshape(_POOL[combiner](wide, position, segments, num_segments=features * batch), [features, -1, 1])
        return tf.reshape(pooled, [features, -1, self.dim]), wide


class ServingTable(ServingTables):
    """One trained table held for CPU serving (a stack of one): `layer(ids)` pools its IDs."""

    def __init__(self, table: TablePlan, name: str, storage: str = "float32", wide: Optional[str] = None):
        super().__init__({name: table}, f"serving_table_{name}", storage, wide={name: wide} if wide else None)
        self.table = name

    def call(self, ids, weights=None, sequence_length: int = 0) -> tf.Tensor:
        return self.lookup(self.table, ids, weights=weights, sequence_length=sequence_length)[0]


def bucket_ids(values: tf.Tensor, boundaries) -> tf.Tensor:
    """int32 bucket of each float32 value: how many `boundaries` (sorted) are <= it (rulebook B1:
    a value equal to a boundary is in the bucket above it; below the first, bucket 0). TF's
    Bucketize op, in the training step and the serving graph alike."""
    return tf.raw_ops.Bucketize(input=tf.cast(values, tf.float32), boundaries=[float(b) for b in boundaries])


def piecewise_linear(values: tf.Tensor, boundaries) -> tf.Tensor:
    """[batch] values -> [batch, bins] float32: the piecewise-linear encoding over the bins between
    consecutive `boundaries` (non-decreasing): per bin 0 below it, 1 at or above its upper
    boundary, the fraction (value - lower) / width inside it; a bin of width zero (a repeated
    boundary) is 1 at or above it and 0 below, as rulebook B1 puts a value equal to a boundary in
    the bucket above. Stock ops only, in the training step and the serving graph alike."""
    b = [float(x) for x in boundaries]
    lower, upper = tf.constant(b[:-1], tf.float32), tf.constant(b[1:], tf.float32)
    width = upper - lower
    x = tf.cast(values, tf.float32)[:, None]
    inside = tf.clip_by_value(tf.math.divide_no_nan(x - lower, width), 0.0, 1.0)
    return tf.where(width > 0, inside, tf.cast(x >= upper, tf.float32))


class BucketTable(tf.keras.layers.Layer):
    """A dense feature's quantile buckets as an embedded categorical (training.dense_buckets): its
    [buckets, dim] embeddings and, with a wide part, one weight per bucket, all zeros at the start
    (so an untrained model is the model without buckets: random vectors of 13 dense features fed
    noise into the cross layers of short runs, tests/test_replicas.py, test_continuous.py). Small: dense variables of the model, replicated and
    restored like the dense network; the embeddings are updated by the dense optimizer, the wide
    weights by the wide part's."""

    def __init__(self, boundaries, dim: int, wide: bool, name: str, encoding: str = "embedding"):
        super().__init__(name=name)
        self.boundaries, self.dim, self.has_wide, self.encoding = tuple(boundaries), dim, wide, encoding
        if encoding == "piecewise_linear" and len(self.boundaries) < 2:
            raise ValueError(f"{name}: a piecewise-linear encoding needs at least 2 boundaries, got {len(self.boundaries)}")

    def build(self, input_shape=None):
        # embedding: one row per bucket; piecewise_linear: one row per bin between two boundaries
        rows = len(self.boundaries) + 1 if self.encoding == "embedding" else len(self.boundaries) - 1
        self.embeddings = self.add_weight(name="embeddings", shape=[rows, self.dim], initializer="zeros", trainable=True)
        self.wide = self.add_weight(name="wide", shape=[rows, 1], initializer="zeros", trainable=True) if self.has_wide else None
        super().build(input_shape)

    def call(self, values: tf.Tensor):
        """[batch] float32 values -> ([batch, dim] vectors, [batch, 1] wide weights or None)."""
        if self.encoding == "piecewise_linear":
            enc = piecewise_linear(values, self.boundaries)
            return tf.matmul(enc, self.embeddings), (tf.matmul(enc, self.wide) if self.wide is not None else None)
        ids = bucket_ids(values, self.boundaries)
        return tf.gather(self.embeddings, ids), (tf.gather(self.wide, ids) if self.wide is not None else None)


class TableOptimizer(NamedTuple):
    """The embedding optimizer of tables with one of their own (tables[].optimizer): the Keras
    optimizer (CPU/GPU update, slot owner, checkpoint key `table_embedding_optimizers/<key>`), the
    TPU one (TableConfig.optimizer) and the clipping limit. Tables with equal specs share one."""

    key: str
    keras: Any
    tpu: Any
    clipvalue: Optional[float]


def sum_over_replicas(grads_and_vars):
    """(gradients summed over the replicas, whether they were): the embedding gradients of one
    step as one replica would compute them for the global batch (Keras scales each replica's loss
    by 1 / replicas, so the sum is the global batch's mean-loss gradient). Sparse gradients are
    gathered, not reduced: an all-reduce makes an IndexedSlices dense, and a lazy optimizer
    (LazyAdam, as the TPU's Adam) would then move every row; gathered rows and values stay an
    IndexedSlices whose duplicate rows sum, and clipping (clip_embedding_gradients) sums duplicates
    before it clips, so the clip applies to the summed gradient, as on TPU-embedding tables, not
    to each replica's part of it (a sum of clipped gradients). Hand-written: Keras aggregates
    inside apply_gradients, after any clipping a caller can do."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1 or not grads_and_vars:
        return list(grads_and_vars), False
    out = []
    for g, v in grads_and_vars:
        if isinstance(g, tf.IndexedSlices):
            g = tf.IndexedSlices(ctx.all_gather(g.values, axis=0), ctx.all_gather(g.indices, axis=0), g.dense_shape)
        else:
            g = ctx.all_reduce(tf.distribute.ReduceOp.SUM, g)
        out.append((g, v))
    return out, True


@tf.custom_gradient
def _scale_gradient(x, factor):
    """x unchanged; its gradient times `factor` (the embedding gradient multiplier)."""

    def grad(dy):
        return dy * tf.cast(factor, dy.dtype), None

    return tf.identity(x), grad


def raw_dense(inputs: Dict[str, Any], names) -> tf.Tensor:
    """[batch, len(names)] float32: the dense features' filled values. `inputs[DENSE_KEY]`, when
    there: the features already as one [batch, len(names)] matrix (the serving transform's fused form)."""
    if DENSE_KEY in inputs:
        return inputs[DENSE_KEY]
    return tf.concat([tf.reshape(inputs[n], [-1, 1]) for n in names], axis=1)


def dense_input(inputs: Dict[str, Any], names, raw: Optional[tf.Tensor] = None) -> tf.Tensor:
    """[batch, len(names)] float32: the dense features, signed log1p (counts are heavy-tailed;
    inside the model so serving does the same). The baseline (baseline.py) reads them so too.
    `raw`: `raw_dense(inputs, names)`, when already there."""
    dense = raw_dense(inputs, names) if raw is None else raw
    return tf.sign(dense) * tf.math.log1p(tf.abs(dense))


class RankingModel(tf.keras.Model):
    """DLRM or DCN-v2 over the plan's tables. `embedding_optimizer=None` builds the serving variant
    (no optimizer, so no slot variables). `tpu_embedding_optimizer`: the `tf.tpu.experimental.embedding`
    optimizer the embedding layer gets on every platform (optimizers.tpu_optimizer: applied in HBM on
    TPU; on CPU/GPU it only creates the slots, through the Keras optimizer, so both platforms hold
    them under the same keys). `embedding_clipvalue`: the embedding gradients are clipped as the TPU
    clips them (optimizers.clip_embedding_gradients) before the Keras optimizer applies them.
    `serving_table_dtype` (the exporter's model) holds every table as plain variables of that dtype
    (`ServingTables`; with `stack_serving_tables`, the tables of one dim stacked in one, which the
    serving transform's fused inputs need) instead of the TFRS layer and TensorCore tables; the dense network is the same.
    `tpu_output_batch`: the static per-replica batch, set as the features' output shape on TPU.
    `table_optimizers` {table: TableOptimizer}: tables updated by an optimizer of their own instead
    of `embedding_optimizer` / `tpu_embedding_optimizer`. Every embedding optimizer counts every
    training step (one with nothing to apply in a step, e.g. on a TPU where the engine updates the
    tables, advances its `iterations` itself), so schedules, Adam's bias correction and a checkpoint
    resumed on the other platform see the same step. `gradient_multiplier` (plan.gradient_multiplier):
    each feature's pooled-vector gradient times its value at the step, in training; the table
    gradients (sums of those) scale with it on every platform, before clipping."""

    def __init__(
        self,
        plan: EmbeddingPlan,
        manifest: VocabularyManifest,
        training: TrainingConfig,
        embedding_optimizer: Optional[tf.keras.optimizers.legacy.Optimizer] = None,
        dense_optimizer: Optional[tf.keras.optimizers.legacy.Optimizer] = None,
        tpu_embedding_optimizer: Any = None,
        serving_table_dtype: Optional[str] = None,
        stack_serving_tables: bool = False,
        tpu_output_batch: Optional[int] = None,
        embedding_clipvalue: Optional[float] = None,
        pipeline_execution_with_tensor_core: bool = False,
        table_optimizers: Optional[Dict[str, TableOptimizer]] = None,
        gradient_multiplier: Any = None,
    ):
        super().__init__(name="ranking_model")
        self.model_type = training.model
        self.dense_names = manifest.dense_names
        self.categorical_names = manifest.categorical_names
        self.embedding_optimizer = embedding_optimizer
        self.dense_optimizer = dense_optimizer
        self.embedding_clipvalue = embedding_clipvalue
        table_optimizers = dict(table_optimizers or {})
        # Tracked once each, under their keys (checkpoint: model/table_embedding_optimizers/<key>);
        # the table -> TableOptimizer map itself is not tracked (it would reach them twice).
        self.table_embedding_optimizers = {o.key: o.keras for o in table_optimizers.values()}
        self._table_optimizer = tf.Module()._no_dependency(table_optimizers)  # pylint: disable=protected-access
        self.gradient_multiplier = gradient_multiplier
        tables = plan.tables
        # The wide part (training.wide): {wide feature: the feature whose IDs it reads}, each a
        # feature of its table's one-dimensional wide table; the model adds their pooled values
        # (and a linear term of the dense features) to the deep part's logit.
        self.wide_features = {w: n for w, n in plan.wide_features().items() if n in self.categorical_names}
        self.wide_feature_of = {n: w for w, n in self.wide_features.items()}
        lookups = list(self.categorical_names) + list(self.wide_features)  # every feature looked up
        self.feature_table = {n: plan.features[n].table for n in lookups}
        self.feature_dim = {n: tables[t].dim for n, t in self.feature_table.items()}
        self.feature_safe = {n: plan.features[n].validate_weights_and_indices for n in lookups}
        tpu_features = [n for n in lookups if tables[self.feature_table[n]].placement == "tpu_embedding"]
        self.embedding_layer = None
        self.serving_stacks: Dict[str, ServingTables] = {}
        self.stack_serving_tables = serving_table_dtype is not None and stack_serving_tables
        serving_tables: Dict[str, ServingTables] = {}
        if serving_table_dtype is not None:
            # The exporter's CPU serving model: the tables as plain (optionally compressed)
            # variables, those of one dim stacked in one (ServingTables).
            # (a wide table is held beside its table's rows: ServingTables' `wide`)
            used = [name for name in tables if any(self.feature_table[n] == name for n in self.categorical_names)]
            wide = {self.feature_table[n]: self.feature_table[w] for w, n in self.wide_features.items()}
            if stack_serving_tables:
                for dim in sorted({tables[name].dim for name in used}):
                    stack = ServingTables({name: tables[name] for name in used if tables[name].dim == dim},
                                          f"serving_tables_dim{dim}", serving_table_dtype, wide=wide)
                    self.serving_stacks[f"dim{dim}"] = stack
            else:  # one variable per table (the Trainer's SavedModel: no offsets to add)
                self.serving_stacks = {name: ServingTable(tables[name], name, serving_table_dtype, wide=wide.get(name))
                                       for name in used}
            for stack in self.serving_stacks.values():
                serving_tables.update({name: stack for name in list(stack.offsets) + list(stack.wide_tables)})
            tpu_features = []
        # table -> its stack (each stack is tracked once, in serving_stacks)
        self.serving_tables = tf.Module()._no_dependency(serving_tables)  # pylint: disable=protected-access
        self.weighted_features = {f.name for f in manifest.categorical_features if f.weight_column}
        self.serving_chunks: List[FusedChunk] = tf.Module()._no_dependency([])  # pylint: disable=protected-access
        self.tpu_feature_names = tpu_features
        if tpu_features:
            # On a TPU the features' output shape is the static per-replica batch (TPUEmbeddingV2
            # sizes its SparseCore stacks from it); elsewhere it stays unset.
            configs = tf_objects.feature_configs(
                plan, output_batch=tpu_output_batch, on_tpu=tpu_output_batch is not None,
                table_optimizers={n: o.tpu for n, o in table_optimizers.items()},
            )
            self.embedding_layer = EmbeddingLayer(
                {n: configs[n] for n in tpu_features},
                optimizer=tpu_embedding_optimizer,
                pipeline_execution_with_tensor_core=pipeline_execution_with_tensor_core,
            )
        # One layer per TensorCore table; features of a shared table use the same layer.
        self.tensor_core_tables = {
            name: TensorCoreTable(t, name) for name, t in tables.items() if t.placement == "tensor_core"
            and any(self.feature_table[n] == name for n in lookups)
        } if serving_table_dtype is None else {}
        # Sequence features: one vector per position (max_sequence_length), pooled by their layer.
        self.sequence_length = {n: plan.features[n].max_sequence_length for n in self.categorical_names
                                if plan.features[n].max_sequence_length}
        self.sequence_query = {n: plan.features[n].sequence_query for n in self.sequence_length}
        self.sequence_pooling = {n: SequencePooling(plan.features[n].sequence_pooling or "mean", f"sequence_{n}")
                                 for n in self.sequence_length}
        # A sequence feature's wide feature reads the same positions; they are pooled by its
        # table's combiner over the row's positions (`_pool_sequences`).
        self.wide_combiner = {w: tables[self.feature_table[w]].combiner for w in self.wide_features}
        self.bottom_mlp = _mlp(training.bottom_mlp, "bottom_mlp")
        # The wide part's linear term of the dense features (their signed log1p, as the deep part
        # reads them), updated by the wide tables' optimizer (`_variable_tables`): with the dense
        # optimizer's small Adam steps it lagged the rest of the wide part (chem97, whose signal
        # is mostly a numeric score). The top MLP's output bias is the bias.
        self.wide_dense = (tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", name="wide_dense")
                           if self.wide_features and self.dense_names else None)
        # Dense features' quantile buckets (plan.dense_buckets), in the model's dense feature order.
        buckets = plan.dense_buckets
        self.bucket_tables = {
            n: BucketTable(buckets.boundaries[n], buckets.dim, bool(self.wide_features), f"buckets_{n}", buckets.encoding)
            for n in self.dense_names if buckets is not None and n in buckets.boundaries}
        self.projections: Dict[str, tf.keras.layers.Layer] = {}
        if self.model_type == "dlrm":
            # DotInteraction needs one width: tables of another dim are projected (no bias).
            width = training.bottom_mlp[-1]
            self.projections = {
                n: tf.keras.layers.Dense(width, use_bias=False, name=f"project_{n}")
                for n in self.categorical_names if self.feature_dim[n] != width
            }
            self.projections.update({
                n: tf.keras.layers.Dense(width, use_bias=False, name=f"project_{n}")
                for n, t in self.bucket_tables.items() if t.dim != width})
            self.interaction = tfrs.layers.feature_interaction.DotInteraction(self_interaction=False)
        else:
            self.cross = [
                tfrs.layers.dcn.Cross(projection_dim=training.cross_projection_dim, name=f"cross_{i}")
                for i in range(training.cross_layers)
            ]
        self.top_mlp = _mlp(
            list(training.top_mlp) + [1], "top_mlp", last_activation=None, dropout=training.dropout, seed=training.seed
        )
        # Training only, on the features' and buckets' vectors that enter the cross layers or the
        # interaction (not the bottom MLP's output: without buckets a dense feature reaches the
        # model only through it, and masking it cost chem97 0.019 there); no variables, so checkpoints
        # and the serving model do not change with it.
        self.input_dropout = (StepDropout(training.input_dropout, seed=training.seed * 100 + 99, name="input_dropout")
                              if training.input_dropout else None)
        if dense_optimizer is not None:
            for layer in self.top_mlp.layers + [self.input_dropout]:
                if isinstance(layer, StepDropout):
                    layer.step_fn = lambda: self.dense_optimizer.iterations

    def embed(self, inputs: Dict[str, Any], training: bool = False) -> Dict[str, tf.Tensor]:
        """Pooled [batch, dim] vector per categorical feature."""
        out: Dict[str, tf.Tensor] = {}
        weights = {n: inputs.get(weights_key(n)) for n in self.categorical_names}  # W1; None: unweighted
        if self.serving_tables:
            for i, chunk in enumerate(self.serving_chunks):  # pooled together (the transform's fused IDs)
                if fused_key(i, "rows") in inputs:
                    pooled, wide = self.serving_stacks[chunk.stack].pool_fused(
                        inputs[fused_key(i, "rows")], inputs[fused_key(i, "segments")], len(chunk.features),
                        inputs[BATCH_KEY], chunk.combiner)
                    out.update(zip(chunk.features, tf.unstack(pooled, num=len(chunk.features))))
                    if wide is not None:
                        out.update(zip((self.wide_feature_of[n] for n in chunk.features), tf.unstack(wide, num=len(chunk.features))))
            for n in self.categorical_names:
                if n not in out:
                    out[n], wide = self.serving_tables[self.feature_table[n]].lookup(
                        self.feature_table[n], inputs[n], weights=weights[n],
                        sequence_length=self.sequence_length.get(n, 0))
                    if n in self.wide_feature_of:
                        out[self.wide_feature_of[n]] = wide
            return self._pool_sequences(out, inputs)
        source = self.wide_features  # a wide feature reads its feature's IDs (and weights)
        if self.embedding_layer is not None:
            tpu = self.tpu_feature_names
            tpu_weights = ({n: weights[source.get(n, n)] for n in tpu}
                           if any(weights[source.get(n, n)] is not None for n in tpu) else None)
            out.update(self.embedding_layer({n: inputs[source.get(n, n)] for n in tpu}, tpu_weights))
        for n in list(self.categorical_names) + list(self.wide_features):
            if n not in out:
                base = source.get(n, n)
                out[n] = self.tensor_core_tables[self.feature_table[n]](
                    inputs[base], safe=self.feature_safe[n], weights=weights[base],
                    sequence_length=self.sequence_length.get(base, 0))
        if training and self.gradient_multiplier is not None and self.dense_optimizer is not None:
            # The seeds' experimental_gradient_multiplier_fn, exact on every platform: a table's
            # gradient is a sum of its features' pooled-vector (or position-vector) gradients (the
            # TPU engine receives these activation gradients), so scaling them scales it. The
            # wide part's tables have their own optimizer and are left as they are.
            factor = self.gradient_multiplier(self.dense_optimizer.iterations)
            out = {n: v if n in source else _scale_gradient(v, factor) for n, v in out.items()}
        return self._pool_sequences(out, inputs)

    def _pool_sequences(self, out: Dict[str, tf.Tensor], inputs: Dict[str, Any]) -> Dict[str, tf.Tensor]:
        """Sequence features' [batch, length, dim] vectors -> [batch, dim] by their pooling layer
        (attention against its query feature's pooled vector)."""
        pooled = dict(out)
        for n, length in self.sequence_length.items():
            query = self.sequence_query.get(n)
            mask = sequence_mask(inputs[n], length, inputs.get(length_key(n)))
            pooled[n] = self.sequence_pooling[n](out[n], mask, query=out[query] if query else None)
            w = self.wide_feature_of.get(n)
            if w is not None:  # [batch, length, 1] -> [batch, 1] by the table's combiner
                total = tf.reduce_sum(out[w] * mask[..., None], 1)
                count = tf.reduce_sum(mask, 1, keepdims=True)
                pooled[w] = {"sum": total, "mean": tf.math.divide_no_nan(total, count),
                             "sqrtn": tf.math.divide_no_nan(total, tf.sqrt(count))}[self.wide_combiner[w]]
        return pooled

    # Not converted by AutoGraph (nor, through its control status, any layer called from here): the
    # model has no tensor-dependent Python control flow (a Python `if` on a tensor raises in a
    # graph, so nothing can silently change), and converting the subclassed layers' code took
    # most of the first trace of every step (13 s of 14 s on the 26-feature demo model), paid by
    # the TPU-rules check, fit's train function, evaluation and the SavedModel signature.
    @tf.autograph.experimental.do_not_convert
    def call(self, inputs: Dict[str, Any], training: bool = False) -> tf.Tensor:
        buckets: Dict[str, Tuple[tf.Tensor, Optional[tf.Tensor]]] = {}
        if self.dense_names:
            raw = raw_dense(inputs, self.dense_names)
            dense = dense_input(inputs, self.dense_names, raw)
            for j, n in enumerate(self.dense_names):
                if n in self.bucket_tables:
                    buckets[n] = self.bucket_tables[n](raw[:, j])
        else:
            batch = inputs[BATCH_KEY] if BATCH_KEY in inputs else tf.shape(inputs[self.categorical_names[0]], out_type=tf.int64)[0]
            dense = tf.zeros([batch, 1])
        bottom = self.bottom_mlp(dense)
        embedded = self.embed(inputs, training=training)
        # the categorical features' pooled vectors, then the dense features' bucket vectors
        names = list(self.categorical_names) + list(buckets)
        vectors = {**embedded, **{n: v for n, (v, _) in buckets.items()}}
        if self.model_type == "dlrm":
            vectors = [bottom] + [self.projections[n](vectors[n]) if n in self.projections else vectors[n] for n in names]
            if training and self.input_dropout is not None:  # one mask over the vectors, split back
                vectors = [bottom] + tf.split(self.input_dropout(tf.concat(vectors[1:], 1), training=True),
                                              [int(v.shape[-1]) for v in vectors[1:]], axis=1)
            top_input = tf.concat([bottom, self.interaction(vectors)], axis=1)
        else:
            features = tf.concat([vectors[n] for n in names], axis=1)
            if training and self.input_dropout is not None:
                features = self.input_dropout(features, training=True)
            x0 = tf.concat([bottom, features], axis=1)
            x = x0
            for layer in self.cross:
                x = layer(x0, x)
            top_input = x
        logit = self.top_mlp(top_input, training=training)
        if self.wide_features:
            logit = logit + self.wide_logit(embedded, dense, [w for _, w in buckets.values()])
        return tf.sigmoid(logit)

    def wide_logit(self, embedded: Dict[str, tf.Tensor], dense: tf.Tensor, bucket_weights=()) -> tf.Tensor:
        """[batch, 1]: the wide part, the sum of the wide features' pooled weights (in the model's
        feature order), the linear term of the dense features and their buckets' weights."""
        terms = [embedded[self.wide_feature_of[n]] for n in self.categorical_names if n in self.wide_feature_of]
        terms += list(bucket_weights)
        if self.wide_dense is not None:
            terms.append(self.wide_dense(dense))
        return tf.add_n(terms)

    def serving_fusion_groups(self) -> List[FusedChunk]:
        """The serving model's features that can be pooled together: per stack and combiner, the
        features that are neither weighted nor sequences, in the model's order (offsets: each
        feature's table's first row in the stack). The raw-feature transform cuts these into the
        chunks it fuses (`set_serving_chunks`)."""
        groups: Dict[Tuple[str, str], List[str]] = {}
        for n in self.categorical_names:
            if n in self.weighted_features or n in self.sequence_length:
                continue
            table = self.feature_table[n]
            stack = next(k for k, v in self.serving_stacks.items() if table in v.offsets)
            groups.setdefault((stack, self.serving_stacks[stack].combiners[table]), []).append(n)
        return [FusedChunk(stack, combiner, tuple(fs), tuple(self.serving_stacks[stack].offsets[self.feature_table[n]] for n in fs))
                for (stack, combiner), fs in groups.items()]

    def set_serving_chunks(self, chunks: List["FusedChunk"]) -> None:
        """The chunks whose IDs the inputs hold fused (`fused_key(i, ...)`, chunk i of these)."""
        self.serving_chunks = tf.Module()._no_dependency(list(chunks))  # pylint: disable=protected-access

    def embedding_variable_ids(self) -> set:
        """The variables the embedding optimizers update: the tables, and the wide part's dense term."""
        ids = {id(v) for t in self.tensor_core_tables.values() for v in t.trainable_variables}
        if self.embedding_layer is not None:
            ids |= {id(v) for v in self.embedding_layer.trainable_variables}
        if self.embedding_optimizer is not None:
            ids |= {id(v) for v in self.wide_dense_variables()}
        return ids

    def wide_dense_variables(self) -> List[tf.Variable]:
        """The wide part's variables outside the tables (the dense features' linear term, their
        buckets' weights): updated by the wide tables' optimizer."""
        out = list(self.wide_dense.trainable_variables) if self.wide_dense is not None else []
        return out + [t.wide for t in self.bucket_tables.values() if t.built and t.wide is not None]

    def _variable_tables(self) -> Dict[int, str]:
        """id(table variable) -> plan table, for the tables updated here (TensorCore tables; TPU
        embedding tables off a TPU, where they are the mid-level API's plain variables). On a TPU
        the TPU layer's trainable variable is TFRS's stand-in and maps to no table."""
        out = {id(t.embeddings): name for name, t in self.tensor_core_tables.items()}
        if self.embedding_layer is not None:
            variables = getattr(self.embedding_layer._tpu_embedding, "_variables", {})  # pylint: disable=protected-access
            for name, slots in variables.items():
                if name in self.feature_table.values() and "parameters" in slots:
                    out[id(slots["parameters"])] = name
        if self.wide_features:  # updated as the wide tables are
            wide_table = self.feature_table[next(iter(self.wide_features))]
            out.update({id(v): wide_table for v in self.wide_dense_variables()})
        return out

    def _embedding_optimizer_groups(self, items, variable=lambda item: item[1]) -> Dict[str, list]:
        """`items` (gradient-variable pairs, or what `variable` maps to a table variable) grouped
        by the key of the embedding optimizer that updates them ("" for `embedding_optimizer`)."""
        tables = self._variable_tables() if self._table_optimizer or self.wide_features else {}
        groups: Dict[str, list] = {"": []}
        for item in items:
            o = self._table_optimizer.get(tables.get(id(variable(item))))
            groups.setdefault(o.key if o else "", []).append(item)
        return groups

    def _embedding_optimizers(self) -> Dict[str, Tuple[Any, Optional[float]]]:
        optimizers = {"": (self.embedding_optimizer, self.embedding_clipvalue)}
        optimizers.update({o.key: (o.keras, o.clipvalue) for o in self._table_optimizer.values()})
        return optimizers

    def create_optimizer_slots(self) -> None:
        """Every optimizer's slots, step counter and hyperparameters for the built model's
        variables, as the first training step would create them (warm_start.py writes a whole
        training checkpoint before training). Keras' `_create_all_weights` is idempotent."""
        variables = self.trainable_variables
        emb = self.embedding_variable_ids()
        self.dense_optimizer._create_all_weights([v for v in variables if id(v) not in emb])  # pylint: disable=protected-access
        groups = self._embedding_optimizer_groups([v for v in variables if id(v) in emb], variable=lambda v: v)
        for key, (optimizer, _) in self._embedding_optimizers().items():
            optimizer._create_all_weights(groups.get(key, []))  # pylint: disable=protected-access

    def _apply_embedding_gradients(self, emb_gv) -> None:
        """Each embedding optimizer applies its tables' gradients (clipped by its limit); one with
        none this step still counts the step. With several replicas the gradients are summed over
        the replicas first and clipped after (`sum_over_replicas`), the rule the TPU embedding
        engine applies to TPU-embedding tables; Keras' own aggregation is then off."""
        emb_gv, summed = sum_over_replicas(emb_gv)
        groups = self._embedding_optimizer_groups(emb_gv)
        for key, (optimizer, clipvalue) in self._embedding_optimizers().items():
            gv = groups.get(key)
            if gv:
                optimizer.apply_gradients(optimizers_lib.clip_embedding_gradients(gv, clipvalue),
                                          experimental_aggregate_gradients=not summed)
            else:
                optimizer.iterations.assign_add(1)

    @tf.autograph.experimental.do_not_convert  # as `call`: no tensor-dependent Python control flow
    def train_step(self, data):
        """Separate optimizers for embeddings and the dense part (TFRS layer docstring pattern:
        under TPUStrategy the TPU layer exposes a stand-in trainable variable whose gradient
        applies its optimizer in HBM; TensorCore tables and CPU tables get the Keras embedding
        optimizer)."""
        features, labels = data
        with tf.GradientTape() as tape:
            probs = self(features, training=True)
            loss = self.compiled_loss(labels, probs, regularization_losses=self.losses)
        variables = self.trainable_variables
        grads = tape.gradient(loss, variables)
        emb_ids = self.embedding_variable_ids()
        dense_gv = [(g, v) for g, v in zip(grads, variables) if id(v) not in emb_ids and g is not None]
        emb_gv = [(g, v) for g, v in zip(grads, variables) if id(v) in emb_ids and g is not None]
        self.dense_optimizer.apply_gradients(dense_gv)
        self._apply_embedding_gradients(emb_gv)
        self.compiled_metrics.update_state(labels, probs)
        return {m.name: m.result() for m in self.metrics}


# ---- where the model's variables are in a training checkpoint ------------------------------------
# The trainer saves `tf.train.Checkpoint(model=<RankingModel>)`, and object-based checkpoint keys
# are the attribute path from that root. Readers of training checkpoints (the exporter) take the
# paths from here, so they depend on the model's statement rather than on its attribute names.
# tests/test_export_layouts.py checks them against a checkpoint of a real RankingModel.
CHECKPOINT_ROOT = "model"
VARIABLE_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"  # suffix of a variable's value under its object path
# Tables placed in `tpu_embedding`: the TFRS layer's mid-level API object (TPUEmbedding,
# TPUEmbeddingV2 or TPUEmbeddingForServing) holds one variable per table, named by the table
# (TPUEmbeddingV2: one per SparseCore stack, named by joining its tables' names with '_').
TPU_EMBEDDING_CHECKPOINT_PATH = CHECKPOINT_ROOT + "/embedding_layer/_tpu_embedding"
# Tables placed on the `tensor_core`: one TensorCoreTable per table, its weight `embeddings`.
TENSOR_CORE_TABLES_CHECKPOINT_PATH = CHECKPOINT_ROOT + "/tensor_core_tables"
# The dense network's sublayers (RankingModel attributes, so checkpoint names under the root):
# MLPs always; `projections` only for dlrm with tables of another width; `cross` only for dcn_v2.
DENSE_CHECKPOINT_PARTS = ("bottom_mlp", "top_mlp", "projections", "cross", "sequence_pooling", "wide_dense", "bucket_tables")


def checkpoint_name(name: str) -> str:
    """A name as it appears in an object-based checkpoint key (TensorFlow's escaping of '.', '/')."""
    return name.replace(".", "..").replace("/", ".S")


def tpu_embedding_checkpoint_key(variable: str) -> str:
    """Key of a variable held directly by the TPU embedding object: a table, a SparseCore stack or
    TensorFlow's `_sparse_core_table_layouts` record."""
    return f"{TPU_EMBEDDING_CHECKPOINT_PATH}/{checkpoint_name(variable)}{VARIABLE_VALUE}"


def table_checkpoint_key(table: str, placement: str) -> str:
    """Key of a plan table's [rows, dim] variable as this model saves it one variable per table
    (CPU/GPU, TPUEmbedding on TPU v2-v4); `placement`: the plan's `tpu_embedding` or `tensor_core`."""
    if placement == "tensor_core":
        return f"{TENSOR_CORE_TABLES_CHECKPOINT_PATH}/{checkpoint_name(table)}/embeddings{VARIABLE_VALUE}"
    return tpu_embedding_checkpoint_key(table)


def dense_checkpoint_parts(model: RankingModel) -> Dict[str, Any]:
    """The model's dense sublayers that exist, under their checkpoint names (DENSE_CHECKPOINT_PARTS)."""
    parts: Dict[str, Any] = {"bottom_mlp": model.bottom_mlp, "top_mlp": model.top_mlp}
    if model.projections:
        parts["projections"] = model.projections
    if model.model_type != "dlrm":
        parts["cross"] = model.cross
    if model.sequence_pooling:
        parts["sequence_pooling"] = model.sequence_pooling
    if model.wide_dense is not None:
        parts["wide_dense"] = model.wide_dense
    if model.bucket_tables:
        parts["bucket_tables"] = model.bucket_tables
    return parts
