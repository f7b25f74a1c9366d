"""The file names inside the artifacts the stages hand each other: one place for each name.

A stage that writes a file and a stage that reads it both take its name from here.
"""
from __future__ import annotations

import os

# EmbeddingVocabulary artifact (preprocessing): one vocabulary file per table, and the manifest.
VOCABULARY_MANIFEST_FILE = "manifest.json"


def named_file(directory: str, name: str, suffix: str) -> str:
    """The path of a file named after a table or feature: `<directory>/<name><suffix>`.

    Every file whose name holds a configured name is built here, so that none lands outside its
    artifact's directory, whatever the name: config loading already refuses a name that is not
    safe (components/rules/names.py), so this raises only on a bug or a hand-made manifest.

    Args:
      directory: the artifact's directory.
      name: the table's or feature's name.
      suffix: the rest of the file name (`.txt`, `.counts.txt`, `.npy`, ...): no separator.

    Returns:
      The file's path, directly inside `directory`.

    Raises:
      ValueError: the file would not be a plain file name directly inside `directory`.
    """
    file_name = f"{name}{suffix}"
    if not name or name.startswith(".") or any(sep in file_name for sep in ("/", "\\", "\0")):
        raise ValueError(f"{file_name!r}: not a file name inside {directory}: a table's or feature's name holds "
                         f"no separator and does not start with a dot")
    return os.path.join(directory, f"{name}{suffix}")


def vocabulary_file(directory: str, table: str) -> str:
    """A table's vocabulary file: one token per line, line i = embedding ID i.

    Args:
      directory: the EmbeddingVocabulary artifact's directory.
      table: the table's name.

    Returns:
      The file's path.
    """
    return named_file(directory, table, ".txt")


def counts_file(directory: str, table: str) -> str:
    """A table's vocabulary with each token's count (`count<TAB>token`), in the same order.

    Args:
      directory: the EmbeddingVocabulary artifact's directory.
      table: the table's name.

    Returns:
      The file's path.
    """
    return named_file(directory, table, ".counts.txt")


# EmbeddingStatistics artifact (preprocessing).
STATISTICS_FILE = "statistics.json"
STATISTICS_REPORT_FILE = "statistics.html"

# Beside the transformed examples: copies for TFX's standard Trainer, which takes only the examples
# artifact (the plan sizes SparseCore limits from the statistics).
EMBEDDING_MANIFEST_FILE = "embedding_manifest.json"
EMBEDDING_STATISTICS_FILE = "embedding_statistics.json"

# Every Examples artifact of this pipeline (ExampleGen, preprocessing): rows in/out by reason.
LEDGER_FILE = "ledger.json"

# The Trainer's Model artifact.
PLAN_FILE = "embedding_plan.json"
TRAINER_CONFIG_FILE = "pipeline_config.json"
CHECKPOINT_DIR = "checkpoints"
EVAL_METRICS_FILE = "eval_metrics.json"
TPU_RULES_FILE = "tpu_rules.json"
TRAINING_RUN_FILE = "training_run.json"
CONTINUOUS_FILE = "continuous.json"  # the last blessed model it started from, carry-over, drift
# In the Tuner's `tuner_results` artifact, beside TFX's tuner_results.json: every trial, failed ones
# too, the algorithm, the budget and the best trial (embedding_trainer/tuner.py `search_record`).
TUNING_TRIALS_FILE = "tuning_trials.json"
# In the BulkInferrer's `inference_result` artifact: whether it scored, the rows of each split it was
# given, where its PredictionLogs are (pipelines/bulk_inference.py `BulkInferrerExecutor`).
SCORING_RECORD_FILE = "scoring_record.json"

# The exporter's serving Model artifact.
SERVING_DIR = "Format-Serving"  # TFX's serving-model directory name (path_utils.serving_model_dir)
EXPORT_REPORT_FILE = "export_report.json"
# Inside the serving SavedModel (so it travels with the model when the Pusher copies it): each JSON
# signature input's raw column, dtype and features (`contracts.serving_inputs.serving_inputs_record`). In
# `assets.extra/`, the SavedModel directory TensorFlow and TF Serving leave to other files.
SERVING_INPUTS_FILE = os.path.join("assets.extra", "serving_inputs.json")
EXPORT_STAGING_DIR = "_incomplete_export"
TABLES_DIR = "tables"
TABLES_MANIFEST_FILE = "tables_manifest.json"
STORE_DIR = "store"  # export.store: row files (rows/) and the dense model (dense_model/), pushed inside a version
