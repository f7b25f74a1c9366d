"""`run_fn` for TFX's standard Trainer (referenced as `components.embedding_trainer.trainer_module.run_fn`).

What it leaves in the Model artifact (the exporter needs nothing else):
- `Format-Serving/`: the trained model as a SavedModel whose `serving_default` takes serialized
  *transformed* tf.Examples (embedding IDs) and returns the click probability;
- `checkpoints/`: the training checkpoint kept as the model (model weights and optimizer slots);
- `embedding_plan.json`: the embedding plan the model was built from (tables, dims, placement,
  optimizer, SparseCore limits, memory), with `vocabulary_dir`, the vocabularies' location;
- `embedding_manifest.json`: the preprocessing manifest (features, vocabularies, OOV buckets);
- `tpu_rules.json`: the TPU-rules check of the input and model (see tpu_rules.py);
- `eval_metrics.json`: exact AUC and log loss on the whole eval split of the kept model (its step
  and how it was chosen: `model_step`, `model_choice`), and under `baseline` the same for the
  logistic regression fitted beside the model (baseline.py; `validation.baseline`);
- `training_run.json`: steps (and under `length` where their number came from: train_steps, or
  training.epochs over the rows trained on, run_plan.training_steps), the step of the checkpoint
  kept as the model (`model_step`, `model_choice`), the step a resumed run started from, the steps checkpointed,
  and under `seconds` where the Trainer's time went: training steps, the held-out slice's one read,
  the held-out evaluations and selection, the final evaluation; under `tuned` the values applied
  from the Tuner's best hyperparameters (TFX's `hyperparameters` input; tuner.py), when there is one;
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
platform (TF 2.16 cannot map its stacks), so such a resume stops and says so. It records the
training data's fingerprint too (`data_signature`): a state trained on other examples (a set
`training.checkpoint_dir` kept from an earlier run) is refused before training, not taken for this
run's training. A `training.checkpoint_dir` inside the push destination is refused
(`check_checkpoint_dir`).
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

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import numpy as np
import tensorflow as tf
from absl import logging
from tfx.utils import io_utils  # read_string_file: any filesystem TFX reads (gs://, local)

from components.reporting import progress
from components.reporting.report import KEPT_BEST, KEPT_LAST
from components.config.checks import check_checkpoint_dir
from components.config.schema import PipelineConfig
from components.config.loading import apply_values
from components.config.tuning import checked_values, values_of
from components.contracts import artifacts
from components.contracts import sizing
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import CheckpointLayout, EmbeddingPlan, PlanError, optimizer_spec
from components.contracts.statistics import EmbeddingStatistics
from components.rows.ledger import check_ledger
from components.embedding_model import optimizers as optimizers_lib
from components.embedding_model import tf_objects
from components.embedding_model.input import make_dataset, parse_batch
from components.embedding_model import sparsecore_state
from components.embedding_model.checkpoint_keys import CHECKPOINT_ROOT, VARIABLE_VALUE, table_checkpoint_key
from components.embedding_model.model import RankingModel, TableOptimizer, check_sparsecore_features
from components.embedding_model.restore import model_from_checkpoint
from components.embedding_model.saving import save_serving_model
from components.embedding_model.unreadable import reading
from components.embedding_trainer import warm_start
from components.embedding_trainer.baseline import train_baseline
from components.embedding_trainer.checkpoints import copy_checkpoint
from components.embedding_trainer.evaluation import evaluate, evaluation_batch
from components.embedding_trainer.hardware import plan_for_hardware, reported_embedding
from components.embedding_trainer.run_plan import derive_plan, training_steps
from components.embedding_trainer.selection import HoldoutSelection
from components.embedding_trainer.sparsecore_limits import check_ids_per_chip
from components.embedding_trainer.tpu_rules import check_tpu_rules
from components.model_registry.registry import read_lookup
from components.rules.metrics import UNDEFINED_KEY, evaluation_reasons, json_safe, with_reasons
from components.tfx_wiring.executor_base import config_of
from components.config.choices import LayoutKind, Placement

STATE_DIR = "training_state"
# custom_config key of the push destination, when the pipeline passes it (check_checkpoint_dir); else
# the LastBlessedModel lookup's (base_model) is used.
SERVING_DIR_KEY = "serving_dir"
# The training data's fingerprint (`data_signature`): windows of each train file's bytes, head and tail among them.
DATA_WINDOW = 1 << 16
DATA_WINDOWS = 8


def examples_root(train_files) -> str:
    """The transformed-examples artifact directory of the train split's files.

    Args:
      train_files: the train split's file patterns (`<uri>/Split-train/*`).

    Returns:
      `<uri>`.
    """
    return os.path.dirname(os.path.dirname(train_files[0]))


def read_manifest_for(train_files) -> VocabularyManifest:
    """The manifest preprocessing wrote beside the transformed examples.

    Args:
      train_files: the train split's file patterns.

    Returns:
      The vocabulary manifest.
    """
    path = os.path.join(examples_root(train_files), artifacts.EMBEDDING_MANIFEST_FILE)
    return VocabularyManifest.from_json(io_utils.read_string_file(path), path)


def read_statistics_for(train_files) -> Optional[EmbeddingStatistics]:
    """The statistics preprocessing copied beside the transformed examples.

    Args:
      train_files: the train split's file patterns.

    Returns:
      The statistics, None when the examples have no copy (the plan then reports SparseCore limits
      as unknown).
    """
    path = os.path.join(examples_root(train_files), artifacts.EMBEDDING_STATISTICS_FILE)
    return EmbeddingStatistics.from_json(io_utils.read_string_file(path), path) if tf.io.gfile.exists(path) else None


def read_plan(model_uri: str) -> EmbeddingPlan:
    """The embedding plan a Trainer Model artifact holds.

    Args:
      model_uri: the Model artifact's directory.

    Returns:
      The plan of its `embedding_plan.json`.
    """
    path = os.path.join(model_uri, artifacts.PLAN_FILE)
    return EmbeddingPlan.from_json(io_utils.read_string_file(path), path)


def distribution_strategy(cfg: PipelineConfig) -> tf.distribute.Strategy:
    """The strategy to train under; connects to and initialises a configured TPU.

    Args:
      cfg: the pipeline config (`training.tpu`).

    Returns:
      TPUStrategy when a TPU is configured, MirroredStrategy on several GPUs, else the default strategy.
    """
    if cfg.training.tpu:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=cfg.training.tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if len(tf.config.list_logical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def checkpoint_layout(strategy: tf.distribute.Strategy, per_replica: int) -> CheckpointLayout:
    """How this run's checkpoint will hold the TPU-embedding tables.

    Recorded in the plan, so the exporter can recompute a SparseCore layout that TensorFlow 2.16
    does not save.

    Args:
      strategy: the training strategy.
      per_replica: each replica's batch size.

    Returns:
      Layout A (one variable per table) off TPU and on TPUs without SparseCore, B (SparseCore
      stacks) on SparseCore, with the replicas, SparseCores per chip and per-replica batch.

    Raises:
      PlanError: the TPU reports an embedding feature this trainer does not know.
    """
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
    """Whether training takes the TPU branch.

    The one predicate that decides it, so that tests can walk the TPU branch on CPU with a
    recording strategy by replacing it (tests/test_tpu_conformance.py).

    Args:
      strategy: the training strategy.

    Returns:
      True for a TPUStrategy.
    """
    return isinstance(strategy, tf.distribute.TPUStrategy)


def build_model(plan: EmbeddingPlan, manifest: VocabularyManifest, cfg: PipelineConfig, for_training: bool,
                on_tpu: bool = False, per_replica_batch: Optional[int] = None) -> RankingModel:
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

    Returns:
      The model, unbuilt (variables are created by its first call).
    """
    t = cfg.training
    if not for_training:
        return RankingModel(plan, manifest, t)
    spec = optimizer_spec(t.embedding_optimizer)
    keras_embedding, tpu_embedding = embedding_optimizers(spec)
    return RankingModel(
        plan, manifest, t, keras_embedding, tf_objects.keras_optimizer(optimizer_spec(t.dense_optimizer)), tpu_embedding,
        tpu_output_batch=per_replica_batch if on_tpu else None,
        embedding_clipvalue=spec.get("clipvalue"),
        pipeline_execution_with_tensor_core=t.pipeline_execution_with_tensor_core,
        table_optimizers=table_optimizers(plan, spec),
        gradient_multiplier=tf_objects.gradient_multiplier(plan.embedding_gradient_multiplier),
    )


