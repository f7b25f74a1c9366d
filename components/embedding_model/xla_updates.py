"""Sparse (row) updates of the Keras optimizers that XLA compiles: the same values on CPU, GPU and TPU.

A TensorCore table is looked up with `tf.gather`, so its gradient is a `tf.IndexedSlices`, and the
legacy Keras optimizers apply an IndexedSlices with fused kernels that XLA has no translation for
(`ResourceSparseApplyAdagradV2`, `ResourceSparseApplyFtrl`: "Detected unsupported operations when
trying to compile graph ... on XLA_CPU_JIT"), and sum duplicate rows first with `tf.unique`, whose
output length depends on the data. On a TPU the whole training step is one XLA computation
(tests/test_xla_step.py compiles the Trainer's own `train_step` with `jit_compile=True` and shows
Keras' own Adagrad and FTRL failing where these compile). The classes here are the same Keras
optimizers (same slots, names, hyperparameters and checkpoints) whose sparse path is written with
ops XLA compiles, at static shapes:

- `occurrence_sums` sums a row's gradients over its duplicates with a stable sort, a cumulative
  sum and `unsorted_segment_sum` into as many segments as there are occurrences (static), and
  gives every occurrence its row's sum, and which occurrence is a row's first.
- In an XLA computation (`in_xla_context`: a TPU step, or `jit_compile=True`), Adagrad, FTRL
  and lazy Adam gather the rows, apply the kernel's formula (the same operations, in
  the same order, as TensorFlow's `SparseApplyAdagradV2` / `SparseApplyFtrl` kernels in
  training_ops.cc) and `scatter_update` them; duplicate occurrences write identical values.
  Outside XLA (the CPU/GPU Trainer) Keras' own path runs: its fused kernels are 2-2.5x faster
  on CPU and give the same values to 1e-6.
- Adam (not lazy) keeps Keras' own rule (`scatter_add` into decayed moments), under XLA fed each
  row's sum at its first occurrence and zeros at the others, which add nothing.
- SGD needs nothing: Keras' `scatter_add` compiles and sums duplicates itself.

Hand-written because no library offers XLA-compilable sparse Adagrad/FTRL for legacy Keras; the
rule is checked against Keras' fused kernels (tests/test_xla_step.py, 1e-6) and against the TPU
embedding engine's documented rule (tests/test_optimizer_rules.py).
"""
from __future__ import annotations

import inspect
from typing import Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

_legacy = tf.keras.optimizers.legacy


def occurrence_sums(values: tf.Tensor, indices: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """Each occurrence's row gradient summed over the row's duplicates, at static shapes.

    Args:
      values: [n, ...] gradient rows.
      indices: int [n] their table rows, duplicates allowed.

    Returns:
      (sums, first): [n, ...] every occurrence's row sum, and bool [n] true at each row's first
      occurrence (in the input order).
    """
    n = tf.shape(indices)[0]
    order = tf.argsort(indices, stable=True)
    ordered = tf.gather(indices, order)
    position = tf.range(n)
    starts = tf.logical_or(tf.not_equal(ordered, tf.roll(ordered, 1, axis=0)), tf.equal(position, 0))
    segment_in_order = tf.cumsum(tf.cast(starts, tf.int32)) - 1
    segment = tf.scatter_nd(order[:, None], segment_in_order, tf.expand_dims(n, 0))
    first = tf.scatter_nd(order[:, None], starts, tf.expand_dims(n, 0))
    sums = tf.math.unsorted_segment_sum(values, segment, n)
    return tf.gather(sums, segment), first


def first_occurrence_sums(values: tf.Tensor, indices: tf.Tensor) -> tf.Tensor:
    """Each row's summed gradient at its first occurrence, zeros at the others: summing
    duplicates (scatter_add, Keras' own dedup) gives exactly the row's sum again.

    Args:
      values: [n, ...] gradient rows.
      indices: int [n] their table rows.

    Returns:
      [n, ...] values.
    """
    sums, first = occurrence_sums(values, indices)
    mask = tf.reshape(first, tf.concat([tf.shape(first), tf.ones([tf.rank(values) - 1], tf.int32)], 0))
    return tf.where(mask, sums, tf.zeros_like(sums))


def _coefficients(optimizer, var, apply_state):
    var_device, var_dtype = var.device, var.dtype.base_dtype
    return (apply_state or {}).get((var_device, var_dtype)) or optimizer._fallback_apply_state(var_device, var_dtype)  # pylint: disable=protected-access


def in_xla_context() -> bool:
    """Whether the graph being traced is compiled by XLA: a TPU computation (TPUReplicateContext)
    or a `tf.function(jit_compile=True)`. Both are XLA control-flow contexts; the test is
    TensorFlow's own (control_flow_util.GraphOrParentsInXlaContext)."""
    return not tf.executing_eagerly() and control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


class RowUpdates:
    """Mixin for a legacy Keras optimizer with a row rule (`_row_update`: gather the rows, compute,
    `scatter_update` them). In an XLA computation it gets every occurrence with its row's summed
    gradient (duplicates write identical values); elsewhere Keras' own path runs (`tf.unique`,
    then its fused kernel), which is 2-2.5x faster on CPU for Adagrad and FTRL (bench/README.md,
    "Figures behind the code") and gives
    the same values (tests/test_xla_step.py, 1e-6)."""

    def _row_update(self, grad, var, indices, apply_state=None):
        raise NotImplementedError

    def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices, **kwargs):
        if not in_xla_context():
            return super()._resource_apply_sparse_duplicate_indices(grad, handle, indices, **kwargs)
        sums, _ = occurrence_sums(grad, indices)
        return self._row_update(sums, handle, indices, **kwargs)


