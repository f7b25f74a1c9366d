"""The CPU harness (tests/tpu_harness.py) is no more lenient than TPUStrategy and TF's enqueue.

- Shards: TF's real `TPUEmbeddingV2` built under the harness's 2-replica strategy holds each stack
  (parameters and slots) as one plain variable per replica device, shard i on device i, as
  TPUStrategy's `skip_mirrored_creator` rule places them; MirroredStrategy alone mirrors every
  shard to every device.
- Enqueue's control-flow check: a lookup inside a `tf.cond` branch, a `tf.while_loop` body or a
  nested tf.function within `strategy.run` is refused by TF's own
  `_raise_error_for_incorrect_control_flow_context`; the same lookup directly in the replica
  function runs.
- Input TF's preprocessing refuses (TF's own `_convert_input_feature_to_coo` over the CPU
  `ConvertToCooTensor`): a dense input of more than one ID per sample, a ragged input of another
  row count than the feature's samples, weights of a ragged input (TF 2.16's `if not weight`),
  weights of another kind or count than the IDs, SparseTensor rows past the samples or unsorted.
- SparseCore preprocessing (`GetMinibatchesInCsrWithPhysicalReplica`): a stack whose sample count
  is no multiple of the SparseCores per chip, and a replica's step with more IDs, each partition
  padded to the XLA pad size, than max_ids_per_chip_per_sample x the stack's samples.
Each refusal is one test; on the harness before these checks each lookup ran.
"""
import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf
from tensorflow.python.distribute import values as tf_values

from tests import tpu_harness

EMB = tf.tpu.experimental.embedding
REPLICAS, PER_CHIP, BATCH, ROWS = 2, 4, 4, 40


def _mid(monkeypatch, batch=BATCH, combiner="sum"):
    cls = tpu_harness.recording_strategy_class(REPLICAS, sparse_cores_per_chip=PER_CHIP)
    tpu_harness.let_pass_type_check(monkeypatch, cls)
    strategy = cls()
    table = EMB.TableConfig(ROWS, 4, initializer=tpu_harness.row_identity_initializer(0), combiner=combiner, name="t",
                            optimizer=EMB.Adagrad(0.1))
    features = {"f": EMB.FeatureConfig(table, name="f", output_shape=[batch])}
    with strategy.scope():
        mid = tpu_harness.cpu_step_v2_class()(features, EMB.Adagrad(0.1))
        mid.build()
    return strategy, mid


def _sparse(rows, batch=BATCH, dtype=tf.int64):
    """A [batch, width] SparseTensor holding `rows` (a list of ID lists, one per sample), row-major."""
    idx = np.array([[i, j] for i, r in enumerate(rows) for j in range(len(r))], np.int64).reshape(-1, 2)
    width = max(1, max(len(r) for r in rows))
    return tf.sparse.SparseTensor(idx, tf.constant([v for r in rows for v in r], dtype), [batch, width])


def _per_replica(strategy, make):
    return strategy.experimental_distribute_values_from_function(lambda ctx: make(ctx.replica_id_in_sync_group))


def _ids(replica, ids_per_sample=1, batch=BATCH):
    return [[(i + replica + k) % ROWS for k in range(ids_per_sample)] for i in range(batch)]


def _lookup(strategy, mid):
    @tf.function
    def step(features, weights=None):
        return strategy.run(lambda f, w: mid(f, w)[0]["f"], args=(features, weights))
    return step


def _expected(rows):
    """Sum-combined rows of the row-identity table (table 0: [r, c] = r + c / 64)."""
    table = tpu_harness.expected_rows(0, ROWS, 4)
    return np.stack([table[r].sum(axis=0) for r in rows])