def embedding_optimizers(spec: Dict[str, Any]):
    """The Keras and TPU embedding optimizers of one spec.

    The Keras one updates CPU/GPU and TensorCore tables and owns the slots; the TPU one's learning
    rate follows the Keras one's step.

    Args:
      spec: an optimizer spec (contracts.plan.optimizer_spec).

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


def transformed_serving_function(model: RankingModel, manifest: VocabularyManifest):
    """The Trainer's serving signature: serialized transformed tf.Examples in, probabilities out.

    Args:
      model: the CPU model.
      manifest: preprocessing's manifest (how to parse the examples).

    Returns:
      A tf.function taking `examples`, string [n], and returning {"probabilities": float32 [n, 1]}.
    """

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(examples):
        features, _ = parse_batch(examples, manifest)
        return {"probabilities": model(features)}

    return serve


class TransformedServing(tf.Module):
    """What the Trainer's SavedModel holds: the CPU model and `serving_default` on transformed examples.

    Args:
      model: the CPU model.
      manifest: preprocessing's manifest.
    """

    def __init__(self, model: RankingModel, manifest: VocabularyManifest):
        super().__init__(name="trainer_serving")
        self.model = model
        self.serve = transformed_serving_function(model, manifest)

    def signatures(self) -> Dict[str, Any]:
        """The SavedModel's signatures: {"serving_default": the serving function}."""
        return {"serving_default": self.serve}


