"""One resolved training input: what the Trainer's `run_fn`, the Tuner's `tuner_fn` and the TPU
smoke test work from, built once from TFX's `FnArgs` and then only read.

`resolve_training_input(fn_args)` reads and checks, in this order: the config (with the Tuner's
best values applied, when the Trainer has them), the push destination (a `training.checkpoint_dir`
inside it is refused), the transformed examples' manifest and statistics (found at the examples
artifact's URI, which our Trainer and Tuner executors pass in `custom_config`: executors.py), the
row ledger (it must add up), the features (the config's must read them as preprocessing did), and the
embedding plan (tuned values may not change a table). The data identity
(data_io/data_identity.py) is computed on first use.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from typing import Any, Dict, List, Optional, Tuple

from tfx.dsl.io import fileio  # exists: any filesystem TFX reads (gs://, local)
from tfx.utils import io_utils  # read_string_file: the same

from components.config.checks import check_checkpoint_dir
from components.config.loading import apply_values
from components.config.schema import PipelineConfig
from components.config.tuning import checked_values, values_of
from components.contracts import artifacts
from components.contracts.manifest import VocabularyManifest, feature_entries
from components.contracts.plan import EmbeddingPlan, PlanError
from components.contracts.statistics import EmbeddingStatistics
from components.embedding_trainer.base_model import serving_dir_of
from components.planning.run_plan import derive_plan, training_steps
from components.embedding_trainer.training_state import data_signature
from components.data_io.data_identity import training_data_identity
from components.reporting.errors import InputError
from components.rows.ledger import check_ledger
from components.tfx_wiring.component_keys import EXAMPLES_URI_KEY
from components.tfx_wiring.executor_base import config_of
from components.planning.fitting import with_run


@dataclasses.dataclass
class TrainingInput:
    """Everything a training run reads, resolved once (module docstring).

    Attributes:
      config: the pipeline config with the tuned values applied.
      untuned: the config as the pipeline passed it.
      tuned: the Tuner's best values applied ({} without a Tuner).
      examples_uri: the transformed examples' artifact URI (the manifest and statistics are there).
      train_files, eval_files: the split files' patterns (TFX's FnArgs).
      manifest: preprocessing's vocabulary manifest.
      statistics: preprocessing's statistics, None when the examples have none.
      plan: the embedding plan of `config`, with the vocabularies' location.
      serving_dir: the push destination, None when neither the pipeline nor the registry says.
      base_model: TFX's `base_model` (the LastBlessedModel lookup), None on a first run.
      model_dir: the Trainer's Model artifact directory (None for the Tuner).
      serving_model_dir, log_dir: where the SavedModel and TensorBoard's logs go (the Trainer's).
      train_steps: TFX's TrainArgs.num_steps (None or 0: derived, run_plan.training_steps).
      working_dir: the Tuner's working directory.
    """

    config: PipelineConfig
    untuned: PipelineConfig
    tuned: Dict[str, Any]
    examples_uri: str
    train_files: List[str]
    eval_files: List[str]
    manifest: VocabularyManifest
    statistics: Optional[EmbeddingStatistics]
    plan: EmbeddingPlan
    serving_dir: Optional[str] = None
    base_model: Optional[str] = None
    model_dir: Optional[str] = None
    serving_model_dir: Optional[str] = None
    log_dir: Optional[str] = None
    train_steps: Optional[int] = None
    working_dir: Optional[str] = None

    @functools.cached_property
    def data_identity(self) -> Dict[str, Any]:
        """What identifies the training data (data_io/data_identity.py: the input ExampleGen read and
        the data stages' config; else training_state.data_signature), read once."""
        ledger = self.statistics.ledger if self.statistics else None
        return training_data_identity(self.untuned, ledger, lambda: data_signature(self.train_files))

    def length(self) -> Dict[str, Any]:
        """The run's length in steps and where it comes from (run_plan.training_steps)."""
        return training_steps(self.config, self.statistics, self.train_steps)


def examples_uri_of(fn_args) -> str:
    """The transformed examples' artifact URI that our Trainer and Tuner executors pass.

    Args:
      fn_args: TFX's FnArgs (or an object with its fields).

    Returns:
      `custom_config[EXAMPLES_URI_KEY]`.

    Raises:
      ValueError: it is missing (a caller that builds FnArgs itself must pass it).
    """
    uri = (getattr(fn_args, "custom_config", None) or {}).get(EXAMPLES_URI_KEY)
    if not uri:
        raise ValueError(f"custom_config has no {EXAMPLES_URI_KEY!r}: run the Trainer and Tuner with this project's "
                         "executors (components/embedding_trainer/executors.py, as pipelines/pipeline.py wires them), "
                         "or pass the transformed examples' artifact URI under that key")
    return uri


def read_manifest(examples_uri: str) -> VocabularyManifest:
    """The manifest preprocessing wrote at the transformed examples' artifact URI.

    Args:
      examples_uri: the transformed examples' artifact URI.

    Returns:
      The vocabulary manifest.
    """
    path = os.path.join(examples_uri, artifacts.EMBEDDING_MANIFEST_FILE)
    return VocabularyManifest.from_json(io_utils.read_string_file(path), path)


def read_statistics(examples_uri: str) -> Optional[EmbeddingStatistics]:
    """The statistics preprocessing copied beside the transformed examples.

    Args:
      examples_uri: the transformed examples' artifact URI.

    Returns:
      The statistics, None when the examples have no copy (the plan then reports SparseCore limits
      as unknown).
    """
    path = os.path.join(examples_uri, artifacts.EMBEDDING_STATISTICS_FILE)
    return EmbeddingStatistics.from_json(io_utils.read_string_file(path), path) if fileio.exists(path) else None


def read_plan(model_uri: str) -> EmbeddingPlan:
    """The embedding plan a Trainer Model artifact holds.

    Args:
      model_uri: the Model artifact's directory.

    Returns:
      The plan of its `embedding_plan.json`.
    """
    path = os.path.join(model_uri, artifacts.PLAN_FILE)
    return EmbeddingPlan.from_json(io_utils.read_string_file(path), path)


def tuned_config(cfg: PipelineConfig, fn_args) -> Tuple[PipelineConfig, Dict[str, Any]]:
    """The config with the Tuner's best values applied (TFX's `hyperparameters` input, which the
    Trainer hands run_fn as `fn_args.hyperparameters`), and those values ({} without a Tuner)."""
    values = checked_values(values_of(getattr(fn_args, "hyperparameters", None)))  # layer widths as lists
    return apply_values(cfg, values), values


def check_tables_unchanged(before: EmbeddingPlan, after: EmbeddingPlan, tuned: Dict[str, Any]) -> None:
    """Raises PlanError when tuned values changed a table's rows, dim or placement (the config's
    check allows only fields that cannot: components/config/tuning.py)."""
    a, b = ({name: (t.rows, t.dim, str(t.placement)) for name, t in plan.tables.items()} for plan in (before, after))
    if a != b:
        changed = sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))
        raise PlanError(f"the tuned values {json.dumps(tuned, sort_keys=True)} changed the plan's tables "
                        f"{', '.join(changed)} (rows, dim, placement); a trial may not change them")


