"""`run_fn` for TFX's standard Trainer (referenced as `components.embedding_trainer.trainer_module.run_fn`).

What it leaves in the Model artifact (the exporter needs nothing else):
- `Format-Serving/`: the trained model as a SavedModel whose `serving_default` takes serialized
  *transformed* tf.Examples (embedding IDs) and returns the click probability;
- `checkpoints/`: the final training checkpoint (model weights and optimizer slots);
- `embedding_plan.json`: the embedding plan the model was built from (tables, dims, placement,
  optimizer, SparseCore limits, memory), with `vocabulary_dir`, the vocabularies' location;
- `embedding_manifest.json`: the preprocessing manifest (features, vocabularies, OOV buckets);
- `tpu_rules.json`: the TPU-rules check of the input and model (see tpu_rules.py);
- `eval_metrics.json`: exact AUC and log loss on the whole eval split, and under `baseline` the
  same for the logistic regression fitted beside the model (baseline.py; `validation.baseline`);
- `training_run.json`: steps (and under `length` where their number came from: train_steps, or
  training.epochs over the train rows), the step a resumed run started from, the steps checkpointed;
- `continuous.json`: the last blessed model the run started from (TFX's `base_model`, from the
  pipeline's LastBlessedModel step: the version served at the push destination), what its warm
  start carried over, and the drift from that model's data (warm_start.py; a drift past
  `continuous.drift` stops the run before training);
- `embedding_statistics.json`: preprocessing's statistics of the training data (the next run's
  drift reference).

Training checkpoints every `training.checkpoint_every_steps` into a state directory that outlives
the execution (`training.checkpoint_dir`, or `<pipeline root>/Trainer/training_state/<key>` where
the key fingerprints the config and the input examples). A run killed mid-training and started
again with the same config and examples restores the last checkpoint, fast-forwards the input to
the same position (one batch per replica per step: `training_input`) and trains only the remaining
steps, so it ends with the same number of steps. The state records its checkpoints' table layout
(sparsecore_state.py): a SparseCore state resumes only on the same topology, and never on another
platform (TF 2.16 cannot map its stacks), so such a resume stops and says so.
The state directory is removed once the Model artifact is complete.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from typing import Any, Callable, Dict, Optional, Tuple

import components  # noqa: F401
import numpy as np
import tensorflow as tf
from absl import logging
from tfx.utils import io_utils  # read_string_file: any filesystem TFX reads (gs://, local)

from components.reporting import progress
from components.config.loading import config_from_json
from components.config.schema import PipelineConfig
from components.contracts import artifacts
from components.contracts import sizing
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import CheckpointLayout, EmbeddingPlan
from components.contracts.statistics import EmbeddingStatistics
from components.rows.ledger import check_ledger
from components.embedding_model import optimizers as optimizers_lib
from components.embedding_trainer import plan as plan_lib
from components.embedding_model.input import make_dataset, parse_batch
from components.embedding_model import sparsecore_state
from components.embedding_model.model import (
    CHECKPOINT_ROOT, VARIABLE_VALUE, RankingModel, TableOptimizer, check_sparsecore_features, table_checkpoint_key,
)
from components.embedding_trainer.hardware import plan_for_hardware, reported_embedding
from components.embedding_trainer.tpu_rules import check_tpu_rules
from components.rules.metrics import log_loss, roc_auc

from components.tfx_wiring.executor_base import CONFIG_KEY, config_of  # noqa: E402
# The Model artifact's files (contracts.artifacts), under the names the tests and benches use.
CHECKPOINT_DIR = artifacts.CHECKPOINT_DIR
EVAL_METRICS_FILE = artifacts.EVAL_METRICS_FILE
TPU_RULES_FILE = artifacts.TPU_RULES_FILE
TRAINING_RUN_FILE = artifacts.TRAINING_RUN_FILE
CONFIG_FILE = artifacts.TRAINER_CONFIG_FILE
STATE_DIR = "training_state"


def examples_root(train_files) -> str:
    """The transformed-examples artifact directory (<uri>/Split-train/* -> <uri>)."""
    return os.path.dirname(os.path.dirname(train_files[0]))


def read_manifest_for(train_files) -> VocabularyManifest:
    """The manifest preprocessing wrote beside the transformed examples."""
    path = os.path.join(examples_root(train_files), artifacts.EMBEDDING_MANIFEST_FILE)
    return VocabularyManifest.from_json(io_utils.read_string_file(path), path)


def read_statistics_for(train_files) -> Optional[EmbeddingStatistics]:
    """The statistics preprocessing copied beside the transformed examples (None for examples
    written before the copy existed: the plan then reports SparseCore limits as unknown)."""
    path = os.path.join(examples_root(train_files), artifacts.EMBEDDING_STATISTICS_FILE)
    return EmbeddingStatistics.from_json(io_utils.read_string_file(path), path) if tf.io.gfile.exists(path) else None


def read_plan(model_uri: str) -> EmbeddingPlan:
    path = os.path.join(model_uri, artifacts.PLAN_FILE)
    return EmbeddingPlan.from_json(io_utils.read_string_file(path), path)


def distribution_strategy(cfg: PipelineConfig) -> tf.distribute.Strategy:
    """TPUStrategy when a TPU is configured, MirroredStrategy on several GPUs, else the default."""
    if cfg.training.tpu:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=cfg.training.tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if len(tf.config.list_logical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def checkpoint_layout(strategy: tf.distribute.Strategy, per_replica: int) -> CheckpointLayout:
    """How this run's checkpoint will hold the TPU-embedding tables (recorded in the plan, so the
    exporter can recompute a SparseCore layout that TensorFlow 2.16 does not save)."""
    if not is_tpu_strategy(strategy):
        return CheckpointLayout(kind="A", embedding_api="TPUEmbeddingForServing (CPU/GPU variables)")
    api, feature, sparse_cores = reported_embedding(strategy)
    v2 = api == sizing.SPARSE_CORE
    names = {sizing.SPARSE_CORE: "TPUEmbeddingV2 (SparseCore)", sizing.TPU_EMBEDDING_V1: "TPUEmbedding",
             # no engine: only TensorCore tables train (hardware.plan_for_hardware), one variable each
             sizing.NO_EMBEDDING_API: f"none (EmbeddingFeature.{feature}: TensorCore tables only, replicated)"}
    return CheckpointLayout(
        kind="B" if v2 else "A",
        embedding_api=names[api],
        num_replicas=strategy.num_replicas_in_sync,
        # TPUEmbeddingV2 falls back to 4 when the hardware does not say (tpu_embedding_v3.py).
        sparse_cores_per_chip=sparse_cores,
        per_replica_batch_size=per_replica,
        hardware_api=api,
    )


def is_tpu_strategy(strategy: tf.distribute.Strategy) -> bool:
    """Whether training takes the TPU branch (tests/test_tpu_conformance.py walks that branch on CPU
    with a recording strategy by replacing this one predicate)."""
    return isinstance(strategy, tf.distribute.TPUStrategy)


def build_model(plan: EmbeddingPlan, manifest: VocabularyManifest, cfg: PipelineConfig, for_training: bool,
                on_tpu: bool = False, per_replica_batch: Optional[int] = None) -> RankingModel:
    """The ranking model for a plan; `for_training=False` builds it without optimizers. For
    training, the embedding optimizers of both platforms come from one spec (optimizers.py): the
    Keras one updates CPU/GPU and TensorCore tables and owns the slots, the TPU one is what the
    TPU embedding engine applies."""
    t = cfg.training
    if not for_training:
        return RankingModel(plan, manifest, t)
    spec = plan_lib.optimizer_spec(t.embedding_optimizer)
    keras_embedding, tpu_embedding = embedding_optimizers(spec)
    return RankingModel(
        plan, manifest, t, keras_embedding, plan_lib.keras_optimizer(plan_lib.optimizer_spec(t.dense_optimizer)), tpu_embedding,
        tpu_output_batch=per_replica_batch if on_tpu else None,
        embedding_clipvalue=spec.get("clipvalue"),
        pipeline_execution_with_tensor_core=t.pipeline_execution_with_tensor_core,
        table_optimizers=table_optimizers(plan, spec),
        gradient_multiplier=plan_lib.gradient_multiplier(plan.embedding_gradient_multiplier),
    )


def embedding_optimizers(spec: Dict[str, Any]):
    """(Keras, TPU) embedding optimizers of one spec: the Keras one updates CPU/GPU and TensorCore
    tables and owns the slots; the TPU one's learning rate follows the Keras one's step."""
    rate = plan_lib.learning_rate(spec)
    keras_opt = optimizers_lib.keras_optimizer(spec, rate)
    keras_opt.iterations  # noqa: B018  created now, in the strategy's scope, not inside the first step
    return keras_opt, optimizers_lib.tpu_optimizer(spec, rate, step_fn=lambda: keras_opt.iterations, keras_opt=keras_opt)


def table_optimizers(plan: EmbeddingPlan, default_spec: Dict[str, Any]) -> Dict[str, TableOptimizer]:
    """{table: TableOptimizer} for the plan's tables whose optimizer differs from `default_spec`.
    Tables with equal specs share one pair (TPUEmbeddingV2 stacks tables whose TPU optimizers are
    equal, and the exporter's layout reader groups them by spec); the pair's key is the first such
    table's name."""
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


def transformed_serving_function(model: RankingModel, manifest: VocabularyManifest):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(examples):
        features, _ = parse_batch(examples, manifest)
        return {"probabilities": model(features)}

    return serve


class TransformedServing(tf.Module):
    """What the Trainer's SavedModel holds: the CPU model and `serving_default` on transformed examples."""

    def __init__(self, model: RankingModel, manifest: VocabularyManifest):
        super().__init__(name="trainer_serving")
        self.model = model
        self.serve = transformed_serving_function(model, manifest)

    def signatures(self) -> Dict[str, Any]:
        return {"serving_default": self.serve}


def evaluate(model: RankingModel, dataset: tf.data.Dataset) -> Dict[str, float]:
    probs, labels = [], []
    for features, label in dataset:
        probs.append(model(features).numpy())
        labels.append(label.numpy())
    p, y = np.concatenate(probs).ravel(), np.concatenate(labels).ravel()
    return {"auc": roc_auc(p, y), "log_loss": log_loss(p, y), "examples": int(len(y)), "positive_rate": float(y.mean())}


def warm_start_sparse_core(model: RankingModel, plan: EmbeddingPlan, layout: CheckpointLayout, warm_prefix: str,
                           strategy: tf.distribute.Strategy) -> Dict[str, Any]:
    """The warm-start checkpoint (one variable per table, written by the host twin) into a
    SparseCore model: TF builds the stacks now, everything but the TPU embedding layer is restored
    as usual, and each TPU-embedding table and its slots are placed into its stack through the
    layout the exporter reads (sparsecore_state.py). Restored by name, a stack of several tables
    would find nothing and a lone table's rows would come back permuted."""
    with strategy.scope():
        model.embedding_layer.build(None)  # TFRS's layer: TPUEmbeddingV2.build(), the stacks
    sparsecore_state.restore_all_but_tpu_embedding(model, warm_prefix, CHECKPOINT_ROOT)
    reader = tf.train.load_checkpoint(warm_prefix)
    keys = reader.get_variable_to_shape_map()

    def table(name: str) -> np.ndarray:
        return reader.get_tensor(table_checkpoint_key(name, "tpu_embedding"))

    def slot(name: str, slot_name: str) -> Optional[np.ndarray]:
        base = table_checkpoint_key(name, "tpu_embedding")[: -len(VARIABLE_VALUE)] + "/.OPTIMIZER_SLOT/"
        found = [k for k in keys if k.startswith(base) and k.endswith(f"/{slot_name}{VARIABLE_VALUE}")]
        return reader.get_tensor(found[0]) if len(found) == 1 else None

    return sparsecore_state.assign_logical_tables(model, plan, layout, table, slot)


def training_input(train_files, manifest: VocabularyManifest, plan: EmbeddingPlan, t, per_replica: int,
                   start: int, replicas: int, holdout_fraction: float = 0.0):
    """The training input as a dataset function (`ctx`: tf.distribute's InputContext, or None for
    one replica): per-replica batches, seeded. One input pipeline reads one stream in units of
    the global batch, so each step's replicas together get the examples one replica gets as that
    step's global batch (make_dataset's `global_batch`). With P input pipelines (hosts), pipeline
    i reads only its own files (i, i+P, ... of the split's sorted files; make_dataset's
    `input_context`) and feeds its replicas / P replicas, in units of its share of the global
    batch. Every step takes one batch per replica, so a run resumed at step `start` skips
    `start x replicas` batches over all pipelines, `start x replicas / P` of each pipeline's
    stream: each pipeline yields the batches it would have yielded next (the replicas are a
    multiple of the pipelines). Skipping only `start` batches would feed a resumed multi-replica
    run examples it has already seen. `holdout_fraction`: the held-out slice (selection.py) is
    left out."""
    widths, lengths = plan_lib.dense_id_widths(plan), plan_lib.sequence_lengths(plan)

    def train_input(ctx: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
        return make_dataset(train_files, manifest, per_replica, training=True, seed=t.seed,
                            skip_batches=start * replicas, dense_id_widths=widths, sequence_lengths=lengths,
                            global_batch=per_replica * replicas, shuffle_rows=t.shuffle_buffer_rows,
                            part="train", holdout_fraction=holdout_fraction, input_context=ctx)

    return train_input


def sample_batch(train_files, manifest: VocabularyManifest, plan: EmbeddingPlan, per_replica: int):
    """One per-replica batch of features, in the training step's input form (builds a model's variables)."""
    features, _ = next(iter(make_dataset(train_files, manifest, per_replica, training=False,
                                         dense_id_widths=plan_lib.dense_id_widths(plan),
                                         sequence_lengths=plan_lib.sequence_lengths(plan))))
    return features


def require_consumed(status, checkpoint: str, model: RankingModel) -> None:
    """Every value of `checkpoint` restored into the model and every variable of the model restored
    from it (both directions; the optimizers' hyperparameters, which the config sets, excepted), or
    a one-line error naming the checkpoint and what did not match."""
    optimizers = [model.dense_optimizer] + [o for o, _ in model._embedding_optimizers().values()]  # pylint: disable=protected-access
    hyper = {k: v for opt in optimizers for k, v in getattr(opt, "_hyper", {}).items()}
    missing = sparsecore_state.restore_mismatches(status, [v for v in hyper.values() if isinstance(v, tf.Variable)], set(hyper))
    if missing:
        shown = "; ".join(missing[:5]) + (f"; and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise sparsecore_state.LayoutMismatch(
            f"checkpoint {checkpoint} does not hold exactly this model's variables ({shown}): it was written by "
            "another model; run with the config that wrote it, or point training.checkpoint_dir at an empty "
            "directory to train from the start")


def restore_built(model: RankingModel, ckpt: tf.train.Checkpoint, prefix: str, on_tpu: bool,
                  strategy: tf.distribute.Strategy, sample) -> Any:
    """Restores a resumed run's checkpoint into variables that exist already, not into ones created
    later (a variable created after the restore takes its value silently or starts fresh).
    CPU/GPU: the whole model and its optimizers' slots are built first, and every value of the
    checkpoint must match a variable and every variable a value (both directions). TPU: the TPU
    embedding tables and their slots are built first (TFRS and TPUEmbeddingV2 create them lazily;
    a renamed stack then fails here); the dense network can only be built inside the training step
    there, so the existing objects are checked now and everything once the first step has run
    (`_Checkpointer`). Returns the restore status."""
    with strategy.scope():
        if on_tpu:
            if model.embedding_layer is not None:
                model.embedding_layer.build(None)
        else:
            model(sample)
            model.create_optimizer_slots()
    status = ckpt.restore(prefix)
    if on_tpu:
        try:
            status.assert_existing_objects_matched()
        except AssertionError as err:
            first = str(err).strip().splitlines()[0][:400]
            raise sparsecore_state.LayoutMismatch(f"checkpoint {prefix} does not hold this model's TPU embedding tables ({first}): "
                                   "run with the config that wrote it, or point training.checkpoint_dir at an "
                                   "empty directory to train from the start") from None
    else:
        require_consumed(status, prefix, model)
    return status


def state_dir(cfg: PipelineConfig, model_uri: str, train_files) -> str:
    """Where checkpoints of an unfinished run live: stable across executions of the same training."""
    if cfg.training.checkpoint_dir:
        return cfg.training.checkpoint_dir
    key = hashlib.sha256((cfg.to_json() + "\n" + examples_root(train_files)).encode()).hexdigest()[:16]
    return os.path.join(os.path.dirname(os.path.dirname(model_uri.rstrip("/"))), STATE_DIR, key)


class _Checkpointer(tf.keras.callbacks.Callback):
    """Saves every `checkpoint_every_steps` (the epoch length) and stops at exactly `total_steps`,
    or earlier when `selection` (selection.HoldoutSelection) says the held-out slice stopped improving."""

    def __init__(self, manager: tf.train.CheckpointManager, step: tf.Variable, total_steps: int,
                 on_step: Optional[Callable[[int, Any], None]] = None, selection=None, restored=None):
        super().__init__()
        self.manager, self.step, self.total_steps = manager, step, total_steps
        self.on_step = on_step  # called with each step reached (live progress)
        self.selection = selection
        self.saved_steps = []
        # A TPU resume's or warm start's (restore status, checkpoint): the dense network's variables
        # exist only after the first step there, so every value is required to be restored then.
        self.restored = restored

    def on_train_batch_end(self, batch, logs=None):
        if self.restored is not None:
            (status, prefix), self.restored = self.restored, None
            require_consumed(status, prefix, self.model)
        n = int(self.step.numpy())
        if self.on_step is not None:
            self.on_step(n, logs)
        if n >= self.total_steps:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        n = int(self.step.numpy())
        self.manager.save(checkpoint_number=n)
        self.saved_steps.append(n)
        logging.info("checkpoint at step %d: %s", n, self.manager.latest_checkpoint)
        if self.selection is not None and self.selection.due(n) and self.selection.evaluate(self.manager.latest_checkpoint, n):
            self.model.stop_training = True


class _Progress:
    """Live progress (components/reporting/progress.py): the step, loss and examples per second, at most
    once a second and at the last step. Called by `_Checkpointer` with the step it already read
    (one read of the step variable per step, not two)."""

    def __init__(self, total_steps: int, batch_size: int, every_seconds: float = 1.0):
        self.total, self.batch_size, self.every = total_steps, batch_size, every_seconds
        self._last = None  # (time, step) of the last report

    def __call__(self, n: int, logs=None) -> None:
        now = time.time()
        if self._last is None:
            self._last = (now, n)
            progress.step(progress.TRAINER, n, self.total, (logs or {}).get("loss"))
            return
        if now - self._last[0] < self.every and n < self.total:
            return
        rate = (n - self._last[1]) * self.batch_size / max(now - self._last[0], 1e-9)
        progress.step(progress.TRAINER, n, self.total, (logs or {}).get("loss"), rate)
        self._last = (now, n)


def train(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files, eval_files,
          state: str, log_dir: Optional[str] = None, train_steps: Optional[int] = None, warm_from=None,
          train_rows: Optional[int] = None):
    """Builds, checks and trains (resuming from `state` when it holds a checkpoint; else, given
    `warm_from` (warm_start.PreviousModel), starting from the last blessed model's weights: the
    record's `warm_start` says what carried over). With `training.early_stopping`, a held-out
    slice of the train split (`train_rows` rows: its size) picks the checkpoint and may stop
    training early (selection.py); `eval_files` are not read here.
    Returns (the model's checkpoint: the best on the slice, else the last; TPU-rules report;
    training-run record); the record's `checkpoint_layout` is how the checkpoint holds the tables
    (`plan.with_run` takes it); `finish` does the rest."""
    t = cfg.training
    tf.keras.utils.set_random_seed(t.seed)
    steps = train_steps or t.train_steps
    if not steps:
        raise ValueError("no training length: pass train_steps (run_fn derives it: plan.training_steps)")
    holdout = t.holdout_fraction(train_rows)
    # Evaluations fall on checkpoints: with early stopping, at least `evaluations` over the run.
    every = min(t.checkpoint_every_steps, t.evaluation_every(steps)) if holdout else t.checkpoint_every_steps
    strategy = distribution_strategy(cfg)
    on_tpu = is_tpu_strategy(strategy)
    replicas = strategy.num_replicas_in_sync
    if t.batch_size % replicas:
        raise ValueError(f"training.batch_size {t.batch_size} must be a multiple of the {replicas} replicas")
    per_replica = t.batch_size // replicas
    layout = checkpoint_layout(strategy, per_replica)
    # What this TPU cannot train is refused, and the plan sized for what it has, before anything is built.
    plan = plan_for_hardware(plan, strategy, on_tpu)
    if layout.kind == "B":
        # What SparseCore cannot train stops the run here, before anything is built or read.
        check_sparsecore_features({n: c for n, c in plan_lib.feature_configs(plan, output_batch=per_replica, on_tpu=True).items()
                                   if n in manifest.categorical_names and plan.feature_table(n).placement == "tpu_embedding"})
    with strategy.scope():
        model = build_model(plan, manifest, cfg, for_training=True, on_tpu=on_tpu, per_replica_batch=per_replica)
        model.compile(
            optimizer=model.dense_optimizer,
            loss=tf.keras.losses.BinaryCrossentropy(),
            steps_per_execution=t.steps_per_execution,
        )
    # The check runs on the host with a CPU twin of the model on every platform (the training
    # model may live on a TPU); the same input feeds the step.
    check_model = build_model(plan, manifest, cfg, for_training=False)
    # TensorCore-table features are fed as padded dense IDs on every platform: the TPU step's input.
    widths = plan_lib.dense_id_widths(plan)
    rules = check_tpu_rules(
        check_model, plan,
        make_dataset(train_files, manifest, per_replica, training=True, seed=t.seed, dense_id_widths=widths,
                     sequence_lengths=plan_lib.sequence_lengths(plan)),
    )

    step = model.dense_optimizer.iterations  # one dense update per training step
    ckpt = tf.train.Checkpoint(model=model)
    manager = tf.train.CheckpointManager(ckpt, state, max_to_keep=2)
    start, resumed_from = 0, manager.latest_checkpoint
    signature = sparsecore_state.plan_signature(plan, layout, cfg, manifest.dense_names)
    restored = None  # (restore status, checkpoint) of a resume or warm start, checked again after a TPU step
    if resumed_from:
        # Only under the table layout and the plan it was written with (TF cannot map SparseCore
        # stacks; a table added, removed or reshaped would start fresh), checked before anything is restored.
        sparsecore_state.check_resumable(state, resumed_from, layout, signature)
        restored = (restore_built(model, ckpt, resumed_from, on_tpu, strategy, sample_batch(
            train_files, manifest, plan, per_replica)), resumed_from)
        start = int(step.numpy())
        logging.info("resuming from %s at step %d of %d", resumed_from, start, steps)
    warm_report = None
    warm_report_path = os.path.join(state, "warm_start", "report.json")
    if resumed_from and warm_from is not None and tf.io.gfile.exists(warm_report_path):
        # A killed run that had warm-started: its checkpoint holds the carried weights already.
        warm_report = dict(json.loads(io_utils.read_string_file(warm_report_path)), resumed_from=resumed_from)
    if not resumed_from and warm_from is not None:
        # The previous model's weights in this model's checkpoint, written by a host twin and
        # restored as a resumed run restores its own (warm_start.py).
        from components.embedding_trainer.warm_start import warm_start_checkpoint

        with tf.device("/cpu:0"):
            twin = build_model(plan, manifest, cfg, for_training=True)
            sample = sample_batch(train_files, manifest, plan, per_replica)
            twin(sample)
            twin.create_optimizer_slots()
            warm_prefix = os.path.join(state, "warm_start", "ckpt")
            warm_report = warm_start_checkpoint(warm_from, cfg, plan, manifest, twin, warm_prefix)
        del twin
        if layout.kind == "B":
            warm_report["sparse_core"] = warm_start_sparse_core(model, plan, layout, warm_prefix, strategy)
        else:
            restored = (restore_built(model, ckpt, warm_prefix, on_tpu, strategy, sample), warm_prefix)
        with tf.io.gfile.GFile(warm_report_path, "w") as fh:  # for a resumed execution's record
            fh.write(json.dumps(warm_report, sort_keys=True))
        if int(step.numpy()) != 0:
            raise RuntimeError(f"warm start restored step {int(step.numpy())}; expected a fresh step counter")
    sparsecore_state.write_layout(state, layout, signature)  # what the checkpoints of this state hold (check_resumable)
    if start > steps:
        raise ValueError(f"checkpoint in {state} is at step {start}, beyond train_steps {steps}; remove it or raise train_steps")

    selection = None
    if holdout:
        from components.embedding_trainer.selection import HoldoutSelection

        selection = HoldoutSelection(cfg, plan.with_run(checkpoint_layout=layout), manifest, train_files, state,
                                     holdout, steps)
        selection.prepare()
    train_input = training_input(train_files, manifest, plan, t, per_replica, start, replicas, holdout)
    if on_tpu:
        # Sparse features stay on the host for the TPU embedding enqueue.
        options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
        train_ds = strategy.distribute_datasets_from_function(train_input, options)
    elif replicas > 1:
        train_ds = strategy.distribute_datasets_from_function(train_input)
    else:
        train_ds = train_input()
    checkpointer = _Checkpointer(manager, step, steps, _Progress(steps, t.batch_size) if progress.enabled() else None,
                                 selection, restored if on_tpu else None)
    callbacks = [checkpointer]
    progress.phase(progress.TRAINER, f"training {steps:,} steps of {t.batch_size} examples"
                                     + (f", resuming at step {start:,}" if start else "")
                                     + f" ({type(strategy).__name__}, {replicas} replica(s))")
    if log_dir:
        # Batch-level loss about 100 times a run too (the run report's training curve), not only per epoch.
        callbacks.append(tf.keras.callbacks.TensorBoard(log_dir=log_dir, update_freq=max(1, steps // 100)))
    if start < steps and not (selection is not None and selection.stopped):
        model.fit(
            train_ds,
            initial_epoch=start // every,
            epochs=math.ceil(steps / every),
            steps_per_epoch=every,
            callbacks=callbacks,
            verbose=2,
        )
    final_step = int(step.numpy())
    if selection is not None and selection.due(final_step) and not any(
            e["step"] == final_step for e in selection.record["evaluations"]):
        # a run killed between its last checkpoint and that checkpoint's evaluation
        selection.evaluate(manager.latest_checkpoint, final_step)
    stopped_at = selection.record["stopped_at"] if selection is not None else None
    if final_step != (stopped_at or steps):
        raise RuntimeError(f"training ended at step {final_step}, expected {stopped_at or steps}")
    final_checkpoint = manager.latest_checkpoint
    if final_checkpoint is None or not final_checkpoint.endswith(f"-{final_step}"):  # saved with checkpoint_number=step
        raise RuntimeError(f"no checkpoint of step {final_step} in {state}")
    chosen = selection.best_checkpoint() if selection is not None else None
    run = {
        "final_step": final_step,
        "resumed_from_step": start,
        "resumed_from_checkpoint": resumed_from,
        "checkpoint_steps": checkpointer.saved_steps,
        "state_dir": state,
        "replicas": replicas,
        "per_replica_batch_size": per_replica,
        "strategy": type(strategy).__name__,
        "checkpoint_layout": dataclasses.asdict(layout),
        "warm_start": warm_report,
        # the step of the checkpoint kept as the model, and how it was chosen
        "model_step": selection.record["best_step"] if chosen else final_step,
        "selection": selection.record if selection is not None else None,
    }
    return chosen or final_checkpoint, rules, run


def finish(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, checkpoint_path: str,
           eval_files, serving_model_dir: str) -> Tuple[Dict[str, float], RankingModel]:
    """Everything after training, the same on CPU, GPU and TPU: the model is rebuilt for CPU from
    the final checkpoint (exporter's restore.py: dense weights restored, tables read in whatever
    layout the platform saved them), evaluated on the whole eval split and saved as the Trainer's
    SavedModel. Nothing here touches the training model or its strategy (a TFRS layer built under
    TPUStrategy refuses calls outside `strategy.run`)."""
    from components.embedding_model.restore import model_from_checkpoint
    from components.embedding_model.saving import save_serving_model

    eval_ds = make_dataset(eval_files, manifest, cfg.training.batch_size, training=False)
    # Pinned to the host CPU: on a TPU VM nothing here may be placed on (or compiled for) the TPU.
    with tf.device("/cpu:0"):
        sample, _ = next(iter(eval_ds))
        model = model_from_checkpoint(plan, manifest, cfg, checkpoint_path, sample)
        metrics = evaluate(model, eval_ds)
        save_serving_model(TransformedServing(model, manifest), serving_model_dir)
    return metrics, model


def copy_checkpoint(checkpoint_path: str, directory: str) -> str:
    """Copies one checkpoint (index and data files) into `directory` with its `checkpoint` state
    file, so tf.train.latest_checkpoint(directory) finds it. Returns the new prefix."""
    tf.io.gfile.makedirs(directory)
    base = os.path.basename(checkpoint_path)
    for src in tf.io.gfile.glob(checkpoint_path + ".*"):
        tf.io.gfile.copy(src, os.path.join(directory, os.path.basename(src)), overwrite=True)
    # Relative to the directory (as CheckpointManager writes it), so the artifact can be copied or moved.
    tf.compat.v1.train.update_checkpoint_state(directory, base, all_model_checkpoint_paths=[base])
    return os.path.join(directory, base)


def continuous_start(cfg: PipelineConfig, base_model: Optional[str], manifest: VocabularyManifest,
                     statistics: Optional[EmbeddingStatistics]) -> Dict[str, Any]:
    """Before training: the last blessed model (TFX's `base_model`: the pipeline's LastBlessedModel
    output, which points at the Trainer model of the version served at the push destination; or a
    Trainer model itself) and the drift from its data, which stops the run past `continuous.drift`
    (warm_start.py). Returns the record of `continuous.json`, with `previous` (the model to start
    from) when warm-starting."""
    if not base_model:
        return {"base_model": None, "drift": None, "note": "no blessed model yet: trained from scratch"}
    from components.embedding_trainer import warm_start
    from components.model_registry.registry import read_lookup

    found = read_lookup(base_model)
    registry = None
    if found is not None:
        registry = {"served_model": found.served_model, "version": found.version, "skipped": found.skipped}
        if not found.found:
            return {"base_model": None, "drift": None, "registry": registry,
                    "note": f"{found.note}: trained from scratch"}
        if found.warm_start_model is None:
            logging.warning("%s", found.warm_start_note)
            return {"base_model": None, "drift": None, "registry": registry, "note": found.warm_start_note}
        base_model = found.warm_start_model
    try:
        prev = warm_start.previous_model(base_model)
    except warm_start.WarmStartError as e:
        if found is None:
            raise
        # The served version's Trainer model is there but incomplete (cleaned up in part, or not
        # this pipeline's): the gate still compares with the served model; this run starts fresh.
        note = f"{e}; the served version's Trainer model cannot start this run: trained from scratch"
        logging.warning("%s", note)
        return {"base_model": None, "drift": None, "registry": registry, "note": note}
    figures = warm_start.drift(prev, manifest, statistics)
    logging.info("drift from %s: %s", prev.uri, json.dumps(figures, sort_keys=True))
    warm_start.check_drift(figures, cfg, prev.uri)
    out: Dict[str, Any] = {"base_model": prev.uri, "drift": figures, "registry": registry}
    if cfg.continuous.warm_start:
        out["previous"] = prev
    else:
        out["note"] = "continuous.warm_start is false: trained from scratch"
    return out


@progress.staged(progress.TRAINER)
def run_fn(fn_args) -> None:
    cfg = config_of(fn_args.custom_config)
    manifest = read_manifest_for(fn_args.train_files)
    statistics = read_statistics_for(fn_args.train_files)
    # No training on rows that were lost (or invented) on the way: the ledger must add up.
    check_ledger(statistics.ledger if statistics else None, "Trainer")
    plan = plan_lib.derive_plan(cfg, manifest, statistics).with_run(vocabulary_dir=manifest.vocabulary_dir)
    model_root = os.path.dirname(fn_args.serving_model_dir.rstrip("/"))
    state = state_dir(cfg, model_root, fn_args.train_files)
    length = plan_lib.training_steps(cfg, statistics, fn_args.train_steps)
    continuous = continuous_start(cfg, getattr(fn_args, "base_model", None), manifest, statistics)
    checkpoint, rules, run = train(
        cfg, plan, manifest, fn_args.train_files, fn_args.eval_files, state,
        log_dir=fn_args.model_run_dir, train_steps=length["steps"], warm_from=continuous.pop("previous", None),
        train_rows=length.get("train_rows"),
    )
    continuous["warm_start"] = run.pop("warm_start")
    run["length"] = length
    # The final state (weights and optimizer slots, as the training platform saved them) goes into
    # the artifact; the state dir is removed below. Evaluation and the SavedModel come from it.
    plan = plan.with_run(checkpoint_layout=CheckpointLayout(**run["checkpoint_layout"]))
    copy_checkpoint(checkpoint, os.path.join(model_root, CHECKPOINT_DIR))
    progress.phase(progress.TRAINER, "evaluating on the eval split and saving the model")
    metrics, _ = finish(cfg, plan, manifest, checkpoint, fn_args.eval_files, fn_args.serving_model_dir)
    progress.evaluated(progress.TRAINER, run["final_step"], {k: v for k, v in metrics.items() if isinstance(v, (int, float))})
    if cfg.validation.baseline.enabled:
        progress.phase(progress.TRAINER, "training the logistic-regression baseline (the validation gate's reference)")
        # The validation gate's reference (exporter): a logistic regression on the same batches.
        from components.embedding_trainer.baseline import train_baseline

        metrics["baseline"] = train_baseline(cfg, plan, manifest, fn_args.train_files, fn_args.eval_files,
                                             model_steps=length["steps"], train_rows=length.get("train_rows"))
        if isinstance(metrics["baseline"], dict) and metrics["baseline"].get("auc") is not None:
            progress.phase(progress.TRAINER, f"baseline eval AUC {metrics['baseline']['auc']:.4f}")
    logging.info("eval metrics: %s", metrics)
    # The config travels with the model so the standalone exporter CLI can rebuild it without one.
    for name, obj in ((artifacts.EMBEDDING_MANIFEST_FILE, manifest.to_dict()), (artifacts.PLAN_FILE, plan.to_dict()),
                      (EVAL_METRICS_FILE, metrics), (TPU_RULES_FILE, rules), (TRAINING_RUN_FILE, run),
                      (CONFIG_FILE, json.loads(cfg.to_json())), (artifacts.CONTINUOUS_FILE, continuous),
                      # The next run's drift reference (warm_start.drift).
                      (artifacts.EMBEDDING_STATISTICS_FILE, statistics.to_dict() if statistics else None)):
        if obj is None:
            continue
        with tf.io.gfile.GFile(os.path.join(model_root, name), "w") as fh:
            fh.write(json.dumps(obj, indent=2, sort_keys=True))
    if not cfg.training.checkpoint_dir and tf.io.gfile.exists(state):
        tf.io.gfile.rmtree(state)
