"""The model kept is the best checkpoint on a held-out slice of the train split; training stops
when that slice stops improving (`training.early_stopping`).

- **The slice.** A share of the train split's records (`input.in_holdout`: by a key of each
  record's content, not of its bytes, which are not canonical; so the same records for the same
  transformed rows in every run, with any file order and on every platform) is held out of training: `TrainingConfig.holdout_fraction`, at most `max_holdout_rows` rows. The
  training input and the logistic-regression baseline read the rest (`part="train"`).
- **Evaluation.** At the checkpoints every `TrainingConfig.evaluation_every` steps and at the last
  step, the checkpoint just written is read into a CPU twin of the model (restore.py: the reader
  the Trainer's own evaluation and the exporter use, whatever table layout the platform saved; the
  twin is built once, before training, outside the strategy's scope, and reloaded each time) and
  scored on the slice (exact AUC and log loss).
- **Selection.** The best checkpoint by holdout AUC is copied to `<state>/best`; after `patience`
  evaluations without a gain of more than `min_improvement`, training stops. The Trainer
  evaluates, saves and hands the exporter that checkpoint.
- **Never the eval split.** The selection is given the train split's files only; the eval split is
  the validation gate's, and choosing on it would overstate the model the gate compares
  (tests/test_early_stopping.py fails if the eval files are opened during training).

The record (`<state>/best/selection.json`) survives a killed run: a resumed run carries on with
the same best and count, and a run that had stopped does not train again.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf
from absl import logging

from components.reporting import progress
from components.config.schema import PipelineConfig
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.embedding_model.input import make_dataset
from components.embedding_model.restore import build_serving_model, load_tables, open_checkpoint_tables, restore_dense
from components.embedding_trainer.baseline import EVAL_BATCH  # the eval batch the baseline scores with
from components.embedding_trainer.checkpoints import copy_checkpoint
from components.embedding_trainer.evaluation import evaluate

BEST_DIR = "best"
RECORD_FILE = "selection.json"


class HoldoutSelection:
    """Scores checkpoints on the held-out slice, keeps the best one, says when to stop.

    Args:
      cfg: the pipeline config (`training.early_stopping`, the evaluation cadence).
      plan: the embedding plan with this run's checkpoint layout (`plan.with_run`), which the CPU
        twin reads the checkpoints through.
      manifest: preprocessing's manifest.
      train_files: the train split's file patterns (never the eval split's).
      state: the run's state directory; the best checkpoint and the record go to `<state>/best`.
      fraction: the share of the train split held out (`TrainingConfig.holdout_fraction`).
      total_steps: the run's length in steps.
    """

    def __init__(self, cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files,
                 state: str, fraction: float, total_steps: int):
        self.cfg, self.plan, self.manifest = cfg, plan, manifest
        self.options = cfg.training.early_stopping
        self.dir = os.path.join(state, BEST_DIR)
        self.total = total_steps
        self.every = cfg.training.evaluation_every(total_steps)
        # Kept in memory after the first full pass (at most ~max_holdout_rows rows): finding the
        # slice reads the whole train split, which each evaluation would otherwise do again.
        self.dataset = make_dataset(list(train_files), manifest, EVAL_BATCH, training=False, part="holdout",
                                    holdout_fraction=fraction).cache()
        self.record: Dict[str, Any] = self._read() or {
            "holdout_fraction": fraction, "evaluation_every": self.every, "evaluations": [],
            "best_step": None, "best_auc": None, "without_improvement": 0, "stopped_at": None, "note": None,
        }
        self._twin = None

    @property
    def stopped(self) -> bool:
        """Whether an earlier evaluation stopped training (a resumed run then trains no further)."""
        return self.record["stopped_at"] is not None

    def due(self, step: int) -> bool:
        """Whether the checkpoint of `step` is evaluated: every `every` steps and at the last.

        Args:
          step: the training step the checkpoint was written at.

        Returns:
          False once the slice was found unable to rank models; else whether `step` is the last
          step or `every` steps past the last evaluation.
        """
        if self.record["note"] is not None:  # the slice cannot rank models (see _score)
            return False
        done: List[Dict[str, Any]] = self.record["evaluations"]
        last = done[-1]["step"] if done else 0
        return step >= self.total or step - last >= self.every

    def evaluate(self, checkpoint_path: str, step: int) -> bool:
        """Scores the checkpoint of `step` on the slice; keeps it if it is the best so far.

        The record (`<state>/best/selection.json`) is written after every call.

        Args:
          checkpoint_path: the prefix of the checkpoint written at `step`.
          step: the training step it was written at.

        Returns:
          True when training should stop: `patience` evaluations without a gain of more than
          `min_improvement`, before the last step.
        """
        metrics = self._score(checkpoint_path)
        r = self.record
        if metrics is None:
            self._write()
            return False
        r["evaluations"].append({"step": step, **metrics})
        progress.evaluated(progress.TRAINER, step, {"holdout_auc": metrics["auc"]})
        if r["best_auc"] is None or metrics["auc"] > r["best_auc"] + self.options.min_improvement:
            self._keep(checkpoint_path)
            r.update(best_step=step, best_auc=metrics["auc"], without_improvement=0)
        else:
            r["without_improvement"] += 1
        stop = r["without_improvement"] >= self.options.patience and step < self.total
        if stop:
            r["stopped_at"] = step
            logging.info("early stopping at step %d: holdout AUC %.4f at step %d, not improved in %d evaluations",
                         step, r["best_auc"], r["best_step"], r["without_improvement"])
        self._write()
        return stop

    def best_checkpoint(self) -> Optional[str]:
        """The best checkpoint so far.

        Returns:
          Its prefix under `<state>/best`, None when none was kept (the slice could not rank models).
        """
        return tf.train.latest_checkpoint(self.dir) if self.record["best_step"] is not None else None

    def prepare(self) -> None:
        """Builds the CPU twin that scores checkpoints; call it before training.

        Before, because Keras runs callbacks inside the training strategy's scope, where the twin's
        variables would become the strategy's. An empty slice is recorded as unable to rank models.
        """
        if self._twin is not None or self.record["note"] is not None:
            return
        sample = next(iter(self.dataset), None)
        if sample is None:
            self._cannot_rank("the held-out slice of the train split is empty")
            self._write()
            return
        with tf.device("/cpu:0"):  # as Trainer.finish: nothing here may be placed on a TPU
            self._twin = build_serving_model(self.plan, self.manifest, self.cfg, "float32", sample[0], stacked=False)

    def _score(self, checkpoint_path: str) -> Optional[Dict[str, Any]]:
        self.prepare()
        if self._twin is None:
            return None
        with tf.device("/cpu:0"):
            restore_dense(self._twin, checkpoint_path)
            load_tables(self._twin, open_checkpoint_tables(checkpoint_path, self.plan))
            metrics = evaluate(self._twin, self.dataset)
        if metrics["positive_rate"] in (0.0, 1.0):
            return self._cannot_rank(f"the held-out slice's {metrics['examples']} examples all have one label")
        return {k: metrics[k] for k in ("auc", "log_loss", "examples")}

    def _cannot_rank(self, why: str) -> None:
        self.record["note"] = f"{why}: no AUC to choose by, so the last checkpoint is the model (no early stopping)"
        logging.warning("%s", self.record["note"])
        return None

    def _keep(self, checkpoint_path: str) -> None:
        if tf.io.gfile.exists(self.dir):
            for old in tf.io.gfile.glob(os.path.join(self.dir, "ckpt-*")):
                tf.io.gfile.remove(old)
        copy_checkpoint(checkpoint_path, self.dir)

    def _path(self) -> str:
        return os.path.join(self.dir, RECORD_FILE)

    def _read(self) -> Optional[Dict[str, Any]]:
        if not tf.io.gfile.exists(self._path()):
            return None
        with tf.io.gfile.GFile(self._path()) as fh:
            return json.loads(fh.read())

    def _write(self) -> None:
        tf.io.gfile.makedirs(self.dir)
        with tf.io.gfile.GFile(self._path(), "w") as fh:
            fh.write(json.dumps(self.record, sort_keys=True))
