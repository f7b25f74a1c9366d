"""The run's summary: what a local run did, read back from its artifacts (`summarize`), and its
report (`summary_report`, rendered by components/reporting/report.py like every other tool's).

The serving-model row names the model this run pushed, or says that none was pushed and why (the
gate's reasons); the exit status follows from the same facts (`exit_status`). Flagged features are
grouped where they read the same, with what to do and the config fields that decide
(pipelines/feature_health_view.py); rows wrap at `SUMMARY_WIDTH` columns.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

from components.config.schema import PipelineConfig
from components.config.tuning import checked_values
from components.contracts.artifacts import (
    CONTINUOUS_FILE, EVAL_METRICS_FILE, EXPORT_REPORT_FILE, LEDGER_FILE, STATISTICS_FILE, TRAINING_RUN_FILE,
    SCORING_RECORD_FILE, TUNING_TRIALS_FILE,
)
from components.contracts.serving_inputs import renamed_inputs_line
from components.model_registry.registry import RegistryError, lookup
from components.reporting.report import (KEPT_BEST, KEPT_LAST, LABEL_WIDTH, Report, count_list, kept_model, reasons_list,
                                         skipped_line)
from components.rules.metrics import UNDEFINED_KEY
from pipelines.feature_health_view import feature_health_hints, feature_health_lines
from pipelines.pipeline import SERVING_DIR

# Exit statuses of `python -m pipelines run` (and demo, continuous): README "Your own data".
EXIT_PUSHED = 0  # the run worked and pushed its model
EXIT_FAILED = 1  # a component failed
EXIT_BAD_INPUT = 2  # refused before anything ran: bad configuration or input, sizes, output directory
EXIT_NOT_PUSHED = 3  # the run worked, but the validation gate kept the model back

# The summary's widest line: rows wrap to it (`wrap_rows`), so a terminal never scrolls sideways.
SUMMARY_WIDTH = 100


def readonly_store(metadata_path: str):
    """A run's SQLite ML Metadata store, opened read-only; None when the file does not exist (yet)."""
    # lazy: ML Metadata loads protobufs this module's report functions do not need
    from ml_metadata.metadata_store.metadata_store import MetadataStore
    from ml_metadata.proto.metadata_store_pb2 import ConnectionConfig, SqliteMetadataSourceConfig

    if not os.path.exists(metadata_path):
        return None
    config = ConnectionConfig()
    config.sqlite.filename_uri = metadata_path
    config.sqlite.connection_mode = SqliteMetadataSourceConfig.READONLY
    return MetadataStore(config)


def run_artifacts(metadata_path: str, since: float) -> Dict[str, str]:
    """The artifacts this run's executions produced or reused, read from its ML Metadata.

    A run's executions are those created since it started (the output directory's lock keeps a
    second run out meanwhile, pipelines/runner.py `output_dir_lock`): each completed one, and each
    that TFX's launcher took from the cache (state CACHED, its OUTPUT events on the reused
    artifacts: tfx/orchestration/portable/execution_publish_utils.py `publish_cached_executions`).
    An earlier run's newer-looking directory is never one of them.

    Args:
      metadata_path: the run's SQLite ML Metadata file.
      since: when the run started (`time.time()`).

    Returns:
      {"<node id>.<output key>": artifact URI}, e.g. {"Trainer.model": ".../Trainer/model/7"}; for
      a node that ran more than once in the run, its last execution's.
    """
    # lazy: ML Metadata and TFX load protobufs this module's report functions do not need
    from ml_metadata.proto.metadata_store_pb2 import Event, Execution
    from tfx.dsl.compiler.constants import NODE_CONTEXT_TYPE_NAME, PIPELINE_CONTEXT_TYPE_NAME

    store = readonly_store(metadata_path)
    if store is None:
        return {}
    since_ms = int(since * 1000)
    done = (Execution.COMPLETE, Execution.CACHED)
    runs = sorted((e for e in store.get_executions() if e.create_time_since_epoch >= since_ms
                   and e.last_known_state in done), key=lambda e: e.id)
    if not runs:
        return {}
    events = [ev for ev in store.get_events_by_execution_ids([e.id for e in runs]) if ev.type == Event.OUTPUT]
    uris = {a.id: a.uri for a in store.get_artifacts_by_id(sorted({ev.artifact_id for ev in events}))}
    nodes = {}
    for e in runs:
        contexts = store.get_contexts_by_execution(e.id)
        pipeline = next((c.name for c in contexts if c.type == PIPELINE_CONTEXT_TYPE_NAME), "")
        node = next((c.name for c in contexts if c.type == NODE_CONTEXT_TYPE_NAME), None)
        if node is not None:
            nodes[e.id] = node[len(pipeline) + 1:] if pipeline and node.startswith(pipeline + ".") else node
    found: Dict[str, str] = {}
    for ev in sorted(events, key=lambda ev: ev.execution_id):  # a later execution of a node wins
        if ev.execution_id in nodes and ev.path.steps and ev.artifact_id in uris:
            found[f"{nodes[ev.execution_id]}.{ev.path.steps[0].key}"] = uris[ev.artifact_id]
    return found


