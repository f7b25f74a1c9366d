"""The serving ranking model: the trained model's tables as plain CPU variables, and its dense tower.

Built from the plan (`ServingRankingModel(plan, manifest, training, ...)`) and then filled from a
training checkpoint (restore.py: the dense tower restored, each table read in its training layout)
or from a trained model in memory (`ServingRankingModel.from_trained`), as torchrec's quantized
modules are built from a float module with `from_float`. Every table is held as plain variables of
one dtype (float32, float16 or int8 with per-row scales), with no optimizer and so no slot
variables; with `stacked`, the tables of one dim are stacked in one variable, which the serving
transform's fused inputs pool from. Its inputs and output are the training model's (dense_tower.py),
and its checkpoint names, variable names and outputs are those the training model's dense tower has.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.config.schema import TABLE_DTYPES
from components.config.training_schema import TrainingConfig
from components.contracts.manifest import VocabularyManifest, weights_key
from components.contracts.plan import EmbeddingPlan, TablePlan
from components.embedding_model.dense_tower import BATCH_KEY, DenseTower, ModelFeatures, Untracked
from components.embedding_model.lookups import POOL, pool_sparse, sequence_positions
from components.config.choices import TableDtype

if TYPE_CHECKING:
    from components.embedding_model.model import RankingModel


class FusedChunk(NamedTuple):
    """Serving features pooled by one segment op.

    Attributes:
      stack: a key of `ServingRankingModel.serving_stacks`.
      combiner: the features' tables' combiner.
      features: the features, in the segments' order.
      offsets: each feature's table's first row in the stack.
    """

    stack: str
    combiner: str
    features: Tuple[str, ...]
    offsets: Tuple[int, ...]


def fused_key(chunk: int, part: str) -> str:
    """Input key of a fused chunk's IDs.

    Args:
      chunk: the chunk's index in the model's serving chunks.
      part: `rows` (int64 IDs offset into the stack) or `segments` (feature x batch + batch row).

    Returns:
      The key in the serving model's inputs.
    """
    return f"__fused_{chunk}_{part}"


class ServingTables(tf.keras.layers.Layer):
    """Trained tables of one dim held for CPU serving, stacked row-wise in one variable.

    Table after table, `offsets` each table's first row: float32, float16, or int8 with a float32
    scale per row (row r = int8 row x scale[r]). Two lookups, each what TPUEmbeddingForServing
    computes (safe_embedding_lookup_sparse: the rows of a batch row's IDs summed in order, divided
    by their count or its square root; zeros for a row without IDs):
    - `lookup(table, ids)`: one feature's SparseTensor IDs pooled with the table's combiner, one
      sparse segment reduction instead of safe_embedding_lookup_sparse's ~25 ops per feature
      (SparseFillEmptyRows, unique, masks, reshapes);
    - `pool_fused(rows, segments, ...)`: many features at once, their IDs already offset into the
      stack and each (feature, batch row) a segment: one segment op for all of them instead of one
      per feature (and the per-feature SparseTensors the raw-feature transform no longer cuts).
      A segment's sum runs over its rows in the same order either way, so the two are bit-identical
      for float32 tables (tests/test_serving_transform.py).
    Stacked because a graph op cannot gather from several variables at once. Compressed tables
    are gathered for the batch's unique rows and dequantized before pooling, so the combiner runs
    in float32. The wide part's one weight per row is held beside the stack in a float32 [rows, 1]
    variable of the same rows (never compressed: 4 bytes a row), pooled from the same positions and
    segments as the rows, so the wide part adds one segment op per lookup and no index work.

    Args:
      tables: {table: its TablePlan}, all of one dim.
      name: the layer's name.
      storage: the rows' dtype, one of TABLE_DTYPES.
      wide: {table: its wide table} (training.wide); `assign` / `read` take a wide table's name too.
      wide_combiners: {table: its wide table's combiner} (the plan's: `sum`, a bag; a plan written
        before the wide part was a bag has its table's); default: the table's own.

    Raises:
      ValueError: an unknown storage dtype, or tables of several dims.
    """

    def __init__(self, tables: Dict[str, Any], name: str, storage: str = "float32",
                 wide: Optional[Dict[str, str]] = None, wide_combiners: Optional[Dict[str, str]] = None):
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
        self.wide_combiners = {n: (wide_combiners or {}).get(n, c) for n, c in self.combiners.items()}

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings", shape=[self.rows, self.dim], dtype=tf.as_dtype(self.storage),
            initializer="zeros", trainable=False,
        )
        self.scale = None
        if self.storage == TableDtype.INT8:
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
        """Stores a table's rows in its place in the stack.

        Args:
          table: a table of the stack, or a wide table (its weights go into the wide column beside
            its table's rows).
          values: [rows, dim] of the storage dtype ([rows, 1] float32 for a wide table).
          scale: int8 storage: float32 [rows], the rows' scales.
        """
        self._built()
        if table in self.wide_tables:
            self.wide[self._span(self.wide_tables[table])].assign(values)
            return
        self.embeddings[self._span(table)].assign(values)
        if scale is not None:
            self.scale[self._span(table)].assign(scale)

    def read(self, table: str) -> np.ndarray:
        """A table's stored rows ([rows, dim], storage dtype) or a wide table's weights ([rows, 1])."""
        self._built()
        if table in self.wide_tables:
            return self.wide[self._span(self.wide_tables[table])].numpy()
        return self.embeddings[self._span(table)].numpy()

    def _float_rows(self, rows: tf.Tensor):
        """(float32 rows, positions, wide weights): the rows to pool from, each ID's place in them
        and the wide weights at the same places (None without a wide part): the stack itself for
        float32, else the batch's unique rows dequantized."""
        if self.storage == TableDtype.FLOAT32:
            return self.embeddings, rows, self.wide
        unique, position = tf.unique(rows)
        values = tf.cast(tf.gather(self.embeddings, unique), tf.float32)
        if self.scale is not None:
            values = values * tf.gather(self.scale, unique)[:, None]
        return values, position, (tf.gather(self.wide, unique) if self.wide is not None else None)

    def lookup(self, table: str, ids, weights=None, sequence_length: int = 0):
        """One feature's IDs pooled with its table's combiner.

        Args:
          table: the feature's table.
          ids: int64 SparseTensor [batch, None] (the raw-feature transform's output); a sequence
            feature's may be padded dense IDs [batch, width].
          weights: float SparseTensor of the IDs' shape (a weighted feature's), or None.
          sequence_length: a sequence feature's max_sequence_length (0: pooled).

        Returns:
          (vectors, wide): float32 [batch, dim] ([batch, length, dim] for a sequence feature), and
          with a wide part its pooled wide weights [batch, 1] ([batch, length, 1]), else None.

        Raises:
          TypeError: pooled IDs that are not a SparseTensor.
        """
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
        wide_combiner = self.wide_combiners[table]
        return vectors, (pool_sparse(wide, ids, wide_combiner, positions=position, weights=weights) if wide is not None else None)

    def pool_fused(self, rows: tf.Tensor, segments: tf.Tensor, features: int, batch: tf.Tensor, combiner: str,
                   wide_combiner: Optional[str] = None):
        """Many features' IDs pooled by one segment op.

        Args:
          rows: int64 [nnz], every ID offset into the stack.
          segments: int [nnz], non-decreasing: feature x batch + batch row.
          features: how many features.
          batch: int64 scalar, the batch size.
          combiner: the features' tables' combiner.
          wide_combiner: their wide tables' combiner (default: `combiner`).

        Returns:
          (vectors, wide): float32 [features, batch, dim], and with a wide part the pooled wide
          weights [features, batch, 1], else None.
        """
        self._built()
        values, position, wide = self._float_rows(rows)
        pooled = POOL[combiner](values, position, segments, num_segments=features * batch)
        if wide is not None:
            wide = tf.reshape(POOL[wide_combiner or combiner](wide, position, segments, num_segments=features * batch),
                              [features, -1, 1])
        return tf.reshape(pooled, [features, -1, self.dim]), wide


class ServingTable(ServingTables):
    """One trained table held for CPU serving (a stack of one): `layer(ids)` pools its IDs.

    Args:
      table: the table's plan.
      name: the table's name.
      storage: the rows' dtype, one of TABLE_DTYPES.
      wide: its wide table's name (training.wide), or None.
    """

    def __init__(self, table: TablePlan, name: str, storage: str = "float32", wide: Optional[str] = None,
                 wide_combiner: Optional[str] = None):
        super().__init__({name: table}, f"serving_table_{name}", storage, wide={name: wide} if wide else None,
                         wide_combiners={name: wide_combiner} if wide_combiner else None)
        self.table = name

    def call(self, ids, weights=None, sequence_length: int = 0) -> tf.Tensor:
        """The pooled vectors of `lookup` (float32 [batch, dim], or [batch, length, dim])."""
        return self.lookup(self.table, ids, weights=weights, sequence_length=sequence_length)[0]


class ServingRankingModel(tf.keras.Model):
    """The ranking model for CPU serving: plain tables, the training model's dense tower.

    Args:
      plan: the embedding plan.
      manifest: the vocabulary manifest.
      training: the training section (the dense tower's shape).
      table_dtype: the tables' storage dtype, one of TABLE_DTYPES.
      stacked: the tables of one dim in one variable (what the serving transform's fused inputs
        pool from), else one variable per table (the Trainer's SavedModel: no offsets to add).
      precision: the dense network's (precision.py): float32 for everything served and saved;
        mixed_bfloat16 only to score a bfloat16 run as its training graph computed.

    Raises:
      ValueError: an unknown table dtype.
    """

    def __init__(self, plan: EmbeddingPlan, manifest: VocabularyManifest, training: TrainingConfig,
                 table_dtype: str = "float32", stacked: bool = False, precision: str = "float32"):
        # The training model's name: variable names (`ranking_model/...`) are the same in both.
        super().__init__(name="ranking_model")
        self.model_type = training.model
        self.dense_names = manifest.dense_names
        self.categorical_names = manifest.categorical_names
        self.model_features = ModelFeatures.from_plan(plan, manifest)
        self.stack_serving_tables = stacked
        self.serving_stacks = self._serving_stacks(plan, table_dtype, stacked)
        tables = {name: stack for stack in self.serving_stacks.values()
                  for name in list(stack.offsets) + list(stack.wide_tables)}
        # table -> its stack, and the fused chunks: each stack is tracked once, in serving_stacks.
        self._routing = Untracked({"tables": tables, "chunks": []})
        self.dense_tower = DenseTower(plan, self.model_features, training, precision=precision)
        for name, layer in self.dense_tower.layers().items():
            setattr(self, name, layer)

    def _serving_stacks(self, plan: EmbeddingPlan, table_dtype: str, stacked: bool) -> Dict[str, ServingTables]:
        """The tables of the model's features (a wide table held beside its table's rows), by dim
        when `stacked`, else one per table."""
        f, tables = self.model_features, plan.tables
        used = [name for name in tables if any(f.feature_table[n] == name for n in f.categorical_names)]
        wide = {f.feature_table[n]: f.feature_table[w] for w, n in f.wide_features.items()}
        wide_combiners = {n: tables[w].combiner for n, w in wide.items()}
        if not stacked:
            return {name: ServingTable(tables[name], name, table_dtype, wide=wide.get(name),
                                       wide_combiner=wide_combiners.get(name)) for name in used}
        stacks = {}
        for dim in sorted({tables[name].dim for name in used}):
            stacks[f"dim{dim}"] = ServingTables({name: tables[name] for name in used if tables[name].dim == dim},
                                                f"serving_tables_dim{dim}", table_dtype, wide=wide, wide_combiners=wide_combiners)
        return stacks

    @classmethod
    def from_trained(cls, trained: "RankingModel", plan: EmbeddingPlan, manifest: VocabularyManifest,
                     training: TrainingConfig, sample_features: Dict[str, Any], stacked: bool = False) -> "ServingRankingModel":
        """The float32 serving model of a model trained on CPU/GPU, its weights copied.

        A model trained on a TPU goes through its checkpoint instead (restore.model_from_checkpoint),
        which reads the tables in every layout a TPU leaves them.

        Args:
          trained: the training model, built.
          plan: the plan it was built from.
          manifest: the manifest it was built from.
          training: the training section it was built from.
          sample_features: a batch of inputs, to create the variables.
          stacked: see the class.

        Returns:
          The serving model, giving the trained model's probabilities.
        """
        serving = cls(plan, manifest, training, "float32", stacked)
        serving(sample_features)  # creates the variables
        for target, source in zip(serving.dense_tower.variables(), trained.dense_tower.variables()):
            target.assign(source)
        for name, values in trained.table_values().items():
            if name in serving.serving_tables:
                serving.serving_tables[name].assign(name, values)
        return serving

    @property
    def serving_tables(self) -> Dict[str, ServingTables]:
        """{table or wide table: the stack holding it}."""
        return self._routing.value["tables"]

    @property
    def serving_chunks(self) -> List[FusedChunk]:
        """The chunks whose IDs the inputs hold fused (`set_serving_chunks`)."""
        return self._routing.value["chunks"]

    def embed(self, inputs: Dict[str, Any], training: bool = False) -> Dict[str, tf.Tensor]:
        """The pooled vector of every categorical feature.

        Args:
          inputs: the serving transform's output: per feature SparseTensor IDs (and weights), or
            the fused chunks' `fused_key` rows and segments with `BATCH_KEY`.
          training: unused (the serving model does not train).

        Returns:
          {feature: float32 [batch, dim]; wide feature: [batch, 1]}.
        """
        f = self.model_features
        out = self._pool_fused_chunks(inputs)
        for n in f.categorical_names:
            if n not in out:
                table = f.feature_table[n]
                out[n], wide = self.serving_tables[table].lookup(
                    table, inputs[n], weights=inputs.get(weights_key(n)), sequence_length=f.sequence_length.get(n, 0))
                if n in f.wide_feature_of:
                    out[f.wide_feature_of[n]] = wide
        return self.dense_tower.pool_sequences(out, inputs)

    def _pool_fused_chunks(self, inputs: Dict[str, Any]) -> Dict[str, tf.Tensor]:
        """The features of the fused chunks the inputs hold, pooled together, one op per chunk."""
        out: Dict[str, tf.Tensor] = {}
        for i, chunk in enumerate(self.serving_chunks):
            if fused_key(i, "rows") not in inputs:
                continue
            stack = self.serving_stacks[chunk.stack]
            # the chunk's wide tables pool alike (the plan's `sum`; a former plan's: its table's, the chunk's)
            f = self.model_features
            wide_combiners = {stack.wide_combiners[f.feature_table[n]] for n in chunk.features if n in f.wide_feature_of}
            if len(wide_combiners) > 1:
                raise ValueError(f"fused chunk {chunk.features}: wide tables with several combiners {sorted(wide_combiners)}")
            pooled, wide = stack.pool_fused(
                inputs[fused_key(i, "rows")], inputs[fused_key(i, "segments")], len(chunk.features),
                inputs[BATCH_KEY], chunk.combiner, wide_combiner=next(iter(wide_combiners), None))
            out.update(zip(chunk.features, tf.unstack(pooled, num=len(chunk.features))))
            if wide is not None:  # the stack has a wide column; not every feature has a wide part (plan.wide_part)
                wide_of = self.model_features.wide_feature_of
                out.update((wide_of[n], w) for n, w in zip(chunk.features, tf.unstack(wide, num=len(chunk.features)))
                           if n in wide_of)
        return out

    # AutoGraph off, as the training model's `call` (model.py): no tensor-dependent Python control flow.
    @tf.autograph.experimental.do_not_convert
    def call(self, inputs: Dict[str, Any], training: bool = False) -> tf.Tensor:
        """The click probability.

        Args:
          inputs: see `embed`; dense features as dense_tower.raw_dense reads them.
          training: unused (dropout never runs in serving).

        Returns:
          float32 [batch, 1].
        """
        dense, buckets, bottom = self.dense_tower.bottom(inputs)
        embedded = self.embed(inputs, training=training)
        return self.dense_tower.top(bottom, dense, buckets, embedded, training=training)

    def serving_fusion_groups(self) -> List[FusedChunk]:
        """The features that can be pooled together, for the raw-feature transform to cut into
        the chunks it fuses (`set_serving_chunks`).

        Returns:
          Per stack and combiner, the features that are neither weighted nor sequences, in the
          model's order, with each feature's table's first row in the stack.
        """
        f = self.model_features
        groups: Dict[Tuple[str, str], List[str]] = {}
        for n in f.categorical_names:
            if n in f.weighted_features or n in f.sequence_length:
                continue
            table = f.feature_table[n]
            stack = next(k for k, v in self.serving_stacks.items() if table in v.offsets)
            groups.setdefault((stack, self.serving_stacks[stack].combiners[table]), []).append(n)
        return [FusedChunk(stack, combiner, tuple(fs), tuple(self.serving_stacks[stack].offsets[f.feature_table[n]] for n in fs))
                for (stack, combiner), fs in groups.items()]

    def set_serving_chunks(self, chunks: List[FusedChunk]) -> None:
        """Sets the chunks whose IDs the inputs hold fused (`fused_key(i, ...)`, chunk i of these)."""
        self._routing.value["chunks"] = list(chunks)