def test_each_shard_is_one_plain_variable_on_its_own_device(monkeypatch):
    strategy, mid = _mid(monkeypatch)
    devices = tpu_harness.cpu_devices(REPLICAS)
    for stacked, slots in mid._variables.items():  # pylint: disable=protected-access
        for slot, variable in slots.items():
            parts = list(variable.values)
            assert len(parts) == REPLICAS, (stacked, slot)
            for i, part in enumerate(parts):
                assert not isinstance(part, tf_values.DistributedValues), (stacked, slot, type(part))
                got, want = tf.DeviceSpec.from_string(part.device), tf.DeviceSpec.from_string(devices[i])
                assert (got.device_type, got.device_index) == (want.device_type, want.device_index), (slot, i, part.device)
    assert set(mid._variables["t"]) == {"parameters", "accumulators"}  # pylint: disable=protected-access


@pytest.mark.slow(reason="four tf.functions traced under the 2-replica harness (~1 s)")
def test_a_lookup_inside_control_flow_or_a_nested_function_is_refused_by_tfs_check(monkeypatch):
    strategy, mid = _mid(monkeypatch)
    inputs = _per_replica(strategy, lambda r: {"f": _sparse(_ids(r))})
    checked = []
    real_check = tpu_harness.REAL_V2._raise_error_for_incorrect_control_flow_context  # pylint: disable=protected-access

    def check(self):
        try:
            checked.append(real_check(self))
        except RuntimeError:
            checked.append("refused")
            raise
        return checked[-1]

    monkeypatch.setattr(tpu_harness.REAL_V2, "_raise_error_for_incorrect_control_flow_context", check)
    # autograph=False: the control flow is TF's own ops (tf.cond, tf.while_loop), nothing to convert.
    # Converted, the harness's lookup code took 8-55 s instead of 1 s in some whole-suite runs,
    # stalled in AutoGraph's rewriting inside a replica thread.

    @tf.function(autograph=False)
    def direct(x):
        return strategy.run(lambda f: mid(f)[0]["f"], args=(x,))

    @tf.function(autograph=False)
    def in_cond(x):
        return strategy.run(lambda f: tf.cond(tf.constant(True), lambda: mid(f)[0]["f"], lambda: tf.zeros([BATCH, 4])),
                            args=(x,))

    @tf.function(autograph=False)
    def in_loop(x):
        def replica(f):
            body = lambda i, acc: (i + 1, acc + mid(f)[0]["f"])  # noqa: E731
            return tf.while_loop(lambda i, _: i < 1, body, (tf.constant(0), tf.zeros([BATCH, 4])))[1]

        return strategy.run(replica, args=(x,))

    @tf.function(autograph=False)
    def nested(x):
        return strategy.run(tf.function(lambda f: mid(f)[0]["f"], autograph=False), args=(x,))

    out = strategy.experimental_local_results(direct(inputs))
    np.testing.assert_allclose(out[0].numpy(), _expected(_ids(0)))
    assert checked == [True] * REPLICAS  # TF's check ran, and found the replica function's TPUReplicateContext
    for fn in (in_cond, in_loop, nested):
        checked.clear()
        with pytest.raises(RuntimeError, match="does not match graph which contains TPUReplicateContext.*enqueueing "
                                               "embedding data is called inside control flow or a tf.function"):
            fn(inputs)
        assert checked == ["refused"], fn  # by TF's own check


@pytest.mark.slow(reason="four input kinds looked up under the 2-replica harness (~2 s)")
def test_inputs_tf_accepts_look_up_their_rows(monkeypatch):
    """Dense IDs of one per sample, ragged rows of the feature's samples, sorted sparse rows: each
    looks up its rows (sum of the row-identity table's rows)."""
    strategy, mid = _mid(monkeypatch)
    step = _lookup(strategy, mid)
    forms = {
        "dense": lambda r: tf.constant([ids[0] for ids in _ids(r)], tf.int64),
        "dense_column": lambda r: tf.constant([[ids[0]] for ids in _ids(r)], tf.int64),
        "ragged": lambda r: tf.ragged.constant(_ids(r, 2), tf.int64),
        "sparse": lambda r: _sparse(_ids(r, 2)),
    }
    for name, make in forms.items():
        out = strategy.experimental_local_results(step(_per_replica(strategy, lambda r, make=make: {"f": make(r)})))
        per_sample = 1 if name.startswith("dense") else 2
        for r, o in enumerate(out):
            np.testing.assert_allclose(o.numpy(), _expected(_ids(r, per_sample)), err_msg=name)


