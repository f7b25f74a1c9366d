"""CLI: `python -m pipelines run --config FILE --output-dir DIR` (also `tpu-embedding-pipeline`).

`compile --config FILE --image IMAGE --output pipeline.yaml` writes the Kubeflow Pipelines v2 spec
(`.json`: a Vertex PipelineJob) and nothing else; see pipelines/kubeflow.py and README "Kubeflow".
A Trainer on a TPU also needs `--tpu-image TPU_IMAGE` (or kubeflow.tpu_trainer_image).
`run` executes the pipeline with TFX's LocalDagRunner (ML Metadata in SQLite under DIR, Beam on
the local FnApiRunner with multi-processing unless the config says otherwise) and prints a summary.
`demo` first generates the embedded default dataset when it is missing, then runs.
Exit status: 0 success, 2 bad configuration or input (one message, no traceback), 1 a failed run.
"""
from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import re
import sys
import time
from typing import Any, Dict, Optional

import components  # noqa: F401
from components.config import ConfigError, PipelineConfig, load_config
from components.errors import FeatureHealthError, InputError, LedgerError
from pipelines.pipeline import METADATA_FILE, PIPELINE_ROOT, SERVING_DIR, create_pipeline, input_location, run_locally

DEMO_ROWS = 375_000


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
    root = os.path.join(output_dir, PIPELINE_ROOT)
    stats = _read(_latest(os.path.join(root, "EmbeddingPreprocess", "statistics", "*", "statistics.json")))
    gen = _read(_latest(os.path.join(root, "EmbeddingExampleGen", "examples", "*", "ledger.json")))
    gen_stage = (gen or {}).get("stages", [{}])[0]
    metrics = _read(_latest(os.path.join(root, "Trainer", "model", "*", "eval_metrics.json")))
    continuous = _read(_latest(os.path.join(root, "Trainer", "model", "*", "continuous.json")))
    report_path = _latest(os.path.join(root, "EmbeddingExporter", "serving_model", "*", "export_report.json"))
    report = _read(report_path)
    served = served_model(os.path.join(output_dir, SERVING_DIR))
    this_run = os.path.dirname(report_path) if report_path else None
    meta = _read(cfg.input.path + ".meta.json") if os.path.isfile(cfg.input.path) else None
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
        "serving_model_this_run": this_run,
        "eval_log_loss": metrics["log_loss"] if metrics else None,
        "best_achievable_auc": meta["best_achievable_auc"] if meta else None,
        "export_parity": report["parity"] if report else None,
        "export_layout": report["layout"]["detected"] if report and "layout" in report else None,
        "export_compression": {
            d: {"table_bytes": v["table_bytes"], "auc_change": v["auc_change"]}
            for d, v in report.get("compression", {}).items()
        } if report else None,
    }


def served_model(serving_dir: str) -> Optional[Dict[str, Any]]:
    """{model, exported_model} of the version served at `serving_dir` (its model registry), None
    when nothing is; {model: None, error} when the registry cannot say."""
    from components.model_registry import registry as R

    try:
        found = R.lookup(serving_dir)
    except R.RegistryError as e:
        return {"model": None, "exported_model": None, "error": str(e)}
    if not found.found:
        return None
    return {"model": found.served_model, "exported_model": found.entry.get("exported_model")}


