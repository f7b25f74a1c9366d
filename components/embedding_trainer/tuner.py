"""`tuner_fn` for TFX's stock Tuner (referenced as `components.embedding_trainer.tuner.tuner_fn`): a
KerasTuner search over the config's `tuning.space` (components/config/tuning.py).

- **A trial** is our own training (training_loop.train, the Trainer's path) of
  `tuning.steps_per_trial` steps on the Trainer's transformed train split, with the trial's values
  applied over a copy of the config; the plan is derived again from that copy and must hold the same
  tables (rows, dim, placement) as the config's own (resolved_input.check_tables_unchanged).
- **Its score** is the AUC of its last checkpoint on the held-out slice of the train split that
  the Trainer selects its checkpoint on (selection.py, `training.early_stopping`'s fraction; held
  out for the trials even when early stopping is off): never the eval split, which the validation
  gate reads. The objective is the maximum AUC.
- **The oracle** is KerasTuner's RandomSearch (`tuning.algorithm: random`) or BayesianOptimization
  (`bayesian`), seeded by `training.seed`, over at most `tuning.trials` trials.
- **Failures.** A trial that raises is recorded by KerasTuner as failed with its error and the search
  goes on; when no trial completes, the search stops with every trial's error (`NoTrialCompleted`).
- **Parallel trials** (`tuning.parallel_trials` on a Vertex AI job, TFX's google_cloud_ai_platform
  Tuner): every replica runs this tuner_fn; KerasTuner's environment (KERASTUNER_TUNER_ID,
  KERASTUNER_ORACLE_IP/PORT) makes one of them the chief oracle, which hands out the trials over
  gRPC, and the others workers that train them. Each tuner keeps its own directory (the primary
  replica holds the chief and a worker on one disk); the chief judges the search once every worker
  is done and writes `best_hyperparameters`.

TFX's Tuner executor then writes the best trial's values as `best_hyperparameters`, which the
Trainer gets as `fn_args.hyperparameters` and applies over the config (resolved_input.resolve_training_input).
Both read the same resolved input (resolved_input.py), the examples' manifest and statistics found
at the artifact's URI that our Tuner executor passes (executors.py).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from typing import Any, Dict, List, Optional

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import keras_tuner
from absl import logging
from keras_tuner.engine import base_tuner
from keras_tuner.src.distribute import utils as dist_utils  # the environment rule BaseTuner itself reads
from tfx.components.tuner.component import TunerFnResult
from tfx.utils import io_utils

from components.config.choices import TuningAlgorithm
from components.reporting import progress
from components.config.schema import PipelineConfig
from components.config.loading import apply_values, config_from_json
from components.config.tuning import checked_values, parse_space
from components.contracts.artifacts import TUNING_TRIALS_FILE
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.embedding_trainer.resolved_input import check_tables_unchanged, resolve_training_input
from components.planning.run_plan import derive_plan, training_steps
from components.embedding_trainer.training_loop import train
from components.tfx_wiring.component_keys import TUNING_RECORD_URI_KEY
from components.planning.fitting import with_run

OBJECTIVE = "auc"  # the held-out slice's AUC, maximized
STAGE = progress.TUNER  # the pipeline's node id (TFX's stock Tuner), as progress events name it
PROJECT = "embedding_tuning"


class NoTrialCompleted(RuntimeError):
    """Every trial of the search failed; the message holds each one's error."""


def search_space(space: Dict[str, Any]) -> keras_tuner.HyperParameters:
    """KerasTuner's hyperparameters of a checked `tuning.space` (components.config.tuning.parse_space).

    Args:
      space: `tuning.space`.

    Returns:
      One hyperparameter per field, named by its path: Choice for a list (of layer-width lists: of
      their JSON texts), Int or Float for a range (log sampling for {log: [lo, hi]}).
    """
    hp = keras_tuner.HyperParameters()
    for path, entry in parse_space(space).items():
        if entry["kind"] == "choice" and entry["type"] == "list":
            hp.Choice(path, [json.dumps(v) for v in entry["values"]], ordered=False)  # a Choice takes scalars
        elif entry["kind"] == "choice":
            hp.Choice(path, entry["values"], ordered=False)
        elif entry["type"] == "int":
            hp.Int(path, entry["min"], entry["max"], sampling="log" if entry["log"] else "linear")
        else:
            hp.Float(path, entry["min"], entry["max"], sampling="log" if entry["log"] else "linear")
    return hp


