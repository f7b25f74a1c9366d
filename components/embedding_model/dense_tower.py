"""The dense tower both ranking models share: the training model (model.py) and the serving model
(serving_model.py) embed their categorical features differently and hand the pooled vectors to it.

Its inputs are a float32 [batch, 1] tensor per dense feature (or all of them as one [batch, dense]
matrix under `DENSE_KEY`) and each categorical feature's pooled [batch, dim] vector (a sequence
feature's [batch, length, dim] vectors, pooled here); its output the click probability [batch, 1]:
- `dlrm`: bottom MLP on the dense features, dot interaction of the bottom output with every pooled
  embedding (tables of another width are projected), top MLP on [bottom, interactions];
- `dcn_v2`: the bottom output and the embeddings concatenated, `cross_layers` DCN-v2 cross layers
  (tfrs.layers.dcn.Cross, low-rank when `cross_projection_dim` is set), then the top MLP.
The dense features' bucket vectors (training.dense_buckets) join the categorical features' vectors
there (`into: interaction`) or the dense values as the bottom MLP's input (`into: bottom_mlp`).
`dropout` (training only) follows each hidden top-MLP layer, and `input_dropout` applies to the
features' (and, `into: interaction`, buckets') vectors that enter the cross layers or the
interaction (not the bottom MLP's input or output); their masks are stateless in the step
(`input_dropout_mask: byte`: drawn a byte an entry). With the wide part (training.wide) the wide
features' pooled weights, a linear term of the dense features and the buckets' weights are added
to the logit.

The tower is a plain Python object, not a Keras layer: each model tracks the tower's layers as
attributes of its own (`DenseTower.layers`), so checkpoint keys (`model/bottom_mlp/...`) and
variable names (`ranking_model/...`) are those of the model, whichever of the two holds them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf
import tensorflow_recommenders as tfrs

from components.config.training_schema import TrainingConfig
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.embedding_model.input import length_key
from components.embedding_model.lookups import sequence_mask
from components.config.choices import BucketEncoding, BucketsInto, DropoutMask, ModelType, Precision
from components.embedding_model.precision import dense_policy
from components.config.choices import SequencePooling as PoolingKind

BATCH_KEY = "__batch"  # int64 scalar: the batch size, with fused inputs
DENSE_KEY = "__dense"  # float32 [batch, dense features]: the dense features in one matrix, with fused inputs


class Untracked:
    """A value held on a Keras layer without Keras tracking it.

    Keras tracks every dict, list and trackable assigned to a layer attribute. A lookup map that
    reaches tracked layers or optimizers again under other names would add them to the checkpoint
    twice; held in this plain object it stays a Python value.

    Args:
      value: any Python value, read back as `.value`.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


def raw_dense(inputs: Dict[str, Any], names) -> tf.Tensor:
    """The dense features' filled values as one matrix.

    Args:
      inputs: the model's inputs: float32 [batch, 1] (or [batch]) per dense feature, or all of them
        as one [batch, len(names)] matrix under `DENSE_KEY` (the serving transform's fused form).
      names: the dense features, in the model's order.

    Returns:
      float32 [batch, len(names)].
    """
    if DENSE_KEY in inputs:
        return inputs[DENSE_KEY]
    return tf.concat([tf.reshape(inputs[n], [-1, 1]) for n in names], axis=1)


def dense_input(inputs: Dict[str, Any], names, raw: Optional[tf.Tensor] = None) -> tf.Tensor:
    """The dense features as the model reads them: signed log1p.

    Counts are heavy-tailed; the transform is inside the model so that serving does the same. The
    baseline (embedding_trainer/baseline.py) reads them so too.

    Args:
      inputs: the model's inputs (see `raw_dense`).
      names: the dense features, in the model's order.
      raw: `raw_dense(inputs, names)`, when already computed.

    Returns:
      float32 [batch, len(names)].
    """
    dense = raw_dense(inputs, names) if raw is None else raw
    return tf.sign(dense) * tf.math.log1p(tf.abs(dense))


def bucket_ids(values: tf.Tensor, boundaries) -> tf.Tensor:
    """Each value's bucket (rulebook B1), by TF's Bucketize op in training and serving alike.

    Args:
      values: float [batch].
      boundaries: sorted floats.

    Returns:
      int32 [batch]: how many boundaries are <= the value (a value equal to a boundary is in the
      bucket above it; below the first, bucket 0).
    """
    return tf.raw_ops.Bucketize(input=tf.cast(values, tf.float32), boundaries=[float(b) for b in boundaries])


