"""The embedding plan rendered into TensorFlow objects: the learning-rate schedule, the Keras
optimizers, initializers, and `table_configs(plan)` / `feature_configs(plan)`, which render the plan
into `tf.tpu.experimental.embedding.TableConfig` / `FeatureConfig` objects. Shared by the model's
training front-ends and its serving tables (trainer and exporter both build models from here).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.planning.derivation import HYPERPARAMETERS
from components.contracts.plan import EmbeddingPlan, PlanError
from components.embedding_model.xla_updates import KERAS_CLASSES


def build_optimizer(classes: Dict[str, Any], spec: Dict[str, Any], kw: Dict[str, Any]):
    """Instantiates the optimizer class a spec names, with the spec's hyperparameters.

    Args:
      classes: {optimizer name: class} of one implementation (Keras or TPU embedding).
      spec: the optimizer spec: `name` and its HYPERPARAMETERS.
      kw: further keyword arguments (learning rate, clipping, ...).

    Returns:
      The optimizer object.

    Raises:
      PlanError: the spec names an optimizer not in `classes`.
    """
    name = spec["name"]
    if name not in classes:
        raise PlanError(f"optimizer {name!r} is not one of {', '.join(classes)}")
    return classes[name](**kw, **{k: spec[k] for k in HYPERPARAMETERS[name]})


class WarmupDecay(tf.keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `learning_rate`, then constant / exponential / cosine decay (ScheduleConfig).

    Args:
      learning_rate: the rate reached at the end of the warm-up.
      schedule: the ScheduleConfig as a dict: name, warmup_steps, decay_steps, decay_rate, alpha.
    """

    def __init__(self, learning_rate: float, schedule: Dict[str, Any]):
        self.learning_rate = learning_rate
        self.schedule = dict(schedule)

    def __call__(self, step):
        """The rate at `step` (a scalar, any numeric dtype): a float32 scalar."""
        sc = self.schedule
        step = tf.cast(step, tf.float32)
        lr = tf.constant(self.learning_rate, tf.float32)
        if sc["warmup_steps"]:
            lr = lr * tf.minimum(1.0, (step + 1.0) / float(sc["warmup_steps"]))
        t = tf.maximum(0.0, step - float(sc["warmup_steps"]))
        if sc["name"] == "exponential":
            lr = lr * tf.pow(float(sc["decay_rate"]), t / float(sc["decay_steps"]))
        elif sc["name"] == "cosine":
            frac = tf.minimum(1.0, t / float(sc["decay_steps"]))
            lr = lr * ((1.0 - sc["alpha"]) * 0.5 * (1.0 + tf.cos(math.pi * frac)) + sc["alpha"])
        return lr

    def get_config(self):
        """The constructor's arguments, for Keras serialization."""
        return {"learning_rate": self.learning_rate, "schedule": self.schedule}


def learning_rate(spec: Dict[str, Any]):
    """An optimizer spec's learning rate with its schedule.

    Args:
      spec: the optimizer spec: `learning_rate` and `schedule`.

    Returns:
      A float for a constant rate without warm-up, else a `WarmupDecay`.
    """
    sc = spec["schedule"]
    if sc["name"] == "constant" and not sc["warmup_steps"]:
        return float(spec["learning_rate"])
    return WarmupDecay(spec["learning_rate"], sc)


def keras_optimizer(spec: Dict[str, Any]):
    """The Keras (legacy) dense optimizer of a spec, the same on every platform.

    The embedding optimizers, CPU and TPU, come from optimizers.py.

    Args:
      spec: the optimizer spec: name, learning rate, schedule, hyperparameters, clipping.

    Returns:
      A tf.keras.optimizers.legacy optimizer (xla_updates.KERAS_CLASSES).

    Raises:
      PlanError: the spec names an unknown optimizer.
    """
    kw: Dict[str, Any] = {"learning_rate": learning_rate(spec)}
    for k in ("clipnorm", "clipvalue"):
        if spec.get(k) is not None:
            kw[k] = spec[k]
    # The classes whose sparse rows XLA compiles: a TPU step is one XLA computation.
    return build_optimizer(KERAS_CLASSES, spec, kw)


def tf_initializer(init):
    """The Keras initializer of a plan's `Initializer`.

    TableConfig gets it on TPU, the TensorCore and serving tables elsewhere.

    Args:
      init: the plan's Initializer (name and its parameters).

    Returns:
      A tf.initializers object.

    Raises:
      ValueError: an unknown initializer name.
    """
    if init.name == "truncated_normal":
        return tf.initializers.TruncatedNormal(mean=init.mean, stddev=init.stddev)
    if init.name == "random_normal":
        return tf.initializers.RandomNormal(mean=init.mean, stddev=init.stddev)
    if init.name == "random_uniform":
        return tf.initializers.RandomUniform(minval=init.minval, maxval=init.maxval)
    if init.name == "zeros":
        return tf.initializers.Zeros()
    raise ValueError(f"initializer {init.name!r} is not one of truncated_normal, random_normal, random_uniform, zeros")