def warm_start_sparse_core(model: RankingModel, plan: EmbeddingPlan, layout: CheckpointLayout, warm_prefix: str,
                           strategy: tf.distribute.Strategy) -> Tuple[Dict[str, Any], Any]:
    """The warm-start checkpoint (one variable per table, written by the host twin) into a
    SparseCore model: TF builds the stacks now, everything but the TPU embedding layer is restored
    as usual, and each TPU-embedding table and its slots are placed into its stack through the
    layout the exporter reads (sparsecore_state.py). Restored by name, a stack of several tables
    would find nothing and a lone table's rows would come back permuted.

    Args:
      model: the training model, built under `strategy`.
      plan: the embedding plan.
      layout: the run's checkpoint layout (kind B).
      warm_prefix: the warm-start checkpoint's prefix.
      strategy: the training strategy.

    Returns:
      (what was placed, per table (sparsecore_state.assign_logical_tables); the restore status of
      everything but the TPU embedding layer, whose dense network is restored lazily, at the first
      step: require_consumed checks it then).
    """
    with strategy.scope():
        model.embedding_layer.build(None)  # TFRS's layer: TPUEmbeddingV2.build(), the stacks
    status = sparsecore_state.restore_all_but_tpu_embedding(model, warm_prefix, CHECKPOINT_ROOT)
    reader = tf.train.load_checkpoint(warm_prefix)
    keys = reader.get_variable_to_shape_map()

    def table(name: str) -> np.ndarray:
        return reader.get_tensor(table_checkpoint_key(name, "tpu_embedding"))

    def slot(name: str, slot_name: str) -> Optional[np.ndarray]:
        base = table_checkpoint_key(name, "tpu_embedding")[: -len(VARIABLE_VALUE)] + "/.OPTIMIZER_SLOT/"
        found = [k for k in keys if k.startswith(base) and k.endswith(f"/{slot_name}{VARIABLE_VALUE}")]
        return reader.get_tensor(found[0]) if len(found) == 1 else None

    return sparsecore_state.assign_logical_tables(model, plan, layout, table, slot), status


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
    run examples it has already seen.

    Args:
      train_files: the train split's file patterns.
      manifest: preprocessing's manifest.
      plan: the embedding plan (padded dense-ID widths, sequence lengths).
      t: the training config (seed, shuffle buffer).
      per_replica: each replica's batch size.
      start: the step the run starts from.
      replicas: the replicas in sync.
      holdout_fraction: the share held out for the selection (selection.py), left out here.

    Returns:
      A function of an optional tf.distribute.InputContext returning the batched dataset.
    """
    widths, lengths = tf_objects.dense_id_widths(plan), tf_objects.sequence_lengths(plan)

    def train_input(ctx: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
        return make_dataset(train_files, manifest, per_replica, training=True, seed=t.seed,
                            skip_batches=start * replicas, dense_id_widths=widths, sequence_lengths=lengths,
                            global_batch=per_replica * replicas, shuffle_rows=t.shuffle_buffer_rows,
                            part="train", holdout_fraction=holdout_fraction, input_context=ctx)

    return train_input


def sample_batch(train_files, manifest: VocabularyManifest, plan: EmbeddingPlan, per_replica: int):
    """One per-replica batch of features in the training step's input form, to build a model's variables.

    Args:
      train_files: the train split's file patterns.
      manifest: preprocessing's manifest.
      plan: the embedding plan.
      per_replica: each replica's batch size.

    Returns:
      The batch's features, {name: tensor} with batch dimension `per_replica`.
    """
    features, _ = next(iter(make_dataset(train_files, manifest, per_replica, training=False,
                                         dense_id_widths=tf_objects.dense_id_widths(plan),
                                         sequence_lengths=tf_objects.sequence_lengths(plan))))
    return features


def require_consumed(status, checkpoint: str, model: RankingModel, model_side_only: bool = False) -> None:
    """Checks that every value of `checkpoint` was restored into the model and every variable restored from it.

    Both directions; the optimizers' hyperparameters, which the config sets, are excepted.

    Args:
      status: the restore status of `checkpoint`.
      checkpoint: the checkpoint's prefix (named in the error).
      model: the model restored into.
      model_side_only: check only that every variable of the model the status covers was restored
        (a SparseCore warm start: its TPU-embedding tables are placed into TF's stacks, not
        restored, so their values stay unbound).

    Raises:
      sparsecore_state.LayoutMismatch: something did not match (one line naming the checkpoint).
    """
    optimizers = [model.dense_optimizer] + [o for o, _ in model._embedding_optimizers().values()]  # pylint: disable=protected-access
    hyper = {k: v for opt in optimizers for k, v in getattr(opt, "_hyper", {}).items()}
    missing = sparsecore_state.restore_mismatches(status, [v for v in hyper.values() if isinstance(v, tf.Variable)], set(hyper))
    if model_side_only:
        missing = [m for m in missing if m.startswith("in the model only")]
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
    (`_Checkpointer`).

    Args:
      model: the training model.
      ckpt: the run's checkpoint object (holding the model).
      prefix: the checkpoint to restore.
      on_tpu: whether the model trains under a TPU strategy.
      strategy: the training strategy.
      sample: a batch of features (`sample_batch`) that builds the model off TPU.

    Returns:
      The restore status.

    Raises:
      sparsecore_state.LayoutMismatch: the checkpoint does not hold this model's variables.
    """
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
    """Where checkpoints of an unfinished run live: stable across executions of the same training.

    Args:
      cfg: the pipeline config (`training.checkpoint_dir`).
      model_uri: the Model artifact's directory.
      train_files: the train split's file patterns.

    Returns:
      training.checkpoint_dir when set; else `<pipeline root>/Trainer/training_state/<key>`, the
      key fingerprinting the config and the examples.
    """
    if cfg.training.checkpoint_dir:
        return cfg.training.checkpoint_dir
    key = hashlib.sha256((cfg.to_json() + "\n" + examples_root(train_files)).encode()).hexdigest()[:16]
    return os.path.join(os.path.dirname(os.path.dirname(model_uri.rstrip("/"))), STATE_DIR, key)


def _windows(size: int) -> list:
    """Offsets of the DATA_WINDOW-byte windows of a file of `size` bytes that its fingerprint reads:
    the whole file when it is small, else DATA_WINDOWS windows spread from its head to its tail."""
    if size <= DATA_WINDOW * DATA_WINDOWS:
        return list(range(0, size, DATA_WINDOW))
    return [round(i * (size - DATA_WINDOW) / (DATA_WINDOWS - 1)) for i in range(DATA_WINDOWS)]