def continuous_summary(c: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The Trainer's continuous.json in brief: what the warm start carried, the largest drift."""
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


def print_continuous(c: Optional[Dict[str, Any]], indent: str = "") -> None:
    if not c:
        return
    if not c.get("base_model"):
        print(f"{indent}warm start:           none ({c.get('note')})")
        return
    w = c.get("warm_start")
    if w:
        print(f"{indent}warm start:           from {c['base_model']}")
        print(f"{indent}  embedding rows:     {w['rows_carried']} of {w['rows']} carried by token; tokens "
              f"{w['tokens_carried']} carried, {w['tokens_new']} new, {w['tokens_dropped']} dropped; "
              f"optimizer slots carried in {w['tables_with_slots']} of {w['tables']} tables")
        print(f"{indent}  dense weights:      {w['dense_weights_carried']} carried, {w['dense_weights_fresh']} fresh; "
              f"their optimizer slots: {w['dense_slots_carried']} carried")
    else:
        print(f"{indent}warm start:           none ({c.get('note')}); drift measured against {c['base_model']}")
    d = c.get("drift") or {}
    parts = []
    for key, label in (("new_token_share", "new-token share"), ("vocabulary_overlap", "lowest vocabulary overlap"),
                       ("ids_per_example_change", "IDs/example change"), ("dense_mean_shift_in_std", "dense mean shift (std)")):
        v = d.get(key)
        if v:
            parts.append(f"{label} {v['value']:.3f} ({v['name']})")
    if parts:
        print(f"{indent}drift:                " + "; ".join(parts))
    if d.get("unknown"):
        print(f"{indent}drift:                partly unknown: {d['unknown']}")


def print_summary(s: Dict[str, Any]) -> None:
    print("\n=== pipeline summary ===")
    if s["serving_model"]:
        who = "pushed by this run" if s.get("pushed_by_this_run") else "an earlier run's; this run pushed nothing"
        print(f"serving model:        {s['serving_model']} ({who})")
    else:
        print(f"serving model:        none{': ' + s['registry_error'] if s.get('registry_error') else ''}")
    if (s.get("input") or {}).get("span"):
        print(f"input:                span {s['input']['span']} ({s['input']['files']} files)")
    if s["rows_read"]:
        print(f"rows read:            {s['rows_read']}  (dropped: {s['rows_dropped']})")
    for stage in (s.get("ledger") or {}).get("stages", []):
        verdict = "adds up" if stage["balanced"] else "DOES NOT ADD UP: " + "; ".join(stage["problems"])
        extra = "".join(f", {k} {v}" for k, v in (("malformed", stage.get("malformed")), ("dropped", stage.get("dropped"))) if v)
        print(f"ledger {stage['stage'] + ':':<21}in {stage['rows_in']}{extra}, out {stage['rows_out']} ({verdict})")
    if s.get("feature_warnings"):
        print("feature health:       " + ", ".join(
            f"{n} {w['share']:.1%} unusable ({w['status']})" for n, w in sorted(s["feature_warnings"].items())))
    if s["vocabulary_sizes"]:
        sizes = s["vocabulary_sizes"]
        print(f"vocabularies:         {len(sizes)} tables, {sum(sizes.values())} entries in all")
        print("                      " + ", ".join(f"{k}={v}" for k, v in sizes.items()))
    print_continuous(s.get("continuous"))
    if s["eval_auc"] is not None:
        best = s["best_achievable_auc"]
        extra = f" (best achievable on this data: {best:.4f})" if best else ""
        print(f"eval AUC:             {s['eval_auc']:.4f}{extra}; log loss {s['eval_log_loss']:.4f}")
    if s.get("baseline_auc") is not None:
        print(f"baseline AUC:         {s['baseline_auc']:.4f} (logistic regression on the same features and eval split)")
    v = s.get("validation")
    if v:
        verdict = "blessed, pushed" if v["blessed"] else "NOT BLESSED: kept, not pushed"
        print(f"validation gate:      {verdict}")
        for c in v["checks"]:
            print(f"  {c['name'] + ':':<20}{'passed' if c['passed'] else 'FAILED'}: {c['reason']}")
        if not v["blessed"]:
            print(f"  the refused model:  {s['serving_model_this_run']}")
    if s["export_parity"]:
        p = s["export_parity"]
        verdict = "passed" if p["passed"] else "FAILED"
        print(
            f"export parity:        {verdict}: max |trained - serving| = {p['max_abs_diff']:.2e} "
            f"on {p['examples']} raw eval examples (tolerance {p['tolerance']:g})"
        )
    if s.get("export_layout"):
        print(f"export tables:        layout {s['export_layout']}; " + ", ".join(
            f"{d} {v['table_bytes'] / 1e6:.1f} MB (AUC {v['auc_change']:+.1e})"
            for d, v in sorted((s["export_compression"] or {}).items(), key=lambda kv: -kv[1]["table_bytes"])
        ))


LOG_FILE = "pipeline.log"


class RunFailed(RuntimeError):
    """A component failed; the message is one line naming it and the cause."""


class _Progress(logging.Handler):
    """Echoes component starts and ends to the terminal while the full log goes to a file, and
    remembers which component ran last (the one to name when the run fails)."""

    def __init__(self, stream):
        super().__init__(logging.INFO)
        self.stream = stream
        self.current: Optional[str] = None

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        m = re.match(r"Component (\S+) is (running|finished)\.", msg)
        if m:
            self.current = m.group(1) if m.group(2) == "running" else self.current
            print(f"[{time.strftime('%H:%M:%S')}] {m.group(1)} {m.group(2)}", file=self.stream, flush=True)


# Where each component's code lives: the innermost matching frame of a failure's traceback names
# the component (the progress log alone cannot: TensorFlow may turn INFO logging down mid-run).
_COMPONENT_CODE = (
    ("components/example_gen/", "EmbeddingExampleGen"),
    ("components/embedding_preprocess/", "EmbeddingPreprocess"),
    ("components/embedding_trainer/", "Trainer"),
    ("tfx/components/trainer/", "Trainer"),
    ("components/embedding_exporter/", "EmbeddingExporter"),
    ("tfx/components/pusher/", "Pusher"),
)


def failed_component(e: BaseException) -> Optional[str]:
    import traceback

    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        path = frame.filename.replace(os.sep, "/")
        for code, name in _COMPONENT_CODE:
            if code in path:
                return name
    return None


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}" if not isinstance(e, (InputError, LedgerError, FeatureHealthError)) else (text[0] if text else type(e).__name__)


