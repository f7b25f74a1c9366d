"""`run_fn` for TFX's standard Trainer (referenced as `components.embedding_trainer.trainer_module.run_fn`):
the Trainer's entry point, over one resolved input (resolved_input.py).

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
the same position (one batch per replica per step: `training_data.training_input`) and trains only the remaining
steps, so it ends with the same number of steps. The state records its checkpoints' table layout
(sparsecore_state.py): a SparseCore state resumes only on the same topology, and never on another
platform (TF 2.16 cannot map its stacks), so such a resume stops and says so. It records the
training data's fingerprint too (`training_state.data_signature`): a state trained on other examples (a set
`training.checkpoint_dir` kept from an earlier run) is refused before training, not taken for this
run's training, and the training config it was written under (resume_rule.py): an unfinished state
goes on under new learning rates or dropout, anything else is refused, and so is any change to a
finished one. A `training.checkpoint_dir` inside the push destination is refused
(`check_checkpoint_dir`).

The parts: resolved_input.py (what a run reads), hardware.py (where it trains), model_building.py
(the model and its optimizers), training_data.py (its input), training_state.py (resume, warm
start, data identity), training_loop.py (the loop and its callbacks), model_artifact.py (what is
left in the Model artifact) and base_model.py (the last blessed model a run starts from).
The state directory is removed once the Model artifact is complete.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf
from absl import logging

from components.contracts import artifacts
from components.contracts.plan import CheckpointLayout
from components.embedding_trainer import model_artifact
from components.embedding_trainer.base_model import continuous_start
from components.embedding_trainer.checkpoints import copy_checkpoint
from components.embedding_trainer.resolved_input import TrainingInput, resolve_training_input
from components.embedding_trainer.training_loop import train
from components.embedding_trainer.training_state import state_dir
from components.reporting import progress
from components.rules.metrics import UNDEFINED_KEY, evaluation_reasons, with_reasons
from components.planning.fitting import with_run


@progress.staged(progress.TRAINER)
def run_fn(fn_args) -> None:
    """Trains, evaluates and saves the model into the Trainer's Model artifact (module docstring).

    Args:
      fn_args: TFX's FnArgs: custom_config (the config under CONFIG_KEY, the transformed examples'
        URI under EXAMPLES_URI_KEY), train_files, eval_files, serving_model_dir, model_run_dir,
        train_steps and, in a continuous pipeline, base_model.

    Raises:
      LedgerError: the row ledger of the examples does not add up.
      ConfigError: training.checkpoint_dir is inside the push destination (check_checkpoint_dir).
      ValueError, RuntimeError, PlanError, DriftStop: from the steps it runs (`train`, `continuous_start`).
    """
    given = resolve_training_input(fn_args)
    cfg, manifest, model_root = given.config, given.manifest, given.model_dir
    state = state_dir(cfg, model_root, given.examples_uri)
    length = given.length()
    continuous = continuous_start(cfg, given.base_model, manifest, given.statistics)
    checkpoint, rules, run = train(
        cfg, given.plan, manifest, given.train_files, given.eval_files, state,
        log_dir=given.log_dir, train_steps=length["steps"], warm_from=continuous.pop("previous", None),
        train_rows=length.get("train_rows"), data=given.data_identity,
    )
    continuous["warm_start"] = run.pop("warm_start")
    run["length"] = length
    if given.tuned:  # which values came from the Tuner's search (the exporter applies them too)
        run["tuned"] = given.tuned
    # The final state (weights and optimizer slots, as the training platform saved them) goes into
    # the artifact; the state dir is removed below. Evaluation and the SavedModel come from it.
    plan = with_run(given.plan, checkpoint_layout=CheckpointLayout(**run["checkpoint_layout"]), replicas=run["replicas"])
    copy_checkpoint(checkpoint, os.path.join(model_root, artifacts.CHECKPOINT_DIR))
    metrics = _evaluate(given, plan, checkpoint, run, length)
    # The config travels with the model so the standalone exporter CLI can rebuild it without one.
    model_artifact.write_records(model_root, {
        artifacts.EMBEDDING_MANIFEST_FILE: manifest.to_dict(), artifacts.PLAN_FILE: plan.to_dict(),
        artifacts.EVAL_METRICS_FILE: metrics, artifacts.TPU_RULES_FILE: rules, artifacts.TRAINING_RUN_FILE: run,
        artifacts.TRAINER_CONFIG_FILE: json.loads(cfg.to_json()), artifacts.CONTINUOUS_FILE: continuous,
        # The next run's drift reference (base_model.drift).
        artifacts.EMBEDDING_STATISTICS_FILE: given.statistics.to_dict() if given.statistics else None})
    if not cfg.training.checkpoint_dir and tf.io.gfile.exists(state):
        tf.io.gfile.rmtree(state)


def _evaluate(given: TrainingInput, plan, checkpoint: str, run: Dict[str, Any], length: Dict[str, Any]) -> Dict[str, Any]:
    """The kept model's metrics on the eval split (an AUC or log loss undefined there, with one
    label only, is null with its reason), the SavedModel saved, and the baseline's under `baseline`."""
    cfg = given.config
    progress.phase(progress.TRAINER, "evaluating on the eval split and saving the model")
    metrics, _ = model_artifact.finish(cfg, plan, given.manifest, checkpoint, given.eval_files, given.serving_model_dir,
                                       precision=run["precision"]["used"])
    run["seconds"]["final_evaluation"] = round(metrics.pop("seconds"), 3)  # training_loop's `seconds`
    metrics = model_artifact.report_final_evaluation(
        run, with_reasons(metrics, evaluation_reasons(metrics, "eval split")))
    for name, why in (metrics.get(UNDEFINED_KEY) or {}).items():
        progress.phase(progress.TRAINER, f"eval {name}: {why}")
    if cfg.validation.baseline.enabled:
        metrics["baseline"] = model_artifact.baseline_metrics(cfg, plan, given.manifest, given.train_files,
                                                              given.eval_files, length)
    logging.info("eval metrics: %s", metrics)
    return metrics