def data_signature(train_files) -> Dict[str, Any]:
    """What identifies the training data a state's checkpoints were trained on (sparsecore_state.check_resumable).

    The fingerprint covers the train split's files by name and size and their bytes (all of a small
    file, DATA_WINDOWS windows of DATA_WINDOW bytes of a large one, head and tail included), not
    their location or times: the same examples resume wherever they are (a cached rerun, a copy),
    other examples of the same table sizes and row count do not.

    Args:
      train_files: the train split's file patterns.

    Returns:
      {"fingerprint", "examples" (the examples' directory), "files", "bytes"}.
    """
    paths = sorted({p for pattern in train_files for p in tf.io.gfile.glob(pattern)})
    digest, total = hashlib.sha256(), 0
    for path in paths:
        size = tf.io.gfile.stat(path).length
        total += size
        digest.update(f"{os.path.basename(path)}\0{size}\0".encode())
        with tf.io.gfile.GFile(path, "rb") as fh:
            for offset in _windows(size):
                fh.seek(offset)
                digest.update(fh.read(DATA_WINDOW))
    return {"fingerprint": digest.hexdigest()[:32], "examples": examples_root(train_files), "files": len(paths),
            "bytes": total}


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
            (status, prefix, model_side_only), self.restored = self.restored, None
            require_consumed(status, prefix, self.model, model_side_only)
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


@dataclasses.dataclass
class _Hardware:
    """Where the run trains: the strategy, its replicas, each replica's batch, the checkpoint layout."""

    strategy: tf.distribute.Strategy
    on_tpu: bool
    replicas: int
    per_replica: int
    layout: CheckpointLayout
    ids_per_chip: Optional[Dict[str, Any]] = None  # SparseCore: sparsecore_limits.check_ids_per_chip's report


@dataclasses.dataclass
class _Checkpoints:
    """The run's checkpoints in its state directory, and the step training starts from."""

    ckpt: tf.train.Checkpoint
    manager: tf.train.CheckpointManager
    step: tf.Variable  # the dense optimizer's iterations: one dense update per training step
    signature: Dict[str, Any]  # what the state's checkpoints hold (sparsecore_state.plan_signature)
    data: Optional[Dict[str, Any]] = None  # what they were trained on (data_signature)
    start: int = 0
    resumed_from: Optional[str] = None
    # (restore status, checkpoint, model side only) of a resume or warm start, checked again after a TPU step
    restored: Optional[Tuple[Any, str, bool]] = None


def train(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files, eval_files,
          state: str, log_dir: Optional[str] = None, train_steps: Optional[int] = None, warm_from=None,
          train_rows: Optional[int] = None):
    """Builds, checks and trains the model, resuming or warm-starting it.

    A run resumes from `state` when it holds a checkpoint; else, given `warm_from`, it starts from
    the last blessed model's weights. With `training.early_stopping`, a held-out slice of the train
    split picks the checkpoint and may stop training early (selection.py). `finish` does the rest.

    Args:
      cfg: the pipeline config.
      plan: the embedding plan (`run_plan.derive_plan`, with the vocabularies' location).
      manifest: preprocessing's manifest.
      train_files: the transformed train split's file patterns.
      eval_files: the eval split's file patterns; not read here (the validation gate's split).
      state: the state directory holding the run's checkpoints (`state_dir`).
      log_dir: TensorBoard's log directory, None for none.
      train_steps: the run's length; defaults to training.train_steps.
      warm_from: the last blessed model to start from (warm_start.PreviousModel), None for a fresh start.
      train_rows: the train split's row count, which sizes the held-out slice.

    Returns:
      (checkpoint, rules, run): the model's checkpoint prefix (the best on the slice, else the
      last), the TPU-rules report, and the training-run record, whose `checkpoint_layout` is how
      the checkpoint holds the tables (`plan.with_run` takes it) and whose `warm_start` says what
      carried over.

    Raises:
      ValueError: no training length, a batch size the replicas do not divide, or a checkpoint
        beyond the run's length.
      RuntimeError: training did not end at the expected step, or its checkpoint is missing.
      PlanError, TPURulesError, sparsecore_state.LayoutMismatch: the plan, the input or the state
        does not fit this hardware or this model (sparsecore_state.DataMismatch: the state was
        trained on other data).
      unreadable.UnreadableFile: the state's checkpoint is cut short or damaged.
      warm_start.WarmStartError: the last blessed model cannot start this run.
    """
    t = cfg.training
    tf.keras.utils.set_random_seed(t.seed)
    steps = train_steps or t.train_steps
    if not steps:
        raise ValueError("no training length: pass train_steps (run_fn derives it: run_plan.training_steps)")
    holdout = t.holdout_fraction(train_rows)
    # Evaluations fall on checkpoints: with early stopping, at least `evaluations` over the run.
    every = min(t.checkpoint_every_steps, t.evaluation_every(steps)) if holdout else t.checkpoint_every_steps
    hardware = _place_training(cfg)
    plan, model = _build_training_model(cfg, plan, manifest, hardware)
    rules = _check_rules_on_host(cfg, plan, manifest, train_files, hardware.per_replica)
    if hardware.ids_per_chip is not None:
        rules["sparsecore_ids_per_chip"] = hardware.ids_per_chip
    checkpoints = _resume_from_state(cfg, plan, manifest, train_files, state, model, hardware, steps)
    warm_report = _warm_start(cfg, plan, manifest, train_files, state, model, hardware, checkpoints, warm_from)
    # what the checkpoints of this state hold and were trained on (check_resumable)
    sparsecore_state.write_layout(state, hardware.layout, checkpoints.signature, checkpoints.data)
    if checkpoints.start > steps:
        raise ValueError(f"checkpoint in {state} is at step {checkpoints.start}, beyond train_steps {steps}; remove it or raise train_steps")
    selection = None
    if holdout:
        selection = HoldoutSelection(cfg, plan.with_run(checkpoint_layout=hardware.layout), manifest, train_files, state,
                                     holdout, steps)
        if checkpoints.start < steps and not selection.stopped:  # else nothing trains: no pass over the split
            selection.prepare()
    train_ds = _training_dataset(cfg, plan, manifest, train_files, hardware, checkpoints.start, holdout)
    fit_start = time.perf_counter()
    checkpointer = _fit(cfg, model, train_ds, hardware, checkpoints, selection, steps, every, log_dir)
    fit_seconds = time.perf_counter() - fit_start
    during_fit = selection.evaluation_seconds if selection is not None else 0.0
    checkpoint, run = _final_checkpoint(state, hardware, checkpoints, checkpointer, selection, steps, warm_report)
    run["seconds"] = _seconds(fit_seconds, during_fit, selection)
    return checkpoint, rules, run


