"""The run's summary: what a local run did, read back from its artifacts (`summarize`), and its
report (`summary_report`, rendered by components/reporting/report.py like every other tool's).

The serving-model row names the model this run pushed, or says that none was pushed and why (the
gate's reasons); the exit status follows from the same facts (`exit_status`).
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any, Dict, Optional

from components.config.schema import PipelineConfig
from components.model_registry.registry import RegistryError, lookup
from components.reporting.report import Report, count_list, reasons_list
from pipelines.pipeline import PIPELINE_ROOT, SERVING_DIR

# Exit statuses of `python -m pipelines run` (and demo, continuous): README "Your own data".
EXIT_PUSHED = 0  # the run worked and pushed its model
EXIT_FAILED = 1  # a component failed
EXIT_BAD_INPUT = 2  # bad configuration or input path: nothing ran
EXIT_NOT_PUSHED = 3  # the run worked, but the validation gate kept the model back


def _latest(pattern: str) -> Optional[str]:
    """The artifact file of the newest execution (artifact dirs end in the execution id)."""
    found = glob.glob(pattern)

    def key(p: str):
        parts = [int(x) for x in p.split(os.sep) if x.isdigit()]
        return parts[-1] if parts else -1

    return max(found, key=key) if found else None


def _read(path: Optional[str]) -> Optional[Dict[str, Any]]:
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    return None


def summarize(cfg: PipelineConfig, output_dir: str) -> Dict[str, Any]:
    """Reads what a local run did back from its artifacts (the newest execution of each step).

    Args:
      cfg: the run's configuration.
      output_dir: the run's output folder (its pipeline root and push destination).

    Returns:
      The summary: the ledger, feature warnings, input span, what is served and whether this run
      pushed it, rows read and dropped, vocabulary sizes, warm start and drift, AUCs, the gate's
      and the Evaluator's decisions, training length, and the export's parity, layout and
      compression. Parts whose artifact is missing are None.
    """
    root = os.path.join(output_dir, PIPELINE_ROOT)
    stats = _read(_latest(os.path.join(root, "EmbeddingPreprocess", "statistics", "*", "statistics.json")))
    gen = _read(_latest(os.path.join(root, "EmbeddingExampleGen", "examples", "*", "ledger.json")))
    gen_stage = (gen or {}).get("stages", [{}])[0]
    metrics = _read(_latest(os.path.join(root, "Trainer", "model", "*", "eval_metrics.json")))
    training_run = _read(_latest(os.path.join(root, "Trainer", "model", "*", "training_run.json")))
    continuous = _read(_latest(os.path.join(root, "Trainer", "model", "*", "continuous.json")))
    report_path = _latest(os.path.join(root, "EmbeddingExporter", "serving_model", "*", "export_report.json"))
    report = _read(report_path)
    served = served_model(os.path.join(output_dir, SERVING_DIR))
    this_run = os.path.dirname(report_path) if report_path else None
    meta = _read(cfg.input.path + ".meta.json") if os.path.isfile(cfg.input.path) else None
    # TFX's Evaluator's blessing (evaluator.enabled): its BLESSED / NOT_BLESSED file
    blessing = _latest(os.path.join(root, "Evaluator", "blessing", "*", "*BLESSED")) if cfg.evaluator.enabled else None
    health = (stats or {}).get("feature_health") or {}
    return {
        "ledger": (stats or {}).get("ledger"),
        "feature_warnings": {
            n: {"share": e["share"], "status": e["status"], "reasons": {k: v for k, v in e["reasons"].items() if v}}
            for n, e in health.get("features", {}).items() if e["status"] != "ok"
        },
        "input": {"span": gen_stage.get("span"), "files": len(gen_stage.get("files", []))} if gen else None,
        # What the push destination serves now (its model registry), and whether this run pushed it.
        "serving_model": served["model"] if served else None,
        "pushed_by_this_run": bool(served and this_run and served["exported_model"] == this_run),
        "registry_error": served.get("error") if served else None,
        "rows_read": {s: v["examples_read"] for s, v in stats["splits"].items()} if stats else None,
        "rows_dropped": {s: v["examples_dropped"] for s, v in stats["splits"].items()} if stats else None,
        "vocabulary_sizes": {t: v["vocabulary_size"] for t, v in stats["tables"].items()} if stats else None,
        "continuous": continuous_summary(continuous),
        "eval_auc": metrics["auc"] if metrics else None,
        "baseline_auc": (metrics.get("baseline") or {}).get("auc") if metrics else None,
        "validation": {
            "blessed": report["validation"]["blessed"],
            "checks": [{k: c.get(k) for k in ("name", "passed", "model_auc", "reference_auc", "margin", "reason")}
                       for c in report["validation"]["checks"]],
            "reasons": report["validation"]["reasons"],
        } if report and "validation" in report else None,
        "evaluator": {"blessed": os.path.basename(blessing) == "BLESSED"} if blessing else None,
        "serving_model_this_run": this_run,
        "training": training_length(cfg, training_run, stats),
        "eval_log_loss": metrics["log_loss"] if metrics else None,
        "best_achievable_auc": meta["best_achievable_auc"] if meta else None,
        "export_parity": report["parity"] if report else None,
        "export_layout": report["layout"]["detected"] if report and "layout" in report else None,
        "export_compression": {
            d: {"table_bytes": v["table_bytes"], "auc_change": v["auc_change"]}
            for d, v in report.get("compression", {}).items()
        } if report else None,
    }


def training_length(cfg: PipelineConfig, run: Optional[Dict[str, Any]], stats: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Says how long the model trained, and how long the defaults would train it.

    Args:
      cfg: the run's configuration (batch size, epochs).
      run: the Trainer's `training_run.json`, or None.
      stats: preprocessing's `statistics.json` (the train split's rows), or None.

    Returns:
      None without a training run; else steps, length source, batch size, train rows, early
      stopping's choice, and, when the rows are known, epochs trained and the defaults' steps
      and epochs (training.train_steps unset: training.epochs passes).
    """
    if not run:
        return None
    t = cfg.training
    rows = ((stats or {}).get("splits") or {}).get("train", {}).get("examples_written")
    out: Dict[str, Any] = {"steps": run.get("final_step"), "source": (run.get("length") or {}).get("source"),
                           "batch_size": t.batch_size, "train_rows": rows}
    selection = run.get("selection")
    if selection and selection.get("best_auc") is not None:  # early stopping: the checkpoint kept, where training stopped
        out["model_step"] = run.get("model_step")
        out["stopped_early"] = selection.get("stopped_at") is not None
        out["holdout_auc"] = selection["best_auc"]
    elif selection:  # the held-out slice could not rank models: the last checkpoint is the model
        out["selection_note"] = selection.get("note")
    if rows and out["steps"]:
        out["epochs"] = round(out["steps"] * t.batch_size / rows, 2)
        out["default_steps"] = t.steps_for_epochs(rows)
        out["default_epochs"] = t.epochs_for(rows)
    return out


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
    return {"model": found.served_model, "exported_model": found.entry.get("exported_model")}


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
        trained = f"trained {t['steps']:,} steps, {t['epochs']:g} epochs of {t['train_rows']:,} train rows"
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
    else:
        r.add("serving model", f"none pushed: {not_pushed_reason(s)}")
        r.sub("still served", s.get("serving_model") or "nothing")
    _input_rows(r, s)
    continuous_rows(r, s.get("continuous"))
    _training_rows(r, s)
    _gate_rows(r, s)
    _export_rows(r, s)
    if s.get("report_html"):
        r.add("run report", s["report_html"])
    if s.get("seconds") is not None:
        r.add("took", f"{s['seconds']:.0f}s")
    return r