def artifact_file(artifacts: Dict[str, str], output: str, name: str) -> Optional[str]:
    """A file inside one of this run's artifacts (`run_artifacts`), or None when the run made no such
    artifact.

    Args:
      artifacts: this run's artifacts.
      output: `<node id>.<output key>`, e.g. `Trainer.model`.
      name: the file's name inside the artifact.
    """
    uri = artifacts.get(output)
    return os.path.join(uri, name) if uri else None


def _read(path: Optional[str]) -> Optional[Dict[str, Any]]:
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    return None


def summarize(cfg: PipelineConfig, output_dir: str, artifacts: Dict[str, str]) -> Dict[str, Any]:
    """Reads what a local run did back from its artifacts: the ones its own executions made or
    reused (`run_artifacts`), never merely the newest on disk.

    Args:
      cfg: the run's configuration.
      output_dir: the run's output folder (its push destination).
      artifacts: this run's artifacts (`run_artifacts`); recorded in the summary as `artifacts`.

    Returns:
      The summary: the ledger, feature warnings, input span, what is served and whether this run
      pushed it, rows read and dropped, vocabulary sizes, warm start and drift, AUCs (an undefined
      one None, its reason under `<key>_undefined`), the gate's and the Evaluator's decisions,
      training length, and the export's parity, layout and compression. Parts whose artifact is
      missing are None.
    """
    def read(output: str, name: str) -> Optional[Dict[str, Any]]:
        return _read(artifact_file(artifacts, output, name))

    stats = read("EmbeddingPreprocess.statistics", STATISTICS_FILE)
    gen = read("EmbeddingExampleGen.examples", LEDGER_FILE)
    metrics = read("Trainer.model", EVAL_METRICS_FILE)
    training_run = read("Trainer.model", TRAINING_RUN_FILE)
    continuous = read("Trainer.model", CONTINUOUS_FILE)
    report = read("EmbeddingExporter.serving_model", EXPORT_REPORT_FILE)
    served = served_model(os.path.join(output_dir, SERVING_DIR))
    this_run = artifacts.get("EmbeddingExporter.serving_model") if report else None
    meta = _read(cfg.input.path + ".meta.json") if os.path.isfile(cfg.input.path) else None
    health = (stats or {}).get("feature_health") or {}
    return {
        "artifacts": dict(artifacts),
        "ledger": (stats or {}).get("ledger"),
        "feature_warnings": _feature_warnings(cfg, health),
        # the limits the warnings were drawn with (input.warn_invalid_share, input.max_invalid_share)
        "feature_health_limits": {k: health.get(k) for k in ("rows", "warn_invalid_share", "max_invalid_share")}
        if health else None,
        **_example_gen_summary(gen),
        **_served_summary(served, this_run),
        "rows_read": {s: v["examples_read"] for s, v in stats["splits"].items()} if stats else None,
        "rows_dropped": {s: v["examples_dropped"] for s, v in stats["splits"].items()} if stats else None,
        "vocabulary_sizes": {t: v["vocabulary_size"] for t, v in stats["tables"].items()} if stats else None,
        "continuous": continuous_summary(continuous),
        **_eval_aucs(metrics, training_run),
        "validation": _gate_validation(report),
        "evaluator": _evaluator_verdict(cfg, artifacts),
        "serving_model_this_run": this_run,
        "training": training_length(cfg, training_run, stats),
        **_optional_steps(artifacts, read, metrics, training_run),
        "eval_log_loss": metrics["log_loss"] if metrics else None,
        "eval_log_loss_undefined": undefined_reason(metrics, "log_loss"),
        "best_achievable_auc": meta["best_achievable_auc"] if meta else None,
        "export_parity": report["parity"] if report else None,
        "export_layout": report["layout"]["detected"] if report and "layout" in report else None,
        # {raw column: JSON signature input} where the input is not the column itself (docs/export.md)
        "serving_inputs_renamed": report.get("serving_inputs_renamed") if report else None,
        "export_compression": _export_compression(report),
    }


