"""The training loop: the model built, checked and fitted on the run's hardware from the step the
state starts at, checkpointed every `training.checkpoint_every_steps` with live progress, stopped
at exactly the run's length (or earlier by the held-out selection), and the checkpoint kept as
the model chosen. `model_artifact.finish` does everything after it."""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Dict, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf
from absl import logging

from components.config.schema import PipelineConfig
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.embedding_model import sparsecore_state
from components.embedding_model import tf_objects
from components.embedding_model.input import make_dataset
from components.embedding_model.model import RankingModel
from components.embedding_trainer.hardware import Hardware, place_training
from components.embedding_trainer.model_building import build_model, build_training_model, create_variables
from components.embedding_trainer.selection import HoldoutSelection
from components.embedding_trainer.tpu_rules import check_tpu_rules
from components.embedding_trainer.training_data import training_dataset
from components.embedding_trainer.training_state import (Checkpoints, check_resume, data_signature, require_consumed,
                                                          resume_from_state, warm_start_into)
from components.reporting import progress
from components.reporting.report import KEPT_BEST, KEPT_LAST
from components.planning.fitting import with_run
from components.planning.gradient_exchange import describe_exchanges, plan_gradient_exchanges


def train(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files, eval_files,
          state: str, log_dir: Optional[str] = None, train_steps: Optional[int] = None, warm_from=None,
          train_rows: Optional[int] = None, data: Optional[Dict[str, Any]] = None):
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
      data: what identifies the training data (training_state.data_signature), computed from
        `train_files` when None.

    Returns:
      (checkpoint, rules, run): the model's checkpoint prefix (the best on the slice, else the last),
      the TPU-rules report, and the training-run record, whose `checkpoint_layout` is how the
      checkpoint holds the tables (`plan.with_run` takes it) and whose `warm_start` says what carried over.

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
    hardware = place_training(cfg)
    plan, model = build_training_model(cfg, plan, manifest, hardware)
    data = data or data_signature(train_files)
    check_resume(cfg, plan, manifest, state, hardware, data)  # refused from the state's record, before the rules check
    rules = _check_rules_on_host(cfg, plan, manifest, train_files, hardware)
    checkpoints, warm_report = _start(cfg, plan, manifest, train_files, state, model, hardware, steps, data, warm_from)
    selection = _selection(cfg, plan, manifest, train_files, state, hardware, holdout, steps, checkpoints.start)
    train_ds = training_dataset(cfg, plan, manifest, train_files, hardware, checkpoints.start, holdout)
    fit_start = time.perf_counter()
    checkpointer = _fit(cfg, model, train_ds, hardware, checkpoints, selection, steps, every, log_dir)
    fit_seconds = time.perf_counter() - fit_start
    checkpoint, run = _final_checkpoint(state, hardware, checkpoints, checkpointer, selection, steps, warm_report)
    run["seconds"] = _seconds(fit_seconds, selection)
    return checkpoint, rules, run


def _start(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files, state: str,
           model: RankingModel, hardware: Hardware, steps: int, data: Dict[str, Any],
           warm_from) -> Tuple[Checkpoints, Optional[Dict[str, Any]]]:
    """Where training starts: the state's last checkpoint resumed, else the last blessed model's
    weights (training_state.py); the state records what its checkpoints hold and were trained on
    (sparsecore_state.check_resumable). Returns (the run's checkpoints, what the warm start carried)."""
    checkpoints = resume_from_state(cfg, plan, manifest, train_files, state, model, hardware, steps, data)
    warm_report = warm_start_into(cfg, plan, manifest, train_files, state, model, hardware, checkpoints, warm_from)
    sparsecore_state.write_layout(state, hardware.layout, checkpoints.signature, checkpoints.data,
                                  training=checkpoints.training, steps=steps, finished=False)
    if checkpoints.start > steps:
        raise ValueError(f"checkpoint in {state} is at step {checkpoints.start}, beyond train_steps {steps}; remove it or raise train_steps")
    return checkpoints, warm_report


def _selection(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files, state: str,
               hardware: Hardware, holdout: float, steps: int, start: int) -> Optional[HoldoutSelection]:
    """The held-out selection of a run with a held-out slice (selection.py), its slice found unless
    nothing is left to train; None without a slice."""
    if not holdout:
        return None
    selection = HoldoutSelection(cfg, with_run(plan, checkpoint_layout=hardware.layout), manifest, train_files, state,
                                 holdout, steps)
    if start < steps and not selection.stopped:  # else nothing trains: no pass over the split
        selection.prepare()
    return selection