def run(cfg: PipelineConfig, output_dir: str, quiet: bool = False, span: Optional[int] = None,
        cache: bool = True) -> Dict[str, Any]:
    """Runs the pipeline with LocalDagRunner. With `quiet`, everything TFX, Beam and TensorFlow log
    (worker processes included) goes to <output_dir>/pipeline.log, the terminal shows one line per
    component, and a failure raises RunFailed with one line naming the component and the cause."""
    # Imported before the quiet run sends this process's output to its log (the import loads
    # TensorFlow's runtime, and a run that imported it only then wrote nothing else to its log).
    from tfx.orchestration.local import local_dag_runner  # noqa: F401
    from tfx.orchestration.portable import tfx_runner  # noqa: F401

    from components.beam_runtime import ensure_local_runner_safe

    ensure_local_runner_safe(cfg.beam_pipeline_args())
    output_dir = os.path.abspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    if quiet:
        return _run_logged(cfg, output_dir, span, cache)
    p = create_pipeline(
        cfg,
        pipeline_root=os.path.join(output_dir, PIPELINE_ROOT),
        metadata_path=os.path.join(output_dir, METADATA_FILE),
        serving_dir=os.path.join(output_dir, SERVING_DIR),
        span=span,
        enable_cache=cache,
    )
    start = time.time()
    run_locally(p)
    summary = summarize(cfg, output_dir)
    summary["seconds"] = round(time.time() - start, 1)
    with open(os.path.join(output_dir, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2, sort_keys=True)
    return summary


def _run_logged(cfg: PipelineConfig, output_dir: str, span: Optional[int] = None, cache: bool = True) -> Dict[str, Any]:
    log_path = os.path.join(output_dir, LOG_FILE)
    terminal = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    progress = _Progress(terminal)
    root = logging.getLogger()
    old_level = root.level
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    saved = os.dup(2), os.dup(1)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(log_fd, 2), os.dup2(log_fd, 1)  # worker processes inherit these
    root.addHandler(progress)
    root.setLevel(min(old_level or logging.INFO, logging.INFO))
    print(f"running {cfg.name}; full log: {log_path}", file=terminal, flush=True)
    try:
        return run(cfg, output_dir, span=span, cache=cache)
    except Exception as e:  # noqa: BLE001 - every failure becomes one line; the traceback is in the log
        logging.exception("pipeline run failed")
        where = failed_component(e) or progress.current or "the pipeline"
        raise RunFailed(f"{where} failed: {_one_line(e)}\nfull log: {log_path}") from e
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(saved[0], 2), os.dup2(saved[1], 1)
        os.close(log_fd), os.close(saved[0]), os.close(saved[1])
        root.removeHandler(progress)
        root.setLevel(old_level)
        terminal.flush()


def compile_command(args) -> int:
    from pipelines.kubeflow import compile_pipeline

    try:
        cfg = load_config(args.config)
        job = compile_pipeline(cfg, args.image, args.output, pipeline_root=args.pipeline_root, tpu_image=args.tpu_image)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tasks = job["pipelineSpec"]["root"]["dag"]["tasks"]
    print(f"compiled {len(tasks)} tasks ({', '.join(tasks)}) to {args.output}")
    return 0


def continuous_command(args) -> int:
    from pipelines.continuous import run_spans, span_config

    try:
        continuous = dict({"warm_start": False} if args.cold else {}, **({"carry_slots": False} if args.no_slots else {}))
        cfg = span_config(args.config, args.data_dir, args.output_dir, {"continuous": continuous} if continuous else None)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        summaries = run_spans(cfg, args.data_dir, args.output_dir, args.spans, args.rows, args.id_shift)
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("\n=== spans ===")
    for s in summaries:
        v, c = s.get("validation") or {}, s.get("continuous") or {}
        w = c.get("warm_start")
        carried = f"{w['rows_carried']}/{w['rows']} rows" if w else "from scratch"
        base = f", baseline {s['baseline_auc']:.4f}" if s.get("baseline_auc") is not None else ""
        print(f"span {s['span']}: warm start {carried}; model AUC {s['eval_auc']:.4f}{base}; "
              f"{'blessed, pushed' if v.get('blessed') else 'not blessed, not pushed'}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "demo"):
        sp = sub.add_parser(name)
        sp.add_argument("--config", required=(name == "run"), default="configs/demo.yaml")
        sp.add_argument("--output-dir", required=(name == "run"), default="output/demo")
        sp.add_argument("--no-cache", action="store_true",
                        help="run every component again (by default a component whose share of the config "
                             "and whose inputs are unchanged reuses its outputs from an earlier run in --output-dir)")
    sp.add_argument("--rows", type=int, default=DEMO_ROWS, help="rows of the generated demo dataset")
    cs = sub.add_parser("continuous", help="daily spans with drifting IDs, one warm-started run per span (README)")
    cs.add_argument("--config", default="configs/demo.yaml", help="the config whose input becomes the spans")
    cs.add_argument("--output-dir", default="output/continuous")
    cs.add_argument("--data-dir", default="data/continuous", help="where the spans are written (span-1, span-2, ...)")
    cs.add_argument("--spans", type=int, default=3)
    cs.add_argument("--rows", type=int, default=100_000, help="rows per span")
    cs.add_argument("--id-shift", type=int, default=20, help="how far the IDs drift per day (token ranks)")
    cs.add_argument("--cold", action="store_true",
                    help="continuous.warm_start: false (every span from scratch; drift and gate as usual), to compare")
    cs.add_argument("--no-slots", action="store_true",
                    help="continuous.carry_slots: false (warm start carries weights, not optimizer slots), to compare")
    cp = sub.add_parser("compile", help="write the Kubeflow Pipelines v2 spec (.yaml) or Vertex PipelineJob (.json)")
    cp.add_argument("--config", required=True)
    cp.add_argument("--image", required=True, help="container image with the project installed (docker/Dockerfile)")
    cp.add_argument("--output", required=True, help="pipeline.yaml (KFP PipelineSpec) or pipeline.json (Vertex PipelineJob)")
    cp.add_argument("--pipeline-root", default=None, help="overrides kubeflow.pipeline_root (e.g. gs://BUCKET/root)")
    cp.add_argument("--tpu-image", default=None,
                    help="the Trainer's image on a TPU route (docker/Dockerfile.tpu); overrides kubeflow.tpu_trainer_image")
    args = parser.parse_args(argv)
    if args.command == "compile":
        return compile_command(args)
    if args.command == "continuous":
        return continuous_command(args)
    try:
        cfg = load_config(args.config)
        if args.command == "demo":
            from components.synthetic_data import GeneratorSpec, ensure_dataset

            meta = ensure_dataset(cfg.input.path, GeneratorSpec(rows=args.rows))
            print(f"demo data: {cfg.input.path} ({meta['rows']} rows)")
        input_location(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        summary = run(cfg, args.output_dir, quiet=True, cache=not args.no_cache)
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print_summary(summary)
    return 0 if summary["serving_model"] else 1


if __name__ == "__main__":
    sys.exit(main())