def _seconds(fit_seconds: float, during_fit: float, selection: Optional[HoldoutSelection]) -> Dict[str, Any]:
    """The run record's `seconds`: where this process's training time went. `training`: model.fit's
    wall time less the held-out evaluations run inside it (its checkpoint saves and first-step
    tracing included); `holdout_read`: the one pass that finds the held-out slice;
    `holdout_evaluations`: every held-out evaluation with the selection's copy of the best
    checkpoint. run_fn adds `final_evaluation`; their sum against the Trainer's whole time is the
    evaluation and selection share of the run."""
    out = {"training": round(fit_seconds - during_fit, 3), "holdout_read": 0.0, "holdout_evaluations": 0.0}
    if selection is not None:
        out.update(holdout_read=round(selection.read_seconds, 3), holdout_evaluations=round(selection.evaluation_seconds, 3))
    progress.phase(progress.TRAINER, f"training steps {out['training']:.1f} s; held-out slice read "
                                     f"{out['holdout_read']:.1f} s, evaluations and selection {out['holdout_evaluations']:.1f} s")
    return out


def _place_training(cfg: PipelineConfig) -> _Hardware:
    """The strategy, its replicas and the checkpoint layout they give; the batch must split evenly."""
    t = cfg.training
    strategy = distribution_strategy(cfg)
    on_tpu = is_tpu_strategy(strategy)
    replicas = strategy.num_replicas_in_sync
    if t.batch_size % replicas:
        raise ValueError(f"training.batch_size {t.batch_size} must be a multiple of the {replicas} replicas")
    per_replica = t.batch_size // replicas
    return _Hardware(strategy, on_tpu, replicas, per_replica, checkpoint_layout(strategy, per_replica))


def _build_training_model(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest,
                          hardware: _Hardware) -> Tuple[EmbeddingPlan, RankingModel]:
    """(the plan sized for the hardware, the compiled training model built under the strategy)."""
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
                            per_replica_batch=hardware.per_replica)
        model.compile(
            optimizer=model.dense_optimizer,
            loss=tf.keras.losses.BinaryCrossentropy(),
            steps_per_execution=cfg.training.steps_per_execution,
        )
    return plan, model


def _check_rules_on_host(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files,
                         per_replica: int) -> Dict[str, Any]:
    """The TPU-rules report of the training input and a CPU twin of the model (tpu_rules.py)."""
    t = cfg.training
    # The check runs on the host with a CPU twin of the model on every platform (the training
    # model may live on a TPU); the same input feeds the step.
    check_model = build_model(plan, manifest, cfg, for_training=False)
    # TensorCore-table features are fed as padded dense IDs on every platform: the TPU step's input.
    widths = tf_objects.dense_id_widths(plan)
    return check_tpu_rules(
        check_model, plan,
        make_dataset(train_files, manifest, per_replica, training=True, seed=t.seed, dense_id_widths=widths,
                     sequence_lengths=tf_objects.sequence_lengths(plan)),
    )


def _resume_from_state(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files, state: str,
                       model: RankingModel, hardware: _Hardware, steps: int) -> _Checkpoints:
    """The run's checkpoint manager over `state`, with the state's last checkpoint restored if any."""
    step = model.dense_optimizer.iterations  # one dense update per training step
    ckpt = tf.train.Checkpoint(model=model)
    manager = tf.train.CheckpointManager(ckpt, state, max_to_keep=2)
    checkpoints = _Checkpoints(ckpt, manager, step, signature=sparsecore_state.plan_signature(
        plan, hardware.layout, cfg, manifest.dense_names), data=data_signature(train_files),
        resumed_from=manager.latest_checkpoint)
    resumed_from = checkpoints.resumed_from
    if resumed_from:
        # Only under the table layout, the plan and on the data it was written with (TF cannot map
        # SparseCore stacks; a table added, removed or reshaped would start fresh; a state from other
        # data would stand for this run's training), checked before anything is restored.
        sparsecore_state.check_resumable(state, resumed_from, hardware.layout, checkpoints.signature, checkpoints.data)
        sample = sample_batch(train_files, manifest, plan, hardware.per_replica)
        with reading(resumed_from, "training state checkpoint",
                     f"remove {state} (training.checkpoint_dir, when set) to train from the start"):
            status = restore_built(model, ckpt, resumed_from, hardware.on_tpu, hardware.strategy, sample)
        checkpoints.restored = (status, resumed_from, False)
        checkpoints.start = int(step.numpy())
        logging.info("resuming from %s at step %d of %d", resumed_from, checkpoints.start, steps)
    return checkpoints