def piecewise_linear(values: tf.Tensor, boundaries) -> tf.Tensor:
    """The piecewise-linear encoding of values over the bins between consecutive boundaries.

    Per bin: 0 below it, 1 at or above its upper boundary, the fraction (value - lower) / width
    inside it; a bin of width zero (a repeated boundary) is 1 at or above it and 0 below, as
    rulebook B1 puts a value equal to a boundary in the bucket above. Stock ops only, so the
    training step and the serving graph compute it alike.

    Args:
      values: float [batch].
      boundaries: non-decreasing floats, at least 2.

    Returns:
      float32 [batch, len(boundaries) - 1].
    """
    b = [float(x) for x in boundaries]
    lower, upper = tf.constant(b[:-1], tf.float32), tf.constant(b[1:], tf.float32)
    width = upper - lower
    x = tf.cast(values, tf.float32)[:, None]
    inside = tf.clip_by_value(tf.math.divide_no_nan(x - lower, width), 0.0, 1.0)
    return tf.where(width > 0, inside, tf.cast(x >= upper, tf.float32))


class StepDropout(tf.keras.layers.Layer):
    """Dropout whose mask is a function of (seed, layer, replica, training step).

    Stateless, so a run resumed from a checkpoint draws the same masks as an uninterrupted one
    (Keras' Dropout keeps its random state outside the checkpoint). `step_fn` returns the step
    counter; the training model points it at the dense optimizer's `iterations`.

    Args:
      rate: the fraction dropped, in [0, 1).
      seed: the layer's seed.
      mask: how the mask is drawn. `float`: one float draw per entry
        (tf.nn.experimental.stateless_dropout). `byte`: one random byte per entry (four from each
        32-bit draw), dropping the entries whose byte is under round(rate * 256): a quarter of the
        random draws, the rate rounded to a multiple of 1/256 (0.2: 51/256 = 0.1992; kept entries
        scaled by 1 / (1 - that)).
    """

    def __init__(self, rate: float, seed: int, mask: str = DropoutMask.FLOAT, **kwargs):
        super().__init__(**kwargs)
        if mask not in DropoutMask.values():
            raise ValueError(f"mask {mask!r} is not one of {', '.join(DropoutMask.values())}")
        self.rate, self.seed, self.mask = rate, seed, mask
        self.step_fn = None

    def call(self, x, training=False):
        """`x` with a fraction `rate` of its entries zeroed and the rest scaled by 1 / (1 - rate) in
        training; `x` unchanged otherwise. Same shape and dtype as `x`."""
        if not training or not self.rate:
            return x
        replica = tf.distribute.get_replica_context()
        replica_id = replica.replica_id_in_sync_group if replica is not None else 0
        step = tf.cast(self.step_fn(), tf.int64) if self.step_fn is not None else tf.constant(0, tf.int64)
        key = tf.cast(self.seed, tf.int64) * 1_000_003 + tf.cast(replica_id, tf.int64)
        seed = tf.stack([key, step])
        if self.mask == DropoutMask.FLOAT:
            return tf.nn.experimental.stateless_dropout(x, self.rate, seed=seed)
        return x * byte_keep_mask(tf.shape(x), self.rate, seed, x.dtype)


