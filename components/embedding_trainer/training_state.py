"""The training state: where an unfinished run's checkpoints live, what identifies the data they
were trained on, and how a run starts from them: resumed from its own last checkpoint (same
layout, plan and data, or refused), or warm-started from the last blessed model's weights
(warm_start.py), with every restored value checked against the model in both directions."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Dict, List, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import numpy as np
import tensorflow as tf
from absl import logging
from tfx.utils import io_utils  # read_string_file: any filesystem TFX reads (gs://, local)

from components.config.choices import LayoutKind
from components.config.schema import PipelineConfig
from components.contracts.manifest import VocabularyManifest
from components.data_io.checksums import sampled_fingerprint
from components.contracts.plan import CheckpointLayout, EmbeddingPlan
from components.embedding_model import sparsecore_state
from components.embedding_model.checkpoint_keys import CHECKPOINT_ROOT, VARIABLE_VALUE, table_checkpoint_key
from components.embedding_model.model import RankingModel
from components.embedding_model.unreadable import reading
from components.embedding_trainer import warm_start
from components.embedding_trainer.hardware import Hardware
from components.embedding_trainer.model_building import build_model
from components.embedding_trainer.resume_rule import check_config, training_record
from components.embedding_trainer.training_data import sample_batch
from components.reporting import progress

STATE_DIR = "training_state"


def state_dir(cfg: PipelineConfig, model_uri: str, examples_uri: str) -> str:
    """Where checkpoints of an unfinished run live: stable across executions of the same training.

    Args:
      cfg: the pipeline config (`training.checkpoint_dir`).
      model_uri: the Model artifact's directory.
      examples_uri: the transformed examples' artifact URI.

    Returns:
      training.checkpoint_dir when set; else `<pipeline root>/Trainer/training_state/<key>`, the
      key fingerprinting the config and the examples.
    """
    if cfg.training.checkpoint_dir:
        return cfg.training.checkpoint_dir
    key = hashlib.sha256((cfg.to_json() + "\n" + examples_uri).encode()).hexdigest()[:16]
    return os.path.join(os.path.dirname(os.path.dirname(model_uri.rstrip("/"))), STATE_DIR, key)


def _common_dir(paths, patterns) -> str:
    """The directory holding all of `paths` (the patterns' when none matched): named in messages."""
    return os.path.commonpath([os.path.dirname(p) for p in paths]) if paths else ", ".join(patterns)


def _gfile(path: str):
    return tf.io.gfile.GFile(path, "rb")


def data_signature(train_files) -> Dict[str, Any]:
    """What identifies transformed examples from an ExampleGen that recorded no input identity
    (data_io/data_identity.py: this project's ExampleGen records one; a stock ExampleGen does not).

    The fingerprint covers the train split's files by name, size and sampled bytes
    (checksums.sampled_fingerprint), not their location or times: the same examples resume
    wherever they are (a cached rerun, a copy), other examples of the same row count do not. Two
    preprocessing runs over the same input write other bytes (data_io/data_identity.py says why):
    such a rerun into a fresh output directory is refused.

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
        digest.update(f"{os.path.basename(path)}\0{sampled_fingerprint(path, size, _gfile)}\0".encode())
    return {"fingerprint": digest.hexdigest()[:32], "examples": _common_dir(paths, train_files), "files": len(paths),
            "bytes": total}


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
    # every optimizer's own (a dict merged by name kept only the last optimizer's `learning_rate`)
    hyper = [(k, v) for opt in optimizers for k, v in getattr(opt, "_hyper", {}).items()]
    missing = sparsecore_state.restore_mismatches(status, [v for _, v in hyper if isinstance(v, tf.Variable)],
                                                  {k for k, _ in hyper})
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
    (`training_loop.Checkpointer`).

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


@dataclasses.dataclass
class Checkpoints:
    """The run's checkpoints in its state directory, and the step training starts from."""

    ckpt: tf.train.Checkpoint
    manager: tf.train.CheckpointManager
    step: tf.Variable  # the dense optimizer's iterations: one dense update per training step
    signature: Dict[str, Any]  # what the state's checkpoints hold (sparsecore_state.plan_signature)
    data: Optional[Dict[str, Any]] = None  # what they were trained on (data_signature)
    training: Optional[Dict[str, Any]] = None  # the training config they are trained under (resume_rule)
    steering: List[str] = dataclasses.field(default_factory=list)  # changes a resumed state continues under
    start: int = 0
    resumed_from: Optional[str] = None
    # (restore status, checkpoint, model side only) of a resume or warm start, checked again after a TPU step
    restored: Optional[Tuple[Any, str, bool]] = None


def check_resume(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, state: str,
                 hardware: Hardware, data: Dict[str, Any], checkpoint: Optional[str] = None) -> List[str]:
    """Refuses a state this run may not resume, from the state's record alone: only under the table
    layout, the plan and on the data it was written with (TF cannot map SparseCore stacks; a table
    added, removed or reshaped would start fresh; a state from other data would stand for this
    run's training), and under a training config it may continue under (resume_rule.py).

    `training_loop.train` calls it once the model object exists, before any variable, input
    pipeline or traced step (a refused resume costs no TPU-rules check), and `resume_from_state`
    again before it restores.

    Args:
      data: what identifies this run's training data (`data_signature`).
      checkpoint: the checkpoint to resume; None: the state's latest, if any.

    Returns:
      The steering changes the resumed run continues under (empty when none, or nothing to resume).

    Raises:
      sparsecore_state.LayoutMismatch, PlanMismatch, DataMismatch; resume_rule.ConfigMismatch.
    """
    checkpoint = checkpoint or tf.train.latest_checkpoint(state)
    if not checkpoint:
        return []
    sparsecore_state.check_resumable(state, checkpoint, hardware.layout,
                                     sparsecore_state.plan_signature(plan, hardware.layout, cfg, manifest.dense_names), data)
    return check_config(state, checkpoint, sparsecore_state.read_record(state), training_record(cfg, plan, hardware.precision),
                        int(checkpoint.rsplit("-", 1)[-1]))


def resume_from_state(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files, state: str,
                      model: RankingModel, hardware: Hardware, steps: int, data: Dict[str, Any]) -> Checkpoints:
    """The run's checkpoint manager over `state`, with the state's last checkpoint restored if any.

    `data` identifies the training data (`data_signature`, or the input identity ExampleGen
    recorded): a state trained on other data is refused (`check_resume`).
    """
    step = model.dense_optimizer.iterations  # one dense update per training step
    ckpt = tf.train.Checkpoint(model=model)
    manager = tf.train.CheckpointManager(ckpt, state, max_to_keep=2)
    checkpoints = Checkpoints(ckpt, manager, step, signature=sparsecore_state.plan_signature(
        plan, hardware.layout, cfg, manifest.dense_names), data=data,
        training=training_record(cfg, plan, hardware.precision), resumed_from=manager.latest_checkpoint)
    resumed_from = checkpoints.resumed_from
    if resumed_from:
        checkpoints.steering = check_resume(cfg, plan, manifest, state, hardware, checkpoints.data, resumed_from)
        if checkpoints.steering:
            progress.phase(progress.TRAINER, f"resuming {resumed_from} under changed settings that steer the rest of "
                                             f"training: {'; '.join(checkpoints.steering)}")
        sample = sample_batch(train_files, manifest, plan, hardware.per_replica)
        with reading(resumed_from, "training state checkpoint",
                     f"remove {state} (training.checkpoint_dir, when set) to train from the start"):
            status = restore_built(model, ckpt, resumed_from, hardware.on_tpu, hardware.strategy, sample)
        checkpoints.restored = (status, resumed_from, False)
        checkpoints.start = int(step.numpy())
        logging.info("resuming from %s at step %d of %d", resumed_from, checkpoints.start, steps)
    return checkpoints


def warm_start_into(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files, state: str,
                    model: RankingModel, hardware: Hardware, checkpoints: Checkpoints,
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