class Adagrad(RowUpdates, _legacy.Adagrad):
    """Keras (legacy) Adagrad; sparse rows under XLA as `SparseApplyAdagradV2`: a += g^2, w -= lr g / (sqrt(a) + eps)."""

    def _row_update(self, grad, var, indices, apply_state=None):
        c = _coefficients(self, var, apply_state)
        acc = self.get_slot(var, "accumulator")
        a = tf.gather(acc, indices) + grad * grad
        w = tf.gather(var, indices) - c["lr_t"] * grad / (tf.sqrt(a) + c["epsilon"])
        return tf.group(acc.scatter_update(tf.IndexedSlices(a, indices)), var.scatter_update(tf.IndexedSlices(w, indices)))


class Ftrl(RowUpdates, _legacy.Ftrl):
    """Keras (legacy) FTRL; sparse rows under XLA as `SparseApplyFtrl` (training_ops.cc, not multiplying the
    linear term by the rate): n' = n + g^2; z += g - (n'^-p - n^-p) / lr * w;
    w = (clip(z, -l1, l1) - z) / (n'^-p / lr + 2 l2), with p the learning-rate power (sqrt at -0.5)
    and l2 including beta / (2 lr) as Keras passes it. L2 shrinkage is not offered."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self._l2_shrinkage_regularization_strength > 0.0:
            raise ValueError("l2_shrinkage_regularization_strength is not supported by this FTRL's sparse rule")
        # however it was passed (not through _get_hyper, which would create the hyperparameter
        # variables now, outside the step's strategy)
        bound = inspect.signature(_legacy.Ftrl.__init__).bind(self, *args, **kwargs).arguments
        self._power = float(bound.get("learning_rate_power", -0.5))

    def _row_update(self, grad, var, indices, apply_state=None):
        c = _coefficients(self, var, apply_state)
        lr = c["lr_t"]
        l1 = c["l1_regularization_strength"]
        l2 = c["l2_regularization_strength"] + c["beta"] / (2.0 * lr)
        accum, linear = self.get_slot(var, "accumulator"), self.get_slot(var, "linear")
        n, z, w = tf.gather(accum, indices), tf.gather(linear, indices), tf.gather(var, indices)
        n_new = n + grad * grad
        if self._power == -0.5:
            root_new, root = tf.sqrt(n_new), tf.sqrt(n)
        else:
            root_new, root = tf.pow(n_new, -self._power), tf.pow(n, -self._power)
        z = z + (grad - (root_new - root) / lr * w)
        x = tf.clip_by_value(z, -l1, l1) - z
        w = x / (root_new / lr + 2.0 * l2)
        return tf.group(accum.scatter_update(tf.IndexedSlices(n_new, indices)),
                        linear.scatter_update(tf.IndexedSlices(z, indices)),
                        var.scatter_update(tf.IndexedSlices(w, indices)))


class Adam(_legacy.Adam):
    """Keras (legacy) Adam (every row's moments decay every step); under XLA its duplicate rows are
    summed at static shapes, and Keras' own sparse rule (`scatter_add`) applies them."""

    def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices, **kwargs):
        if not in_xla_context():
            return super()._resource_apply_sparse_duplicate_indices(grad, handle, indices, **kwargs)
        return self._resource_apply_sparse(first_occurrence_sums(grad, indices), handle, indices, **kwargs)


class LazyAdam(RowUpdates, _legacy.Adam):
    """Keras (legacy) Adam whose sparse update touches only the rows in the gradient, as the TPU
    embedding Adam does by default (`lazy_adam=True`): for those rows
    m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, w -= lr_t m / (sqrt(v) + epsilon), with Keras'
    bias-corrected lr_t. Hand-written because neither Keras 2 nor TFRS has a lazy Adam (TF Addons'
    LazyAdam is not in the stack). Slots keep Adam's names (m, v); dense gradients follow Adam.
    Its rule is the row rule on every platform (Keras deduplicates first outside XLA)."""

    def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
        return self._row_update(grad, var, indices, apply_state)

    def _row_update(self, grad, var, indices, apply_state=None):
        c = _coefficients(self, var, apply_state)
        m = self.get_slot(var, "m")
        v = self.get_slot(var, "v")
        m_rows = c["beta_1_t"] * tf.gather(m, indices) + c["one_minus_beta_1_t"] * grad
        v_rows = c["beta_2_t"] * tf.gather(v, indices) + c["one_minus_beta_2_t"] * grad * grad
        step = c["lr"] * m_rows / (tf.sqrt(v_rows) + c["epsilon"])
        w = tf.gather(var, indices) - step
        return tf.group(m.scatter_update(tf.IndexedSlices(m_rows, indices)),
                        v.scatter_update(tf.IndexedSlices(v_rows, indices)),
                        var.scatter_update(tf.IndexedSlices(w, indices)))


# The Keras optimizer classes every Keras optimizer of the trainer is built from (dense, embedding,
# per-table); `adam` is replaced by LazyAdam where the spec asks for the lazy rule.
KERAS_CLASSES = {"sgd": _legacy.SGD, "adagrad": Adagrad, "adam": Adam, "ftrl": Ftrl}