def _seconds(fit_seconds: float, selection: Optional[HoldoutSelection]) -> Dict[str, Any]:
    """The run record's `seconds`: where this process's training time went. `training`: model.fit's
    wall time less the held-out evaluations run inside it (its checkpoint saves and first-step
    tracing included); `holdout_read`: the one pass that finds the held-out slice;
    `holdout_evaluations`: every held-out evaluation with the selection's copy of the best
    checkpoint. run_fn adds `final_evaluation`; their sum against the Trainer's whole time is the
    evaluation and selection share of the run."""
    during_fit = selection.evaluation_seconds if selection is not None else 0.0
    out = {"training": round(fit_seconds - during_fit, 3), "holdout_read": 0.0, "holdout_evaluations": 0.0}
    if selection is not None:
        out.update(holdout_read=round(selection.read_seconds, 3), holdout_evaluations=round(selection.evaluation_seconds, 3))
    progress.phase(progress.TRAINER, f"training steps {out['training']:.1f} s; held-out slice read "
                                     f"{out['holdout_read']:.1f} s, evaluations and selection {out['holdout_evaluations']:.1f} s")
    return out


def _check_rules_on_host(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files,
                         hardware: Hardware) -> Dict[str, Any]:
    """The TPU-rules report of the training input and a CPU twin of the model (tpu_rules.py), with
    SparseCore's IDs-per-chip report (model_building.build_training_model's) where there is one."""
    t = cfg.training
    # The check runs on the host with a CPU twin of the model on every platform (the training
    # model may live on a TPU); the same input feeds the step.
    check_model = build_model(plan, manifest, cfg, for_training=False)
    # TensorCore-table features are fed as padded dense IDs on every platform: the TPU step's input.
    widths = tf_objects.dense_id_widths(plan)
    rules = check_tpu_rules(
        check_model, plan,
        make_dataset(train_files, manifest, hardware.per_replica, training=True, seed=t.seed, dense_id_widths=widths,
                     sequence_lengths=tf_objects.sequence_lengths(plan)),
    )
    if hardware.ids_per_chip is not None:
        rules["sparsecore_ids_per_chip"] = hardware.ids_per_chip
    exchanges = plan_gradient_exchanges(plan, hardware.replicas)
    if exchanges:  # several replicas: how the step sums the TensorCore gradients, and its bytes
        rules["gradient_exchange"] = {"replicas": hardware.replicas, "tables": {n: e.to_dict() for n, e in exchanges.items()}}
        progress.phase(progress.TRAINER, describe_exchanges(exchanges, hardware.replicas))
    return rules


def _fit(cfg: PipelineConfig, model: RankingModel, train_ds, hardware: Hardware, checkpoints: Checkpoints,
         selection: Optional[HoldoutSelection], steps: int, every: int, log_dir: Optional[str]) -> Checkpointer:
    """Trains from the start step to `steps`, checkpointing every `every` steps; returns the checkpointer."""
    t = cfg.training
    start = checkpoints.start
    checkpointer = Checkpointer(checkpoints.manager, checkpoints.step, steps,
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
        if hardware.on_tpu and checkpoints.restored is None:  # (a restored TPU model is built by its first step)
            create_variables(model, train_ds.element_spec, hardware.strategy)  # one trace of the step, not two
        elif not hardware.on_tpu and hardware.replicas == 1:
            create_variables(model, train_ds.element_spec)
        model.fit(
            train_ds,
            initial_epoch=start // every,
            epochs=math.ceil(steps / every),
            steps_per_epoch=every,
            callbacks=callbacks,
            verbose=2,
        )
    return checkpointer


def _final_checkpoint(state: str, hardware: Hardware, checkpoints: Checkpoints, checkpointer: Checkpointer,
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
    sparsecore_state.update_record(state, finished=True)  # resumed again, it trains nothing (resume_rule.py)
    run = {
        "final_step": final_step,
        "resumed_from_step": checkpoints.start,
        "resumed_from_checkpoint": checkpoints.resumed_from,
        "resumed_with_changes": checkpoints.steering,
        "checkpoint_steps": checkpointer.saved_steps,
        "state_dir": state,
        "replicas": hardware.replicas,
        "per_replica_batch_size": hardware.per_replica,
        "strategy": type(hardware.strategy).__name__,
        "checkpoint_layout": dataclasses.asdict(hardware.layout),
        "precision": hardware.precision_record(),  # what training.precision said, what was used, and why
        "warm_start": warm_report,
        # the step of the checkpoint kept as the model, and how it was chosen
        "model_step": selection.record["best_step"] if chosen else final_step,
        "model_choice": KEPT_BEST if chosen else KEPT_LAST,
        "selection": selection.record if selection is not None else None,
    }
    return chosen or final_checkpoint, run


class Checkpointer(tf.keras.callbacks.Callback):
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
    once a second and at the last step. Called by `Checkpointer` with the step it already read
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