def _warm_start(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files, state: str,
                model: RankingModel, hardware: _Hardware, checkpoints: _Checkpoints,
                warm_from) -> Optional[Dict[str, Any]]:
    """Starts a fresh run from the last blessed model's weights; returns what carried over (None: no warm start)."""
    warm_report = None
    warm_report_path = os.path.join(state, "warm_start", "report.json")
    if checkpoints.resumed_from and warm_from is not None and tf.io.gfile.exists(warm_report_path):
        # A killed run that had warm-started: its checkpoint holds the carried weights already.
        warm_report = dict(json.loads(io_utils.read_string_file(warm_report_path)), resumed_from=checkpoints.resumed_from)
    if not checkpoints.resumed_from and warm_from is not None:
        # The previous model's weights in this model's checkpoint, written by a host twin and
        # restored as a resumed run restores its own (warm_start.py).
        with tf.device("/cpu:0"):
            twin = build_model(plan, manifest, cfg, for_training=True)
            sample = sample_batch(train_files, manifest, plan, hardware.per_replica)
            twin(sample)
            twin.create_optimizer_slots()
            warm_prefix = os.path.join(state, "warm_start", "ckpt")
            warm_report = warm_start.warm_start_checkpoint(warm_from, cfg, plan, manifest, twin, warm_prefix)
            if hardware.layout.kind == LayoutKind.B:
                # The SparseCore model's dense network exists only after its first step and is
                # restored lazily: the written checkpoint is checked now, before training, against
                # the host twin (the same model), both directions, naming what is missing.
                require_consumed(tf.train.Checkpoint(**{CHECKPOINT_ROOT: twin}).restore(warm_prefix), warm_prefix, twin)
        del twin
        if hardware.layout.kind == LayoutKind.B:
            warm_report["sparse_core"], status = warm_start_sparse_core(model, plan, hardware.layout, warm_prefix,
                                                                        hardware.strategy)
            # and after the first step, that the TPU model's own dense variables were all restored
            checkpoints.restored = (status, warm_prefix, True)
        else:
            checkpoints.restored = (restore_built(model, checkpoints.ckpt, warm_prefix, hardware.on_tpu, hardware.strategy,
                                                  sample), warm_prefix, False)
        with tf.io.gfile.GFile(warm_report_path, "w") as fh:  # for a resumed execution's record
            fh.write(json.dumps(warm_report, sort_keys=True))
        if int(checkpoints.step.numpy()) != 0:
            raise RuntimeError(f"warm start restored step {int(checkpoints.step.numpy())}; expected a fresh step counter")
    return warm_report


def _training_dataset(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files,
                      hardware: _Hardware, start: int, holdout: float):
    """The training input from step `start`, distributed over the replicas as the strategy needs it."""
    train_input = training_input(train_files, manifest, plan, cfg.training, hardware.per_replica, start,
                                 hardware.replicas, holdout)
    if hardware.on_tpu:
        # Sparse features stay on the host for the TPU embedding enqueue.
        options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
        return hardware.strategy.distribute_datasets_from_function(train_input, options)
    if hardware.replicas > 1:
        return hardware.strategy.distribute_datasets_from_function(train_input)
    return train_input()


def _fit(cfg: PipelineConfig, model: RankingModel, train_ds, hardware: _Hardware, checkpoints: _Checkpoints,
         selection: Optional[HoldoutSelection], steps: int, every: int, log_dir: Optional[str]) -> _Checkpointer:
    """Trains from the start step to `steps`, checkpointing every `every` steps; returns the checkpointer."""
    t = cfg.training
    start = checkpoints.start
    checkpointer = _Checkpointer(checkpoints.manager, checkpoints.step, steps,
                                 _Progress(steps, t.batch_size) if progress.enabled() else None,
                                 selection, checkpoints.restored if hardware.on_tpu else None)
    callbacks = [checkpointer]
    progress.phase(progress.TRAINER, f"training {steps:,} steps of {t.batch_size} examples"
                                     + (f", resuming at step {start:,}" if start else "")
                                     + f" ({type(hardware.strategy).__name__}, {hardware.replicas} replica(s))")
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
    return checkpointer


def _final_checkpoint(state: str, hardware: _Hardware, checkpoints: _Checkpoints, checkpointer: _Checkpointer,
                      selection: Optional[HoldoutSelection], steps: int,
                      warm_report: Optional[Dict[str, Any]]) -> Tuple[str, Dict[str, Any]]:
    """(the model's checkpoint: the best on the slice, else the last; the training-run record)."""
    manager = checkpoints.manager
    final_step = int(checkpoints.step.numpy())
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
        "resumed_from_step": checkpoints.start,
        "resumed_from_checkpoint": checkpoints.resumed_from,
        "checkpoint_steps": checkpointer.saved_steps,
        "state_dir": state,
        "replicas": hardware.replicas,
        "per_replica_batch_size": hardware.per_replica,
        "strategy": type(hardware.strategy).__name__,
        "checkpoint_layout": dataclasses.asdict(hardware.layout),
        "warm_start": warm_report,
        # the step of the checkpoint kept as the model, and how it was chosen
        "model_step": selection.record["best_step"] if chosen else final_step,
        "model_choice": KEPT_BEST if chosen else KEPT_LAST,
        "selection": selection.record if selection is not None else None,
    }
    return chosen or final_checkpoint, run


