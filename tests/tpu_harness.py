"""TensorFlow's own TPU-embedding classes, run on CPU with several replicas.

No TPU is reachable here. What a CPU can run of `TPUEmbeddingV2` (SparseCore), it runs for real:
its constructor (table padding, `_round_table_sizes`; TensorFlow's C++ `stack_tables`; offsets and
rotations), `build` (the stacked variables, created by TF's `make_sharded_variable_creator` as
one `TPUEmbeddingShardedVariable` per stack with one shard per replica device, and initialized by
TF's own `table_initialize_fn`, i.e. TF's index mapping) and checkpoint saving (TF's
`TPUEmbeddingShardedSaveable`: the keys and slices a TPU run writes). What needs the SparseCore
itself (`__call__`/`enqueue`/`dequeue`: the COO preprocessing and the SparseCore lookup and update
kernels) is replaced by `CpuStepV2`, which looks rows up through TF's `map_indices_in_shard`.

To get there, three things of a TPU are stood in for, and nothing else:
- the strategy: `RecordingTPUStrategy` is a `MirroredStrategy` over R logical CPU devices (tests/
  conftest.py configures 4), so `num_replicas_in_sync` is R and every replica runs its own step;
  it carries `extended.tpu_hardware_feature` (embedding feature V1/V2, SparseCores per chip) and
  `extended._tpu_devices` ([R, 1] device names, the shape TPUStrategy has on one core per replica);
- TPUEmbeddingV2's type check (`isinstance(strategy, (TPUStrategy, TPUStrategyV2))`) is pointed at
  that class by replacing the `tpu_strategy` module reference in tpu_embedding_v3 only;
- TFRS's `_is_tpu_strategy` and the trainer's `is_tpu_strategy` answer True for it.
A stand-in may be no more lenient than the real thing: the strategy refuses what TPUStrategy does
where it matters here (dataset options keeping sparse features on the host).
"""
from __future__ import annotations

import contextlib
import types
from typing import Any, Dict, List

import numpy as np

import components  # noqa: F401
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_for_serving as serving_lib
from tensorflow.python.tpu import tpu_embedding_v3
from tensorflow.python.tpu import tpu_embedding_v3_utils

Feature = tf.tpu.experimental.HardwareFeature.EmbeddingFeature
REAL_V2 = tf.tpu.experimental.embedding.TPUEmbeddingV2


def mirrored_strategy(replicas: int) -> tf.distribute.MirroredStrategy:
    """MirroredStrategy over `replicas` logical CPU devices (reduced through one device; see
    recording_strategy_class)."""
    return tf.distribute.MirroredStrategy(cpu_devices(replicas), cross_device_ops=tf.distribute.ReductionToOneDevice())


def cpu_devices(replicas: int) -> List[str]:
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) < replicas:
        raise RuntimeError(
            f"{replicas} replicas need {replicas} logical CPU devices, TensorFlow has {len(devices)} "
            "(tests/conftest.py configures them before TensorFlow starts)")
    return devices[:replicas]


class HardwareFeature:
    def __init__(self, embedding_feature, sparse_cores_per_chip: int = 4):
        self.embedding_feature = embedding_feature
        self.num_embedding_devices_per_chip = sparse_cores_per_chip