def trial_config(cfg: PipelineConfig, values: Dict[str, Any], steps: int) -> PipelineConfig:
    """The config one trial trains with: `values` over a copy of `cfg`, `steps` steps (rounded up
    to whole steps_per_execution) checkpointed once at the end and scored there on the held-out
    slice (early stopping on, one evaluation: the budget is the trial's, not the Trainer's length).

    Args:
      cfg: the pipeline config (unchanged).
      values: the trial's values, field path -> value.
      steps: tuning.steps_per_trial.

    Returns:
      A new resolved config.
    """
    trial = apply_values(cfg, values) if values else config_from_json(cfg.to_json())  # never the caller's object
    t = trial.training
    t.train_steps = t._whole_executions(steps)  # pylint: disable=protected-access
    t.checkpoint_every_steps = t.train_steps
    t.checkpoint_dir = None
    t.early_stopping.enabled = True
    t.early_stopping.evaluations = 1
    return trial


class EmbeddingTuner(base_tuner.BaseTuner):
    """A KerasTuner tuner whose trial trains our model (module docstring).

    Args:
      oracle: KerasTuner's oracle holding the search space.
      cfg: the pipeline config (its tuning section set).
      manifest: preprocessing's manifest.
      statistics: preprocessing's statistics, or None.
      train_files: the transformed train split's file patterns.
      directory: the tuner's working directory (each trial trains under it; removed after the trial).
    """

    def __init__(self, oracle, cfg: PipelineConfig, manifest: VocabularyManifest, statistics, train_files,
                 directory: str, record_uri: Optional[str] = None):
        # In a distributed search (KerasTuner's environment, module docstring) the chief and the
        # primary replica's worker share one disk, and `overwrite` empties the project directory:
        # each tuner gets its own.
        project = f"{PROJECT}_{os.environ['KERASTUNER_TUNER_ID']}" if dist_utils.has_chief_oracle() else PROJECT
        super().__init__(oracle=oracle, directory=directory, project_name=project, overwrite=True)
        self.cfg, self.manifest, self.statistics = cfg, manifest, statistics
        self.train_files = list(train_files)
        self.plan: EmbeddingPlan = derive_plan(cfg, manifest, statistics)
        # The rows the Trainer sizes its held-out slice by (its own length's source, run_plan).
        self.train_rows = training_steps(cfg, statistics).get("train_rows") if statistics else None
        self.results: List[Dict[str, Any]] = []
        self.record_uri = record_uri  # where the search's record goes (None: not written)

    def run_trial(self, trial, *fit_args, **fit_kwargs) -> Dict[str, float]:
        values = dict(trial.hyperparameters.values)
        cfg = trial_config(self.cfg, values, self.cfg.tuning.steps_per_trial)
        plan = derive_plan(cfg, self.manifest, self.statistics)
        check_tables_unchanged(self.plan, plan, values)
        plan = with_run(plan, vocabulary_dir=self.manifest.vocabulary_dir)
        state = os.path.join(self.project_dir, f"training_{trial.trial_id}")  # not the oracle's trial_<id>
        try:
            with progress.reported_as(progress.TRAINER, STAGE):  # the trial's training shows under the Tuner
                _, _, run = train(cfg, plan, self.manifest, self.train_files, [], state,
                                  train_steps=cfg.training.train_steps, train_rows=self.train_rows)
        finally:
            shutil.rmtree(state, ignore_errors=True)
        auc = (run.get("selection") or {}).get("best_auc")
        if auc is None:
            note = (run.get("selection") or {}).get("note") or "no held-out evaluation"
            raise keras_tuner.errors.FailedTrialError(f"trial {trial.trial_id} {values}: no held-out AUC ({note})")
        logging.info("tuning trial %s %s: held-out AUC %.5f", trial.trial_id, values, auc)
        progress.phase(STAGE, f"trial {trial.trial_id} {values}: held-out AUC {auc:.4f}")
        self.results.append({"trial_id": trial.trial_id, "values": values, OBJECTIVE: auc,
                             "steps": run["final_step"]})
        return {OBJECTIVE: float(auc)}

    def on_trial_begin(self, trial):
        super().on_trial_begin(trial)
        progress.phase(STAGE, f"trial {trial.trial_id} of at most {self.oracle.max_trials}: "
                              f"{dict(trial.hyperparameters.values)}, {self.cfg.tuning.steps_per_trial} steps")

    def search_space_summary(self, extended=False):
        """Logged, not printed (TFX's executor calls it; KerasTuner prints to stdout)."""
        logging.info("tuning space: %s", self.oracle.get_space().get_config())

    def results_summary(self, num_trials=10):
        """Logged, not printed (TFX's executor calls it; KerasTuner prints to stdout)."""
        for t in self.oracle.get_best_trials(num_trials):
            logging.info("tuning trial %s: score %s, %s", t.trial_id, t.score, t.hyperparameters.values)

    def on_search_begin(self):
        super().on_search_begin()
        if self.cfg.tuning.parallel_trials > 1 and not self._is_worker():
            progress.phase(STAGE, f"tuning.parallel_trials: {self.cfg.tuning.parallel_trials} applies to a Vertex AI "
                                  "job (kubeflow.vertex_training); here the trials train one at a time")

    def search(self, *fit_args, **fit_kwargs):
        super().search(*fit_args, **fit_kwargs)
        if dist_utils.is_chief_oracle():
            self._check_completed()  # the chief oracle's search returns when every worker is done

    def on_search_end(self):
        super().on_search_end()
        if not self._is_worker():  # a worker sees only its own trials; the chief judges the search
            if self.record_uri:
                io_utils.write_string_file(os.path.join(self.record_uri, TUNING_TRIALS_FILE),
                                           json.dumps(search_record(self.cfg, self.oracle), sort_keys=True))
            self._check_completed()
        else:
            wait_for_chief_oracle()

    def _check_completed(self):
        completed = [t for t in self.oracle.trials.values() if t.status == keras_tuner.engine.trial.TrialStatus.COMPLETED]
        if not completed:
            # A worker's error reaches the chief without its text (KerasTuner's EndTrial carries none).
            errors = "; ".join(f"trial {t.trial_id} {dict(t.hyperparameters.values)}: "
                               + ((t.message or "").strip().splitlines() or ["its error is in the log of the machine "
                                                                             "that trained it"])[-1]
                               for t in self.oracle.trials.values())
            raise NoTrialCompleted(f"tuning: none of the {len(self.oracle.trials)} trials completed ({errors}); "
                                   "fix the space (tuning.space) or the training settings")