REFUSED = {
    # name: (ids of replica r, weights of replica r or None, error, message)
    "dense_ids_several_a_sample": (lambda r: tf.constant(_ids(r, 2), tf.int64), None, tf.errors.InvalidArgumentError,
                                   "Dense tensor input should have values elements number the same as the sample count"),
    "ragged_rows_other_than_samples": (lambda r: tf.ragged.constant(_ids(r, 1, BATCH + 1), tf.int64), None,
                                       tf.errors.InvalidArgumentError,
                                       "Ragged tensor input should have row_splits elements number the same as the sample"),
    "ragged_weights": (lambda r: tf.ragged.constant(_ids(r, 2), tf.int64), lambda r: tf.ragged.constant([[1.0, 1.0]] * BATCH),
                       TypeError, "RaggedTensor may not be used as a boolean"),
    "sparse_weights_of_another_kind": (lambda r: _sparse(_ids(r)), lambda r: tf.ones([BATCH]), ValueError,
                                       "Expect weight to be SparseTensor type"),
    "sparse_weights_of_another_count": (lambda r: _sparse(_ids(r, 2)), lambda r: _sparse([[1.0]] * BATCH, dtype=tf.float32), tf.errors.InvalidArgumentError,
                                        "Values and weights should have same elements"),
    "sparse_row_past_the_samples": (lambda r: _sparse(_ids(r, 1, BATCH + 1), batch=BATCH + 1), None,
                                    tf.errors.InvalidArgumentError, r"contained a row_id that was >= the sample count \(4\)"),
    "sparse_rows_unsorted": (lambda r: tf.sparse.SparseTensor([[1, 0], [0, 0], [2, 0], [3, 0]], tf.constant([1, 2, 3, 4], tf.int64), [BATCH, 1]),
                             None, tf.errors.InvalidArgumentError, "need to be sorted in ascending"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_input_tfs_preprocessing_refuses_is_refused(case, monkeypatch):
    ids, weights, error, message = REFUSED[case]
    strategy, mid = _mid(monkeypatch)
    features = _per_replica(strategy, lambda r: {"f": ids(r)})
    w = _per_replica(strategy, lambda r: {"f": weights(r)}) if weights else None
    with pytest.raises(error, match=message):
        _lookup(strategy, mid)(features, w)


def test_a_sample_count_the_sparsecores_do_not_divide_is_refused(monkeypatch):
    strategy, mid = _mid(monkeypatch, batch=6)  # 6 samples on 4 SparseCores per chip
    features = _per_replica(strategy, lambda r: {"f": _sparse(_ids(r, 1, 6), batch=6)})
    with pytest.raises(ValueError, match="sample_count 6 is not divisible by the number of sparsecores per chip 4"):
        _lookup(strategy, mid)(features)


def test_more_ids_than_the_per_chip_buffer_fail_the_step(monkeypatch):
    """The kernel's buffer holds max_ids_per_chip_per_sample x samples IDs with every (SparseCore,
    shard) partition padded to the XLA pad size: 4 samples of one ID each fill 4 partitions of one
    SparseCore each, 4 x 8 = 32 slots; a buffer of 8 x 4 holds them, one of 7 x 4 does not, though
    the 4 IDs alone would fit."""
    strategy, mid = _mid(monkeypatch)
    assert mid.max_ids_per_chip_per_sample == 64  # TF 2.16's fixed value
    step = _lookup(strategy, mid)
    features = _per_replica(strategy, lambda r: {"f": _sparse(_ids(r))})
    mid.max_ids_per_chip_per_sample = 8
    step(features)
    mid.max_ids_per_chip_per_sample = 7
    step = _lookup(strategy, mid)  # retraced: the bound is a constant of the step
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"more IDs after padding in one replica step than max_ids_per_chip 28 .*\[32\]"):
        step(features)
