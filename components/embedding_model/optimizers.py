"""The embedding optimizer, one rule on every platform.

The same config trains the embedding tables with two implementations: on CPU/GPU a Keras (legacy)
optimizer updates the `TPUEmbeddingForServing` / TensorCore table variables; on a TPU the TPU
embedding engine applies the `tf.tpu.experimental.embedding` optimizer to the tables in HBM. This
module builds both from one spec so they apply the same update, and says where they cannot:

- **Adam bias correction.** The TPU Adam does not implement hyper-parameter updates (TF's
  `optimization_parameters.proto`, AdamParameters: "use the dynamic learning rate feature instead,
  setting the learning rate to: user learning_rate * sqrt(1 - beta2^t) / (1 - beta1^t)"). Keras'
  Adam applies that factor itself. `tpu_optimizer` passes the corrected rate as the TPU
  optimizer's dynamic learning rate; tensorflow-recommenders' `translate_keras_optimizer` passes
  the raw rate, which trains another model on TPU than on CPU.
- **Adam's laziness.** The TPU Adam is lazy by default (rows not looked up in a step keep their
  moments and values); Keras' Adam decays every row's moments and moves every row. `lazy_adam`
  (config, default true like the TPU) selects the rule on both: `LazyAdam` (xla_updates.py) on CPU/GPU, the
  TPU optimizer's `lazy_adam` on TPU. `sum_inside_sqrt` is set to False on TPU so the update is
  Keras' `m / (sqrt(v) + epsilon)`.
- **Clipping.** TFRS refuses to translate a Keras optimizer with `clipvalue`; the TPU optimizers
  clip the *accumulated* gradient of each row (gradient accumulation sums a row's gradients over
  the batch first). `clip_embedding_gradients` does the same on CPU/GPU (sum duplicate rows, then
  clip), so the Keras optimizer is built without `clipvalue`. Clipping by norm does not exist in
  the TPU embedding API (refused by the config check).
- **Checkpoint keys.** The TPU optimizer is given a `slot_variable_creation_fn` that creates its
  slots with the Keras optimizer's `add_slot` under Keras' slot names (TFRS's mapping:
  accumulators -> accumulator, momenta/velocities -> m/v, linears -> linear), so a checkpoint
  written with `TPUEmbedding` (TPU v2-v4) holds the slots under the keys a CPU run writes, and
  either resumes the other. Not so on SparseCore: TF 2.16's `TPUEmbeddingV2` saves stacks of
  tables, padded and sharded, under the stack's name; a SparseCore state resumes only on the
  same topology, and the trainer refuses any other (sparsecore_state.check_resumable). Warm
  starts into SparseCore place each table and slot into its stack (sparsecore_state.py).
- **Adagrad's epsilon.** Keras adds epsilon (1e-7) to sqrt(accumulator); the TPU Adagrad has no
  epsilon. With accumulators >= initial_accumulator_value (0.1 by default) the two updates differ
  by less than 1e-6 relative; tests/test_optimizer_rules.py holds them to 1e-6.

SparseCore (`TPUEmbeddingV2`, TF 2.16) passes neither clipping nor `lazy_adam` to its kernels
(tpu_embedding_v3.py, `apply_gradients`): `check_sparsecore_optimizer` refuses those settings there
instead of training another model than the config says.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.embedding_model import autograph_rules  # noqa: F401  (rules before any trace)
from components.embedding_model import tf_objects, xla_updates

# TPU embedding slot name -> Keras (legacy) slot name, per optimizer (as tensorflow-recommenders'
# _SLOT_NAME_MAPPING): the names both platforms save the slots under.
KERAS_SLOT_NAMES: Dict[str, Dict[str, str]] = {
    "sgd": {},
    "adagrad": {"accumulators": "accumulator"},
    "adam": {"momenta": "m", "velocities": "v"},
    "ftrl": {"accumulators": "accumulator", "linears": "linear"},
}


class EmbeddingOptimizerError(ValueError):
    """An embedding optimizer setting the platform cannot apply; says what to change."""


def keras_optimizer(spec: Dict[str, Any], learning_rate) -> tf.keras.optimizers.legacy.Optimizer:
    """The CPU/GPU embedding optimizer of a spec.

    Built without clipping arguments: `clip_embedding_gradients` clips, as the TPU does.

    Args:
      spec: the embedding optimizer spec: name, hyperparameters, `lazy_adam`.
      learning_rate: a float or a schedule (`tf_objects.learning_rate`).

    Returns:
      A Keras (legacy) optimizer whose sparse rows XLA compiles (xla_updates.py); `LazyAdam` for
      Adam with `lazy_adam` (the default).

    Raises:
      PlanError: the spec names an unknown optimizer.
    """
    classes = dict(xla_updates.KERAS_CLASSES)
    if spec.get("lazy_adam", True):
        classes["adam"] = xla_updates.LazyAdam
    return tf_objects.build_optimizer(classes, spec, {"learning_rate": learning_rate})


def slot_variable_creation_fn(keras_opt: tf.keras.optimizers.legacy.Optimizer, name: str):
    """The TPU optimizer's slot creator: the Keras optimizer's `add_slot`, under Keras' names.

    The slots are then tracked, saved and restored by the Keras optimizer on every platform.

    Args:
      keras_opt: the Keras embedding optimizer that owns the slots.
      name: the optimizer's name (a key of KERAS_SLOT_NAMES).

    Returns:
      create(table, slot_names, slot_initializers) -> {TPU slot name: tf.Variable}.
    """
    mapping = KERAS_SLOT_NAMES[name]
    # Private, as in TFRS: the mid-level API tracks what the creator returns, so unwrapped slots
    # would be saved twice (there and under the Keras optimizer); TF has no public NoDependency.
    no_dependency = tf.Module()._no_dependency  # pylint: disable=protected-access

    def create(table, slot_names: List[str], slot_initializers: List[Any]) -> Dict[str, tf.Variable]:
        return {
            slot: no_dependency(keras_opt.add_slot(table, mapping[slot], initializer))
            for slot, initializer in zip(slot_names, slot_initializers)
        }

    return create


def tpu_learning_rate(spec: Dict[str, Any], learning_rate, step_fn: Callable[[], tf.Tensor]):
    """The TPU optimizer's learning rate, as Keras applies it.

    Args:
      spec: the embedding optimizer spec (name; beta_1 and beta_2 for Adam).
      learning_rate: a float or a schedule of the step.
      step_fn: returns the step before this update (Keras evaluates the schedule there).

    Returns:
      The float itself (constant rate, not Adam), else a callable evaluated in the step: the
      schedule at `step_fn()`, for Adam times the bias correction sqrt(1 - b2^t) / (1 - b1^t),
      t = step + 1, as a float32 scalar.
    """
    adam = spec["name"] == "adam"
    if isinstance(learning_rate, float) and not adam:
        return learning_rate

    def rate():
        step = tf.cast(step_fn(), tf.float32)
        lr = learning_rate(step) if callable(learning_rate) else tf.constant(learning_rate, tf.float32)
        if adam:
            t = step + 1.0
            lr = lr * tf.sqrt(1.0 - tf.pow(float(spec["beta_2"]), t)) / (1.0 - tf.pow(float(spec["beta_1"]), t))
        return lr

    return rate


def tpu_optimizer(spec: Dict[str, Any], learning_rate, step_fn: Callable[[], tf.Tensor],
                  keras_opt: Optional[tf.keras.optimizers.legacy.Optimizer] = None):
    """The TPU embedding optimizer applying the update of `keras_optimizer(spec)` with
    `clip_embedding_gradients` (see the module docstring).

    Args:
      spec: the embedding optimizer spec.
      learning_rate: a float or a schedule of the step.
      step_fn: returns the step before this update (`tpu_learning_rate`).
      keras_opt: the Keras embedding optimizer that owns the slots (their checkpoint keys), or None.

    Returns:
      A tf.tpu.experimental.embedding optimizer (SGD, Adagrad, Adam or FTRL).

    Raises:
      PlanError: the spec names an unknown optimizer.
    """
    emb = tf.tpu.experimental.embedding
    name = spec["name"]
    kw: Dict[str, Any] = {"learning_rate": tpu_learning_rate(spec, learning_rate, step_fn)}
    clip = spec.get("clipvalue")
    if clip is not None:
        kw["clipvalue"] = (-float(clip), float(clip))  # needs gradient accumulation (on by default)
    if keras_opt is not None and KERAS_SLOT_NAMES[name]:
        kw["slot_variable_creation_fn"] = slot_variable_creation_fn(keras_opt, name)
    if name == "adam":
        kw.update(lazy_adam=bool(spec.get("lazy_adam", True)), sum_inside_sqrt=False)
    if name == "ftrl":
        kw.update(
            learning_rate_power=-0.5, beta=0.0,  # Keras' Ftrl defaults
            multiply_linear_by_learning_rate=False,  # Keras' `linear` slot semantics
        )
    classes = {"sgd": emb.SGD, "adagrad": emb.Adagrad, "adam": emb.Adam, "ftrl": emb.FTRL}
    return tf_objects.build_optimizer(classes, spec, kw)


def check_sparsecore_optimizer(opt, where: str = "training.embedding_optimizer") -> None:
    """Refuses settings TF 2.16's TPUEmbeddingV2 would silently ignore.

    tpu_embedding_v3.py's apply_gradients passes no clipping limits and no laziness flag to the
    SparseCore kernels.

    Args:
      opt: a tf.tpu.experimental.embedding optimizer.
      where: the config field the optimizer comes from (a table's own optimizer names its table).

    Raises:
      EmbeddingOptimizerError: the optimizer clips gradients, or is a non-lazy Adam.
    """
    if getattr(opt, "clip_gradient_min", None) is not None or getattr(opt, "clip_gradient_max", None) is not None:
        raise EmbeddingOptimizerError(
            f"{where}.clipvalue: SparseCore (TPUEmbeddingV2 in TensorFlow 2.16) does not "
            "clip embedding gradients; remove clipvalue, or train on TPU v2-v4 (TPUEmbedding) or CPU/GPU"
        )
    if isinstance(opt, tf.tpu.experimental.embedding.Adam) and not opt.lazy_adam:
        raise EmbeddingOptimizerError(
            f"{where}.lazy_adam: false is not available on SparseCore (TPUEmbeddingV2 in "
            "TensorFlow 2.16 updates only the looked-up rows); set lazy_adam: true"
        )


def clip_embedding_gradients(
    grads_and_vars: Sequence[Tuple[Any, tf.Variable]], clipvalue: Optional[float]
) -> List[Tuple[Any, tf.Variable]]:
    """The TPU embedding clipping rule on CPU/GPU.

    Each row's gradient is summed over the batch (IndexedSlices deduplicated, as gradient
    accumulation does), then clipped to +-clipvalue.

    Args:
      grads_and_vars: (gradient, variable) pairs; a gradient is an IndexedSlices, a dense tensor
        of the variable's shape, or None.
      clipvalue: the limit, or None for no clipping.

    Returns:
      The pairs with clipped gradients, in the same order. An IndexedSlices keeps its indices
      (static shapes, for XLA): each row's clipped sum at its first occurrence, zeros at the
      others, so the optimizer's summing of duplicates gives exactly the clipped sum.
    """
    if clipvalue is None:
        return list(grads_and_vars)
    out = []
    for g, v in grads_and_vars:
        if isinstance(g, tf.IndexedSlices):
            clipped = tf.clip_by_value(xla_updates.first_occurrence_sums(g.values, g.indices), -clipvalue, clipvalue)
            g = tf.IndexedSlices(clipped, g.indices, g.dense_shape)  # clip(0) = 0 at the other occurrences
        elif g is not None:
            g = tf.clip_by_value(g, -clipvalue, clipvalue)
        out.append((g, v))
    return out