def recording_strategy_class(replicas: int, embedding_feature=Feature.V2, sparse_cores_per_chip: int = 4,
                             on_scope=None, on_run=None, on_distribute=None):
    """A MirroredStrategy over `replicas` CPU devices with TPUStrategy's TPU-only attributes.
    `on_scope(entered: bool)`, `on_run(fn, args, kwargs, options, entered)`,
    `on_distribute(dataset_fn, options)`: recorders (tests/test_tpu_conformance.py binds them to
    TPUStrategy's signatures)."""
    devices = cpu_devices(replicas)

    class RecordingTPUStrategy(tf.distribute.MirroredStrategy):
        def __init__(self):
            # Reduced through one device, not collectives: collective instance keys of several
            # strategies in one test process collide (a TPU has no cross_device_ops either).
            super().__init__(devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
            self.extended.tpu_hardware_feature = HardwareFeature(embedding_feature, sparse_cores_per_chip)
            self.extended._tpu_devices = np.array([[d] for d in devices], dtype=object)  # pylint: disable=protected-access

        @contextlib.contextmanager
        def scope(self):
            if on_scope:
                on_scope(self, True)
            try:
                with super().scope():
                    yield
            finally:
                if on_scope:
                    on_scope(self, False)

        def run(self, fn, args=(), kwargs=None, options=None):
            if on_run:
                on_run(self, fn, args, kwargs, options, True)
            try:
                return super().run(fn, args=args, kwargs=kwargs, options=options)
            finally:
                if on_run:
                    on_run(self, fn, args, kwargs, options, False)

        def distribute_datasets_from_function(self, dataset_fn, options=None):
            if on_distribute:
                on_distribute(self, dataset_fn, options)
            if options is None or options.experimental_fetch_to_device is not False:
                raise ValueError("sparse features must stay on the host for the TPU embedding enqueue "
                                 "(InputOptions(experimental_fetch_to_device=False))")
            return super().distribute_datasets_from_function(dataset_fn)

    return RecordingTPUStrategy


def let_pass_type_check(monkeypatch, strategy_cls) -> None:
    """TPUEmbeddingV2's `isinstance(strategy, (TPUStrategy, TPUStrategyV2))` accepts `strategy_cls`
    (and only it): the module reference it checks against is replaced, nothing else of TF."""
    monkeypatch.setattr(tpu_embedding_v3, "tpu_strategy",
                        types.SimpleNamespace(TPUStrategy=strategy_cls, TPUStrategyV2=strategy_cls))


def stacked_positions(mid: Any, table_name: str, rows: int) -> tf.Tensor:
    """int64 [rows]: where logical rows 0..rows-1 of `table_name` are in its stacked variable
    (shards concatenated in device order, as the checkpoint holds them), by TF's own
    `map_indices_in_shard` and the offsets and rotations TF's constructor computed."""
    stacked, offset, rotation = mid._table_to_stacked_table_offset[table_name]  # pylint: disable=protected-access
    n = mid._num_sc_shards  # pylint: disable=protected-access
    total = sum(t.vocabulary_size for t in mid._stacked_table_to_tables[stacked])  # pylint: disable=protected-access
    shard, position = tpu_embedding_v3_utils.map_indices_in_shard(n, offset // n, rotation, tf.range(rows, dtype=tf.int64))
    return shard * (total // n) + position


def logical_table(mid: Any, table_name: str, rows: int, dim: int, slot: str = "parameters") -> tf.Tensor:
    """[rows, dim]: a table's logical rows read out of TF's stacked, sharded variable (`slot`: one
    of its optimizer slots instead, by the TPU optimizer's slot name, e.g. "accumulators")."""
    stacked = mid._table_to_stacked_table_offset[table_name][0]  # pylint: disable=protected-access
    variable = mid._variables[stacked][slot]  # pylint: disable=protected-access
    full = tf.concat([tf.convert_to_tensor(v) for v in variable.values], axis=0)
    return tf.gather(full, stacked_positions(mid, table_name, rows))[:, :dim]


def cpu_step_v2_class(on_call=None, on_apply=None):
    """TF's real `TPUEmbeddingV2` (constructor, build, variables, saving) with the SparseCore-only
    step (`__call__`, `apply_gradients`) done on CPU: lookups read the logical rows out of the
    stacked variables through TF's index mapping and pool them with TF's CPU lookup
    (`cpu_embedding_lookup`); gradients are checked for structure and not applied (the SparseCore
    applies them in HBM; tables keep what TF's initializer placed, so an exporter that reads them
    back in the wrong order is caught). `on_call(mid, bound_arguments)`, `on_apply(mid, bound)`:
    recorders."""
    import inspect

    class CpuStepV2(REAL_V2):
        def __init__(self, feature_config, optimizer=None, pipeline_execution_with_tensor_core=False):
            self._logical_features = feature_config  # TF clones and pads its own copy
            super().__init__(feature_config, optimizer, pipeline_execution_with_tensor_core)

        def __call__(self, *args, **kwargs):
            a = inspect.signature(REAL_V2.__call__).bind(self, *args, **kwargs).arguments
            if on_call:
                on_call(self, a)
            self._maybe_build()
            configs = tf.nest.flatten(self._logical_features)
            tables = {}
            for f in configs:
                if f.table not in tables:
                    tables[f.table] = logical_table(self, f.table.name, f.table.vocabulary_size, f.table.dim)
            out = serving_lib.cpu_embedding_lookup(a["features"], a.get("weights"), tables, self._logical_features)
            return out, {"stacked_activations": tf.zeros([1])}

        def apply_gradients(self, *args, **kwargs):
            a = inspect.signature(REAL_V2.apply_gradients).bind(self, *args, **kwargs).arguments
            if on_apply:
                on_apply(self, a)
            tf.nest.assert_same_structure(self._logical_features, a["gradients"])

    return CpuStepV2


def build_real_v2(strategy, feature_config, optimizer, pipelining: bool = False):
    """TF's TPUEmbeddingV2, constructed and built under `strategy` (a RecordingTPUStrategy)."""
    with strategy.scope():
        mid = REAL_V2(feature_config=feature_config, optimizer=optimizer,
                      pipeline_execution_with_tensor_core=pipelining)
        mid.build()
    return mid


def tf_layout(mid) -> Dict[str, Dict[str, Any]]:
    """What TF's constructor decided, per table: stack, offset in the stack (rows), rotation,
    padded shape, shard count."""
    out = {}
    for stacked, tables in mid._stacked_table_to_tables.items():  # pylint: disable=protected-access
        for t in tables:
            name, offset, rotation = mid._table_to_stacked_table_offset[t.name]  # pylint: disable=protected-access
            out[t.name] = {"stacked": name, "offset_in_shard": offset // mid._num_sc_shards, "rotation": rotation,  # pylint: disable=protected-access
                           "padded": [t.vocabulary_size, t.dim], "num_sparse_cores": mid._num_sc_shards}  # pylint: disable=protected-access
    return out


def layout_as_dict(layout) -> Dict[str, Any]:
    """A SparseCoreTableLayout (the exporter's recomputed or TF's record) in tf_layout's terms."""
    return {"stacked": layout.stacked_table_name, "offset_in_shard": int(layout.sparse_core_shard_row_offset),
            "rotation": int(layout.sparse_core_shard_rotation), "padded": [int(x) for x in layout.unsharded_padded_shape],
            "num_sparse_cores": int(layout.num_sparse_cores)}


def row_identity_initializer(table_index: int):
    """Values that name their logical row: [r, c] = table_index x 1e5 + r + c / 64 (exact in
    float32 for the sizes used here). Deterministic, so every device's call of TF's initializer
    sees the same full table; not sharding-aware (no `shard_info`), so TF builds the full padded
    table and slices each SparseCore's shard out of it with its own index mapping."""

    def init(shape, dtype=tf.float32):
        rows, cols = shape
        r = tf.range(rows, dtype=tf.float32)[:, None]
        c = tf.range(cols, dtype=tf.float32)[None, :]
        return tf.cast(table_index * 1e5 + r + c / 64.0, dtype)

    return init


def expected_rows(table_index: int, rows: int, dim: int) -> np.ndarray:
    r = np.arange(rows, dtype=np.float32)[:, None]
    c = np.arange(dim, dtype=np.float32)[None, :]
    return (table_index * 1e5 + r + c / 64.0).astype(np.float32)


def checkpoint_of_model_path(mid) -> tf.train.Checkpoint:
    """A checkpoint holding `mid` where RankingModel holds its TPU embedding object
    (model/embedding_layer/_tpu_embedding), so the exporter's reader sees model keys."""
    return tf.train.Checkpoint(model=tf.train.Checkpoint(embedding_layer=tf.train.Checkpoint(_tpu_embedding=mid)))
