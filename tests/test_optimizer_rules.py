"""The embedding optimizer applies one update rule on CPU/GPU and on TPU.

CPU side: the Keras optimizer the trainer builds (optimizers.keras_optimizer) after the trainer's
gradient clipping (optimizers.clip_embedding_gradients), applied to a table variable with sparse
gradients that repeat rows. TPU side: the TPU embedding optimizer the trainer builds
(optimizers.tpu_optimizer), read through the `OptimizationParameters` proto it writes for the TPU
(what the hardware receives), and applied with the update rule TensorFlow documents for the TPU
embedding engine (tensorflow/core/protobuf/tpu/optimization_parameters.proto and the CPU kernels it
links to): gradients of a row summed over the batch (gradient accumulation), clipped to the
gradient clipping limits, then SGD / Adagrad / Adam (no bias correction of its own: the dynamic
learning rate carries it; lazy unless use_non_lazy_adam; sum_inside_sqrt as flagged) / FTRL (with
`beta / (2 lr)` added to l2). Tables and slots must agree to 1e-6 (absolute, or relative for
accumulators that grow past 1: float32) after several steps.

What this cannot show: that the TPU hardware implements its documented rule (only a TPU run can:
the TPU smoke test, components/tpu_smoke/, compares the chip's SparseCore
training with the same steps on CPU; tests/tpu_harness.py's CPU SparseCore step applies this
reference's rule).
"""
import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2

from components.config.training_schema import OptimizerConfig, ScheduleConfig
from components.embedding_model import optimizers
from components.planning.derivation import optimizer_spec
from components.embedding_model.tf_objects import learning_rate
from tests.optimizer_reference import optimization_parameters as _proto, tpu_reference_step as _tpu_reference_step

ROWS, DIM, STEPS = 12, 4, 6
# Each step's gradient rows, with repeats (a row looked up twice in the batch) and rows never seen.
STEP_ROWS = [[0, 3, 3, 7], [1, 3, 5, 5, 5], [0, 2, 9], [3, 3, 3, 3], [4, 7, 8, 11], [0, 1, 2, 3]]


def _grads(step: int) -> tf.IndexedSlices:
    rows = np.array(STEP_ROWS[step], np.int64)
    rng = np.random.default_rng(step)
    values = rng.normal(0.0, 1.5, size=(len(rows), DIM)).astype(np.float32)
    return tf.IndexedSlices(tf.constant(values), tf.constant(rows), tf.constant([ROWS, DIM], tf.int64))


