"""One static HTML page per local run: `<output_dir>/run_report.html`.

Sections (each an `<h2 id=...>`, `SECTIONS`): the summary, the row ledger, the preprocessing
statistics (a link to the statistics report preprocessing wrote, plus its headline figures and the
feature health warnings in words), the training curves (the loss from the Trainer's TensorBoard
event files, beside the held-out AUC at each evaluation from its `training_run.json`), eval AUC
against the baseline and the last blessed model, export parity and compression, and warm start
and drift.

Plain HTML with inline SVG line charts: no script, no network, no file beside it but the links to
the run's own artifacts; it opens from a file system or a bucket alike. The charts are drawn here
(a polyline per series) rather than with matplotlib, which is not among the pinned packages.
"""
from __future__ import annotations

import glob
import html
import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from components.embedding_preprocess.health import describe_reasons
from components.reporting.report import count_list, kept_model, reasons_list
from components.reporting.report import render as render_text
from components.data_io.safe_files import replace_text
from components.contracts.artifacts import STATISTICS_REPORT_FILE, TRAINING_RUN_FILE
from pipelines.feature_health_view import feature_health_hints, feature_health_lines
from pipelines.summary import artifact_file, metric_measured, metric_text, summary_report, values_text

SECTIONS = (
    ("summary", "Summary"),
    ("ledger", "Row ledger"),
    ("statistics", "Preprocessing statistics"),
    ("tuning", "Tuning"),
    ("training", "Training curves"),
    ("evaluation", "Evaluation and the validation gate"),
    ("export", "Export: parity and compression"),
    ("continuous", "Warm start and drift"),
)

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:62em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4}.ok{color:#176317}.bad{color:#a31515;font-weight:bold}.muted{color:#777}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto}svg{background:#fcfcfc;border:1px solid #eee}
.charts{display:flex;flex-wrap:wrap;gap:.6em}
"""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _table(rows: Sequence[Sequence[Any]], header: Optional[Sequence[str]] = None) -> str:
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{c if isinstance(c, _Raw) else _e(c)}</td>" for c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


class _Raw(str):
    """Already HTML."""


def _verdict(ok: bool, yes: str = "passed", no: str = "FAILED") -> _Raw:
    return _Raw(f'<span class="{"ok" if ok else "bad"}">{_e(yes if ok else no)}</span>')


def line_chart(series: Dict[str, List[Tuple[float, float]]], title: str, width: int = 560, height: int = 220,
               x_label: str = "step", highlight: Optional[Tuple[float, float]] = None) -> str:
    """An SVG line chart, axes labelled with their ranges.

    Args:
      series: name -> [(step, value)].
      title: the chart's title.
      width: in pixels.
      height: in pixels.
      x_label: what the x axis counts (written beside its last value).
      highlight: one point to ring, e.g. the checkpoint kept as the model; None for none.

    Returns:
      The `<svg>` element; empty when there are no points.
    """
    points = [p for s in series.values() for p in s]
    if not points:
        return ""
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + (abs(y0) or 1) * 0.01
    left, right, top, bottom = 60, 110, 24, 30
    w, h = width - left - right, height - top - bottom

    def xy(p):
        return left + (p[0] - x0) / (x1 - x0) * w, top + (1 - (p[1] - y0) / (y1 - y0)) * h

    colors = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{_e(title)}">',
             f'<text x="{left}" y="16" font-size="13">{_e(title)}</text>',
             f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#999"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="#999"/>',
             f'<text x="{left - 4}" y="{top + 4}" font-size="11" text-anchor="end">{y1:.4g}</text>',
             f'<text x="{left - 4}" y="{top + h}" font-size="11" text-anchor="end">{y0:.4g}</text>',
             f'<text x="{left}" y="{top + h + 16}" font-size="11">{x0:,.0f}</text>',
             f'<text x="{left + w}" y="{top + h + 16}" font-size="11" text-anchor="end">{_e(x_label)} {x1:,.0f}</text>']
    for k, (name, pts) in enumerate(sorted(series.items())):
        color = colors[k % len(colors)]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(p) for p in sorted(pts)))
        if len(pts) == 1:
            x, y = xy(pts[0])
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>')
        else:
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}"/>')
        parts.append(f'<text x="{left + w + 8}" y="{top + 14 + 16 * k}" font-size="11" fill="{color}">{_e(name)}</text>')
    if highlight is not None:
        x, y = xy(highlight)
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="none" stroke="#222" stroke-width="1.5"/>')
    parts.append("</svg>")
    return "".join(parts)


def training_curves(run_dir: Optional[str]) -> Dict[str, Dict[str, List[Tuple[float, float]]]]:
    """Reads the scalar curves of the TensorBoard event files under `run_dir`, with TensorBoard's own loader.

    Args:
      run_dir: the Trainer's model_run artifact (None or missing: no curves).

    Returns:
      metric -> {series (train, validation...): [(step, value)]}.
    """
    if not run_dir or not os.path.isdir(run_dir):
        return {}
    # lazy: TensorBoard's loader imports TensorFlow; the runner imports this module on the CLI's path
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    curves: Dict[str, Dict[str, List[Tuple[float, float]]]] = {}
    for sub in sorted({os.path.dirname(f) for f in glob.glob(os.path.join(run_dir, "**", "events.out.tfevents.*"),
                                                              recursive=True)}):
        series = os.path.relpath(sub, run_dir)
        acc = event_accumulator.EventAccumulator(sub, size_guidance={event_accumulator.TENSORS: 0,
                                                                     event_accumulator.SCALARS: 0})
        acc.Reload()
        tags = acc.Tags()
        for tag in tags.get("scalars", []):
            for ev in acc.Scalars(tag):
                curves.setdefault(tag, {}).setdefault(series, []).append((ev.step, float(ev.value)))
        for tag in tags.get("tensors", []):
            for ev in acc.Tensors(tag):
                value = tensor_util.make_ndarray(ev.tensor_proto)
                if value.size == 1 and value.dtype.kind in "fiu":
                    curves.setdefault(tag, {}).setdefault(series, []).append((ev.step, float(value.reshape(()))))
    return curves


def holdout_evaluations(run: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The held-out evaluations of a training run, as the Trainer recorded them.

    The Trainer's `training_run.json` (in its Model artifact) keeps, under `selection`, the record
    of the held-out selection (components/embedding_trainer/selection.py): one entry per
    evaluation with its step, AUC and log loss, the step kept as the model and where training
    stopped. (The same evaluations reach the live progress file as `eval` events.)

    Args:
      run: the parsed `training_run.json`, or None.

    Returns:
      None when there is no run record; else {auc, log_loss: [(step, value)], best_step, best_auc,
      stopped_at, note}, the lists empty when the selection was off (`note` then says so) or could
      not rank models (`note` says why).
    """
    if run is None:
        return None
    selection = run.get("selection")
    if not selection:
        return {"auc": [], "log_loss": [], "best_step": None, "best_auc": None, "stopped_at": None,
                "note": "training.early_stopping is off: no held-out slice, the last checkpoint is the model"}
    evaluations = sorted(selection.get("evaluations") or [], key=lambda e: e["step"])
    return {
        "auc": [(e["step"], float(e["auc"])) for e in evaluations if e.get("auc") is not None],
        "log_loss": [(e["step"], float(e["log_loss"])) for e in evaluations if e.get("log_loss") is not None],
        "best_step": selection.get("best_step"),
        "best_auc": selection.get("best_auc"),
        "stopped_at": selection.get("stopped_at"),
        "note": selection.get("note"),
    }


def render(summary: Dict[str, Any], output_dir: str, path: str) -> str:
    """The run report's HTML page.

    Args:
      summary: the run's summary (pipelines/summary.py `summarize`).
      output_dir: the run's output folder (its name titles the page; the artifacts linked and read are
        the summary's `artifacts`, this run's own).
      path: where the page will be written (links are relative to it).

    Returns:
      The whole page, one section per entry of `SECTIONS`.
    """
    artifacts = summary.get("artifacts") or {}  # this run's, from its ML Metadata (summary.run_artifacts)
    here = os.path.dirname(os.path.abspath(path))
    body = {
        "summary": f"<pre>{_e(render_text(summary_report(summary)))}</pre>",
        "ledger": _ledger_section(summary),
        "statistics": _statistics_section(summary, artifacts, here),
        "tuning": _tuning_section(summary.get("tuning")),
        "training": _training_section(artifacts),
        "evaluation": _evaluation_section(summary),
        "export": _export_section(summary),
        "continuous": _continuous_section(summary),
    }
    title = f"Run report: {os.path.basename(output_dir.rstrip('/'))}"
    nav = " · ".join(f'<a href="#{k}">{_e(t)}</a>' for k, t in SECTIONS)
    sections = "".join(f'<h2 id="{k}">{_e(t)}</h2>{body[k]}' for k, t in SECTIONS)
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{_e(title)}</h1><p>{nav}</p>{sections}</body></html>\n")


def _ledger_section(summary: Dict[str, Any]) -> str:
    stages = (summary.get("ledger") or {}).get("stages") or []

    def counts(v):
        return count_list(v) if isinstance(v, dict) else (f"{v:,}" if isinstance(v, int) else v)

    def reasons(v):
        return reasons_list(v) if isinstance(v, dict) else (v or "")

    return _table(
        [[s["stage"], counts(s["rows_in"]), reasons(s.get("malformed")), reasons(s.get("dropped")), counts(s["rows_out"]),
          _verdict(s["balanced"], "adds up", "DOES NOT ADD UP: " + "; ".join(s.get("problems") or []))]
         for s in stages],
        ["stage", "rows in", "malformed", "dropped", "rows out", "verdict"],
    ) if stages else '<p class="muted">No row ledger (the run stopped before preprocessing).</p>'


def _statistics_section(summary: Dict[str, Any], artifacts: Dict[str, str], here: str) -> str:
    stats_html = artifact_file(artifacts, "EmbeddingPreprocess.statistics", STATISTICS_REPORT_FILE)
    stats_html = stats_html if stats_html and os.path.isfile(stats_html) else None
    sizes = summary.get("vocabulary_sizes") or {}
    parts = []
    if stats_html:
        parts.append(f'<p>The full report: <a href="{_e(os.path.relpath(stats_html, here))}">statistics.html</a> '
                     "(vocabularies, IDs per example, unique IDs per batch, skew, per-shard load, table memory).</p>")
    if sizes:
        parts.append(_table(sorted(sizes.items()), ["table", "vocabulary size"]))
    warnings = summary.get("feature_warnings") or {}
    if warnings:
        limits = summary.get("feature_health_limits") or {}
        warn = limits.get("warn_invalid_share")
        parts.append(f"<p>Feature health: {len(warnings)} feature{'' if len(warnings) == 1 else 's'} flagged"
                     + (f" above input.warn_invalid_share ({warn:.0%})" if warn is not None else "") + ":</p><ul>"
                     + "".join(f"<li>{_e(kind)}: {_e(line)}</li>" for kind, line in feature_health_lines(warnings))
                     + "</ul><p>What to do:</p><ul>"
                     + "".join(f"<li>{_e(h)}</li>" for h in feature_health_hints(warnings, limits)) + "</ul>")
        parts.append(_table(
            [[n, w.get("kind") or "", f"{w['share']:.1%}", w["status"], describe_reasons(w["reasons"], w.get("rows"))]
             for n, w in sorted(warnings.items(), key=lambda kv: _natural(kv[0]))],
            ["feature", "kind", "unusable", "status", "reasons"]))
    return "".join(parts) or '<p class="muted">No preprocessing statistics.</p>'


# The loss curve shown beside the held-out AUC, by preference: per batch (its x axis is steps, as
# the held-out evaluations'), else per epoch (Keras' epochs: one per checkpoint interval).
_LOSS_TAGS = ("batch_loss", "epoch_loss", "loss")


def _natural(name: str) -> tuple:
    """Sort key: I2 before I10."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name) if p)


def _training_section(artifacts: Dict[str, str]) -> str:
    run_dir = artifacts.get("Trainer.model_run")
    curves = training_curves(run_dir)
    holdout = holdout_evaluations(_read_json(artifact_file(artifacts, "Trainer.model", TRAINING_RUN_FILE)))
    loss_tag = next((t for t in _LOSS_TAGS if t in curves), None)
    pair = []
    if loss_tag:
        loss = dict(curves[loss_tag])
        if holdout and holdout["log_loss"] and loss_tag != "epoch_loss":  # same x axis: steps
            loss["held-out"] = holdout["log_loss"]
        pair.append(line_chart(loss, f"training loss ({loss_tag})", width=460, x_label=_x_label(loss_tag)))
    if holdout and holdout["auc"]:
        best = next((p for p in holdout["auc"] if p[0] == holdout["best_step"]), None)
        title = "held-out AUC" + (f" (model: step {best[0]:,}, {best[1]:.4f})" if best else "")
        pair.append(line_chart({"held-out": holdout["auc"]}, title, width=460, highlight=best))
    text = f'<div class="charts">{"".join(pair)}</div>' if pair else ""
    if holdout and holdout["auc"]:
        text += ("<p>Held-out AUC: the train split's held-out slice, scored at each evaluation; the ringed point "
                 "is the checkpoint kept as the model"
                 + (f"; training stopped early at step {holdout['stopped_at']:,}" if holdout["stopped_at"] else "")
                 + ".</p>")
    elif holdout:
        text += f'<p class="muted">No held-out AUC curve: {_e(holdout["note"] or "no evaluation was recorded")}.</p>'
    else:
        text += ('<p class="muted">No held-out AUC curve: no training_run.json in the Trainer\'s model artifact '
                 "(the run stopped before training ended).</p>")
    text += "".join(line_chart(s, tag, x_label=_x_label(tag)) for tag, s in sorted(curves.items()) if tag != loss_tag)
    if not curves:
        text += '<p class="muted">No TensorBoard events found under the Trainer\'s model_run artifact.</p>'
    if run_dir:
        text += f'<p class="muted">Events: {_e(run_dir)} (open with TensorBoard for more).</p>'
    return text


def _x_label(tag: str) -> str:
    """Keras writes its epoch-level scalars at the epoch's number, the others at the step."""
    return "epoch" if tag.startswith("epoch_") else "step"


def _read_json(path: Optional[str]) -> Optional[Dict[str, Any]]:
    if not path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _tuning_section(t: Optional[Dict[str, Any]]) -> str:
    """The Tuner's search: each trial's values under their config field names and held-out AUC."""
    if not t:
        return '<p class="muted">No Tuner in this run (no `tuning` section).</p>'
    rows = [[trial["trial_id"], values_text(trial["values"]),
             f"{trial['score']:.4f}" if trial.get("score") is not None else f"failed: {trial.get('error') or '?'}"]
            for trial in t["trials"]]
    best = t.get("best")
    used = ("the Trainer trained with them" if t.get("trainer_used_best")
            else f"the Trainer trained with {values_text(t.get('trainer_values') or {})}")
    return (f"<p>{_e(t['algorithm'])} search: {len(t['trials'])} trial(s) of at most {t['max_trials']} "
            f"({t['failed']} failed), {t['steps_per_trial']:,} steps each, scored by {_e(t['objective'])}.</p>"
            + _table(rows, ["trial", "values", "held-out AUC"])
            + (f"<p>Best: trial {_e(best['trial_id'])}, {_e(values_text(best['values']))}; {_e(used)}.</p>"
               if best else ""))


def _evaluation_section(summary: Dict[str, Any]) -> str:
    rows = []
    # an undefined metric (one label in the eval split) keeps its row and shows its reason
    if metric_measured(summary, "eval_auc"):
        m = summary.get("eval_model")  # the checkpoint the Trainer kept, which its eval AUC is of
        rows.append(["this run's model" + (f": {kept_model(m['step'], m['choice'])}" if m else ""),
                     metric_text(summary, "eval_auc"),
                     f"log loss {metric_text(summary, 'eval_log_loss')}"])
    p = summary.get("precision") or {}
    if p.get("trained_auc") is not None:  # a bfloat16 run: the AUC above is served in float32
        rows.append([f"this run's model as trained ({p['used']})", f"{p['trained_auc']:.4f}",
                     "the dense network in bfloat16; the served model computes it in float32"])
    if metric_measured(summary, "baseline_auc"):
        rows.append(["baseline (logistic regression)", metric_text(summary, "baseline_auc"),
                     "same features and eval split"])
    if summary.get("best_achievable_auc"):
        rows.append(["best achievable on this data", f"{summary['best_achievable_auc']:.4f}", "the generator's own"])
    v = summary.get("validation")
    checks = []
    if v:
        for c in v["checks"]:
            ref = c.get("reference_auc")
            if c["name"] != "baseline" and ref is not None:
                rows.append([f"last blessed model ({c['name']})", f"{ref:.4f}", "scored on this run's eval rows"])
            checks.append([c["name"], _verdict(bool(c["passed"])), c.get("reason")])
    return (_table(rows, ["model", "eval AUC", ""]) if rows else "") + (
        f"<p>Validation gate: {_verdict(bool(v['blessed']), 'blessed, pushed', 'NOT BLESSED: kept, not pushed')}</p>"
        + _table(checks, ["check", "result", "reason"]) if v else '<p class="muted">No gate decision (the export did not run).</p>')


def _export_section(summary: Dict[str, Any]) -> str:
    p = summary.get("export_parity")
    if not p:
        return '<p class="muted">No export (the run stopped before it).</p>'
    comp = summary.get("export_compression") or {}
    return (
        f"<p>Parity: {_verdict(bool(p['passed']))}: max |trained - serving| = {p['max_abs_diff']:.2e} on "
        f"{p['examples']} raw eval examples (tolerance {p['tolerance']:g}); table layout "
        f"{_e(summary.get('export_layout'))}.</p>"
        + _table([[d, f"{c['table_bytes'] / 1e6:.1f} MB", f"{c['auc_change']:+.1e}"]
                  for d, c in sorted(comp.items(), key=lambda kv: -kv[1]["table_bytes"])],
                 ["table dtype", "tables", "AUC change vs float32"]))


def _continuous_section(summary: Dict[str, Any]) -> str:
    c = summary.get("continuous")
    if not c:
        return '<p class="muted">No warm start or drift record.</p>'
    w, d = c.get("warm_start"), c.get("drift") or {}
    rows = [["base model", c.get("base_model") or f"none ({c.get('note')})"]]
    if w:
        rows += [["embedding rows carried", f"{w['rows_carried']:,} of {w['rows']:,}"],
                 ["tokens", f"{w['tokens_carried']:,} carried, {w['tokens_new']:,} new, {w['tokens_dropped']:,} dropped"],
                 ["dense weights", f"{w['dense_weights_carried']} carried, {w['dense_weights_fresh']} fresh"]]
    for key in ("new_token_share", "vocabulary_overlap", "ids_per_example_change", "dense_mean_shift_in_std"):
        if d.get(key):
            rows.append([f"drift: {key.replace('_', ' ')}", f"{d[key]['value']:.3f} ({d[key]['name']})"])
    return _table(rows)


def write_run_report(summary: Dict[str, Any], output_dir: str, path: str) -> str:
    """Writes the run report's page through a temporary file, so that no half-written report is left.

    Args:
      summary: the run's summary (pipelines/summary.py `summarize`).
      output_dir: the run's output folder.
      path: the page's path.

    Returns:
      `path`.
    """
    replace_text(path, render(summary, output_dir, path))  # never through a link planted at `path`
    return path
