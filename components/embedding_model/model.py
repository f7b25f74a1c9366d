"""The training ranking model (DLRM, DCN-v2), whose embeddings follow the embedding plan.

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

The pooled vectors go through the dense tower (dense_tower.py), which the serving model
(serving_model.py) shares; where its variables are in a checkpoint is checkpoint_keys.py.
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf
import tensorflow_recommenders as tfrs

from components.config.training_schema import TrainingConfig
from components.contracts.manifest import VocabularyManifest, weights_key
from components.contracts.plan import EmbeddingPlan, TablePlan
from components.embedding_model import optimizers as optimizers_lib
from components.embedding_model import tf_objects
from components.embedding_model.dense_tower import DenseTower, ModelFeatures, Untracked
from components.embedding_model.lookups import pool_sparse, sequence_positions
from components.config.choices import Combiner, Placement, Precision
from components.planning.gradient_exchange import ALL_REDUCE, exchange_method

_V2 = tf.tpu.experimental.HardwareFeature.EmbeddingFeature.V2



class SparseCoreUnsupported(ValueError):
    """The model asks of SparseCore (TF 2.16's TPUEmbeddingV2) what it cannot do; says what to change."""


def check_sparsecore_features(feature_configs: Dict[str, Any]) -> None:
    """Refuses sequence features on TPU-embedding tables on SparseCore, before TF does worse.

    TF 2.16's `TPUEmbeddingV2` multiplies out every feature's `output_shape` in its constructor
    (tpu_embedding_v3.py, `_stack_tables_with_same_table_dim_and_optimizer`): a sequence feature
    leaves it unset (tf_objects.feature_configs), so the constructor raises "Cannot iterate over a
    shape with unknown rank"; and given a shape, V2 pools every feature with its table's combiner
    (`_convert_input_feature_to_coo`), so there is no per-position output to attend over.

    Args:
      feature_configs: {feature: tf.tpu.experimental.embedding.FeatureConfig} of the TPU layer.

    Raises:
      SparseCoreUnsupported: a feature has a max_sequence_length; the message lists them.
    """
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
    installed TensorFlow.

    TFRS 0.7.7 builds `TPUEmbeddingV2(feature_config, optimizer,
    pipeline_execution_with_tensor_core, sparse_core_embedding_config)`, four positional arguments,
    while TF 2.16.2's `TPUEmbeddingV2.__init__` takes three (tpu_embedding_v3.py): a TypeError on
    every SparseCore chip. Here the V2 object is built with the installed signature, by keyword;
    SparseCore settings TF 2.16 does not take (`SparseCoreEmbeddingConfig`, TF >= 2.17) are
    refused, and optimizer settings its kernels ignore are refused
    (optimizers.check_sparsecore_optimizer). Everything else (V1 TPUEmbedding, the CPU/GPU
    TPUEmbeddingForServing, the lookup and gradient trap) is TFRS's. Takes TFRS's TPUEmbedding
    arguments.
    """

    # Overrides a private TFRS hook: TFRS builds the mid-level object only here and offers no public
    # way to pass it one, so the constructor that fits TF 2.16 can be chosen nowhere else.
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


class TensorCoreTable(tf.keras.layers.Layer):
    """A small table kept on the TensorCore: a [rows, dim] variable, pooled lookups of its IDs.

    Args:
      table: the table's plan (rows, dim, combiner, initializer).
      name: the table's name (the layer is `table_<name>`).
    """

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
        """One feature's IDs looked up and pooled with the table's combiner.

        Args:
          ids: int64 SparseTensor [batch, None], or padded dense IDs [batch, width] (negative as
            padding: the TPU step's static form).
          safe: the feature's use_safe_embedding_lookup: SparseTensor IDs through
            safe_embedding_lookup_sparse (negative IDs dropped), else pooled as given.
          weights: a weighted feature's (W1) float weights, one per ID, in the IDs' form, or None.
          sequence_length: a sequence feature's max_sequence_length (0: pooled).

        Returns:
          float32 [batch, dim]; [batch, length, dim], one vector per position, for a sequence feature.
        """
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
        if self.combiner == Combiner.SUM:
            return total
        if self.combiner == Combiner.MEAN:
            return tf.math.divide_no_nan(total, tf.reduce_sum(mask, axis=1, keepdims=True))
        return tf.math.divide_no_nan(total, tf.sqrt(tf.reduce_sum(mask * mask, axis=1, keepdims=True)))  # sqrtn


class TableOptimizer(NamedTuple):
    """The embedding optimizer of tables with one of their own (tables[].optimizer).

    Tables with equal specs share one.

    Attributes:
      key: its checkpoint name, `table_embedding_optimizers/<key>`.
      keras: the Keras optimizer (CPU/GPU update, slot owner).
      tpu: the TPU one (TableConfig.optimizer).
      clipvalue: the clipping limit, or None.
    """

    key: str
    keras: Any
    tpu: Any
    clipvalue: Optional[float]


def sum_over_replicas(grads_and_vars):
    """The gradients of one step as one replica would compute them for the global batch.

    Keras scales each replica's loss by 1 / replicas, so the sum over the replicas is the global
    batch's mean-loss gradient. Sparse gradients stay sparse: under TPUStrategy an all-reduce makes
    an IndexedSlices a dense [rows, dim] tensor (`_reduce_to` hands it to `cross_replica_sum`,
    which converts it), and a lazy optimizer (LazyAdam, as the TPU's Adam) or FTRL given that dense
    gradient would move every row. Each is summed by planning.gradient_exchange's rule: gathered
    (`all_gather` refuses an IndexedSlices, so its values and indices are gathered as tensors,
    static shapes: replicas x the replica's rows) while that is no more rows than the table's,
    else by one table-sized all-reduce (`_all_reduced_rows`) whose untouched rows are left out
    again. Either way the result is an IndexedSlices of the rows some replica looked up, whose
    duplicate rows sum, and clipping (clip_embedding_gradients) sums duplicates
    before it clips, so the clip applies to the summed gradient, as on TPU-embedding tables, not
    to each replica's part of it (a sum of clipped gradients). Hand-written: Keras aggregates
    inside apply_gradients, after any clipping a caller can do.

    Args:
      grads_and_vars: (gradient, variable) pairs of this replica; a gradient is a Tensor or an
        IndexedSlices.

    Returns:
      The pairs with gradients summed over the replicas (IndexedSlices gathered); unchanged in a
      single replica or outside a replica context.
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1 or not grads_and_vars:
        return list(grads_and_vars)
    grads = [g for g, _ in grads_and_vars]
    dense = [i for i, g in enumerate(grads) if not isinstance(g, tf.IndexedSlices)]
    if dense:  # one batched all-reduce, as Keras' own aggregation does
        for i, g in zip(dense, ctx.all_reduce(tf.distribute.ReduceOp.SUM, [grads[i] for i in dense])):
            grads[i] = g
    out = []
    for g, (_, v) in zip(grads, grads_and_vars):
        if isinstance(g, tf.IndexedSlices):
            looked_up, rows = g.values.shape[0], v.shape[0]
            if looked_up is not None and v.shape.is_fully_defined() and exchange_method(
                    ctx.num_replicas_in_sync, looked_up, rows, v.shape[1:].num_elements()) == ALL_REDUCE:
                g = _all_reduced_rows(ctx, g, rows)
            else:
                g = tf.IndexedSlices(ctx.all_gather(g.values, axis=0), ctx.all_gather(g.indices, axis=0), g.dense_shape)
        out.append((g, v))
    return out


def _all_reduced_rows(ctx, g: tf.IndexedSlices, rows: int) -> tf.IndexedSlices:
    """A table's sparse gradient summed over the replicas by one table-sized all-reduce: each
    replica's rows summed into [rows, ...] with a count per row, both all-reduced; then one entry
    per table row, in which a row no replica looked up points at one that was looked up with a
    zero value. The row rules and Keras' sparse kernels sum duplicate rows, so only the rows some
    replica looked up move, as after a gather, and static shapes stay static (XLA)."""
    summed = tf.math.unsorted_segment_sum(g.values, g.indices, rows)
    counts = tf.math.unsorted_segment_sum(tf.ones_like(g.indices, g.values.dtype), g.indices, rows)
    summed, counts = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [summed, counts])
    looked_up = counts > 0
    first = tf.argmax(tf.cast(looked_up, tf.int32), output_type=g.indices.dtype)  # a looked-up row
    indices = tf.where(looked_up, tf.range(rows, dtype=g.indices.dtype), first)
    return tf.IndexedSlices(summed, indices, g.dense_shape)


@tf.custom_gradient
def _scale_gradient(x, factor):
    """x unchanged; its gradient times `factor` (the embedding gradient multiplier)."""

    def grad(dy):
        return dy * tf.cast(factor, dy.dtype), None

    return tf.identity(x), grad



class RankingModel(tf.keras.Model):
    """The training ranking model: DLRM or DCN-v2 over the plan's TPU-embedding and TensorCore tables.

    Without optimizers it is the evaluation variant of the same model (no slot variables). Every
    embedding optimizer counts every training step (one with nothing to apply in a step, e.g. on a
    TPU where the engine updates the tables, advances its `iterations` itself), so schedules, Adam's
    bias correction and a checkpoint resumed on the other platform see the same step. The serving
    model (serving_model.ServingRankingModel) is built from the plan and this model or its checkpoint.

    Args:
      plan: the embedding plan (tables, their placement, features).
      manifest: the vocabulary manifest (the features and their order).
      training: the training section (the dense tower's shape).
      embedding_optimizer: the Keras optimizer of the tables on CPU/GPU and the TensorCore tables.
      dense_optimizer: the Keras optimizer of the dense tower.
      tpu_embedding_optimizer: the `tf.tpu.experimental.embedding` optimizer the embedding layer
        gets on every platform (optimizers.tpu_optimizer: applied in HBM on TPU; on CPU/GPU it only
        creates the slots, through the Keras optimizer, so both platforms hold them under the same keys).
      tpu_output_batch: the static per-replica batch, set as the features' output shape on TPU
        (None: not on a TPU).
      embedding_clipvalue: the embedding gradients are clipped as the TPU clips them
        (optimizers.clip_embedding_gradients) before the Keras optimizer applies them.
      pipeline_execution_with_tensor_core: the TPU embedding layer's setting of that name.
      table_optimizers: {table: TableOptimizer}: tables updated by an optimizer of their own
        instead of `embedding_optimizer` / `tpu_embedding_optimizer`.
      gradient_multiplier: (plan.gradient_multiplier) step -> factor: each feature's pooled-vector
        gradient times it in training, so the table gradients (sums of those) scale with it on
        every platform, before clipping.
      precision: the dense network's resolved precision (precision.py): `float32`, or
        `mixed_bfloat16`; the tables and the probability it returns are float32 either way.
    """

    def __init__(
        self,
        plan: EmbeddingPlan,
        manifest: VocabularyManifest,
        training: TrainingConfig,
        embedding_optimizer: Optional[tf.keras.optimizers.legacy.Optimizer] = None,
        dense_optimizer: Optional[tf.keras.optimizers.legacy.Optimizer] = None,
        tpu_embedding_optimizer: Any = None,
        tpu_output_batch: Optional[int] = None,
        embedding_clipvalue: Optional[float] = None,
        pipeline_execution_with_tensor_core: bool = False,
        table_optimizers: Optional[Dict[str, TableOptimizer]] = None,
        gradient_multiplier: Any = None,
        precision: str = Precision.FLOAT32,
    ):
        super().__init__(name="ranking_model")
        self.precision = precision
        self.model_type = training.model
        self.dense_names = manifest.dense_names
        self.categorical_names = manifest.categorical_names
        self.embedding_optimizer = embedding_optimizer
        self.dense_optimizer = dense_optimizer
        self.embedding_clipvalue = embedding_clipvalue
        table_optimizers = dict(table_optimizers or {})
        # Tracked once each, under their keys (checkpoint: model/table_embedding_optimizers/<key>);
        # the table -> TableOptimizer map is held untracked: tracked, it would reach them twice.
        self.table_embedding_optimizers = {o.key: o.keras for o in table_optimizers.values()}
        self._table_optimizers_held = Untracked(table_optimizers)
        self.gradient_multiplier = gradient_multiplier
        self.model_features = features = ModelFeatures.from_plan(plan, manifest)
        tables = plan.tables
        self.tpu_feature_names = [n for n in features.lookups
                                  if tables[features.feature_table[n]].placement == Placement.TPU_EMBEDDING]
        self.embedding_layer = self._tpu_embedding_layer(
            plan, tpu_embedding_optimizer, tpu_output_batch, pipeline_execution_with_tensor_core, table_optimizers)
        # One layer per TensorCore table; features of a shared table use the same layer.
        self.tensor_core_tables = {
            name: TensorCoreTable(t, name) for name, t in tables.items() if t.placement == Placement.TENSOR_CORE
            and any(features.feature_table[n] == name for n in features.lookups)
        }
        step_fn = (lambda: self.dense_optimizer.iterations) if dense_optimizer is not None else None
        self.dense_tower = DenseTower(plan, features, training, step_fn=step_fn, precision=precision)
        for name, layer in self.dense_tower.layers().items():
            setattr(self, name, layer)

    @property
    def _table_optimizer(self) -> Dict[str, TableOptimizer]:
        """{table: TableOptimizer} of the tables with an optimizer of their own."""
        return self._table_optimizers_held.value

    def _tpu_embedding_layer(self, plan: EmbeddingPlan, optimizer: Any, output_batch: Optional[int],
                             pipeline_execution_with_tensor_core: bool,
                             table_optimizers: Dict[str, TableOptimizer]) -> Optional[EmbeddingLayer]:
        """The TFRS layer of the features on TPU-embedding tables (None without such features)."""
        if not self.tpu_feature_names:
            return None
        # On a TPU the features' output shape is the static per-replica batch (TPUEmbeddingV2
        # sizes its SparseCore stacks from it); elsewhere it stays unset.
        configs = tf_objects.feature_configs(
            plan, output_batch=output_batch, on_tpu=output_batch is not None,
            table_optimizers={n: o.tpu for n, o in table_optimizers.items()},
        )
        return EmbeddingLayer(
            {n: configs[n] for n in self.tpu_feature_names},
            optimizer=optimizer,
            pipeline_execution_with_tensor_core=pipeline_execution_with_tensor_core,
        )

    def embed(self, inputs: Dict[str, Any], training: bool = False) -> Dict[str, tf.Tensor]:
        """The pooled vector of every categorical feature.

        Args:
          inputs: per categorical feature int64 SparseTensor [batch, None] or padded [batch, width]
            IDs (and a weighted feature's weights under `weights_key`; a sequence feature's lengths
            under `length_key`).
          training: whether the gradient multiplier applies.

        Returns:
          {feature: float32 [batch, dim]; wide feature: [batch, 1]}.
        """
        f = self.model_features
        out: Dict[str, tf.Tensor] = {}
        weights = {n: inputs.get(weights_key(n)) for n in f.categorical_names}  # W1; None: unweighted
        source = f.wide_features  # a wide feature reads its feature's IDs (and weights)
        if self.embedding_layer is not None:
            tpu = self.tpu_feature_names
            tpu_weights = ({n: weights[source.get(n, n)] for n in tpu}
                           if any(weights[source.get(n, n)] is not None for n in tpu) else None)
            out.update(self.embedding_layer({n: inputs[source.get(n, n)] for n in tpu}, tpu_weights))
        for n in f.lookups:
            if n not in out:
                base = source.get(n, n)
                out[n] = self.tensor_core_tables[f.feature_table[n]](
                    inputs[base], safe=f.feature_safe[n], weights=weights[base],
                    sequence_length=f.sequence_length.get(base, 0))
        if training and self.gradient_multiplier is not None and self.dense_optimizer is not None:
            # The seeds' experimental_gradient_multiplier_fn, exact on every platform: a table's
            # gradient is a sum of its features' pooled-vector (or position-vector) gradients (the
            # TPU engine receives these activation gradients), so scaling them scales it. The
            # wide part's tables have their own optimizer and are left as they are.
            factor = self.gradient_multiplier(self.dense_optimizer.iterations)
            out = {n: v if n in source else _scale_gradient(v, factor) for n, v in out.items()}
        return self.dense_tower.pool_sequences(out, inputs)

    # Not converted by AutoGraph (nor, through its control status, any layer called from here): the
    # model has no tensor-dependent Python control flow (a Python `if` on a tensor raises in a
    # graph, so nothing can silently change), and converting the subclassed layers' code takes
    # most of the first trace of every step, paid by the TPU-rules check, fit's train function,
    # evaluation and the SavedModel signature.
    @tf.autograph.experimental.do_not_convert
    def call(self, inputs: Dict[str, Any], training: bool = False) -> tf.Tensor:
        """The click probability.

        Args:
          inputs: the dense features (float32 [batch, 1] each) and the categorical features' IDs
            (see `embed`).
          training: whether dropout and the gradient multiplier apply.

        Returns:
          float32 [batch, 1].
        """
        dense, buckets, bottom = self.dense_tower.bottom(inputs)
        embedded = self.embed(inputs, training=training)
        return self.dense_tower.top(bottom, dense, buckets, embedded, training=training)

    def table_values(self) -> Dict[str, np.ndarray]:
        """Every table's trained rows, read from a model built off a TPU.

        Returns:
          {table: float32 [rows, dim]} (a wide table's [rows, 1]).
        """
        out = {name: t.embeddings.numpy() for name, t in self.tensor_core_tables.items()}
        if self.embedding_layer is not None:
            out.update({config.name: table.numpy() for config, table in self.embedding_layer.embedding_tables.items()})
        return out

    def embedding_variable_ids(self) -> set:
        """The ids of the variables the embedding optimizers update: the tables, and the wide
        part's dense term."""
        ids = {id(v) for t in self.tensor_core_tables.values() for v in t.trainable_variables}
        if self.embedding_layer is not None:
            ids |= {id(v) for v in self.embedding_layer.trainable_variables}
        if self.embedding_optimizer is not None:
            ids |= {id(v) for v in self.dense_tower.wide_variables()}
        return ids

    def _variable_tables(self) -> Dict[int, str]:
        """id(table variable) -> plan table, for the tables updated here (TensorCore tables; TPU
        embedding tables off a TPU, where they are the mid-level API's plain variables). On a TPU
        the TPU layer's trainable variable is TFRS's stand-in and maps to no table."""
        out = {id(t.embeddings): name for name, t in self.tensor_core_tables.items()}
        if self.embedding_layer is not None:
            # Private: TFRS's public `embedding_tables` raises on a TPU (TF refuses to return sharded
            # tables there) and builds TPUEmbeddingV2 as a side effect; only the mid-level object's
            # variable dict maps table variables on every platform without either.
            variables = getattr(self.embedding_layer._tpu_embedding, "_variables", {})  # pylint: disable=protected-access
            for name, slots in variables.items():
                if name in self.model_features.feature_table.values() and "parameters" in slots:
                    out[id(slots["parameters"])] = name
        if self.model_features.wide_features:  # updated as the wide tables are
            wide_table = self.model_features.feature_table[next(iter(self.model_features.wide_features))]
            out.update({id(v): wide_table for v in self.dense_tower.wide_variables()})
        return out

    def _embedding_optimizer_groups(self, items, variable=lambda item: item[1]) -> Dict[str, list]:
        """`items` (gradient-variable pairs, or what `variable` maps to a table variable) grouped
        by the key of the embedding optimizer that updates them ("" for `embedding_optimizer`)."""
        table_optimizers = self._table_optimizer
        tables = self._variable_tables() if table_optimizers or self.model_features.wide_features else {}
        groups: Dict[str, list] = {"": []}
        for item in items:
            o = table_optimizers.get(tables.get(id(variable(item))))
            groups.setdefault(o.key if o else "", []).append(item)
        return groups

    def _embedding_optimizers(self) -> Dict[str, Tuple[Any, Optional[float]]]:
        """{optimizer key: (Keras embedding optimizer, clipping limit)}, "" for `embedding_optimizer`."""
        optimizers = {"": (self.embedding_optimizer, self.embedding_clipvalue)}
        optimizers.update({o.key: (o.keras, o.clipvalue) for o in self._table_optimizer.values()})
        return optimizers

    def create_optimizer_slots(self) -> None:
        """Creates every optimizer's slots, step counter and hyperparameters for the built model's
        variables, as the first training step would (warm_start.py writes a whole training
        checkpoint before training)."""
        variables = self.trainable_variables
        emb = self.embedding_variable_ids()
        # Private, and idempotent: legacy Keras optimizers have no public way to create their slots
        # without applying an update (a zero update would still move FTRL's and decayed weights).
        self.dense_optimizer._create_all_weights([v for v in variables if id(v) not in emb])  # pylint: disable=protected-access
        groups = self._embedding_optimizer_groups([v for v in variables if id(v) in emb], variable=lambda v: v)
        for key, (optimizer, _) in self._embedding_optimizers().items():
            optimizer._create_all_weights(groups.get(key, []))  # pylint: disable=protected-access

    def _apply_embedding_gradients(self, emb_gv) -> None:
        """Each embedding optimizer applies its tables' gradients (clipped by its limit); one with
        none this step still counts the step. With several replicas the gradients are summed over
        the replicas first and clipped after (`sum_over_replicas`), the rule the TPU embedding
        engine applies to TPU-embedding tables; Keras' own aggregation is always off. The sparse rows
        are applied with operations XLA compiles (xla_updates.py), as the TPU step needs."""
        emb_gv = sum_over_replicas(emb_gv)
        groups = self._embedding_optimizer_groups(emb_gv)
        for key, (optimizer, clipvalue) in self._embedding_optimizers().items():
            gv = groups.get(key)
            if gv:
                # Never Keras' aggregation, even at one replica: under TPUStrategy its all-reduce
                # would make an IndexedSlices dense, and a dense FTRL or Adam update moves rows
                # the batch never looked up (another model than the CPU one trains).
                optimizer.apply_gradients(optimizers_lib.clip_embedding_gradients(gv, clipvalue),
                                          experimental_aggregate_gradients=False)
            else:
                optimizer.iterations.assign_add(1)

    @tf.autograph.experimental.do_not_convert  # as `call`: no tensor-dependent Python control flow
    def train_step(self, data):
        """One training step, separate optimizers for the embeddings and the dense tower.

        TFRS layer docstring pattern: under TPUStrategy the TPU layer exposes a stand-in trainable
        variable whose gradient applies its optimizer in HBM; TensorCore tables and CPU tables get
        the Keras embedding optimizer.

        Args:
          data: (features, labels): the model's inputs and float32 [batch, 1] labels.

        Returns:
          {metric name: its value so far}.
        """
        features, labels = data
        with tf.GradientTape() as tape:
            probs = self(features, training=True)
            loss = self.compiled_loss(labels, probs, regularization_losses=self.losses)
        variables = self.trainable_variables
        grads = tape.gradient(loss, variables)
        emb_ids = self.embedding_variable_ids()
        dense_gv = [(g, v) for g, v in zip(grads, variables) if id(v) not in emb_ids and g is not None]
        emb_gv = [(g, v) for g, v in zip(grads, variables) if id(v) in emb_ids and g is not None]
        # Summed over the replicas here, not by Keras: under TPUStrategy Keras' all-reduce makes a
        # sparse gradient (the dense buckets' gathers) dense, and a dense FTRL update moves rows
        # the batch never looked up, which the CPU's sparse update does not.
        dense_gv = sum_over_replicas(dense_gv)
        self.dense_optimizer.apply_gradients(dense_gv, experimental_aggregate_gradients=False)
        self._apply_embedding_gradients(emb_gv)
        self.compiled_metrics.update_state(labels, probs)
        return {m.name: m.result() for m in self.metrics}