def finish(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, checkpoint_path: str,
           eval_files, serving_model_dir: str) -> Tuple[Dict[str, float], RankingModel]:
    """Everything after training, the same on CPU, GPU and TPU: the model is rebuilt for CPU from
    the kept checkpoint (exporter's restore.py: dense weights restored, tables read in whatever
    layout the platform saved them), evaluated on the whole eval split and saved as the Trainer's
    SavedModel. Nothing here touches the training model or its strategy (a TFRS layer built under
    TPUStrategy refuses calls outside `strategy.run`).

    Args:
      cfg: the pipeline config.
      plan: the embedding plan with the run's checkpoint layout.
      manifest: preprocessing's manifest.
      checkpoint_path: the model's checkpoint.
      eval_files: the eval split's file patterns.
      serving_model_dir: where the SavedModel goes.

    Returns:
      (metrics, model): `evaluation.evaluate`'s metrics on the eval split (`seconds`: the wall
      seconds of its reading and scoring) and the CPU model.
    """
    # Batches of about EVAL_ROWS rows scored by one compiled function each (evaluation.py): the
    # training batch, scored eagerly, read the eval split at a small fraction of training's rate.
    eval_ds = make_dataset(eval_files, manifest, evaluation_batch(manifest), training=False)
    # Pinned to the host CPU: on a TPU VM nothing here may be placed on (or compiled for) the TPU.
    with tf.device("/cpu:0"):
        sample, _ = next(iter(eval_ds))
        model = model_from_checkpoint(plan, manifest, cfg, checkpoint_path, sample)
        metrics = evaluate(model, eval_ds)
        rate = metrics["examples"] / max(metrics["seconds"], 1e-9)
        logging.info("final evaluation: %d rows in %.1f s (%.0f rows/s)", metrics["examples"], metrics["seconds"], rate)
        progress.phase(progress.TRAINER, f"final evaluation: {metrics['examples']:,} rows in "
                                         f"{metrics['seconds']:.1f} s ({rate:,.0f} rows/s)")
        save_serving_model(TransformedServing(model, manifest), serving_model_dir)
    return metrics, model


def report_final_evaluation(run: Dict[str, Any], metrics: Dict[str, Any]) -> Dict[str, Any]:
    """Reports the Trainer's evaluation on the eval split as the kept model's.

    `finish` scores the checkpoint kept as the model (the best on the held-out slice, else the
    last), which need not be the last step's: the progress event names that step and how it was
    chosen, and eval_metrics.json records both beside the metrics, so that the progress line, the
    summary and the run report name the same model for the same AUC.

    Args:
      run: the training-run record (`model_step`, `model_choice`: `_final_checkpoint`).
      metrics: the eval split's metrics (`finish`, with their reasons).

    Returns:
      `metrics` with `model_step` and `model_choice` added.
    """
    progress.evaluated(progress.TRAINER, run["model_step"],
                       {k: v for k, v in metrics.items() if isinstance(v, (int, float))},
                       kept=run["model_choice"])
    return {**metrics, "model_step": run["model_step"], "model_choice": run["model_choice"]}


def continuous_start(cfg: PipelineConfig, base_model: Optional[str], manifest: VocabularyManifest,
                     statistics: Optional[EmbeddingStatistics]) -> Dict[str, Any]:
    """Before training: the last blessed model (TFX's `base_model`: the pipeline's LastBlessedModel
    output, which points at the Trainer model of the version served at the push destination; or a
    Trainer model itself) and the drift from its data, which stops the run past `continuous.drift`
    (warm_start.py).

    Args:
      cfg: the pipeline config (`continuous`).
      base_model: TFX's `base_model`, None or empty on a first run.
      manifest: this run's manifest.
      statistics: this run's statistics.

    Returns:
      The record of `continuous.json`: base_model, drift, registry and a note, with `previous`
      (a warm_start.PreviousModel) when warm-starting.

    Raises:
      warm_start.DriftStop: the data drifted past `continuous.drift`.
      warm_start.WarmStartError: `base_model` is not a usable Trainer Model (and no registry
        lookup stands behind it).
    """
    if not base_model:
        return {"base_model": None, "drift": None, "note": "no blessed model yet: trained from scratch"}
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


def serving_dir_of(fn_args) -> Optional[str]:
    """The push destination as the Trainer knows it: its custom_config's SERVING_DIR_KEY, else the
    LastBlessedModel lookup that TFX hands it as `base_model`; None when neither says."""
    given = (getattr(fn_args, "custom_config", None) or {}).get(SERVING_DIR_KEY)
    if given:
        return given
    base_model = getattr(fn_args, "base_model", None)
    found = read_lookup(base_model) if base_model else None
    return found.serving_dir if found is not None else None


def table_shapes(plan: EmbeddingPlan) -> Dict[str, Tuple[int, int, str]]:
    """Each table's (rows, dim, placement): what no tuned value may change."""
    return {name: (t.rows, t.dim, str(t.placement)) for name, t in plan.tables.items()}


def check_tables_unchanged(before: EmbeddingPlan, after: EmbeddingPlan, tuned: Dict[str, Any]) -> None:
    """Raises PlanError when tuned values changed a table's rows, dim or placement (the config's
    check allows only fields that cannot: components/config/tuning.py)."""
    a, b = table_shapes(before), table_shapes(after)
    if a != b:
        changed = sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))
        raise PlanError(f"the tuned values {json.dumps(tuned, sort_keys=True)} changed the plan's tables "
                        f"{', '.join(changed)} (rows, dim, placement); a trial may not change them")


def tuned_config(cfg: PipelineConfig, fn_args) -> Tuple[PipelineConfig, Dict[str, Any]]:
    """The config with the Tuner's best values applied (TFX's `hyperparameters` input, which the
    Trainer hands run_fn as `fn_args.hyperparameters`), and those values ({} without a Tuner)."""
    values = checked_values(values_of(getattr(fn_args, "hyperparameters", None)))  # layer widths as lists
    return apply_values(cfg, values), values


