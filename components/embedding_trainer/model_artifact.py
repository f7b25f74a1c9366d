"""What the Trainer leaves in its Model artifact after training: the kept checkpoint rebuilt on
CPU and evaluated on the whole eval split, the SavedModel on transformed examples, the baseline
to beat, and the JSON records the exporter and the next run read (trainer_module's docstring
lists them)."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf
from absl import logging

from components.config.schema import PipelineConfig
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.embedding_model.input import make_dataset, parse_batch
from components.embedding_model.model import RankingModel
from components.embedding_model.restore import model_from_checkpoint
from components.embedding_model.saving import save_serving_model
from components.embedding_trainer.baseline import train_baseline
from components.embedding_trainer.evaluation import evaluate, evaluation_batch
from components.reporting import progress
from components.rules.metrics import UNDEFINED_KEY, json_safe


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


def finish(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, checkpoint_path: str,
           eval_files, serving_model_dir: str, precision: str = "float32") -> Tuple[Dict[str, float], RankingModel]:
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
      precision: the precision the run trained in. The model evaluated and saved is float32 (what
        is served); a bfloat16 run is scored again as its training graph computes, under
        `trained_precision` (its AUC and log loss beside the float32 ones).

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
        if precision != "float32":
            trained = evaluate(model_from_checkpoint(plan, manifest, cfg, checkpoint_path, sample, precision=precision),
                               eval_ds)
            metrics["trained_precision"] = {"precision": precision, "auc": trained["auc"],
                                            "log_loss": trained["log_loss"]}
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


def baseline_metrics(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files, eval_files,
                     length: Dict[str, Any]) -> Dict[str, Any]:
    """The validation gate's reference (the exporter's): a logistic regression trained on the same
    batches and evaluated on the eval split (baseline.py), with its AUC (or why there is none) in
    the live progress.

    Args:
      cfg: the pipeline config.
      plan: the embedding plan.
      manifest: preprocessing's manifest.
      train_files: the transformed train split's file patterns.
      eval_files: the eval split's file patterns.
      length: the run's length (run_plan.training_steps: `steps`, `train_rows`).

    Returns:
      baseline.train_baseline's metrics.
    """
    progress.phase(progress.TRAINER, "training the logistic-regression baseline (the validation gate's reference)")
    metrics = train_baseline(cfg, plan, manifest, train_files, eval_files,
                             model_steps=length["steps"], train_rows=length.get("train_rows"))
    if isinstance(metrics, dict) and metrics.get("auc") is not None:
        progress.phase(progress.TRAINER, f"baseline eval AUC {metrics['auc']:.4f}")
    elif isinstance(metrics, dict):
        why = (metrics.get(UNDEFINED_KEY) or {}).get("auc")
        progress.phase(progress.TRAINER, f"baseline eval AUC: {why or 'not measured'}")
    return metrics


def write_records(model_root: str, records: Dict[str, Optional[Any]]) -> None:
    """Writes the Model artifact's JSON records, {file name: object}; a None object is left out.

    Strict JSON: a NaN left anywhere (a diverged loss) is written as null, its reason beside it.

    Args:
      model_root: the Model artifact's directory.
      records: {file name (contracts.artifacts): JSON-able object or None}.
    """
    for name, obj in records.items():
        if obj is None:
            continue
        with tf.io.gfile.GFile(os.path.join(model_root, name), "w") as fh:
            fh.write(json.dumps(json_safe(obj), indent=2, sort_keys=True, allow_nan=False))