def byte_keep_mask(shape: tf.Tensor, rate: float, seed: tf.Tensor, dtype=tf.float32) -> tf.Tensor:
    """A stateless dropout keep-mask from one random byte per entry.

    Args:
      shape: int32 [2], the mask's [rows, columns].
      rate: the fraction dropped, in [0, 1); rounded to a multiple of 1/256, at most 255/256.
      seed: int64 [2], the stateless seed.
      dtype: the mask's dtype.

    Returns:
      [rows, columns] of 0 (dropped: the entry's byte < round(rate * 256)) and 1 / (1 - rounded
      rate) elsewhere.
    """
    threshold = min(int(round(rate * 256)), 255)
    size = tf.reduce_prod(shape)
    words = tf.random.stateless_uniform([(size + 3) // 4], seed=seed, minval=None, maxval=None, dtype=tf.uint32)
    drawn = tf.reshape(tf.bitcast(words, tf.uint8), [-1])[:size]
    keep = tf.cast(drawn >= threshold, dtype) * (256.0 / (256 - threshold))
    return tf.reshape(keep, shape)


def mlp(widths: List[int], name: str, last_activation: Optional[str] = "relu", dropout: float = 0.0,
        seed: int = 0, dtype: Any = None, last_dtype: Any = None) -> tf.keras.Sequential:
    """A stack of Dense layers, ReLU between them.

    Args:
      widths: each layer's output width.
      name: the Sequential's name (its checkpoint name under the model).
      last_activation: the last layer's activation (None: linear).
      dropout: a StepDropout of this rate after each hidden layer (0: none).
      seed: the dropout layers' seed.
      dtype: the layers' Keras dtype policy (None: float32).
      last_dtype: the last layer's (None: `dtype`): float32 for a logit under a mixed policy.

    Returns:
      The Sequential, unbuilt.
    """
    layers: List[tf.keras.layers.Layer] = []
    for i, w in enumerate(widths):
        last = i == len(widths) - 1
        layers.append(tf.keras.layers.Dense(w, activation=last_activation if last else "relu",
                                            dtype=(last_dtype or dtype) if last else dtype))
        if dropout and not last:
            layers.append(StepDropout(dropout, seed=seed * 100 + i, name=f"{name}_dropout_{i}", dtype=dtype))
    return tf.keras.Sequential(layers, name=name)


class SequencePooling(tf.keras.layers.Layer):
    """A sequence feature's position vectors pooled into one.

    `mean`: the mean over the row's positions (zeros for an empty row). `attention` (target
    attention in the style of DIN, Zhou et al. 2018): each position's score is an MLP of
    [query, key, query - key, query * key], softmax-normalised over the row's positions; the output
    is the score-weighted sum of keys, so a user's past items count by their relevance to the
    candidate. Hand-written: neither Keras 2 nor TFRS 0.7.7 has a masked target-attention pooling.

    Args:
      pooling: `mean` or `attention`.
      name: the layer's name.
      hidden: the attention score MLP's hidden width.
    """

    def __init__(self, pooling: str, name: str, hidden: int = 32):
        super().__init__(name=name)
        self.pooling = pooling
        if pooling == PoolingKind.ATTENTION:
            self.score = tf.keras.Sequential(
                [tf.keras.layers.Dense(hidden, activation="relu"), tf.keras.layers.Dense(1)], name="score")

    def call(self, keys: tf.Tensor, mask: tf.Tensor, query: Optional[tf.Tensor] = None) -> tf.Tensor:
        """Pools the positions.

        Args:
          keys: float32 [batch, length, dim], one vector per position.
          mask: float32 [batch, length], 1 where the row has an ID.
          query: float32 [batch, dim], the candidate's pooled vector (attention only).

        Returns:
          float32 [batch, dim].
        """
        if self.pooling == PoolingKind.MEAN:
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


class BucketTable(tf.keras.layers.Layer):
    """A dense feature's quantile buckets as an embedded categorical (training.dense_buckets).

    Its [buckets, dim] embeddings and, with a wide part, one weight per bucket start at zero, so an
    untrained model is the model without buckets (random bucket vectors would feed noise into the
    cross layers of short runs). Small: dense variables of the model, replicated and restored like
    the dense network; the embeddings are updated by the dense optimizer, the wide weights by the
    wide part's.

    Args:
      boundaries: the bucket boundaries (non-decreasing floats).
      dim: the embedding width.
      wide: whether the buckets also get one wide weight each.
      name: the layer's name.
      encoding: `embedding` (the bucket's row) or `piecewise_linear` (the encoding times the rows).

    Raises:
      ValueError: a piecewise-linear encoding with fewer than 2 boundaries.
    """

    def __init__(self, boundaries, dim: int, wide: bool, name: str, encoding: str = "embedding"):
        super().__init__(name=name)
        self.boundaries, self.dim, self.has_wide, self.encoding = tuple(boundaries), dim, wide, encoding
        if encoding == BucketEncoding.PIECEWISE_LINEAR and len(self.boundaries) < 2:
            raise ValueError(f"{name}: a piecewise-linear encoding needs at least 2 boundaries, got {len(self.boundaries)}")

    def build(self, input_shape=None):
        # embedding: one row per bucket; piecewise_linear: one row per bin between two boundaries
        rows = len(self.boundaries) + 1 if self.encoding == BucketEncoding.EMBEDDING else len(self.boundaries) - 1
        self.embeddings = self.add_weight(name="embeddings", shape=[rows, self.dim], initializer="zeros", trainable=True)
        self.wide = self.add_weight(name="wide", shape=[rows, 1], initializer="zeros", trainable=True) if self.has_wide else None
        super().build(input_shape)

    def call(self, values: tf.Tensor):
        """Embeds values by their bucket.

        Args:
          values: float32 [batch].

        Returns:
          (vectors, wide): float32 [batch, dim], and float32 [batch, 1] wide weights or None.
        """
        if self.encoding == BucketEncoding.PIECEWISE_LINEAR:
            enc = piecewise_linear(values, self.boundaries)
            return tf.matmul(enc, self.embeddings), (tf.matmul(enc, self.wide) if self.wide is not None else None)
        ids = bucket_ids(values, self.boundaries)
        return tf.gather(self.embeddings, ids), (tf.gather(self.wide, ids) if self.wide is not None else None)


@dataclass(frozen=True)
class ModelFeatures:
    """Which features a ranking model reads and how, from the plan and the manifest.

    Attributes:
      dense_names: the dense features, in the model's order.
      categorical_names: the categorical features, in the model's order.
      wide_features: {wide feature: the feature whose IDs it reads} (training.wide).
      wide_feature_of: the inverse, {feature: its wide feature}.
      feature_table: {feature or wide feature: its plan table}.
      feature_dim: {feature or wide feature: its table's dim}.
      feature_safe: {feature or wide feature: its use_safe_embedding_lookup}.
      weighted_features: the features whose IDs carry weights (W1).
      sequence_length: {sequence feature: its max_sequence_length}.
      sequence_query: {sequence feature: its attention query feature or None}.
      sequence_pooling: {sequence feature: `mean` or `attention`}.
      wide_combiner: {wide feature: its table's combiner}.
    """

    dense_names: Tuple[str, ...]
    categorical_names: Tuple[str, ...]
    wide_features: Mapping[str, str]
    wide_feature_of: Mapping[str, str]
    feature_table: Mapping[str, str]
    feature_dim: Mapping[str, int]
    feature_safe: Mapping[str, bool]
    weighted_features: frozenset
    sequence_length: Mapping[str, int]
    sequence_query: Mapping[str, Optional[str]]
    sequence_pooling: Mapping[str, str]
    wide_combiner: Mapping[str, str]

    @classmethod
    def from_plan(cls, plan: EmbeddingPlan, manifest: VocabularyManifest) -> "ModelFeatures":
        """The features of `manifest` as `plan` embeds them.

        Args:
          plan: the embedding plan (tables, features, wide part).
          manifest: the vocabulary manifest (the features and their order).

        Returns:
          The ModelFeatures.
        """
        categorical = tuple(manifest.categorical_names)
        wide = {w: n for w, n in plan.wide_features().items() if n in categorical}
        lookups = list(categorical) + list(wide)  # every feature looked up
        table = {n: plan.features[n].table for n in lookups}
        sequences = {n: plan.features[n].max_sequence_length for n in categorical if plan.features[n].max_sequence_length}
        return cls(
            dense_names=tuple(manifest.dense_names),
            categorical_names=categorical,
            wide_features=wide,
            wide_feature_of={n: w for w, n in wide.items()},
            feature_table=table,
            feature_dim={n: plan.tables[t].dim for n, t in table.items()},
            feature_safe={n: plan.features[n].validate_weights_and_indices for n in lookups},
            weighted_features=frozenset(f.name for f in manifest.categorical_features if f.weight_column),
            sequence_length=sequences,
            sequence_query={n: plan.features[n].sequence_query for n in sequences},
            sequence_pooling={n: plan.features[n].sequence_pooling or "mean" for n in sequences},
            wide_combiner={w: plan.tables[table[w]].combiner for w in wide},
        )

    @property
    def lookups(self) -> List[str]:
        """Every feature looked up in a table: the categorical features, then the wide features."""
        return list(self.categorical_names) + list(self.wide_features)


class DenseTower:
    """The dense network of a ranking model: everything after the embedding lookups.

    Args:
      plan: the embedding plan (dense buckets).
      features: the model's features.
      training: the training section (model type, MLP widths, cross layers, dropout, seed).
      step_fn: returns the training step, for the dropout masks (None: the serving model, whose
        dropout never runs).
    """

    def __init__(self, plan: EmbeddingPlan, features: ModelFeatures, training: TrainingConfig,
                 step_fn: Optional[Callable[[], tf.Tensor]] = None, precision: str = Precision.FLOAT32):
        self.model_type = training.model
        self.features = features
        # The dense layers' Keras policy: None (float32), or mixed_bfloat16 (precision.py). The
        # tables, their bucket and sequence-pooling layers, the wide part and the logit stay float32.
        self.policy = dense_policy(precision)
        self.compute_dtype = tf.bfloat16 if self.policy is not None else tf.float32
        # Created in the order the models tracked them before the tower existed: Keras numbers
        # unnamed layers in creation order, and the variables' names follow.
        self.sequence_pooling = {n: SequencePooling(features.sequence_pooling[n], f"sequence_{n}")
                                 for n in features.sequence_length}
        self.bottom_mlp = mlp(training.bottom_mlp, "bottom_mlp", dtype=self.policy)
        # The wide part's linear term of the dense features (their signed log1p, as the deep part
        # reads them), updated by the wide tables' optimizer: with the dense optimizer's small Adam
        # steps it lags the rest of the wide part. The top MLP's output bias is the bias.
        self.wide_dense = (tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", name="wide_dense")
                           if features.wide_features and features.dense_names else None)
        buckets = plan.dense_buckets  # in the model's dense feature order
        # Where the bucket vectors enter: beside the features' vectors (interaction), or beside the
        # dense values into the bottom MLP (bottom_mlp: the cross layers / interaction stay as wide
        # as without buckets, which is where their cost was).
        self.buckets_into = training.dense_buckets.into
        self.bucket_tables = {
            n: BucketTable(buckets.boundaries[n], buckets.dim, bool(features.wide_features), f"buckets_{n}", buckets.encoding)
            for n in features.dense_names if buckets is not None and n in buckets.boundaries}
        self.projections: Dict[str, tf.keras.layers.Layer] = {}
        self.interaction, self.cross = None, []
        if self.model_type == ModelType.DLRM:
            self._build_dot_interaction(training.bottom_mlp[-1])
        else:
            self.cross = [tfrs.layers.dcn.Cross(projection_dim=training.cross_projection_dim, name=f"cross_{i}",
                                                dtype=self.policy) for i in range(training.cross_layers)]
        self.top_mlp = mlp(list(training.top_mlp) + [1], "top_mlp", last_activation=None, dropout=training.dropout,
                           seed=training.seed, dtype=self.policy, last_dtype="float32")
        # No variables, so checkpoints and the serving model do not change with it. The bottom
        # MLP's output is left out: without buckets a dense feature reaches the model only through it.
        self.input_dropout = (StepDropout(training.input_dropout, seed=training.seed * 100 + 99, name="input_dropout",
                                          mask=training.input_dropout_mask, dtype=self.policy)
                              if training.input_dropout else None)
        if step_fn is not None:
            for layer in self.top_mlp.layers + [self.input_dropout]:
                if isinstance(layer, StepDropout):
                    layer.step_fn = step_fn

    def _build_dot_interaction(self, width: int) -> None:
        """DotInteraction needs one width: features and buckets of another dim are projected (no bias)."""
        self.projections = {n: tf.keras.layers.Dense(width, use_bias=False, name=f"project_{n}", dtype=self.policy)
                            for n in self.features.categorical_names if self.features.feature_dim[n] != width}
        if self.buckets_into == BucketsInto.INTERACTION:
            self.projections.update({n: tf.keras.layers.Dense(width, use_bias=False, name=f"project_{n}",
                                                              dtype=self.policy)
                                     for n, t in self.bucket_tables.items() if t.dim != width})
        self.interaction = tfrs.layers.feature_interaction.DotInteraction(self_interaction=False, dtype=self.policy)

    def layers(self) -> Dict[str, Any]:
        """The tower's layers under the attribute names a model tracks them by, in tracking order.

        Returns:
          {attribute: layer, dict or list of layers, or None}: the names are checkpoint names under
          the model (`model/bottom_mlp/...`); `interaction` only for dlrm, `cross` only for dcn_v2.
        """
        out = {"sequence_pooling": self.sequence_pooling, "bottom_mlp": self.bottom_mlp,
               "wide_dense": self.wide_dense, "bucket_tables": self.bucket_tables, "projections": self.projections}
        if self.model_type == ModelType.DLRM:
            out["interaction"] = self.interaction
        else:
            out["cross"] = self.cross
        out.update(top_mlp=self.top_mlp, input_dropout=self.input_dropout)
        return out

    def checkpoint_parts(self) -> Dict[str, Any]:
        """The tower's parts that hold variables, under their checkpoint names.

        Returns:
          {name: layer or dict/list of layers}, names from checkpoint_keys.DENSE_CHECKPOINT_PARTS:
          the MLPs always, the others where the model has them.
        """
        parts: Dict[str, Any] = {"bottom_mlp": self.bottom_mlp, "top_mlp": self.top_mlp}
        if self.projections:
            parts["projections"] = self.projections
        if self.model_type != ModelType.DLRM:
            parts["cross"] = self.cross
        if self.sequence_pooling:
            parts["sequence_pooling"] = self.sequence_pooling
        if self.wide_dense is not None:
            parts["wide_dense"] = self.wide_dense
        if self.bucket_tables:
            parts["bucket_tables"] = self.bucket_tables
        return parts

    def variables(self) -> List[tf.Variable]:
        """Every dense variable in a fixed order: by part name, then by key within a dict part."""
        out: List[tf.Variable] = []
        for name, part in sorted(self.checkpoint_parts().items()):
            if isinstance(part, dict):  # projections, bucket_tables, sequence_pooling
                out += [v for k in sorted(part) for v in part[k].variables]
            elif name == "cross":
                out += [v for layer in part for v in layer.variables]
            else:
                out += list(part.variables)
        return out

    def wide_variables(self) -> List[tf.Variable]:
        """The wide part's variables outside the tables: the dense features' linear term and their
        buckets' weights (updated by the wide tables' optimizer)."""
        out = list(self.wide_dense.trainable_variables) if self.wide_dense is not None else []
        return out + [t.wide for t in self.bucket_tables.values() if t.built and t.wide is not None]

    def bottom(self, inputs: Dict[str, Any]) -> Tuple[tf.Tensor, Dict[str, Tuple[tf.Tensor, Optional[tf.Tensor]]], tf.Tensor]:
        """The dense features through their buckets and the bottom MLP.

        Args:
          inputs: the model's inputs (dense features as `raw_dense` reads them).

        Returns:
          (dense, buckets, bottom): float32 [batch, dense] signed log1p values ([batch, 1] zeros
          without dense features); {feature: ([batch, dim] vectors, [batch, 1] wide weights or
          None)} per bucketed feature; the bottom MLP's float32 [batch, bottom_mlp[-1]] output (its
          input the dense values, and with `into: bottom_mlp` the bucket vectors after them, in the
          model's dense feature order).
        """
        names = self.features.dense_names
        buckets: Dict[str, Tuple[tf.Tensor, Optional[tf.Tensor]]] = {}
        if names:
            raw = raw_dense(inputs, names)
            dense = dense_input(inputs, names, raw)
            for j, n in enumerate(names):
                if n in self.bucket_tables:
                    buckets[n] = self.bucket_tables[n](raw[:, j])
        else:
            first = self.features.categorical_names[0]
            batch = inputs[BATCH_KEY] if BATCH_KEY in inputs else tf.shape(inputs[first], out_type=tf.int64)[0]
            dense = tf.zeros([batch, 1])
        if buckets and self.buckets_into == BucketsInto.BOTTOM_MLP:
            return dense, buckets, self.bottom_mlp(tf.concat([dense] + [v for v, _ in buckets.values()], axis=1))
        return dense, buckets, self.bottom_mlp(dense)

    def pool_sequences(self, out: Dict[str, tf.Tensor], inputs: Dict[str, Any]) -> Dict[str, tf.Tensor]:
        """Sequence features' position vectors pooled by their layer (attention against the query
        feature's pooled vector); a sequence feature's wide weights by its table's combiner.

        Args:
          out: {feature: float32 [batch, dim], or [batch, length, dim] for a sequence feature; wide
            feature: [batch, 1], or [batch, length, 1]}.
          inputs: the model's inputs (the sequence features' IDs and lengths, for their masks).

        Returns:
          `out` with every value [batch, dim] (wide features [batch, 1]).
        """
        f = self.features
        pooled = dict(out)
        for n, length in f.sequence_length.items():
            query = f.sequence_query.get(n)
            mask = sequence_mask(inputs[n], length, inputs.get(length_key(n)))
            pooled[n] = self.sequence_pooling[n](out[n], mask, query=out[query] if query else None)
            w = f.wide_feature_of.get(n)
            if w is not None:  # [batch, length, 1] -> [batch, 1] by the table's combiner
                total = tf.reduce_sum(out[w] * mask[..., None], 1)
                count = tf.reduce_sum(mask, 1, keepdims=True)
                pooled[w] = {"sum": total, "mean": tf.math.divide_no_nan(total, count),
                             "sqrtn": tf.math.divide_no_nan(total, tf.sqrt(count))}[f.wide_combiner[w]]
        return pooled

    def top(self, bottom: tf.Tensor, dense: tf.Tensor, buckets: Dict[str, Tuple[tf.Tensor, Optional[tf.Tensor]]],
            embedded: Dict[str, tf.Tensor], training: bool = False) -> tf.Tensor:
        """The click probability from the bottom output and the pooled vectors.

        Args:
          bottom: `bottom`'s bottom MLP output, float32 [batch, width].
          dense: `bottom`'s signed log1p dense values, float32 [batch, dense].
          buckets: `bottom`'s bucket vectors and wide weights.
          embedded: {feature: float32 [batch, dim]} from `pool_sequences` (wide features [batch, 1]).
          training: whether dropout applies.

        Returns:
          float32 [batch, 1] probabilities.
        """
        # the categorical features' pooled vectors, then the dense features' bucket vectors (unless
        # they went into the bottom MLP)
        names = list(self.features.categorical_names)
        if self.buckets_into == BucketsInto.INTERACTION:
            names += list(buckets)
        vectors = {**embedded, **{n: v for n, (v, _) in buckets.items()}}
        if self.model_type == ModelType.DLRM:
            top_input = self._interact(bottom, [vectors[n] for n in names], names, training)
        else:
            top_input = self._cross(bottom, tf.concat([vectors[n] for n in names], axis=1), training)
        logit = self.top_mlp(top_input, training=training)
        if self.features.wide_features:
            logit = logit + self.wide_logit(embedded, dense, [w for _, w in buckets.values()])
        return tf.sigmoid(logit)

    def _interact(self, bottom: tf.Tensor, vectors: List[tf.Tensor], names: List[str], training: bool) -> tf.Tensor:
        """dlrm: [bottom, dot interactions of bottom and the (projected) vectors], in the compute dtype."""
        vectors = [bottom] + [tf.cast(self.projections[n](v) if n in self.projections else v, self.compute_dtype)
                              for n, v in zip(names, vectors)]
        if training and self.input_dropout is not None:  # one mask over the vectors, split back
            vectors = [bottom] + tf.split(self.input_dropout(tf.concat(vectors[1:], 1), training=True),
                                          [int(v.shape[-1]) for v in vectors[1:]], axis=1)
        return tf.concat([bottom, self.interaction(vectors)], axis=1)

    def _cross(self, bottom: tf.Tensor, features: tf.Tensor, training: bool) -> tf.Tensor:
        """dcn_v2: [bottom, features] through the cross layers, in the compute dtype (the pooled
        vectors are cast where they meet the dense network; their gradients come back float32)."""
        features = tf.cast(features, self.compute_dtype)
        if training and self.input_dropout is not None:
            features = self.input_dropout(features, training=True)
        x0 = tf.concat([tf.cast(bottom, self.compute_dtype), features], axis=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return x

    def wide_logit(self, embedded: Dict[str, tf.Tensor], dense: tf.Tensor, bucket_weights=()) -> tf.Tensor:
        """The wide part's logit.

        Args:
          embedded: the pooled vectors, wide features' weights included ([batch, 1] each).
          dense: float32 [batch, dense], the signed log1p dense values.
          bucket_weights: the buckets' float32 [batch, 1] wide weights.

        Returns:
          float32 [batch, 1]: the wide features' pooled weights (in the model's feature order), the
          linear term of the dense features and their buckets' weights, summed.
        """
        f = self.features
        terms = [embedded[f.wide_feature_of[n]] for n in f.categorical_names if n in f.wide_feature_of]
        terms += list(bucket_weights)
        if self.wide_dense is not None:
            terms.append(self.wide_dense(dense))
        return tf.add_n(terms)