def wait_for_chief_oracle() -> None:
    """On a Vertex AI job's primary replica, waits for the chief oracle and fails when it failed.

    TFX's worker executor (tfx/extensions/google_cloud_ai_platform/tuner/executor.py,
    `_start_chief_oracle_in_subprocess`) starts the chief as a multiprocessing child of the
    primary's worker process and never joins it: the interpreter joins it at exit and ignores its
    status. A chief that failed (`NoTrialCompleted`: every trial failed) would leave the job
    succeeding without `best_hyperparameters`, and the Trainer failing later on an empty artifact.
    So this joins the process's non-daemon children now, as the interpreter would at exit (a
    tuning worker starts no other: the chief is the only one), and checks their status. Elsewhere
    (no child) it returns at once.

    Raises:
      NoTrialCompleted: a child (the chief oracle) exited with a non-zero status; its error is in
        the log above.
    """
    for child in multiprocessing.active_children():
        if not child.daemon:
            child.join()
            if child.exitcode:
                raise NoTrialCompleted(f"tuning: the chief oracle (pid {child.pid}) failed with status {child.exitcode} "
                                       "and wrote no best_hyperparameters; its error is in this job's log above")


def search_record(cfg: PipelineConfig, oracle) -> Dict[str, Any]:
    """What the search did, for the summary and the report: the algorithm and budget, every trial
    (values under their config field names, held-out AUC, status, a failed one's last error line)
    and the best trial.

    Args:
      cfg: the config (`tuning`).
      oracle: the search's KerasTuner oracle.

    Returns:
      {"algorithm", "max_trials", "steps_per_trial", "objective", "trials": [...], "completed",
      "failed", "best": {"trial_id", "values", "score"} or None}.
    """
    trials = []
    for t in sorted(oracle.trials.values(), key=lambda t: t.trial_id):
        entry = {"trial_id": t.trial_id, "values": checked_values(dict(t.hyperparameters.values)),
                 "score": t.score, "status": str(t.status)}
        if t.status == keras_tuner.engine.trial.TrialStatus.FAILED:
            entry["error"] = ((t.message or "").strip().splitlines() or [""])[-1]
        trials.append(entry)
    best = [t for t in trials if t["status"] == "COMPLETED" and t["score"] is not None]
    best.sort(key=lambda t: -t["score"])
    tu = cfg.tuning
    return {"algorithm": str(tu.algorithm), "max_trials": tu.trials, "steps_per_trial": tu.steps_per_trial,
            "objective": "held-out AUC of the train split's slice", "trials": trials,
            "completed": len(best), "failed": sum(t["status"] == "FAILED" for t in trials),
            "best": {k: best[0][k] for k in ("trial_id", "values", "score")} if best else None}