def table_configs(plan: EmbeddingPlan, table_optimizers: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The TPU embedding TableConfig of every table in the plan.

    Args:
      plan: the embedding plan.
      table_optimizers: {table: TPU embedding optimizer} of the tables with an optimizer of their
        own (TableConfig.optimizer); the others take the layer's.

    Returns:
      {table name: tf.tpu.experimental.embedding.TableConfig}.
    """
    table_optimizers = table_optimizers or {}
    out = {}
    for name, t in plan.tables.items():
        out[name] = tf.tpu.experimental.embedding.TableConfig(
            vocabulary_size=t.rows,
            dim=t.dim,
            combiner=t.combiner,
            initializer=tf_initializer(t.initializer),
            optimizer=table_optimizers.get(name),
            name=name,
        )
    return out


def gradient_multiplier(spec: Optional[Dict[str, Any]]):
    """The embedding gradients' factor as a function of the step.

    Args:
      spec: the plan's {value, schedule}, or None.

    Returns:
      A `WarmupDecay` of them, or None without a spec.
    """
    if not spec:
        return None
    return WarmupDecay(float(spec["value"]), spec["schedule"])


def feature_configs(
    plan: EmbeddingPlan, tables: Optional[Dict[str, Any]] = None, output_batch: Optional[int] = None,
    on_tpu: bool = False, table_optimizers: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The TPU embedding FeatureConfig of every feature in the plan.

    `validate_weights_and_indices` (the config's use_safe_embedding_lookup) is passed as planned
    only for a TPU (`on_tpu`); elsewhere it stays on: without it TensorFlow 2.16's CPU lookups
    (tpu_embedding_for_serving.cpu_embedding_lookup -> embedding_lookup_sparse_v2, no
    num_segments) drop the trailing rows of a batch that have no IDs, and the pooled output no
    longer has the batch's rows (tests/test_trainer.py checks the shape).

    Args:
      plan: the embedding plan.
      tables: {table name: TableConfig}; default `table_configs(plan, table_optimizers)`.
      output_batch: the static per-replica batch a TPU step sees (FeatureConfig.output_shape).
      on_tpu: whether the configs are for a TPU.
      table_optimizers: as for `table_configs`, when `tables` is not given.

    Returns:
      {feature name: FeatureConfig}; features of a shared table hold the same TableConfig object.
    """
    tables = tables or table_configs(plan, table_optimizers)
    return {
        name: tf.tpu.experimental.embedding.FeatureConfig(
            table=tables[f.table], max_sequence_length=f.max_sequence_length, name=name,
            # A sequence feature leaves output_shape unset: with it set, TF 2.16 ignores
            # max_sequence_length (tpu_embedding_v2.py, _get_output_shape); the shape is then
            # detected from the static-batch input as [batch, max_sequence_length].
            output_shape=[output_batch] if output_batch and not f.max_sequence_length else None,
            validate_weights_and_indices=f.validate_weights_and_indices or not on_tpu,
        )
        for name, f in plan.features.items()
    }


def sequence_lengths(plan: EmbeddingPlan) -> Dict[str, int]:
    """The plan's sequence input features and their lengths.

    Args:
      plan: the embedding plan.

    Returns:
      {feature: max_sequence_length}, input features only (a wide feature reads its feature's input).
    """
    return {n: f.max_sequence_length for n, f in plan.features.items() if f.max_sequence_length and not f.wide_of}


def dense_id_widths(plan: EmbeddingPlan) -> Dict[str, int]:
    """The features fed as padded dense IDs: those of TensorCore tables.

    Args:
      plan: the embedding plan.

    Returns:
      {feature: width}, input features only (a wide feature reads its feature's input, of the
      same width).

    Raises:
      ValueError: a TensorCore table's feature has no planned width (no max_length).
    """
    out: Dict[str, int] = {}
    for name, f in plan.features.items():
        if plan.tables[f.table].placement != "tensor_core" or f.wide_of:
            continue
        if not f.dense_width:
            raise ValueError(
                f"categorical_features: {name!r} uses TensorCore table {f.table!r}, whose TPU step input "
                "needs a static number of IDs per example; set max_length for it (or train from "
                "preprocessing output that carries embedding_statistics.json)"
            )
        out[name] = int(f.dense_width)
    return out