@progress.staged(progress.TRAINER)
def run_fn(fn_args) -> None:
    """Trains, evaluates and saves the model into the Trainer's Model artifact (module docstring).

    Args:
      fn_args: TFX's FnArgs: custom_config (the config under CONFIG_KEY), train_files, eval_files,
        serving_model_dir, model_run_dir, train_steps and, in a continuous pipeline, base_model.

    Raises:
      LedgerError: the row ledger of the examples does not add up.
      ConfigError: training.checkpoint_dir is inside the push destination (check_checkpoint_dir).
      ValueError, RuntimeError, PlanError, DriftStop: from the steps it runs (`train`, `continuous_start`).
    """
    untuned = config_of(fn_args.custom_config)
    # With a Tuner: its best values over the config (the state key and pipeline_config.json see them).
    cfg, tuned = tuned_config(untuned, fn_args)
    check_checkpoint_dir(cfg.training.checkpoint_dir, serving_dir_of(fn_args))
    manifest = read_manifest_for(fn_args.train_files)
    statistics = read_statistics_for(fn_args.train_files)
    # No training on rows that were lost (or invented) on the way: the ledger must add up.
    check_ledger(statistics.ledger if statistics else None, "Trainer")
    plan = derive_plan(cfg, manifest, statistics).with_run(vocabulary_dir=manifest.vocabulary_dir)
    if tuned:
        check_tables_unchanged(derive_plan(untuned, manifest, statistics), plan, tuned)
    model_root = os.path.dirname(fn_args.serving_model_dir.rstrip("/"))
    state = state_dir(cfg, model_root, fn_args.train_files)
    length = training_steps(cfg, statistics, fn_args.train_steps)
    continuous = continuous_start(cfg, getattr(fn_args, "base_model", None), manifest, statistics)
    checkpoint, rules, run = train(
        cfg, plan, manifest, fn_args.train_files, fn_args.eval_files, state,
        log_dir=fn_args.model_run_dir, train_steps=length["steps"], warm_from=continuous.pop("previous", None),
        train_rows=length.get("train_rows"),
    )
    continuous["warm_start"] = run.pop("warm_start")
    run["length"] = length
    if tuned:  # which values came from the Tuner's search (the exporter applies them too)
        run["tuned"] = tuned
    # The final state (weights and optimizer slots, as the training platform saved them) goes into
    # the artifact; the state dir is removed below. Evaluation and the SavedModel come from it.
    plan = plan.with_run(checkpoint_layout=CheckpointLayout(**run["checkpoint_layout"]))
    copy_checkpoint(checkpoint, os.path.join(model_root, artifacts.CHECKPOINT_DIR))
    progress.phase(progress.TRAINER, "evaluating on the eval split and saving the model")
    metrics, _ = finish(cfg, plan, manifest, checkpoint, fn_args.eval_files, fn_args.serving_model_dir)
    run["seconds"]["final_evaluation"] = round(metrics.pop("seconds"), 3)  # train's `_seconds`
    # An AUC or log loss undefined on the eval split (one label only) is null, with its reason.
    metrics = report_final_evaluation(run, with_reasons(metrics, evaluation_reasons(metrics, "eval split")))
    for name, why in (metrics.get(UNDEFINED_KEY) or {}).items():
        progress.phase(progress.TRAINER, f"eval {name}: {why}")
    if cfg.validation.baseline.enabled:
        progress.phase(progress.TRAINER, "training the logistic-regression baseline (the validation gate's reference)")
        # The validation gate's reference (exporter): a logistic regression on the same batches.
        metrics["baseline"] = train_baseline(cfg, plan, manifest, fn_args.train_files, fn_args.eval_files,
                                             model_steps=length["steps"], train_rows=length.get("train_rows"))
        if isinstance(metrics["baseline"], dict) and metrics["baseline"].get("auc") is not None:
            progress.phase(progress.TRAINER, f"baseline eval AUC {metrics['baseline']['auc']:.4f}")
        elif isinstance(metrics["baseline"], dict):
            why = (metrics["baseline"].get(UNDEFINED_KEY) or {}).get("auc")
            progress.phase(progress.TRAINER, f"baseline eval AUC: {why or 'not measured'}")
    logging.info("eval metrics: %s", metrics)
    # The config travels with the model so the standalone exporter CLI can rebuild it without one.
    for name, obj in ((artifacts.EMBEDDING_MANIFEST_FILE, manifest.to_dict()), (artifacts.PLAN_FILE, plan.to_dict()),
                      (artifacts.EVAL_METRICS_FILE, metrics), (artifacts.TPU_RULES_FILE, rules), (artifacts.TRAINING_RUN_FILE, run),
                      (artifacts.TRAINER_CONFIG_FILE, json.loads(cfg.to_json())), (artifacts.CONTINUOUS_FILE, continuous),
                      # The next run's drift reference (warm_start.drift).
                      (artifacts.EMBEDDING_STATISTICS_FILE, statistics.to_dict() if statistics else None)):
        if obj is None:
            continue
        with tf.io.gfile.GFile(os.path.join(model_root, name), "w") as fh:
            # strict JSON: a NaN left anywhere (a diverged loss) is null, its reason beside it
            fh.write(json.dumps(json_safe(obj), indent=2, sort_keys=True, allow_nan=False))
    if not cfg.training.checkpoint_dir and tf.io.gfile.exists(state):
        tf.io.gfile.rmtree(state)