def check_rows_to_train(cfg: PipelineConfig, statistics: Optional[EmbeddingStatistics], stage: str) -> None:
    """Refuses examples with no row to train on or none to evaluate on, before any step.

    A 2-row input split into 2 train rows and no eval row failed deep in the Trainer (`StopIteration`,
    or no files matching an empty split).

    Args:
      cfg: the config (the held-out share of early stopping: TrainingConfig.trained_rows).
      statistics: preprocessing's statistics (None: nothing is known, nothing refused).
      stage: the stage named in the message.

    Raises:
      InputError: one line with the rows of each split and what to change.
    """
    if statistics is None:
        return
    rows = {s: int(v.get("examples_written", 0)) for s, v in statistics.splits.items()}
    train, evaluated = rows.get("train", 0), rows.get("eval", 0)
    trained = cfg.training.trained_rows(train)
    if trained >= 1 and evaluated >= 1:
        return
    held = f" ({train - trained:,} of them held out for early stopping)" if train != trained else ""
    raise InputError(f"{stage}: the train split holds {train:,} rows{held} and the eval split {evaluated:,}: a run "
                     "needs rows to train on and rows to evaluate on; give the pipeline more rows (each row's split "
                     "is a hash of its content: input.train_buckets and input.eval_buckets set the shares)")