def _input_rows(r: Report, s: Dict[str, Any]) -> None:
    """The span read, the rows read and dropped, each stage's ledger, feature health, vocabularies."""
    if (s.get("input") or {}).get("span"):
        r.add("input", f"span {s['input']['span']} ({s['input']['files']} files)")
    if s.get("rows_read"):
        r.add("rows read", f"{count_list(s['rows_read'])} (dropped: {reasons_list(s['rows_dropped'] or {})})")
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
        r.add("feature health", ", ".join(
            f"{n} {w['share']:.1%} unusable ({w['status']})" for n, w in sorted(s["feature_warnings"].items())))
    if s.get("vocabulary_sizes"):
        sizes = s["vocabulary_sizes"]
        r.add("vocabularies", f"{len(sizes)} tables, {sum(sizes.values()):,} entries in all")
        r.sub("", ", ".join(f"{k}={v:,}" for k, v in sizes.items()))


def _training_rows(r: Report, s: Dict[str, Any]) -> None:
    """How long it trained and which step is the model; eval AUC against the baseline's."""
    t = s.get("training") or {}
    if t.get("steps"):
        epochs = f", {t['epochs']:g} epochs" if t.get("epochs") is not None else ""
        line = f"{t['steps']:,} steps of {t['batch_size']}{epochs}"
        if t.get("model_step") is not None:
            line += (f"; the model is step {t['model_step']:,}, the best on the held-out slice of the train split "
                     f"(AUC {t['holdout_auc']:.4f})" + ("; stopped early" if t.get("stopped_early") else ""))
        r.add("training", line)
        if t.get("selection_note"):
            r.sub("model choice", t["selection_note"])
    if s.get("eval_auc") is not None:
        best = s.get("best_achievable_auc")
        extra = f" (best achievable on this data: {best:.4f})" if best else ""
        r.add("eval AUC", f"{s['eval_auc']:.4f}{extra}; log loss {s['eval_log_loss']:.4f}")
    if s.get("baseline_auc") is not None:
        r.add("baseline AUC", f"{s['baseline_auc']:.4f} (logistic regression on the same features and eval split)")


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
    if s.get("export_layout"):
        r.add("export tables", f"layout {s['export_layout']}; " + ", ".join(
            f"{d} {v['table_bytes'] / 1e6:.1f} MB (AUC {v['auc_change']:+.1e})"
            for d, v in sorted((s.get("export_compression") or {}).items(), key=lambda kv: -kv[1]["table_bytes"])))
