"""The model kept is the best checkpoint on a held-out slice of the train split; training stops
when that slice stops improving (`training.early_stopping`).

- **The slice.** A share of the train split's records (`input.in_holdout`: by a key of each
  record's content, not of its bytes, which are not canonical; so the same records for the same
  transformed rows in every run, with any file order and on every platform) is held out of training: `TrainingConfig.holdout_fraction`, at most `max_holdout_rows` rows. The
  training input and the logistic-regression baseline read the rest (`part="train"`).
- **Reading it once.** Finding the slice means keying every record of the train split; that one
  pass runs before training (`prepare`: input.read_holdout), and the slice's serialized records
  (at most about `max_holdout_rows` rows: a few MB) stay in memory, so each evaluation reads only
  them. The pass's seconds and the slice's rows go into the record.
- **Evaluation.** At the checkpoints every `TrainingConfig.evaluation_every` steps and at the last
  step, the checkpoint just written is read into a CPU twin of the model (restore.py: the reader
  the Trainer's own evaluation and the exporter use, whatever table layout the platform saved; the
  twin is built once, before training, outside the strategy's scope, and reloaded each time) and
  scored on the slice (exact AUC and log loss, evaluation.evaluate: one compiled function per
  batch of EVAL_ROWS rows). Each evaluation's seconds (and those of the checkpoint's reload
  alone, `load_seconds`) go into its entry of the record.
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
import time
from typing import Any, Dict, List, Optional

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf
from absl import logging

from components.reporting import progress
from components.config.schema import PipelineConfig
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.embedding_model.input import read_holdout, records_dataset
from components.embedding_model.restore import build_serving_model, load_tables, open_checkpoint_tables, restore_dense
from components.embedding_trainer.checkpoints import copy_checkpoint
from components.embedding_trainer.evaluation import evaluate, evaluation_batch

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
        self.train_files, self.fraction = list(train_files), fraction
        # The slice's serialized records, read once by `prepare` (finding them reads the whole
        # train split, which each evaluation would otherwise do again), and their batches.
        self.dataset: Optional[tf.data.Dataset] = None
        # This process's seconds: the slice's one pass, and the evaluations (restore, scoring, keeping the best)
        self.read_seconds = 0.0
        self.evaluation_seconds = 0.0
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
        start, read_before = time.perf_counter(), self.read_seconds
        try:
            return self._evaluate(checkpoint_path, step, start)
        finally:  # a slice read on the way (prepare was not called) counts as the read's
            self.evaluation_seconds += time.perf_counter() - start - (self.read_seconds - read_before)

    def _evaluate(self, checkpoint_path: str, step: int, start: float) -> bool:
        metrics = self._score(checkpoint_path)
        r = self.record
        if metrics is None:
            self._write()
            return False
        r["evaluations"].append({"step": step, **metrics, "seconds": round(time.perf_counter() - start, 3)})
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
        variables would become the strategy's. The slice is read here, in one pass over the train
        split (its seconds and rows go into the record). An empty slice is recorded as unable to
        rank models.
        """
        if self._twin is not None or self.record["note"] is not None:
            return
        if self.dataset is None:
            self._read_slice()
        sample = next(iter(self.dataset), None)
        if sample is None:
            self._cannot_rank("the held-out slice of the train split is empty")
            self._write()
            return
        with tf.device("/cpu:0"):  # as Trainer.finish: nothing here may be placed on a TPU
            self._twin = build_serving_model(self.plan, self.manifest, self.cfg, "float32", sample[0], stacked=False)

    def _read_slice(self) -> None:
        start = time.perf_counter()
        held = read_holdout(self.train_files, self.manifest, self.fraction, self.options.max_holdout_rows)
        self.read_seconds += time.perf_counter() - start
        self.dataset = records_dataset(held.records, self.manifest, evaluation_batch(self.manifest))
        self.record.update(holdout_rows=held.rows, holdout_slice_rows=held.slice_rows,
                           holdout_read_seconds=round(self.read_seconds, 3))
        logging.info("held-out slice: %d rows (of %d in the slice) read in one pass over the train split in %.1f s",
                     held.rows, held.slice_rows, self.read_seconds)
        progress.phase(progress.TRAINER, f"held-out slice: {held.rows:,} rows, found in one pass over the train "
                                         f"split in {self.read_seconds:.1f} s")

    def _score(self, checkpoint_path: str) -> Optional[Dict[str, Any]]:
        self.prepare()
        if self._twin is None:
            return None
        start = time.perf_counter()
        with tf.device("/cpu:0"):
            restore_dense(self._twin, checkpoint_path)
            load_tables(self._twin, open_checkpoint_tables(checkpoint_path, self.plan))
            loaded = time.perf_counter() - start
            metrics = evaluate(self._twin, self.dataset)
        if metrics["positive_rate"] in (0.0, 1.0):
            return self._cannot_rank(f"the held-out slice's {metrics['examples']} examples all have one label")
        # the checkpoint's reload (grows with the tables) apart from the scoring (grows with the slice)
        return {**{k: metrics[k] for k in ("auc", "log_loss", "examples")}, "load_seconds": round(loaded, 3)}

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
