"""The Trainer's model and its optimizers: the ranking model of a plan, each table's embedding
optimizer pair (Keras for CPU/GPU and TensorCore tables, TPU for the embedding engine, one spec),
and the compiled training model built under the run's strategy."""
from __future__ import annotations

import json
from typing import Any, Dict, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf
from tensorflow.python.distribute import values as distribute_values  # PerReplicaSpec: no public name

from components.config.choices import LayoutKind, Placement, Precision
from components.config.schema import PipelineConfig
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.planning.derivation import optimizer_spec
from components.embedding_model import optimizers as optimizers_lib
from components.embedding_model import tf_objects
from components.embedding_model.model import RankingModel, TableOptimizer, check_sparsecore_features
from components.embedding_trainer.hardware import Hardware, plan_for_hardware
from components.embedding_trainer.sparsecore_limits import check_ids_per_chip


def build_model(plan: EmbeddingPlan, manifest: VocabularyManifest, cfg: PipelineConfig, for_training: bool,
                on_tpu: bool = False, per_replica_batch: Optional[int] = None,
                precision: str = Precision.FLOAT32) -> RankingModel:
    """The ranking model for a plan.

    For training, the embedding optimizers of both platforms come from one spec (optimizers.py):
    the Keras one updates CPU/GPU and TensorCore tables and owns the slots, the TPU one is what the
    TPU embedding engine applies.

    Args:
      plan: the embedding plan.
      manifest: preprocessing's manifest.
      cfg: the pipeline config (`training`).
      for_training: False builds the model without optimizers (a CPU twin to check or score).
      on_tpu: whether the model trains under a TPU strategy.
      per_replica_batch: each replica's batch, the TPU embedding's output batch on TPU.
      precision: the dense network's resolved precision (precision_choice.py; float32 for a model
        that checks or scores: the exporter compares like with like in float32).

    Returns:
      The model, unbuilt (variables are created by its first call).
    """
    t = cfg.training
    if not for_training:
        return RankingModel(plan, manifest, t, precision=precision)
    spec = optimizer_spec(t.embedding_optimizer)
    keras_embedding, tpu_embedding = embedding_optimizers(spec)
    return RankingModel(
        plan, manifest, t, keras_embedding, tf_objects.keras_optimizer(optimizer_spec(t.dense_optimizer)), tpu_embedding,
        tpu_output_batch=per_replica_batch if on_tpu else None,
        embedding_clipvalue=spec.get("clipvalue"),
        pipeline_execution_with_tensor_core=t.pipeline_execution_with_tensor_core,
        table_optimizers=table_optimizers(plan, spec),
        gradient_multiplier=tf_objects.gradient_multiplier(plan.embedding_gradient_multiplier),
        precision=precision,
    )


def embedding_optimizers(spec: Dict[str, Any]):
    """The Keras and TPU embedding optimizers of one spec.

    The Keras one updates CPU/GPU and TensorCore tables and owns the slots; the TPU one's learning
    rate follows the Keras one's step.

    Args:
      spec: an optimizer spec (planning.derivation.optimizer_spec).

    Returns:
      (Keras optimizer, TPU embedding optimizer).
    """
    rate = tf_objects.learning_rate(spec)
    keras_opt = optimizers_lib.keras_optimizer(spec, rate)
    keras_opt.iterations  # noqa: B018  created now, in the strategy's scope, not inside the first step
    return keras_opt, optimizers_lib.tpu_optimizer(spec, rate, step_fn=lambda: keras_opt.iterations, keras_opt=keras_opt)


def table_optimizers(plan: EmbeddingPlan, default_spec: Dict[str, Any]) -> Dict[str, TableOptimizer]:
    """The optimizers of the plan's tables whose optimizer differs from `default_spec`.

    Tables with equal specs share one pair (TPUEmbeddingV2 stacks tables whose TPU optimizers are
    equal, and the exporter's layout reader groups them by spec); the pair's key is the first such
    table's name.

    Args:
      plan: the embedding plan.
      default_spec: the embedding optimizer's spec (training.embedding_optimizer).

    Returns:
      {table: TableOptimizer}, tables with the default optimizer left out.
    """
    by_spec: Dict[str, TableOptimizer] = {}
    out: Dict[str, TableOptimizer] = {}
    for name in sorted(plan.tables):
        spec = dict(plan.tables[name].optimizer)
        if spec == default_spec:
            continue
        key = json.dumps(spec, sort_keys=True)
        if key not in by_spec:
            keras_opt, tpu_opt = embedding_optimizers(spec)
            by_spec[key] = TableOptimizer(name, keras_opt, tpu_opt, spec.get("clipvalue"))
        out[name] = by_spec[key]
    return out