def build_tuner(cfg: PipelineConfig, manifest: VocabularyManifest, statistics, train_files,
                directory: str, record_uri: Optional[str] = None) -> EmbeddingTuner:
    """The tuner of `cfg.tuning` on the given transformed train split.

    Args:
      cfg: the pipeline config with its `tuning` section.
      manifest: preprocessing's manifest.
      statistics: preprocessing's statistics (the train split's rows), or None.
      train_files: the transformed train split's file patterns.
      directory: the tuner's working directory.
      record_uri: where the search writes its record (`search_record`); None: nowhere.

    Returns:
      The EmbeddingTuner, its oracle holding `tuning.space`.

    Raises:
      ValueError: the config has no `tuning` section.
    """
    tu = cfg.tuning
    if tu is None:
        raise ValueError("the config has no tuning section; add one (configs/README.md, tuning) to run the Tuner")
    kwargs = dict(objective=keras_tuner.Objective(OBJECTIVE, direction="max"), max_trials=tu.trials,
                  hyperparameters=search_space(tu.space), seed=cfg.training.seed,
                  max_consecutive_failed_trials=tu.trials + 1)
    if tu.algorithm == TuningAlgorithm.BAYESIAN:
        oracle = keras_tuner.oracles.BayesianOptimizationOracle(**kwargs)
    else:
        oracle = keras_tuner.oracles.RandomSearchOracle(**kwargs)
    oracle.verbose = 0  # KerasTuner's display prints to stdout; the trials are logged and reported instead
    return EmbeddingTuner(oracle, cfg, manifest, statistics, train_files, directory, record_uri)


def tuner_fn(fn_args) -> TunerFnResult:
    """TFX Tuner's entry point: the tuner of the config in `custom_config` on the Tuner's examples.

    Args:
      fn_args: TFX's FnArgs: custom_config (the config under CONFIG_KEY, the transformed examples'
        URI under EXAMPLES_URI_KEY), train_files (the transformed train split), working_dir.

    Returns:
      TunerFnResult(tuner, fit_kwargs={}): TFX's executor runs `tuner.search()` and writes the best
      trial's values (`best_hyperparameters`) and every completed trial's score (`tuner_results`).
    """
    given = resolve_training_input(fn_args, stage=STAGE)
    tuner = build_tuner(given.config, given.manifest, given.statistics, given.train_files, given.working_dir,
                        (fn_args.custom_config or {}).get(TUNING_RECORD_URI_KEY))
    return TunerFnResult(tuner=tuner, fit_kwargs={})
