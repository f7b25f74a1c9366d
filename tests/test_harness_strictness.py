"""The CPU harness (tests/tpu_harness.py) is no more lenient than TPUStrategy and TF's enqueue.

- Shards: TF's real `TPUEmbeddingV2` built under the harness's 2-replica strategy holds each stack
  (parameters and slots) as one plain variable per replica device, shard i on device i, as
  TPUStrategy's `skip_mirrored_creator` rule places them; MirroredStrategy alone mirrors every
  shard to every device.
- Enqueue: a lookup inside a `tf.cond` branch or a nested tf.function within `strategy.run` is
  refused with TF's own words (`_raise_error_for_incorrect_control_flow_context`); the same
  lookup directly in the replica function runs.
- SparseCore preprocessing: a replica's step with more IDs than max_ids_per_chip_per_sample x the
  stack's samples fails the step.
"""
import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf
from tensorflow.python.distribute import values as tf_values

from tests import tpu_harness

EMB = tf.tpu.experimental.embedding
REPLICAS, PER_CHIP, BATCH = 2, 4, 4


def _mid(monkeypatch):
    cls = tpu_harness.recording_strategy_class(REPLICAS, sparse_cores_per_chip=PER_CHIP)
    tpu_harness.let_pass_type_check(monkeypatch, cls)
    strategy = cls()
    table = EMB.TableConfig(40, 4, initializer=tf.keras.initializers.Ones(), combiner="sum", name="t",
                            optimizer=EMB.Adagrad(0.1))
    features = {"f": EMB.FeatureConfig(table, name="f", output_shape=[BATCH])}
    with strategy.scope():
        mid = tpu_harness.cpu_step_v2_class()(features, EMB.Adagrad(0.1))
        mid.build()
    return strategy, mid


def _inputs(strategy, ids_per_sample=1):
    def make(ctx):
        rows = [[(i + ctx.replica_id_in_sync_group + k) % 40 for k in range(ids_per_sample)] for i in range(BATCH)]
        idx = [[i, j] for i, r in enumerate(rows) for j in range(len(r))]
        return {"f": tf.sparse.SparseTensor(tf.constant(idx, tf.int64), tf.constant([v for r in rows for v in r], tf.int64),
                                            [BATCH, ids_per_sample])}
    return strategy.experimental_distribute_values_from_function(make)


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


def test_a_lookup_inside_control_flow_or_a_nested_function_is_refused(monkeypatch):
    strategy, mid = _mid(monkeypatch)
    inputs = _inputs(strategy)

    @tf.function
    def direct(x):
        return strategy.run(lambda f: mid(f)[0]["f"], args=(x,))

    @tf.function
    def in_cond(x):
        return strategy.run(lambda f: tf.cond(tf.constant(True), lambda: mid(f)[0]["f"], lambda: tf.zeros([BATCH, 4])),
                            args=(x,))

    @tf.function
    def nested(x):
        return strategy.run(tf.function(lambda f: mid(f)[0]["f"]), args=(x,))

    out = strategy.experimental_local_results(direct(inputs))
    np.testing.assert_allclose(out[0].numpy(), np.ones([BATCH, 4]))  # Ones tables, one ID a sample
    for fn in (in_cond, nested):
        with pytest.raises(RuntimeError, match="enqueueing embedding data is called inside control flow or a tf.function"):
            fn(inputs)


def test_more_ids_than_the_per_chip_buffer_fail_the_step(monkeypatch):
    strategy, mid = _mid(monkeypatch)
    assert mid.max_ids_per_chip_per_sample == 64  # TF 2.16's fixed value
    mid.max_ids_per_chip_per_sample = 2  # a buffer of 2 x 4 samples: 3 IDs a sample overflow it

    @tf.function
    def step(x):
        return strategy.run(lambda f: mid(f)[0]["f"], args=(x,))

    step(_inputs(strategy, ids_per_sample=2))  # 8 IDs: fits
    with pytest.raises(tf.errors.InvalidArgumentError, match="more IDs in one replica step than max_ids_per_chip_per_sample 2 x 4 samples"):
        step(_inputs(strategy, ids_per_sample=3))