def _same(a: Any, b: Any) -> bool:
    """Equal, a fill value of NaN equal to NaN."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def check_features_match(cfg: PipelineConfig, manifest: VocabularyManifest, stage: str) -> None:
    """Refuses a config whose features are not those the examples were preprocessed with, or that
    reads one of them otherwise (its column, table, separator, max_length, weight column, fill value).

    A config with fewer categorical features than preprocessing's passed the plan and failed in
    the model's build with a KeyError naming the first missing feature; one that moved a feature to
    another table would train IDs counted in one vocabulary as rows of another.

    Args:
      cfg: the config the stage runs with (tuned values cannot change features).
      manifest: preprocessing's manifest.
      stage: the stage named in the refusal.

    Raises:
      InputError: one line naming each difference and what to change.
    """
    dense, categorical = feature_entries(cfg)
    differences = []
    for kind, config_entries, data_entries in (("categorical", categorical, manifest.categorical_features),
                                               ("dense", dense, manifest.dense_features)):
        ours, theirs = {e.name: e for e in config_entries}, {e.name: e for e in data_entries}
        for names, where in ((sorted(set(ours) - set(theirs)), "in the config but not in the examples"),
                             (sorted(set(theirs) - set(ours)), "in the examples but not in the config")):
            if names:
                differences.append(f"{kind} features {', '.join(names)} are {where}")
        for name in sorted(set(ours) & set(theirs)):
            a, b = ours[name], theirs[name]
            differences += [f"{name}.{f.name} is {getattr(a, f.name)!r} in the config, {getattr(b, f.name)!r} in the "
                            "examples" for f in dataclasses.fields(a) if not _same(getattr(a, f.name), getattr(b, f.name))]
    if differences:
        raise InputError(f"{stage}: the examples were preprocessed with other features than this config names: "
                         f"{'; '.join(differences)}; run preprocessing with this config, or give the {stage} the "
                         "config preprocessing ran with")


def resolve_training_input(fn_args, stage: str = "Trainer") -> TrainingInput:
    """The training input of TFX's FnArgs, read and checked once (module docstring).

    Args:
      fn_args: TFX's FnArgs: custom_config (the config under CONFIG_KEY, the examples' URI under
        EXAMPLES_URI_KEY, the push destination under SERVING_DIR_KEY), train_files, eval_files and,
        for the Trainer, serving_model_dir, model_run_dir, train_steps, hyperparameters, base_model;
        for the Tuner, working_dir.
      stage: the stage named in a refusal (a ledger that does not add up, no rows, other features).

    Returns:
      The TrainingInput.

    Raises:
      ValueError: the examples' URI is missing (examples_uri_of).
      ConfigError: training.checkpoint_dir is inside the push destination (check_checkpoint_dir).
      LedgerError: the row ledger of the examples does not add up.
      InputError: no rows to train or evaluate on, or the config names or reads its features
        otherwise than the examples were preprocessed with.
      PlanError: the config gives no plan, or the tuned values changed a table.
    """
    untuned = config_of(fn_args.custom_config)
    # With a Tuner: its best values over the config (the state key and pipeline_config.json see them).
    cfg, tuned = tuned_config(untuned, fn_args)
    serving_dir = serving_dir_of(fn_args)
    check_checkpoint_dir(cfg.training.checkpoint_dir, serving_dir)
    examples_uri = examples_uri_of(fn_args)
    manifest, statistics = read_manifest(examples_uri), read_statistics(examples_uri)
    # No training on rows that were lost (or invented) on the way: the ledger must add up.
    check_ledger(statistics.ledger if statistics else None, stage)
    check_rows_to_train(cfg, statistics, stage)
    check_features_match(cfg, manifest, stage)
    plan = with_run(derive_plan(cfg, manifest, statistics), vocabulary_dir=manifest.vocabulary_dir)
    if tuned:
        check_tables_unchanged(derive_plan(untuned, manifest, statistics), plan, tuned)
    serving_model_dir = getattr(fn_args, "serving_model_dir", None)
    return TrainingInput(
        config=cfg, untuned=untuned, tuned=tuned, examples_uri=examples_uri,
        train_files=list(fn_args.train_files), eval_files=list(getattr(fn_args, "eval_files", None) or []),
        manifest=manifest, statistics=statistics, plan=plan, serving_dir=serving_dir,
        base_model=getattr(fn_args, "base_model", None) or None,
        model_dir=os.path.dirname(serving_model_dir.rstrip("/")) if serving_model_dir else None,
        serving_model_dir=serving_model_dir, log_dir=getattr(fn_args, "model_run_dir", None),
        train_steps=getattr(fn_args, "train_steps", None), working_dir=getattr(fn_args, "working_dir", None))
