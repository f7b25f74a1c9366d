"""TensorFlow's own TPU-embedding classes, run on CPU with several replicas.

No TPU is reachable here. What a CPU can run of `TPUEmbeddingV2` (SparseCore), it runs for real:
its constructor (table padding, `_round_table_sizes`; TensorFlow's C++ `stack_tables`; offsets and
rotations), `build` (the stacked variables, created by TF's `make_sharded_variable_creator` as
one `TPUEmbeddingShardedVariable` per stack with one shard per replica device, and initialized by
TF's own `table_initialize_fn`, i.e. TF's index mapping) and checkpoint saving (TF's
`TPUEmbeddingShardedSaveable`: the keys and slices a TPU run writes). What needs the SparseCore
itself (`__call__`/`enqueue`/`dequeue`: the COO preprocessing and the SparseCore lookup and update
kernels, which have no CPU kernels) is replaced by `CpuStepV2`, which looks rows up and updates
them in TF's stacked variables and slots through TF's `map_indices_in_shard`, summing the
replicas' row gradients first and applying the SparseCore optimizer rule once per touched row
(tests/optimizer_reference.py, the rule the Keras CPU path is held to as well).

To get there, three things of a TPU are stood in for, and nothing else:
- the strategy: `RecordingTPUStrategy` is a `MirroredStrategy` over R logical CPU devices (tests/
  conftest.py configures 4), so `num_replicas_in_sync` is R and every replica runs its own step;
  it carries `extended.tpu_hardware_feature` (embedding feature V1/V2, SparseCores per chip) and
  `extended._tpu_devices` ([R, 1] device names, the shape TPUStrategy has on one core per replica);
- TPUEmbeddingV2's type check (`isinstance(strategy, (TPUStrategy, TPUStrategyV2))`) is pointed at
  that class by replacing the `tpu_strategy` module reference in tpu_embedding_v3 only;
- TFRS's `_is_tpu_strategy` and the trainer's `is_tpu_strategy` answer True for it.
A stand-in may be no more lenient than the real thing (tests/test_harness_strictness.py): the
strategy places each shard of a sharded variable on its own device only, as TPUStrategy's
`skip_mirrored_creator` rule does, and refuses datasets that would not keep sparse features on the
host; `CpuStepV2` runs TF's own enqueue code on its input up to the SparseCore kernels: its
structure checks, its control-flow check (`_raise_error_for_incorrect_control_flow_context`, with
the replica function's graph marked as TPUStrategy's TPUReplicateContext marks it) and its COO
preprocessing (`_preprocess_inputs_and_weights_to_coo_tensor`: input types, weights, casts, sample
offsets, TF's row rotation), with only the kernels it calls, which have no CPU kernel in the wheel,
stood in for: `ConvertToCooTensor` (`CpuConvertToCoo`: the kernel's input validation and combiner
gains) and `GetMinibatchesInCsrWithPhysicalReplica`'s refusals (a sample count that is no multiple
of the SparseCores per chip; more IDs in a replica's step, every (SparseCore, shard) partition
padded to the XLA pad size, than max_ids_per_chip_per_sample x the stack's samples).
"""
from __future__ import annotations

import contextlib
import functools
import threading
import types
from typing import Any, Dict, List, NamedTuple, Tuple

import numpy as np

import components  # noqa: F401
import tensorflow as tf
from tensorflow.python.util import nest
from tensorflow.python.tpu import tpu_embedding_v3
from tensorflow.python.tpu import tpu_embedding_v3_utils
from tensorflow.python.tpu import tpu_replication

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


# Per replica thread: the graph `RecordingTPUStrategy.run` called the replica function in, as
# TPUStrategy's TPUReplicateContext marks it.
_REPLICA = threading.local()


class _ReplicateContextMark(tpu_replication.TPUReplicateContext):
    """What TF's `_raise_error_for_incorrect_control_flow_context` looks for on a graph: a
    TPUReplicateContext among its control-flow contexts (TPUStrategy's `tpu.replicate` sets one on
    the graph the replica function is built in). Set on the replica function's graph only while
    TF's check runs (`CpuStepV2._refuse_as_enqueue_does`), so no op is ever built under it; its
    only member is the one the check reads, `outer_context`."""

    def __init__(self, outer):  # pylint: disable=super-init-not-called
        self._outer_context = outer