def build_training_model(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest,
                         hardware: Hardware) -> Tuple[EmbeddingPlan, RankingModel]:
    """The plan sized for the hardware and the compiled training model built under its strategy.

    What the TPU cannot train (hardware.plan_for_hardware) or SparseCore cannot hold
    (check_sparsecore_features, sparsecore_limits.check_ids_per_chip) is refused before anything
    is built; the IDs-per-chip report is kept in `hardware.ids_per_chip`.

    Returns:
      (the plan sized for the hardware, the compiled training model).
    """
    # What this TPU cannot train is refused, and the plan sized for what it has, before anything is built.
    plan = plan_for_hardware(plan, hardware.strategy, hardware.on_tpu)
    if hardware.layout.kind == LayoutKind.B:
        # What SparseCore cannot train stops the run here, before anything is built or read.
        check_sparsecore_features({n: c for n, c in tf_objects.feature_configs(plan, output_batch=hardware.per_replica, on_tpu=True).items()
                                   if n in manifest.categorical_names and plan.feature_table(n).placement == Placement.TPU_EMBEDDING})
        # Stacks whose measured IDs per example overflow TF 2.16's fixed per-chip buffer on an
        # average step are refused; the report (kept in the TPU-rules report) says what is certified.
        hardware.ids_per_chip = check_ids_per_chip(plan, None, hardware.replicas, hardware.layout.sparse_cores_per_chip,
                                                   hardware.per_replica)
    with hardware.strategy.scope():
        model = build_model(plan, manifest, cfg, for_training=True, on_tpu=hardware.on_tpu,
                            per_replica_batch=hardware.per_replica, precision=hardware.precision)
        model.compile(
            optimizer=model.dense_optimizer,
            loss=tf.keras.losses.BinaryCrossentropy(),
            steps_per_execution=cfg.training.steps_per_execution,
        )
    return plan, model


def create_variables(model: RankingModel, element_spec, strategy: Optional[tf.distribute.Strategy] = None) -> bool:
    """Creates the training model's variables and every optimizer's slots before training starts,
    so that Keras traces its training step once instead of twice (TF traces a tf.function whose
    first call creates variables a second time, without; on a small model that second trace was
    about half of a short fit, and about 40% of a 3-step TPU-harness fit).

    The values are the ones the first step would have created: the model is called once on the
    step's input, in inference mode, which calls its layers in the step's order, and Keras'
    initializers draw their seeds from Python's random generator in creation order, graph or eager
    alike; the slots start from constants. Off a TPU on one replica the call is eager, on zeros.
    On a TPU (`strategy`) it is made inside `strategy.run`, as the step makes it (the TPU
    embedding's lookups need a replica context), and only traced: the forward pass is traced twice
    (as any first call that creates variables) and never run, so a TPU compiles nothing for it, and
    its variables are created by the initializers lifted out of that trace, as the step's first
    trace creates them; a checkpoint restore still pending (the smoke test's start) is applied then,
    as it is at the first step. tests/test_trainer.py (one replica) and tests/test_tpu_conformance.py
    (the TPU harness) hold every checkpoint value of a short fit equal with and without this
    (creating them in another order failed the first).

    Args:
      model: the compiled training model (model_building.build_training_model), of a run on one
        replica or on a TPU: under MirroredStrategy's replicas the variables created eagerly took
        other values than the step's (measured).
      element_spec: the training dataset's (features, label) element spec; a distributed
        dataset's per-replica specs stand for one replica's batch.
      strategy: the TPU strategy of a run on a TPU; None off a TPU.

    Returns:
      Whether the variables were created here (False: the model is built already, as a resumed
      or warm-started run's is to restore into (training_state.restore_built); or an input this
      cannot stand in for, a ragged tensor or one of unknown rank, left to the first step as before).
    """
    if model.built:
        return False
    features = tf.nest.map_structure(_one_replica, element_spec[0])
    specs = tf.nest.flatten(features)
    if not all(type(s) in (tf.TensorSpec, tf.SparseTensorSpec) and s.shape.rank is not None for s in specs):
        return False
    if strategy is None:
        model(tf.nest.map_structure(_zeros, features), training=False)
        model.create_optimizer_slots()
        return True

    @tf.function(autograph=False)
    def forward(inputs):
        strategy.run(lambda x: model(x, training=False), args=(inputs,))

    forward.get_concrete_function(features)
    with strategy.scope():
        model.create_optimizer_slots()
    return True


def _one_replica(spec):
    """One replica's spec of a distributed dataset's element (PerReplicaSpec holds one per replica, all alike)."""
    return spec._value_specs[0] if isinstance(spec, distribute_values.PerReplicaSpec) else spec  # pylint: disable=protected-access


def _zeros(spec):
    shape = [d if d is not None else 1 for d in spec.shape.as_list()]
    if isinstance(spec, tf.SparseTensorSpec):
        return tf.SparseTensor(tf.zeros([0, len(shape)], tf.int64), tf.zeros([0], spec.dtype), shape)
    return tf.zeros(shape, spec.dtype)