def _example_gen_summary(gen: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """From ExampleGen's ledger: the input read (span, files, what was not read) and the rows it
    dropped before the split (a missing or invalid label), by reason."""
    if not gen:
        return {"input": None, "rows_dropped_before_split": None}
    stage = gen.get("stages", [{}])[0]
    return {"input": {"span": stage.get("span"), "files": len(stage.get("files", [])),
                      "skipped": stage.get("files_skipped", []), "skipped_count": stage.get("files_skipped_count", 0)},
            "rows_dropped_before_split": dict(stage.get("dropped") or {})}


def _feature_warnings(cfg: PipelineConfig, health: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The statistics' feature health entries that are not `ok`, each with its dense fill value."""
    fill_values = {d.name: d.fill_value for d in cfg.dense_features}
    return {
        n: {"share": e["share"], "status": e["status"], "reasons": {k: v for k, v in e["reasons"].items() if v},
            "kind": e.get("kind"), "unusable_rows": e.get("unusable_rows"), "rows": health.get("rows"),
            **({"fill_value": fill_values[n]} if n in fill_values else {})}
        for n, e in health.get("features", {}).items() if e["status"] != "ok"
    }


def _eval_aucs(metrics: Optional[Dict[str, Any]], training_run: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The Trainer's eval AUCs, the model's and the baseline's, each with why it is undefined, and
    the model they are of."""
    return {
        "eval_auc": metrics["auc"] if metrics else None,
        # the model those metrics are of: the checkpoint kept (its step, how it was chosen)
        "eval_model": eval_model(metrics, training_run) if metrics else None,
        # why a metric the Trainer measured is undefined (one label in the eval split): None when defined
        "eval_auc_undefined": undefined_reason(metrics, "auc"),
        "baseline_auc": (metrics.get("baseline") or {}).get("auc") if metrics else None,
        "baseline_auc_undefined": undefined_reason((metrics or {}).get("baseline"), "auc"),
    }


def _precision(metrics: Optional[Dict[str, Any]], training_run: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The dense network's precision (what was set, used and why) and, for a bfloat16 run, its
    eval AUC as trained beside the eval AUC served in float32 (the Trainer's `eval_auc`)."""
    if not (training_run or {}).get("precision"):
        return None
    trained = (metrics or {}).get("trained_precision") or {}
    return dict(training_run["precision"], trained_auc=trained.get("auc"))


def tuning_summary(record: Optional[Dict[str, Any]], training_run: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The Tuner's search (its record: tuner.py `search_record`) and whether the Trainer trained
    with the best trial's values (its training_run.json `tuned`); None without a Tuner."""
    if not record:
        return None
    tuned = (training_run or {}).get("tuned")
    tuned = checked_values(tuned) if tuned else tuned  # typed as the record's (KerasTuner holds lists as JSON)
    best = record.get("best") or {}
    return dict(record, trainer_values=tuned,
                trainer_used_best=bool(best) and tuned is not None and tuned == best.get("values"))


def _optional_steps(artifacts: Dict[str, str], read, metrics, training_run) -> Dict[str, Any]:
    """The precision the Trainer used; the Tuner's search; BulkInferrer's record (rows scored per
    split, where, or why none: pipelines/bulk_inferrer_executor.py); the serving check's verdict
    (serving_check.enabled: embedding_exporter/serving_check_step.py); the file scored (bulk_inference.path:
    embedding_exporter/scoring_step.py). None where a run has no such step."""
    return {"precision": _precision(metrics, training_run),
            "tuning": tuning_summary(read("Tuner.tuner_results", TUNING_TRIALS_FILE), training_run),
            "bulk_inference": read("BulkInferrer.inference_result", SCORING_RECORD_FILE),
            "file_scoring": read("FileScoring.scores", SCORING_RECORD_FILE),
            "serving_check": _serving_check(artifacts)}


def _serving_check(artifacts: Dict[str, str]) -> Optional[Dict[str, Any]]:
    """The serving check's record and verdict (its InfraBlessing's files), None without the step."""
    uri = artifacts.get("ServingCheck.blessing")
    record = _read(os.path.join(uri, "serving_check.json")) if uri else None
    if record is None:
        return None
    return dict(record, blessed=os.path.isfile(os.path.join(uri, "INFRA_BLESSED")))


def _gate_validation(report: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The exporter's gate decision from its report: blessed, each check's figures, the reasons."""
    if not (report and "validation" in report):
        return None
    return {
        "blessed": report["validation"]["blessed"],
        "checks": [{k: c.get(k) for k in ("name", "passed", "model_auc", "reference_auc", "margin", "reason")}
                   for c in report["validation"]["checks"]],
        "reasons": report["validation"]["reasons"],
    }


def _evaluator_verdict(cfg: PipelineConfig, artifacts: Dict[str, str]) -> Optional[Dict[str, Any]]:
    """TFX's Evaluator's blessing (evaluator.enabled), from its BLESSED / NOT_BLESSED file; None
    without one."""
    blessing_dir = artifacts.get("Evaluator.blessing") if cfg.evaluator.enabled else None
    blessing = next((os.path.join(blessing_dir, n) for n in ("BLESSED", "NOT_BLESSED")
                     if os.path.isfile(os.path.join(blessing_dir, n))), None) if blessing_dir else None
    return {"blessed": os.path.basename(blessing) == "BLESSED"} if blessing else None


def _export_compression(report: Optional[Dict[str, Any]]) -> Optional[Dict[str, Dict[str, Any]]]:
    """Per compared table dtype: its tables' bytes and the AUC change it costs (the export report's)."""
    if not report:
        return None
    return {d: {"table_bytes": v["table_bytes"], "auc_change": v["auc_change"]}
            for d, v in report.get("compression", {}).items()}


def undefined_reason(metrics: Optional[Dict[str, Any]], name: str) -> Optional[str]:
    """Why a metric of an evaluation is undefined, as its stage recorded it (rules/metrics.py `with_reasons`).

    Args:
      metrics: the evaluation's metrics (`eval_metrics.json`, or its `baseline`); None when not measured.
      name: the metric, e.g. `auc`.

    Returns:
      None when there is no evaluation or the metric is a number; else its reason ("undefined: the
      300-row eval split holds only label 0"), or a sentence saying none was recorded.
    """
    if not isinstance(metrics, dict) or metrics.get(name) is not None:
        return None
    recorded = (metrics.get(UNDEFINED_KEY) or {}).get(name)
    return recorded or f"undefined: eval_metrics.json records no {name} and no reason"


def training_length(cfg: PipelineConfig, run: Optional[Dict[str, Any]], stats: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Says how long the model trained, and how long the defaults would train it.

    Args:
      cfg: the run's configuration (batch size, epochs).
      run: the Trainer's `training_run.json`, or None.
      stats: preprocessing's `statistics.json` (the train split's rows), or None.

    Returns:
      None without a training run; else steps, length source, batch size, train rows and the rows
      trained on (TrainingConfig.trained_rows: less the held-out slice), early stopping's choice,
      and, when the rows are known, epochs trained (passes over the rows trained on,
      TrainingConfig.epochs_trained) and the defaults' steps and epochs (training.train_steps
      unset: training.epochs passes).
    """
    if not run:
        return None
    t = cfg.training
    rows = ((stats or {}).get("splits") or {}).get("train", {}).get("examples_written")
    out: Dict[str, Any] = {"steps": run.get("final_step"), "source": (run.get("length") or {}).get("source"),
                           "batch_size": t.batch_size, "train_rows": rows,
                           "trained_rows": t.trained_rows(rows) if rows else None}
    selection = run.get("selection")
    if selection and selection.get("best_auc") is not None:  # early stopping: the checkpoint kept, where training stopped
        out["model_step"] = run.get("model_step")
        out["stopped_early"] = selection.get("stopped_at") is not None
        out["holdout_auc"] = selection["best_auc"]
    elif selection:  # the held-out slice could not rank models: the last checkpoint is the model
        out["selection_note"] = selection.get("note")
    if rows and out["steps"]:
        # passes over the rows trained on (the train split less the held-out slice), as the planned length counts them
        out["epochs"] = round(t.epochs_trained(out["steps"], rows), 2)
        out["default_steps"] = t.steps_for_epochs(rows)
        out["default_epochs"] = t.epochs_for(rows)
    return out


def eval_model(metrics: Optional[Dict[str, Any]], run: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Which model the eval split's metrics are of: the checkpoint the Trainer kept.

    Args:
      metrics: the Trainer's `eval_metrics.json` (`model_step`, `model_choice`), or None.
      run: its `training_run.json`, which says the same for artifacts whose metrics do not, or None.

    Returns:
      {step, choice} (choice: report.KEPT_BEST or KEPT_LAST); None when neither file says.
    """
    if metrics and metrics.get("model_step") is not None:
        return {"step": metrics["model_step"], "choice": metrics.get("model_choice") or KEPT_LAST}
    if run and run.get("model_step") is not None:
        best = (run.get("selection") or {}).get("best_step")
        chosen = run.get("model_choice") or (KEPT_BEST if best is not None and best == run["model_step"] else KEPT_LAST)
        return {"step": run["model_step"], "choice": chosen}
    return None


def served_model(serving_dir: str) -> Optional[Dict[str, Any]]:
    """What the model registry at `serving_dir` says is served.

    Args:
      serving_dir: the push destination.

    Returns:
      {model, exported_model} of the version served; None when nothing is; {model: None,
      exported_model: None, error} when the registry cannot say.
    """
    try:
        found = lookup(serving_dir)
    except RegistryError as e:
        return {"model": None, "exported_model": None, "error": str(e)}
    if not found.found:
        return None
    return {"model": found.served_model, "exported_model": found.entry.get("exported_model"),
            "store": found.entry.get("store")}


def _served_summary(served: Optional[Dict[str, Any]], this_run: Optional[str]) -> Dict[str, Any]:
    """What the push destination serves now (its model registry), whether this run pushed it, and
    (export.store) the pushed row files and their delta against the version served before."""
    pushed = bool(served and this_run and served["exported_model"] == this_run)
    return {"serving_model": served["model"] if served else None, "pushed_by_this_run": pushed,
            "store": served.get("store") if pushed else None,
            "registry_error": served.get("error") if served else None}


def store_line(store: Dict[str, Any]) -> str:
    """The pushed row files and their delta, in one line: rows changed, new and deleted per table."""
    head = f"{store['rows']:,} rows in row files ({store['row_file_bytes']:,} bytes)"
    d = store.get("delta")
    if not d:
        return f"{head}; no delta: {store.get('delta_reason') or 'none written'}"
    parts = [f"{n} {t['changed']:,} changed, {t['new']:,} new, {t['deleted']:,} deleted"
             for n, t in sorted(d["tables"].items()) if t["changed"] or t["new"] or t["deleted"]]
    return (f"{head}; delta against version {d['base_version']}: {'; '.join(parts) or 'no row changed'}; "
            f"{d['bytes']:,} bytes, {d['bytes_vs_full']:.1%} of the full rows")


def continuous_summary(c: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Sums up the Trainer's continuous.json: what the warm start carried and the largest drift.

    Args:
      c: the parsed continuous.json, or None.

    Returns:
      None without it; else base model, note, warm start totals and, per drift measure, the
      worst table or feature (`{name, value}`).
    """
    if not c:
        return None
    out: Dict[str, Any] = {"base_model": c.get("base_model"), "note": c.get("note")}
    w = c.get("warm_start")
    if w:
        tables = w["tables"].values()
        out["warm_start"] = {
            "rows_carried": w["rows_carried"], "rows": w["rows"],
            "tokens_carried": sum(t.get("tokens_carried", 0) for t in tables),
            "tokens_new": sum(t.get("tokens_new", 0) for t in tables),
            "tokens_dropped": sum(t.get("tokens_dropped", 0) for t in tables),
            "tables_with_slots": sum(1 for t in tables if t.get("slots_carried")),
            "tables": len(w["tables"]),
            "dense_weights_carried": w["dense"]["weights_carried"],
            "dense_weights_fresh": len(w["dense"]["weights_fresh"]),
            "dense_slots_carried": w["dense"].get("slots_carried", 0),
        }
    d = c.get("drift")
    if d:
        def worst(rows, key, lowest=False):
            items = [(v[key], k) for k, v in rows.items() if v.get(key) is not None]
            if not items:
                return None
            value, name = (min if lowest else max)(items)
            return {"name": name, "value": value}

        out["drift"] = {
            "new_token_share": worst(d["tables"], "new_token_share"),
            "vocabulary_overlap": worst(d["tables"], "vocabulary_overlap", lowest=True),
            "ids_per_example_change": worst(d["features"], "change"),
            "dense_mean_shift_in_std": worst(d["dense_features"], "shift_in_std"),
            "unknown": d.get("unknown"),
        }
    return out



def exit_status(s: Dict[str, Any]) -> int:
    """Chooses the exit status of a run that ended without a failure.

    Args:
      s: the run's summary (`summarize`).

    Returns:
      `EXIT_PUSHED` (0) when this run pushed its model, `EXIT_NOT_PUSHED` (3) when the validation
      gate or TFX's Evaluator kept it back, else `EXIT_FAILED` (1).
    """
    if s.get("pushed_by_this_run"):
        return EXIT_PUSHED
    if s.get("validation") and not s["validation"]["blessed"]:
        return EXIT_NOT_PUSHED
    if s.get("evaluator") and not s["evaluator"]["blessed"]:
        return EXIT_NOT_PUSHED
    return EXIT_FAILED


def not_pushed_reason(s: Dict[str, Any]) -> str:
    """Says why a run pushed no model.

    Args:
      s: the run's summary (`summarize`).

    Returns:
      The gate's reasons, the Evaluator's refusal, the registry's error, or that the run ended
      without a push.
    """
    v = s.get("validation")
    if v and not v["blessed"]:
        return "the validation gate kept the model back: " + "; ".join(v.get("reasons") or ["not blessed"])
    if s.get("evaluator") and not s["evaluator"]["blessed"]:
        return "TFX's Evaluator kept the model back (evaluator.min_auc / evaluator.calibration_bounds did not hold)"
    check = s.get("serving_check")
    if check and not check.get("blessed"):
        return f"the serving check kept the model back: {check.get('reason')}"
    if s.get("registry_error"):
        return s["registry_error"]
    return "the run ended without a push"


def refusal_hints(s: Dict[str, Any]) -> list:
    """Lists what a user whose model the gate refused can try.

    Args:
      s: the run's summary (`summarize`).

    Returns:
      One sentence per hint: how far the model was from each failed check's reference, and how
      long it trained against what the defaults would train.
    """
    hints = []
    v = s.get("validation") or {}
    for c in v.get("checks") or []:
        if not c.get("passed") and c.get("model_auc") is not None and c.get("reference_auc") is not None:
            short = c["reference_auc"] - (c.get("margin") or 0.0) - c["model_auc"]
            margin = c.get("margin") or 0.0
            asks = f"{c['reference_auc']:.4f} - margin {margin:g}" if margin >= 0 else f"{c['reference_auc']:.4f} + {-margin:g}"
            hints.append(f"the model's eval AUC {c['model_auc']:.4f} is {short:.4f} short of what the "
                         f"{c['name']} check asks ({asks})")
    t = s.get("training") or {}
    if t.get("epochs") is not None:
        trained = f"trained {t['steps']:,} steps, {t['epochs']:g} epochs of the {t['trained_rows']:,} rows trained on"
        if t.get("stopped_early"):
            hints.append(f"{trained}: stopped early, the held-out slice of the train split peaked at step "
                         f"{t['model_step']:,} (AUC {t['holdout_auc']:.4f}); a lower embedding learning rate "
                         "or more data are the next things to try (training.early_stopping.patience waits longer)")
        elif t["steps"] < t["default_steps"]:
            hints.append(f"{trained}; the defaults would train {t['default_steps']:,} steps "
                         f"({t['default_epochs']:g} epochs): unset training.train_steps, or raise it")
        else:
            hints.append(f"{trained}; more epochs (training.epochs), more data, or the feature health "
                         "warnings above are the next things to look at")
    return hints


def continuous_rows(r: Report, c: Optional[Dict[str, Any]]) -> None:
    """Adds the warm start and drift rows to a report.

    Args:
      r: the report to add to.
      c: the summary's `continuous` part (`continuous_summary`); None adds nothing.
    """
    if not c:
        return
    if not c.get("base_model"):
        r.add("warm start", f"none ({c.get('note')})")
        return
    w = c.get("warm_start")
    if w:
        r.add("warm start", f"from {c['base_model']}")
        r.sub("embedding rows", f"{w['rows_carried']:,} of {w['rows']:,} carried by token; tokens "
                                f"{w['tokens_carried']:,} carried, {w['tokens_new']:,} new, {w['tokens_dropped']:,} dropped; "
                                f"optimizer slots carried in {w['tables_with_slots']} of {w['tables']} tables")
        r.sub("dense weights", f"{w['dense_weights_carried']} carried, {w['dense_weights_fresh']} fresh; "
                               f"their optimizer slots: {w['dense_slots_carried']} carried")
    else:
        r.add("warm start", f"none ({c.get('note')}); drift measured against {c['base_model']}")
    d = c.get("drift") or {}
    parts = []
    for key, label in (("new_token_share", "new-token share"), ("vocabulary_overlap", "lowest vocabulary overlap"),
                       ("ids_per_example_change", "IDs/example change"), ("dense_mean_shift_in_std", "dense mean shift (std)")):
        v = d.get(key)
        if v:
            parts.append(f"{label} {v['value']:.3f} ({v['name']})")
    if parts:
        r.add("drift", "; ".join(parts))
    if d.get("unknown"):
        r.add("drift", f"partly unknown: {d['unknown']}")


def wrap_rows(report: Report, width: int = SUMMARY_WIDTH) -> Report:
    """Wraps each row's text so that no rendered line is wider than `width` (a word longer than
    the room, such as a path, keeps a line of its own); continuation lines align under the text.

    Args:
      report: the report; its rows are replaced.
      width: the widest line, in characters.

    Returns:
      The same report.
    """
    rows = []
    for indent, label, text in report.rows:
        head = f"{'  ' * indent}{label}:" if label else "  " * indent
        first = width - max(LABEL_WIDTH, len(head) + 1)
        lines = _wrap(text, max(first, 20), width - LABEL_WIDTH)
        rows.append((indent, label, lines[0]))
        rows += [(indent, "", line) for line in lines[1:]]
    report.rows = rows
    return report


def _wrap(text: str, first: int, rest: int) -> List[str]:
    """Greedy word wrap: the first line `first` characters wide, the others `rest`."""
    lines: List[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            room = first if not lines else rest
            if line and len(line) + 1 + len(word) > room:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return lines


def summary_report(s: Dict[str, Any]) -> Report:
    """The pipeline summary as a Report.

    Args:
      s: the run's summary (`summarize`).

    Returns:
      A report whose data is the summary itself: what is served, the rows, the training, the gate
      and the export.
    """
    r = Report("pipeline summary", data=s)
    if s.get("pushed_by_this_run"):
        r.add("serving model", f"{s['serving_model']} (pushed by this run)")
        if s.get("store"):
            r.sub("store", store_line(s["store"]))
    else:
        r.add("serving model", f"none pushed: {not_pushed_reason(s)}")
        r.sub("still served", s.get("serving_model") or "nothing")
    _input_rows(r, s)
    continuous_rows(r, s.get("continuous"))
    _tuning_rows(r, s.get("tuning"))
    _training_rows(r, s)
    _gate_rows(r, s)
    _export_rows(r, s)
    c = s.get("serving_check")
    if c:
        r.add("serving check", (f"passed: loaded and answered as TF Serving would; {c.get('compared', 0)} recorded "
                                f"answers compared; serving_default p50 at batch 1 "
                                f"{c.get('timings', {}).get('1', {}).get('p50_ms', float('nan')):.2f} ms")
              if c["blessed"] else f"FAILED: {c.get('reason')}")
    f = s.get("file_scoring")
    if f:
        r.add("file scoring", (f"{f['rows_scored']:,} of {f['rows_read']:,} rows of {f['input']} scored"
                               + (f" ({f['malformed']:,} malformed)" if f.get("malformed") else "") + f": {f['output']}")
              if f["scored"] else f"nothing scored: {f['why_not']}")
    b = s.get("bulk_inference")
    if b:
        r.add("batch scoring", (f"{count_list(b['rows'])} rows scored: {b['output']}" if b["scored"]
                                else f"nothing scored: {b['why_not']}"))
    if s.get("report_html"):
        r.add("run report", s["report_html"])
    if s.get("seconds") is not None:
        r.add("took", f"{s['seconds']:.0f}s")
    return wrap_rows(r)


def _input_rows(r: Report, s: Dict[str, Any]) -> None:
    """The span read, the rows read and dropped, each stage's ledger, feature health, vocabularies."""
    if (s.get("input") or {}).get("span"):
        r.add("input", f"span {s['input']['span']} ({s['input']['files']} files)")
    if (s.get("input") or {}).get("skipped_count"):
        shown = skipped_line(s["input"]["skipped"])
        more = s["input"]["skipped_count"] - len(s["input"]["skipped"])
        r.add("input not read", shown + (f", and {more} more" if more > 0 else ""))
    if s.get("rows_read"):
        before = reasons_list(s.get("rows_dropped_before_split") or {})
        r.add("rows read", f"{count_list(s['rows_read'])} (dropped: {reasons_list(s['rows_dropped'] or {})}"
                           + (f"; before the split: {before})" if before != "none" else ")"))
    for stage in (s.get("ledger") or {}).get("stages", []):
        verdict = "adds up" if stage["balanced"] else "DOES NOT ADD UP: " + "; ".join(stage["problems"])
        extra = "".join(f"; {k} {reasons_list(v)}" for k, v in (("malformed", stage.get("malformed")),
                                                                 ("dropped", stage.get("dropped")))
                        if v and reasons_list(v) != "none")
        rows_in = stage["rows_in"]
        r.add(f"ledger {stage['stage']}",
              f"in {count_list(rows_in) if isinstance(rows_in, dict) else f'{rows_in:,}'}{extra}; "
              f"out {count_list(stage['rows_out'])} ({verdict})")
    if s.get("feature_warnings"):
        warnings = s["feature_warnings"]
        limits = s.get("feature_health_limits") or {}
        above = f" above input.warn_invalid_share ({limits['warn_invalid_share']:.0%})" \
            if limits.get("warn_invalid_share") is not None else ""
        r.add("feature health", f"{len(warnings)} feature{'' if len(warnings) == 1 else 's'} flagged{above}")
        for kind, line in feature_health_lines(warnings):
            r.sub(kind, line)
        for hint in feature_health_hints(warnings, limits):
            r.sub("what to do", hint)
    if s.get("vocabulary_sizes"):
        sizes = s["vocabulary_sizes"]
        r.add("vocabularies", f"{len(sizes)} tables, {sum(sizes.values()):,} entries in all")
        r.sub("", ", ".join(f"{k}={v:,}" for k, v in sizes.items()))


def _tuning_rows(r: Report, t: Optional[Dict[str, Any]]) -> None:
    """The Tuner's search: algorithm, trials run and failed, the budget, each trial, the best values."""
    if not t:
        return
    r.add("tuning", f"{t['algorithm']} search, {len(t['trials'])} trial(s) of at most {t['max_trials']} "
                    f"({t['failed']} failed), {t['steps_per_trial']:,} steps each, scored by {t['objective']}")
    for trial in t["trials"]:
        score = f"{trial['score']:.4f}" if trial.get("score") is not None else f"failed: {trial.get('error') or '?'}"
        r.sub(f"trial {trial['trial_id']}", f"{values_text(trial['values'])}: {score}")
    best = t.get("best")
    if best:
        used = ("the Trainer trained with them" if t.get("trainer_used_best")
                else f"the Trainer trained with {values_text(t.get('trainer_values') or {})}")
        r.sub("best", f"trial {best['trial_id']}, {values_text(best['values'])} (AUC {best['score']:.4f}); {used}")


def values_text(values: Dict[str, Any]) -> str:
    """Tuned values under their config field names: `training.dropout 0.25, training.top_mlp [64, 32]`."""
    return ", ".join(f"{k} {json.dumps(v)}" for k, v in sorted(values.items())) or "none"


def _training_rows(r: Report, s: Dict[str, Any]) -> None:
    """How long it trained and which step is the model; eval AUC against the baseline's."""
    t = s.get("training") or {}
    if t.get("steps"):
        epochs = f", {t['epochs']:g} epochs of the {t['trained_rows']:,} rows trained on" if t.get("epochs") is not None else ""
        line = f"{t['steps']:,} steps of {t['batch_size']}{epochs}"
        if t.get("model_step") is not None:
            line += (f"; the model is step {t['model_step']:,}, the best on the held-out slice of the train split "
                     f"(AUC {t['holdout_auc']:.4f})" + ("; stopped early" if t.get("stopped_early") else ""))
        r.add("training", line)
        if t.get("selection_note"):
            r.sub("model choice", t["selection_note"])
    if metric_measured(s, "eval_auc"):
        m = s.get("eval_model")
        r.add("eval AUC", (f"{kept_model(m['step'], m['choice'])}: " if m else "")
              + f"{metric_text(s, 'eval_auc', s.get('best_achievable_auc'))}; log loss {metric_text(s, 'eval_log_loss')}")
    p = s.get("precision")
    if p:
        line = f"{p['used']} ({p['reason']})"
        if p.get("trained_auc") is not None and s.get("eval_auc") is not None:
            line += f"; eval AUC {p['trained_auc']:.4f} as trained, {s['eval_auc']:.4f} served in float32"
        r.add("precision", line)
    if metric_measured(s, "baseline_auc"):
        r.add("baseline AUC",
              f"{metric_text(s, 'baseline_auc')} (logistic regression on the same features and eval split)")


def metric_measured(s: Dict[str, Any], key: str) -> bool:
    """Whether a summary holds the metric `key`, as a number or with the reason it is undefined."""
    return s.get(key) is not None or bool(s.get(key + "_undefined"))


def metric_text(s: Dict[str, Any], key: str, best: Optional[float] = None) -> str:
    """A summary's metric as text: `0.7712` (with the best achievable, when known), or its reason
    (`undefined: the 300-row eval split holds only label 0`); `not measured` when it has neither."""
    if s.get(key) is not None:
        return f"{s[key]:.4f}" + (f" (best achievable on this data: {best:.4f})" if best else "")
    return s.get(key + "_undefined") or "not measured"


def _gate_rows(r: Report, s: Dict[str, Any]) -> None:
    """The validation gate's decision and checks; for a refused model, what to try."""
    v = s.get("validation")
    if v:
        r.add("validation gate", "blessed, pushed" if v["blessed"] else "NOT BLESSED: kept, not pushed")
        for c in v["checks"]:
            r.sub(c["name"], f"{'passed' if c['passed'] else 'FAILED'}: {c['reason']}")
        if not v["blessed"]:
            r.sub("the refused model", s.get("serving_model_this_run"))
            for hint in refusal_hints(s):
                r.sub("what to try", hint)


def _export_rows(r: Report, s: Dict[str, Any]) -> None:
    """The export's parity and its table files by dtype."""
    if s.get("export_parity"):
        p = s["export_parity"]
        r.add("export parity", f"{'passed' if p['passed'] else 'FAILED'}: max |trained - serving| = "
                               f"{p['max_abs_diff']:.2e} on {p['examples']} raw eval examples (tolerance {p['tolerance']:g})")
    if s.get("serving_inputs_renamed"):
        r.add("serving inputs", renamed_inputs_line(s["serving_inputs_renamed"]))
    if s.get("export_layout"):
        r.add("export tables", f"layout {s['export_layout']}; " + ", ".join(
            f"{d} {v['table_bytes'] / 1e6:.1f} MB (AUC {_signed(v.get('auc_change'))})"
            for d, v in sorted((s.get("export_compression") or {}).items(), key=lambda kv: -kv[1]["table_bytes"])))


def _signed(change) -> str:
    """An AUC change, or why there is none (an eval sample of one label has no AUC)."""
    return f"{change:+.1e}" if isinstance(change, (int, float)) else "change undefined"
