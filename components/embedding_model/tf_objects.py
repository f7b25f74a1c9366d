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

from components.contracts.plan import HYPERPARAMETERS, EmbeddingPlan, PlanError


def build_optimizer(classes: Dict[str, Any], spec: Dict[str, Any], kw: Dict[str, Any]):
    name = spec["name"]
    if name not in classes:
        raise PlanError(f"optimizer {name!r} is not one of {', '.join(classes)}")
    return classes[name](**kw, **{k: spec[k] for k in HYPERPARAMETERS[name]})


class WarmupDecay(tf.keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `learning_rate`, then constant / exponential / cosine decay (ScheduleConfig)."""

    def __init__(self, learning_rate: float, schedule: Dict[str, Any]):
        self.learning_rate = learning_rate
        self.schedule = dict(schedule)

    def __call__(self, step):
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
        return {"learning_rate": self.learning_rate, "schedule": self.schedule}


def learning_rate(spec: Dict[str, Any]):
    """A float, or a `WarmupDecay` schedule, for an optimizer spec's learning rate and schedule."""
    sc = spec["schedule"]
    if sc["name"] == "constant" and not sc["warmup_steps"]:
        return float(spec["learning_rate"])
    return WarmupDecay(spec["learning_rate"], sc)


def keras_optimizer(spec: Dict[str, Any]):
    """The Keras (legacy) optimizer for a spec: the dense optimizer on every platform (the embedding
    optimizers, CPU and TPU, come from optimizers.py)."""
    kw: Dict[str, Any] = {"learning_rate": learning_rate(spec)}
    for k in ("clipnorm", "clipvalue"):
        if spec.get(k) is not None:
            kw[k] = spec[k]
    legacy = tf.keras.optimizers.legacy
    classes = {"sgd": legacy.SGD, "adagrad": legacy.Adagrad, "adam": legacy.Adam, "ftrl": legacy.Ftrl}
    return build_optimizer(classes, spec, kw)


def tf_initializer(init):
    """The Keras initializer of a plan's `Initializer`: what TableConfig gets on TPU and the
    TensorCore and serving tables elsewhere."""
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
    """name -> TableConfig for every table in the plan. `table_optimizers`: {table: TPU embedding
    optimizer} of the tables with an optimizer of their own (TableConfig.optimizer); the others
    take the layer's."""
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
    """The embedding gradients' factor as a function of the step (`WarmupDecay` of the plan's
    {value, schedule}), or None."""
    if not spec:
        return None
    return WarmupDecay(float(spec["value"]), spec["schedule"])


def feature_configs(
    plan: EmbeddingPlan, tables: Optional[Dict[str, Any]] = None, output_batch: Optional[int] = None,
    on_tpu: bool = False, table_optimizers: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """feature -> FeatureConfig (shared tables are the same TableConfig object). `output_batch`:
    the static per-replica batch a TPU step sees (FeatureConfig.output_shape).

    `validate_weights_and_indices` (the config's use_safe_embedding_lookup) is passed as planned
    only for a TPU (`on_tpu`); elsewhere it stays on: without it TensorFlow 2.16's CPU lookups
    (tpu_embedding_for_serving.cpu_embedding_lookup -> embedding_lookup_sparse_v2, no
    num_segments) drop the trailing rows of a batch that have no IDs, and the pooled output no
    longer has the batch's rows (tests/test_trainer.py: [63, 16] for a batch of 64)."""
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
    """{feature: max_sequence_length} of the plan's sequence features (input features: a wide
    feature reads its feature's input)."""
    return {n: f.max_sequence_length for n, f in plan.features.items() if f.max_sequence_length and not f.wide_of}


def dense_id_widths(plan: EmbeddingPlan) -> Dict[str, int]:
    """{feature: width} of the features fed as padded dense IDs (those of TensorCore tables; input
    features only: a wide feature reads its feature's input, of the same width)."""
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