def recording_strategy_class(replicas: int, embedding_feature=Feature.V2, sparse_cores_per_chip: int = 4,
                             on_scope=None, on_run=None, on_distribute=None):
    """A MirroredStrategy over `replicas` CPU devices with TPUStrategy's TPU-only attributes.
    `on_scope(entered: bool)`, `on_run(fn, args, kwargs, options, entered)`,
    `on_distribute(dataset_fn, options)`: recorders (tests/test_tpu_conformance.py binds them to
    TPUStrategy's signatures)."""
    devices = cpu_devices(replicas)

    class RecordingTPUStrategy(tf.distribute.MirroredStrategy):
        def __init__(self):
            # A TPU's step is compiled by XLA, not rewritten by grappler, TF's CPU graph optimizer:
            # its passes are off while the harness runs (tests/conftest.py turns them back on after
            # each test). A harness test runs about 8% faster without them.
            tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
            # Reduced through one device, not collectives: collective instance keys of several
            # strategies in one test process collide (a TPU has no cross_device_ops either).
            super().__init__(devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
            self.extended.tpu_hardware_feature = HardwareFeature(embedding_feature, sparse_cores_per_chip)
            self.extended._tpu_devices = np.array([[d] for d in devices], dtype=object)  # pylint: disable=protected-access
            # TPUStrategy's variable rule (tpu_strategy.py, `_create_variable`): a creator that asks
            # to skip mirroring gets one plain variable where it stands. TPUEmbeddingV2's sharded
            # creator asks it for every shard, so each shard lives on its own device only;
            # MirroredStrategy alone would mirror every shard to every device.
            mirrored = self.extended._create_variable  # pylint: disable=protected-access

            def create_variable(next_creator, **kwargs):
                if kwargs.pop("skip_mirrored_creator", False):
                    return next_creator(**kwargs)
                return mirrored(next_creator, **kwargs)

            self.extended._create_variable = create_variable  # pylint: disable=protected-access

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

            @functools.wraps(fn)
            def replica_fn(*a, **k):  # the graph a TPU replicate context would hold (CpuStepV2 checks it)
                _REPLICA.graph = tf.compat.v1.get_default_graph()
                try:
                    return fn(*a, **k)
                finally:
                    _REPLICA.graph = None

            try:
                return super().run(replica_fn, args=args, kwargs=kwargs, options=options)
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
    return stacked_rows(mid, table_name, tf.range(rows, dtype=tf.int64))


def logical_table(mid: Any, table_name: str, rows: int, dim: int, slot: str = "parameters") -> tf.Tensor:
    """[rows, dim]: a table's logical rows read out of TF's stacked, sharded variable (`slot`: one
    of its optimizer slots instead, by the TPU optimizer's slot name, e.g. "accumulators")."""
    stacked = mid._table_to_stacked_table_offset[table_name][0]  # pylint: disable=protected-access
    full = _read_full(mid._variables[stacked][slot])  # pylint: disable=protected-access
    return tf.gather(full, stacked_positions(mid, table_name, rows))[:, :dim]


class Coo(NamedTuple):
    """One stack's looked-up IDs in a step, as the SparseCore's COO/CSR input holds them: the
    sample each ID belongs to (in the stack's sample space: the feature's sample offset added),
    the ID's row in the stacked variable (TF's index mapping) and its gain (weight x combiner)."""

    sample: tf.Tensor
    position: tf.Tensor
    gain: tf.Tensor


def stacked_rows(mid: Any, table_name: str, ids: tf.Tensor) -> tf.Tensor:
    """int64: the rows of the stacked variable (shards concatenated in device order) that hold
    logical rows `ids` of `table_name`, by TF's `map_indices_in_shard` and the offset and rotation
    TF's constructor gave the table."""
    stacked, offset, rotation = mid._table_to_stacked_table_offset[table_name]  # pylint: disable=protected-access
    n = mid._num_sc_shards  # pylint: disable=protected-access
    tables = mid._stacked_table_to_tables[stacked]  # pylint: disable=protected-access
    total = sum(t.vocabulary_size for t in tables)
    mutation = getattr(mid, "mutation", None)  # MUTATIONS: a broken SparseCore the smoke test must catch
    if mutation == "rotation":
        rotation += 1
    elif mutation == "padding":  # rows padded to 8 x SparseCores per chip, not 8 x all SparseCores
        per_chip = n // mid._strategy.num_replicas_in_sync  # pylint: disable=protected-access
        total = sum(-(-(t.vocabulary_size - mid._table_to_padding_rows[t.name]) // (8 * per_chip)) * 8 * per_chip  # pylint: disable=protected-access
                    for t in tables)
    shard, position = tpu_embedding_v3_utils.map_indices_in_shard(n, offset // n, rotation, tf.cast(ids, tf.int64))
    return shard * (total // n) + position


# The XLA pad size `GetMinibatchesInCsrWithPhysicalReplica` rounds every partition up to (the TPU
# topology's, `TpuUtil_GetXlaPadSizeFromTpuTopologyFn`; unknown on CPU): 8 assumed, as the
# trainer's IDs-per-chip check assumes (components/embedding_trainer/sparsecore_limits.py).
XLA_PAD_SIZE = 8


def _refusal(ok: tf.Tensor, message: str, *values: tf.Tensor) -> tf.Operation:
    """An op failing the step with InvalidArgumentError `message` (and `values`) where the boolean
    `ok` is false, as a kernel's refusal fails it. TF's `Assert` with string and int32 data only, so
    that it is one op: `tf.debugging.assert_*` guard theirs with a `cond` (two branch graphs traced
    per check, per feature, per replica: about a tenth of a harness test's tracing)."""
    return tf.debugging.Assert(ok, [message] + [tf.cast(v, tf.int32) for v in values])


class CpuConvertToCoo:
    """TF's `xla_ops` module as TPUEmbeddingV2's COO preprocessing sees it while `CpuStepV2` runs
    that preprocessing (TF's own `_preprocess_inputs_and_weights_to_coo_tensor` and
    `_convert_input_feature_to_coo`): every op is TF's but `convert_to_coo_tensor`, the SparseCore
    host kernel the wheel registers no CPU kernel for, done here as the kernel does it
    (tensorflow/core/tpu/kernels/sparse_core_preprocess_ops.cc, `ConvertToCooTensorOp`):
    - its input validation (`ValidateInputs`), each failure an InvalidArgumentError in the
      kernel's words: as many weights as IDs; a dense input of exactly one ID per sample (TF
      flattens it: [batch, k] with k > 1 is refused); a ragged input of exactly sample_count rows;
      for a SparseTensor, sample rows below sample_count in non-decreasing order (refused by later
      kernels; the early-2024 one put a row past the feature's samples into the next feature's,
      and the minibatch split, which walks rows in order, misplaces unsorted ones);
    - the combiner's gains (sum: w; mean: w / sum w; sqrtn: w / sqrt(sum w^2) over the sample's
      IDs; 0 where that sum is 0, as TF's CPU lookup has it). The kernel also merges an ID repeated
      next to itself in a sample (gains summed); the values looked up and the gradients are the
      same either way, and the IDs are counted unmerged here (the buffer check: never fewer than
      the kernel keeps).
    `ids`: each call's IDs (the int32 `values`), in TF's call order (the flat feature order)."""

    def __init__(self, real):
        self._real = real
        self.ids: List[tf.Tensor] = []

    def __getattr__(self, name):
        return getattr(self._real, name)

    def convert_to_coo_tensor(self, indices_or_row_splits, values, weights, sample_count, combiner):
        if combiner not in ("sum", "mean", "sqrtn"):
            raise ValueError(f"Invalid combiner {combiner!r}: one of sum, mean, sqrtn")
        n = tf.size(values, out_type=tf.int64)
        checks = [_refusal(tf.equal(n, tf.size(weights, out_type=tf.int64)),
                           "Values and weights should have same elements (elements of values, of weights)",
                           n, tf.size(weights, out_type=tf.int64))]
        rank = indices_or_row_splits.shape.rank
        if rank == 1 and indices_or_row_splits.shape[0] == 0:  # dense: TF passes zeros((0,))
            checks.append(_refusal(
                tf.equal(n, sample_count),
                f"Dense tensor input should have values elements number the same as the sample count "
                f"{sample_count} (one ID per sample)", n))
            sample = tf.range(n)
        elif rank == 2:  # SparseTensor indices
            sample = tf.cast(indices_or_row_splits[:, 0], tf.int64)
            checks.append(_refusal(
                tf.reduce_all(sample < sample_count),
                f"Invalid indices_or_row_splits input, indices of SparseTensor contained a row_id that was "
                f">= the sample count ({sample_count})", tf.reduce_max(sample)))
            checks.append(_refusal(
                tf.reduce_all(sample[1:] >= sample[:-1]),
                "Invalid indices_or_row_splits input, indices of SparseTensor need to be sorted in "
                "ascending (non-decreasing) order"))
        elif rank == 1:  # RaggedTensor row_splits
            splits = tf.size(indices_or_row_splits, out_type=tf.int64)
            checks.append(_refusal(
                tf.equal(splits, sample_count + 1),
                f"Ragged tensor input should have row_splits elements number the same as the sample count "
                f"+ 1 ({sample_count + 1})", splits))
            sample = tf.ragged.row_splits_to_segment_ids(tf.cast(indices_or_row_splits, tf.int64), out_type=tf.int64)
        else:
            raise ValueError(f"Invalid indices_or_row_splits input, Got dimension of {rank}")
        with tf.control_dependencies(checks):  # nothing of the step reads the input unchecked
            sample, values, w = tf.identity(sample), tf.identity(values), tf.cast(tf.reshape(weights, [-1]), tf.float32)
        if combiner == "mean":
            w = tf.math.divide_no_nan(w, tf.gather(tf.math.unsorted_segment_sum(w, sample, sample_count), sample))
        elif combiner == "sqrtn":
            w = tf.math.divide_no_nan(w, tf.gather(tf.sqrt(tf.math.unsorted_segment_sum(w * w, sample, sample_count)), sample))
        self.ids.append(values)
        return tf.cast(sample, tf.int32), values, w


@contextlib.contextmanager
def _kernel_stand_in(kernel: CpuConvertToCoo):
    """TF's tpu_embedding_v3 calls `kernel` for its `xla_ops` while the block runs (one
    synchronous call from one replica thread; MirroredStrategy runs its replicas one at a time)."""
    real = tpu_embedding_v3.xla_ops
    tpu_embedding_v3.xla_ops = kernel
    try:
        yield kernel
    finally:
        tpu_embedding_v3.xla_ops = real


def _read_full(variable) -> tf.Tensor:
    """A TPUEmbeddingShardedVariable's parts, concatenated in device order (the stacked table)."""
    return tf.concat([tf.convert_to_tensor(v) for v in variable.values], axis=0)


def _write_rows(variable, rows: tf.Tensor, values: tf.Tensor) -> List[Any]:
    """`values` into rows `rows` of the stacked table, each part on its own device."""
    parts = list(variable.values)
    per_part = int(parts[0].shape[0])
    ops = []
    for d, part in enumerate(parts):
        mine = tf.equal(rows // per_part, d)
        local = tf.boolean_mask(rows, mine) - d * per_part
        # read, scatter and assign whole: the parts are TPU-flavoured variables without scatter methods
        updated = tf.tensor_scatter_nd_update(tf.convert_to_tensor(part), local[:, None], tf.boolean_mask(values, mine))
        ops.append(part.assign(updated))
    return ops


# Broken TPU steps, each a way a TPU kernel, layout or compiled step could go wrong;
# tests/test_smoke_mutations.py requires the smoke test's parity check to fail on each. In the
# SparseCore step (`cpu_step_v2_class(mutation=...)`):
SPARSECORE_MUTATIONS = {
    "no_slot_write": "the optimizer slots are never written back",
    "per_occurrence_square": "the accumulators add each occurrence's g^2, not the square of the row's summed g",
    "averaged_replicas": "the replicas' row gradients averaged, not summed",
    "replica_0_only": "only replica 0's row gradients applied",
    "learning_rate": "twice the learning rate",
    "learning_rate_2pct": "one stack's learning rate x1.02 (the first stack by name)",
    "rotation": "each table's shard rotation off by one",
    "padding": "rows padded to 8 x SparseCores per chip, not 8 x all SparseCores",
}
# In the step the TensorCore runs (`break_tensor_core_step`): the Keras optimizers' updates under
# the harness's strategy, which only the TPU run trains under. Each acts at one step (the last
# parity step): the tables' values are then still the CPU run's, and only a check of the slots or
# the dense network sees it.
TENSOR_CORE_MUTATIONS = {
    "tensor_core_slot": "a TensorCore table's optimizer slots not written back (its rows still are)",
    "dense_step": "a dense optimizer step dropped: the dense network's weights and their slots left as they were",
}
MUTATIONS = {**SPARSECORE_MUTATIONS, **TENSOR_CORE_MUTATIONS}


def _then_restore(update, variables, when):
    """`update` (a function building the update op) run with `variables` read before it and
    written back after it where `when` (a boolean tensor) holds: every change it made to them undone."""
    before = [tf.identity(tf.convert_to_tensor(v)) for v in variables]
    with tf.control_dependencies(before):
        op = update()
    with tf.control_dependencies([op]):
        return tf.cond(when, lambda: tf.group(*[v.assign(b) for v, b in zip(variables, before)]), tf.no_op)


def break_tensor_core_step(monkeypatch, mutation: str, step: int) -> None:
    """One of TENSOR_CORE_MUTATIONS in the Keras optimizers' updates made under a distribution
    strategy (the harness's TPU run; the CPU run trains under none), at the optimizer's step `step`
    (its `iterations`, 0-based) only. Undone by `monkeypatch`.
    - tensor_core_slot: each sparse (row) update, a TensorCore table's, leaves its slots as they were;
    - dense_step: each dense-gradient update leaves its variable and slots as they were; the step
      counter still counts the step."""
    from tf_keras.src.optimizers.legacy import gradient_descent

    from components.embedding_model import xla_updates

    if mutation not in TENSOR_CORE_MUTATIONS:
        raise ValueError(f"unknown mutation {mutation!r}: one of {', '.join(TENSOR_CORE_MUTATIONS)}")
    classes = {*xla_updates.KERAS_CLASSES.values(), xla_updates.LazyAdam, gradient_descent.SGD}
    method = "_resource_apply_sparse_duplicate_indices" if mutation == "tensor_core_slot" else "_resource_apply_dense"
    for cls in classes:
        original = getattr(cls, method)

        def broken(self, grad, var, *args, _original=original, **kwargs):
            update = lambda: _original(self, grad, var, *args, **kwargs)  # noqa: E731
            if not tf.distribute.has_strategy():
                return update()
            kept = [self.get_slot(var, n) for n in self.get_slot_names()]
            if mutation == "dense_step":
                kept.insert(0, var)
            return _then_restore(update, kept, tf.equal(self.iterations, step))

        monkeypatch.setattr(cls, method, broken)


def cpu_step_v2_class(on_call=None, on_apply=None, mutation=None):
    """TF's real `TPUEmbeddingV2` (constructor, build, variables, saving) with the SparseCore-only
    step (`__call__`, `apply_gradients`) done on CPU, on the padded stacked variables and the slot
    variables TF built:
    - `__call__`: TF's own enqueue checks and COO preprocessing (`_coo`, over CpuConvertToCoo:
      each feature's samples, IDs and gains), each ID placed into its stack's row by TF's index
      mapping (`stacked_rows`); the stack refused where TF's SparseCore preprocessing refuses it
      (`_within_ids_per_chip`); per stack the rows times their gains
      summed per sample, split back into features by TF's own `_unstack_activations`. Returns the
      COO of each stack as the preserved outputs (the SparseCore keeps its CSR input for the
      backward pass).
    - `apply_gradients`: TF's own `_stack_gradients` (structure and shape checks, padded columns,
      zero gradients for None), each ID's row gradient (its sample's gradient x gain), then, as the
      SparseCore does, the row gradients of all replicas summed and one update of each touched row
      (`merge_call`), by the SparseCore optimizer rule (tests/optimizer_reference.py,
      `sparse_core_step`: the stack's `tf.tpu.experimental.embedding` optimizer, its learning rate
      evaluated in the step as TF's `_wrap_param` does, a callable following the Keras step),
      written into the stacked parameters and slots through TF's index mapping, each part on its
      device. `apply_updates = False` (class attribute) checks and drops the gradients instead.
    `on_call(mid, bound_arguments)`, `on_apply(mid, bound)`: recorders. `mutation`: one of
    SPARSECORE_MUTATIONS, a deliberately broken step (None: the correct one)."""
    if mutation is not None and mutation not in SPARSECORE_MUTATIONS:
        raise ValueError(f"unknown mutation {mutation!r}: one of {', '.join(SPARSECORE_MUTATIONS)}")
    import inspect

    from tests.optimizer_reference import sparse_core_parameters, sparse_core_step

    class CpuStepV2(REAL_V2):
        apply_updates = True

        def __call__(self, *args, **kwargs):
            a = inspect.signature(REAL_V2.__call__).bind(self, *args, **kwargs).arguments
            if on_call:
                on_call(self, a)
            self._maybe_build()  # as TF's embedding_lookup, then its enqueue:
            features, weights = a["features"], a.get("weights")
            nest.assert_same_structure(self._feature_config, features)
            flat_weights = [None] * len(self._flat_features)
            if weights is not None:
                nest.assert_same_structure(self._feature_config, weights)
                flat_weights = nest.flatten(weights)
            self._refuse_as_enqueue_does()
            parts: Dict[str, List[Tuple[tf.Tensor, ...]]] = {n: [] for n in self._stacked_table_to_tables}
            for sample, logical, gain, tf_col_ids, feature in self._coo(nest.flatten(features), flat_weights):
                stacked = self._table_to_stacked_table_offset[feature.table.name][0]
                parts[stacked].append((sample, stacked_rows(self, feature.table.name, logical), gain, tf_col_ids))
            activations, preserved = {}, {}
            for stacked, coos in parts.items():
                coo = Coo(*(tf.concat([c[i] for c in coos], 0) for i in range(3)))
                coo = self._within_ids_per_chip(stacked, coo, tf.concat([c[3] for c in coos], 0))
                rows = tf.gather(_read_full(self._variables[stacked]["parameters"]), coo.position)
                activations[stacked] = tf.math.unsorted_segment_sum(
                    rows * coo.gain[:, None], coo.sample, self._table_to_sample_count[stacked])
                preserved[stacked] = coo
            return self._unstack_activations(activations), preserved

        def _coo(self, flat_inputs, flat_weights):
            """Per feature, in TF's flat order: (sample in the stack's sample space, logical ID, gain,
            TF's column ID in the stack), by TF's own `_preprocess_inputs_and_weights_to_coo_tensor`
            (its type and weight checks, casts, sample offsets and row rotation) over the CPU
            `ConvertToCooTensor` (CpuConvertToCoo)."""
            with _kernel_stand_in(CpuConvertToCoo(tpu_embedding_v3.xla_ops)) as kernel:
                coos = REAL_V2._preprocess_inputs_and_weights_to_coo_tensor(  # pylint: disable=protected-access
                    flat_inputs, flat_weights, self._flat_features, self._stacked_table_to_tables,
                    self._table_to_stacked_table_offset, self._feature_to_sample_offset, self._num_sc_shards)
            seen = {n: 0 for n in coos}
            for ids, (_, feature) in zip(kernel.ids, self._flat_features):
                stacked = self._table_to_stacked_table_offset[feature.table.name][0]
                i, seen[stacked] = seen[stacked], seen[stacked] + 1
                rows, cols, gains = (coos[stacked][k][i] for k in range(3))
                yield (tf.cast(rows, tf.int64), tf.cast(ids, tf.int64), gains, tf.cast(cols, tf.int64), feature)

        def _refuse_as_enqueue_does(self) -> bool:
            """TF's own `_raise_error_for_incorrect_control_flow_context`, which `enqueue` runs: it
            refuses an enqueue anywhere but directly in the graph holding TPUStrategy's
            TPUReplicateContext, i.e. inside control flow (a cond or loop branch) or a nested
            tf.function within `strategy.run`, where outside compilation cannot extract the enqueue.
            The harness's strategy records the replica function's graph; it is marked with a
            TPUReplicateContext (`_ReplicateContextMark`) for the check only."""
            graph = getattr(_REPLICA, "graph", None)
            if graph is None:  # outside strategy.run: no TPUReplicateContext anywhere, as on a TPU
                return REAL_V2._raise_error_for_incorrect_control_flow_context(self)  # pylint: disable=protected-access
            outer = graph._get_control_flow_context()  # pylint: disable=protected-access
            graph._set_control_flow_context(_ReplicateContextMark(outer))  # pylint: disable=protected-access
            try:
                return REAL_V2._raise_error_for_incorrect_control_flow_context(self)  # pylint: disable=protected-access
            finally:
                graph._set_control_flow_context(outer)  # pylint: disable=protected-access

        def _within_ids_per_chip(self, stacked: str, coo: "Coo", tf_col_ids: tf.Tensor) -> "Coo":
            """What TF 2.16's `GetMinibatchesInCsrWithPhysicalReplica` (libtpu; no CPU kernel) refuses
            of a stack's input in one replica's step (sparse_core_preprocess_ops.cc;
            components/embedding_trainer/sparsecore_limits.py says what is known of it):
            - a sample count that is no multiple of the SparseCores per chip;
            - more IDs than its buffer of max_ids_per_chip_per_sample (TF's fixed 64) x the stack's
              samples, counted as the kernel packs them: per partition (the SparseCore of the
              sample: sample // (samples / SparseCores per chip), and the physical replica, i.e.
              shard, of the row: TF's column ID mod the shards), each rounded up to the XLA pad
              size (XLA_PAD_SIZE, assumed). One minibatch per SparseCore is assumed: libtpu splits
              a partition into more (each padded again) past its `max_ids_per_partition`, an FDO
              figure not known off a TPU, so a TPU may refuse sooner, never later."""
            samples = self._table_to_sample_count[stacked]  # pylint: disable=protected-access
            per_chip = self._num_sc_per_chip  # pylint: disable=protected-access
            if samples % per_chip:
                raise ValueError(f"stack {stacked}: sample_count {samples} is not divisible by the number of "
                                 f"sparsecores per chip {per_chip}")
            n = self._num_sc_shards  # pylint: disable=protected-access
            partition = coo.sample // (samples // per_chip) * n + tf_col_ids % n
            counts = tf.math.unsorted_segment_sum(tf.ones_like(partition), partition, per_chip * n)
            padded = tf.reduce_sum((counts + XLA_PAD_SIZE - 1) // XLA_PAD_SIZE * XLA_PAD_SIZE)
            bound = self.max_ids_per_chip_per_sample * samples
            check = _refusal(
                padded <= bound,
                f"stack {stacked}: more IDs after padding in one replica step than max_ids_per_chip "
                f"{bound} (max_ids_per_chip_per_sample {self.max_ids_per_chip_per_sample} x {samples} samples)",
                padded)
            with tf.control_dependencies([check]):  # no row is looked up or updated past a refusal
                return Coo(*(tf.identity(t) for t in coo))

        def apply_gradients(self, *args, **kwargs):
            a = inspect.signature(REAL_V2.apply_gradients).bind(self, *args, **kwargs).arguments
            if on_apply:
                on_apply(self, a)
            if not self._built:
                raise RuntimeError("apply_gradients called on unbuilt TPUEmbeddingV2 object.")
            nest.assert_same_structure(self._feature_config, a["gradients"])
            gradients = self._stack_gradients(a["gradients"])  # TF's: per stack, padded columns
            if not self.apply_updates:
                return
            ctx = tf.distribute.get_replica_context()
            for stacked, tables in self._stacked_table_to_tables.items():
                coo = a["preserved_outputs"][stacked]
                optimizer = tables[0].optimizer  # as TF's apply_gradients: the stack's optimizer
                rate = optimizer.learning_rate
                lr = tf.cast(rate() if callable(rate) else rate, tf.float32)
                row_gradients = tf.gather(gradients[stacked], coo.sample) * coo.gain[:, None]
                update = functools.partial(self._update_stack, stacked, optimizer)
                if ctx is None or ctx.num_replicas_in_sync == 1:
                    update(None, coo.position, row_gradients, lr)
                else:
                    ctx.merge_call(update, args=(coo.position, row_gradients, lr))

        def _update_stack(self, stacked: str, optimizer, strategy, positions, row_gradients, lr) -> None:
            """Cross-replica: the replicas' row gradients summed per row, one update per touched row."""
            local = strategy.experimental_local_results if strategy is not None else (lambda x: (x,))
            replicas = len(local(positions))
            if mutation == "replica_0_only":
                positions, row_gradients = local(positions)[0], local(row_gradients)[0]
            else:
                positions = tf.concat(local(positions), 0)
                row_gradients = tf.concat(local(row_gradients), 0)
            if mutation == "averaged_replicas":
                row_gradients = row_gradients / replicas
            first = stacked == min(self._stacked_table_to_tables)  # one stack, whatever the order of TF's dict
            if mutation == "learning_rate_2pct" and first and strategy is not None:  # which tables it broke
                strategy.broken_tables = sorted(t.name for t in self._stacked_table_to_tables[stacked])
            lr = local(lr)[0] * (2.0 if mutation == "learning_rate" else
                                 1.02 if mutation == "learning_rate_2pct" and first else 1.0)
            rows, index = tf.unique(positions)
            summed = tf.math.unsorted_segment_sum(row_gradients, index, tf.shape(rows)[0])
            variables = self._variables[stacked]
            names = ["parameters"] + list(optimizer._slot_names())  # pylint: disable=protected-access
            before = [tf.gather(_read_full(variables[n]), rows) for n in names]
            params = sparse_core_parameters(optimizer)

            def step(lr_value, gradient, *values):
                w = values[0].astype(np.float64)
                slots = {n: v.astype(np.float64) for n, v in zip(names[1:], values[1:])}
                sparse_core_step(params, float(lr_value), w, slots, gradient)
                return [w.astype(np.float32)] + [slots[n].astype(np.float32) for n in names[1:]]

            after = tf.numpy_function(step, [lr, summed] + before, [tf.float32] * len(names), stateful=True)
            after = [tf.reshape(value, tf.shape(before[0])) for value in after]
            if mutation == "per_occurrence_square":
                squares = tf.math.unsorted_segment_sum(row_gradients * row_gradients, index, tf.shape(rows)[0])
                after = [b + squares if n == "accumulators" else a for n, a, b in zip(names, after, before)]
            for n, value in zip(names, after):
                if n != "parameters" and mutation == "no_slot_write":
                    continue
                _write_rows(variables[n], rows, value)

    CpuStepV2.mutation = mutation
    return CpuStepV2


def install_sparsecore(monkeypatch, replicas: int = 2, sparse_cores_per_chip: int = 4, v2_class=None, mutation=None,
                       mutation_step: int = 0):
    """The trainer's TPU branch on the harness, for SparseCore: a RecordingTPUStrategy instance
    (`replicas` CPU devices) that TF's TPUEmbeddingV2, TFRS's layer and the trainer's
    `is_tpu_strategy` accept, with `v2_class` (default `cpu_step_v2_class()`) built wherever the
    model builds `tf.tpu.experimental.embedding.TPUEmbeddingV2`. `mutation`: one of MUTATIONS, the
    TPU run's step broken that way (TENSOR_CORE_MUTATIONS at step `mutation_step`). Undone by
    `monkeypatch`."""
    if mutation in TENSOR_CORE_MUTATIONS:
        break_tensor_core_step(monkeypatch, mutation, mutation_step)
    elif mutation is not None:
        v2_class = cpu_step_v2_class(mutation=mutation)
    from tensorflow_recommenders.layers.embedding import tpu_embedding_layer as tfrs_layer

    from components.embedding_trainer import hardware  # lazy: a harness helper, TensorFlow's trainer modules

    cls = recording_strategy_class(replicas, Feature.V2, sparse_cores_per_chip)
    let_pass_type_check(monkeypatch, cls)
    is_harness = lambda s: isinstance(s, cls)  # noqa: E731
    monkeypatch.setattr(hardware, "is_tpu_strategy", is_harness)
    monkeypatch.setattr(tfrs_layer, "_is_tpu_strategy", is_harness)
    v2 = v2_class or cpu_step_v2_class()
    # TFRS reaches the class through tensorflow.compat.v2, another module object than tf's.
    for module in {id(m): m for m in (tf.tpu.experimental.embedding, tf.compat.v2.tpu.experimental.embedding)}.values():
        monkeypatch.setattr(module, "TPUEmbeddingV2", v2)
    return cls()


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