CASES = {
    "sgd": OptimizerConfig(name="sgd", learning_rate=0.3),
    "sgd_clip": OptimizerConfig(name="sgd", learning_rate=0.3, clipvalue=0.8),
    "adagrad": OptimizerConfig(name="adagrad", learning_rate=0.2, initial_accumulator_value=0.1),
    "adagrad_clip_schedule": OptimizerConfig(
        name="adagrad", learning_rate=0.2, initial_accumulator_value=0.5, clipvalue=1.0,
        schedule=ScheduleConfig(name="exponential", warmup_steps=2, decay_steps=3, decay_rate=0.5),
    ),
    "adam_lazy": OptimizerConfig(name="adam", learning_rate=0.05),
    "adam_not_lazy": OptimizerConfig(name="adam", learning_rate=0.05, lazy_adam=False, beta_1=0.8, beta_2=0.99),
    "adam_lazy_clip_cosine": OptimizerConfig(
        name="adam", learning_rate=0.05, clipvalue=0.5, epsilon=1e-3,
        schedule=ScheduleConfig(name="cosine", decay_steps=5, alpha=0.1),
    ),
    "ftrl": OptimizerConfig(name="ftrl", learning_rate=0.5),
    "ftrl_l1_l2_clip": OptimizerConfig(
        name="ftrl", learning_rate=0.5, l1_regularization_strength=0.05, l2_regularization_strength=10.0,
        initial_accumulator_value=0.2, clipvalue=1.2,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cpu_update_equals_tpu_documented_rule(case):
    spec = optimizer_spec(CASES[case])
    rate = learning_rate(spec)
    keras_opt = optimizers.keras_optimizer(spec, rate)
    tpu_opt = optimizers.tpu_optimizer(spec, rate, step_fn=lambda: keras_opt.iterations, keras_opt=keras_opt)
    proto = _proto(tpu_opt)
    init = np.random.default_rng(99).normal(0, 0.3, size=(ROWS, DIM)).astype(np.float32)
    table = tf.Variable(init, name="table")
    # The slots are created by the TPU optimizer's creator (as on TPU and by the trainer's layer),
    # under Keras' names, owned by the Keras optimizer.
    created = tpu_opt._create_slots(table, lambda name, initializer: None)  # pylint: disable=protected-access
    assert set(created) == set(tpu_opt._slot_names())  # pylint: disable=protected-access
    assert sorted(keras_opt.get_slot_names()) == sorted(optimizers.KERAS_SLOT_NAMES[spec["name"]].values())
    for tpu_name, keras_name in optimizers.KERAS_SLOT_NAMES[spec["name"]].items():
        # NoDependency: the mid-level API keeps the slot without tracking it (the Keras optimizer does).
        assert created[tpu_name].value is keras_opt.get_slot(table, keras_name)

    w = init.astype(np.float64)
    slots = {name: keras_opt.get_slot(table, k).numpy().astype(np.float64)
             for name, k in optimizers.KERAS_SLOT_NAMES[spec["name"]].items()}
    for step in range(STEPS):
        lr = float(tpu_opt.learning_rate()) if callable(tpu_opt.learning_rate) else float(tpu_opt.learning_rate)
        grads = _grads(step)
        _tpu_reference_step(proto, lr, w, slots, grads.indices.numpy(), grads.values.numpy())
        keras_opt.apply_gradients(optimizers.clip_embedding_gradients([(grads, table)], spec.get("clipvalue")))
        np.testing.assert_allclose(table.numpy(), w, rtol=1e-6, atol=1e-6, err_msg=f"{case}: table after step {step}")
        for name, keras_name in optimizers.KERAS_SLOT_NAMES[spec["name"]].items():
            np.testing.assert_allclose(
                keras_opt.get_slot(table, keras_name).numpy(), slots[name], rtol=1e-6, atol=1e-6,
                err_msg=f"{case}: slot {name} after step {step}",
            )
    if spec["name"] == "adam" and spec["lazy_adam"]:
        never = sorted(set(range(ROWS)) - {r for rows in STEP_ROWS for r in rows})
        assert never and np.array_equal(table.numpy()[never], init[never])  # lazy: untouched rows kept


def test_proto_says_what_the_config_says():
    """The settings reach the TPU: clipping limits, laziness, sum_inside_sqrt off, FTRL's l1/l2."""
    spec = optimizer_spec(CASES["adam_not_lazy"])
    p = _proto(optimizers.tpu_optimizer(spec, learning_rate(spec), step_fn=lambda: 0))
    assert p.adam.use_non_lazy_adam and not p.adam.use_sum_inside_sqrt
    assert p.adam.beta1 == pytest.approx(0.8) and p.adam.beta2 == pytest.approx(0.99)
    assert callable(optimizers.tpu_optimizer(spec, 0.05, step_fn=lambda: 0).learning_rate)  # fed every step (bias-corrected)
    spec = optimizer_spec(CASES["ftrl_l1_l2_clip"])
    p = _proto(optimizers.tpu_optimizer(spec, learning_rate(spec), step_fn=lambda: 0))
    assert (p.ftrl.l1, p.ftrl.l2, p.ftrl.lr_power) == pytest.approx((0.05, 10.0, -0.5))
    assert (p.gradient_clipping_limits.lower.value, p.gradient_clipping_limits.upper.value) == pytest.approx((-1.2, 1.2))
    assert p.gradient_accumulation_status == optimization_parameters_pb2.GradientAccumulationStatus.ENABLED


def test_adam_learning_rate_carries_bias_correction():
    spec = optimizer_spec(OptimizerConfig(name="adam", learning_rate=0.01, beta_1=0.9, beta_2=0.999))
    step = tf.Variable(0, dtype=tf.int64)
    tpu_opt = optimizers.tpu_optimizer(spec, learning_rate(spec), step_fn=lambda: step)
    for s in (0, 1, 9, 999):
        step.assign(s)
        t = s + 1
        # float32, as Keras computes it (1 - 0.999 ** 1 loses digits in float32)
        assert float(tpu_opt.learning_rate()) == pytest.approx(0.01 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t), rel=1e-4)


def test_sparsecore_refuses_what_it_would_ignore():
    for cfg, match in ((OptimizerConfig(name="adagrad", clipvalue=1.0), "clipvalue"),
                       (OptimizerConfig(name="adam", lazy_adam=False), "lazy_adam")):
        spec = optimizer_spec(cfg)
        with pytest.raises(optimizers.EmbeddingOptimizerError, match=match):
            optimizers.check_sparsecore_optimizer(optimizers.tpu_optimizer(spec, learning_rate(spec), step_fn=lambda: 0))
    spec = optimizer_spec(OptimizerConfig(name="adam"))
    optimizers.check_sparsecore_optimizer(optimizers.tpu_optimizer(spec, learning_rate(spec), step_fn=lambda: 0))


def test_clipping_sums_repeated_rows_first():
    g = tf.IndexedSlices(tf.constant([[0.6], [0.6], [-3.0]]), tf.constant([2, 2, 5], tf.int64), tf.constant([8, 1], tf.int64))
    v = tf.Variable(tf.zeros([8, 1]))
    [(clipped, _)] = optimizers.clip_embedding_gradients([(g, v)], 1.0)
    dense = tf.convert_to_tensor(clipped).numpy().ravel()
    assert dense[2] == pytest.approx(1.0) and dense[5] == pytest.approx(-1.0)  # 1.2 -> 1.0, not 0.6 + 0.6
