"""Command line: `python -m pipelines run|demo|continuous|compile` (also `tpu-embedding-pipeline`).

`run --config FILE --output-dir DIR` executes the pipeline locally (pipelines/runner.py: TFX's
LocalDagRunner, ML Metadata in SQLite under DIR, Beam on the local runner) with live progress on
the terminal and everything else in DIR/pipeline.log, then prints the run's summary (`--json`:
the summary as JSON) and writes DIR/run_report.html. `demo` first generates the embedded default
dataset when it is missing. `continuous` runs daily spans, one warm-started run each. `compile`
writes the Kubeflow Pipelines v2 spec (`.json`: a Vertex PipelineJob) and nothing else. `score`
scores a CSV or Parquet file with a serving model (components/embedding_exporter/batch_scoring.py);
`check-serving` loads and answers one as a stock TF Serving would (serving_check.py).

Exit statuses (pipelines/summary.py): 0 the run pushed its model; 3 the run worked but the
validation gate kept the model back; 2 refused before anything ran (one message: a bad
configuration or input, sizes that cannot fit, an output directory that cannot be used or that
another run holds); 1 a failed run (one line: the component, the cause and the full log's path), or a run that
ended without pushing for another reason (its summary's serving-model line says why); 130 or 143 a run
Ctrl-C or SIGTERM stopped (one line: the stage that ran and how to resume).
"""
from __future__ import annotations

import argparse
import signal
import sys
import warnings
from typing import Any, Dict, List

import components  # noqa: F401  (selects legacy Keras; light: imports no TensorFlow)
from components.config.loading import load_config
from components.config.schema import ConfigError
from components.example_gen.synthetic_data import GeneratorSpec, ensure_dataset
from components.reporting.report import Report, emit, error_line
from pipelines import runner
from pipelines.continuous import run_spans, span_config
from pipelines.kubeflow import compile_pipeline
from pipelines.pipeline import input_location, stock_data_components
from pipelines.runner import DEMO_ROWS, RunFailed
from pipelines.summary import (
    EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NOT_PUSHED, EXIT_PUSHED, exit_status, metric_measured, metric_text, summary_report,
    wrap_rows,
)


def compile_command(args) -> int:
    """Runs `compile`: writes the Kubeflow Pipelines v2 spec and prints its tasks.

    Args:
      args: the parsed arguments (`config`, `image`, `output`, `pipeline_root`, `tpu_image`).

    Returns:
      The exit status: 0, or `EXIT_BAD_INPUT` on a ConfigError (printed).
    """
    try:
        cfg = load_config(args.config)
        job = compile_pipeline(cfg, args.image, args.output, pipeline_root=args.pipeline_root, tpu_image=args.tpu_image)
    except ConfigError as e:
        print(error_line(e), file=sys.stderr)
        return EXIT_BAD_INPUT
    tasks = job["pipelineSpec"]["root"]["dag"]["tasks"]
    print(f"compiled {len(tasks)} tasks ({', '.join(tasks)}) to {args.output}")
    return 0


def continuous_command(args) -> int:
    """Runs `continuous`: one warm-started pipeline run per daily span, then a report of the spans.

    Args:
      args: the parsed arguments (`config`, `data_dir`, `output_dir`, `spans`, `rows`, `id_shift`,
        `cold`, `no_slots`, `json`).

    Returns:
      The exit status: `EXIT_BAD_INPUT` on a ConfigError, `EXIT_FAILED` when a run fails or a
      span pushed nothing for another reason, else `EXIT_NOT_PUSHED` when the gate kept any
      span's model back, else `EXIT_PUSHED`.
    """
    try:
        with runner.output_dir_lock(args.output_dir):  # every span's run, and the spans' config file
            continuous = dict({"warm_start": False} if args.cold else {}, **({"carry_slots": False} if args.no_slots else {}))
            cfg = span_config(args.config, args.data_dir, args.output_dir, {"continuous": continuous} if continuous else None)
            summaries = run_spans(cfg, args.data_dir, args.output_dir, args.spans, args.rows, args.id_shift,
                                  show=not args.json, progress_to_stderr=args.json)
    except ConfigError as e:  # e.g. a span's data path holds data the generator did not write
        print(error_line(e), file=sys.stderr)
        return EXIT_BAD_INPUT
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    statuses = [exit_status(s) for s in summaries]
    emit(spans_report(summaries, statuses), as_json=args.json)
    # 3 when the gate kept any span's model back; 1 when a span pushed nothing for another reason
    return max(statuses, key=lambda x: (x == EXIT_FAILED, x == EXIT_NOT_PUSHED)) if statuses else EXIT_PUSHED


def spans_report(summaries: List[Dict[str, Any]], statuses: List[int]) -> Report:
    """The `continuous` command's report: one row per span, wrapped like the run summary's
    (`summary.wrap_rows`, at SUMMARY_WIDTH columns).

    Args:
      summaries: each span's run summary (`summary.summarize`, with its `span`).
      statuses: each span's exit status, in the same order.

    Returns:
      The report; its data is the summaries and statuses (what `--json` prints).
    """
    report = Report("spans", data={"spans": summaries, "exit_statuses": statuses})
    for s in summaries:
        v, c = s.get("validation") or {}, s.get("continuous") or {}
        w = c.get("warm_start")
        carried = f"{w['rows_carried']:,}/{w['rows']:,} rows" if w else "from scratch"
        # an AUC undefined on the eval split (one label) shows its reason, as the run summary does
        base = f", baseline {metric_text(s, 'baseline_auc')}" if metric_measured(s, "baseline_auc") else ""
        report.add(f"span {s['span']}", f"warm start {carried}; model AUC {metric_text(s, 'eval_auc')}{base}; "
                                        f"{'blessed, pushed' if v.get('blessed') else 'not blessed, not pushed'}")
    return wrap_rows(report)


def build_parser() -> argparse.ArgumentParser:
    """Builds the command line's parser: the subcommands run, demo, continuous and compile.

    Returns:
      The parser.
    """
    parser = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "demo"):
        sp = sub.add_parser(name)
        sp.add_argument("--config", required=(name == "run"), default="configs/demo.yaml")
        sp.add_argument("--output-dir", required=(name == "run"), default="output/demo")
        sp.add_argument("--no-cache", action="store_true",
                        help="run every component again (by default a component whose share of the config "
                             "and whose inputs are unchanged reuses its outputs from an earlier run in --output-dir)")
        sp.add_argument("--json", action="store_true", help="print the summary as JSON instead of text")
        sp.add_argument("--with-data-validation", action="store_true",
                        help="also run TFX's stock StatisticsGen, SchemaGen and ExampleValidator on the examples (docs/tfx.md)")
    sp.add_argument("--rows", type=int, default=DEMO_ROWS, help="rows of the generated demo dataset")
    cs = sub.add_parser("continuous", help="daily spans with drifting IDs, one warm-started run per span (docs/continuous.md)")
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
    cs.add_argument("--json", action="store_true", help="print the spans' summaries as JSON instead of text")
    cp = sub.add_parser("compile", help="write the Kubeflow Pipelines v2 spec (.yaml) or Vertex PipelineJob (.json)")
    cp.add_argument("--config", required=True)
    cp.add_argument("--image", required=True, help="container image with the project installed (docker/Dockerfile)")
    cp.add_argument("--output", required=True, help="pipeline.yaml (KFP PipelineSpec) or pipeline.json (Vertex PipelineJob)")
    cp.add_argument("--pipeline-root", default=None, help="overrides kubeflow.pipeline_root (e.g. gs://BUCKET/root)")
    cp.add_argument("--tpu-image", default=None,
                    help="the Trainer's image on a TPU route (docker/Dockerfile.tpu); overrides kubeflow.tpu_trainer_image")
    sc = sub.add_parser("score", help="score a CSV or Parquet file with a serving model (docs/export.md)")
    sc.add_argument("--model", required=True, help="a serving model directory, e.g. a pushed version")
    sc.add_argument("--input", required=True, help="a .csv or .parquet file with the columns the model was trained on")
    sc.add_argument("--output", required=True, help="scores.parquet (or .csv): row, score and the carried columns")
    sc.add_argument("--carry", action="append", default=[], metavar="COLUMN",
                    help="an input column to copy beside each score, e.g. an ID (repeatable)")
    sc.add_argument("--delimiter", default=",", metavar="CHAR",
                    help="a CSV file's field separator (default a comma, as ExampleGen reads; e.g. ';' or $'\\t')")
    sc.add_argument("--beam", action="store_true",
                    help="score a Parquet file as a Beam job, one row group per work item (local processes by default)")
    sc.add_argument("--beam-option", action="append", default=[], metavar="OPTION",
                    help="a Beam option for --beam, e.g. --beam-option=--runner=DataflowRunner (repeatable)")
    ck = sub.add_parser("check-serving", help="load and answer a serving model as a stock TF Serving would (docs/export.md)")
    ck.add_argument("--model", required=True, help="a serving model directory, e.g. a pushed version")
    ck.add_argument("--json", action="store_true", help="print what the check found as JSON")
    return parser


def check_serving_command(args) -> int:
    """`check-serving`: what the check found, or one line naming why the model fails it (exit 1)."""
    # lazy: the check's own process loads TensorFlow; this one only for a damaged model's files
    from components.embedding_exporter.serving_check import ServingCheckFailed, check_serving

    try:
        found = check_serving(args.model)
    except ServingCheckFailed as e:
        print(error_line(e), file=sys.stderr)
        return EXIT_FAILED
    r = Report("serving check", data=found.to_dict())
    r.add("loaded", f"{found.model} in a fresh TensorFlow process: {found.ops} ops, all in stock TensorFlow; "
                    f"signatures {', '.join(found.signatures)} answered")
    r.add("answers", found.no_record or f"{found.compared} warm-up requests answered as exported "
                                          f"(max |diff| {found.max_diff:.1e})")
    r.add("latency", f"{found.timed_signature} on {found.timed_on}: " + "; ".join(
        f"batch {b}: p50 {t['p50_ms']:.2f} ms, p99 {t['p99_ms']:.2f} ms" for b, t in found.timings.items()))
    emit(r, as_json=args.json)
    return EXIT_PUSHED


def score_command(args) -> int:
    """`score`: one line per million rows on stderr while it scores, then what it did (exit 2: refused)."""
    # lazy: pyarrow and TensorFlow load only for this command
    from components.embedding_exporter.batch_scoring import ScoreError, score_file
    from components.embedding_exporter.batch_scoring_beam import LOCAL_BEAM_SCORING, score_file_beam

    shown = [0]

    def on_batch(rows: int) -> None:
        if rows // 1_000_000 > shown[0]:
            shown[0] = rows // 1_000_000
            print(f"scored {rows:,} rows", file=sys.stderr, flush=True)

    try:
        if args.beam:
            report = score_file_beam(args.model, args.input, args.output, carry=args.carry,
                                     beam_args=LOCAL_BEAM_SCORING + list(args.beam_option))
        else:
            report = score_file(args.model, args.input, args.output, carry=args.carry, on_batch=on_batch,
                                delimiter=args.delimiter)
    except ScoreError as e:
        print(error_line(e), file=sys.stderr)
        return EXIT_BAD_INPUT
    r = Report("scores", data=report.to_dict())
    r.add("scored", f"{report.rows_scored:,} of {report.rows_read:,} rows in {report.seconds:.1f}s "
                    f"({report.to_dict()['rows_per_second'] or 0:,} rows/s)")
    if report.malformed:
        r.add("not scored", f"{len(report.malformed):,} malformed row(s) (another number of fields than the header), "
                            f"data rows {', '.join(str(n) for n in report.malformed[:5])}")
    r.add("written", args.output)
    emit(r)
    return EXIT_PUSHED


def main(argv=None) -> int:
    """Runs the command line.

    Args:
      argv: the arguments (without the program name); None reads sys.argv.

    Returns:
      The exit status (module docstring).
    """
    args = build_parser().parse_args(argv)
    if args.command == "compile":
        return compile_command(args)
    if args.command == "continuous":
        return continuous_command(args)
    if args.command == "score":
        return score_command(args)
    if args.command == "check-serving":
        return check_serving_command(args)
    try:
        cfg = load_config(args.config)
        if args.command == "demo":
            meta = ensure_dataset(cfg.input.path, GeneratorSpec(rows=args.rows))
            print(f"demo data: {cfg.input.path} ({meta['rows']:,} rows)", file=sys.stderr if args.json else sys.stdout)
        input_location(cfg)
        with warnings.catch_warnings():  # Google's clients under Beam warn of Python 3.10 on import: not for the terminal
            warnings.simplefilter("ignore", FutureWarning)
            # lazy: Beam's file systems and pyarrow; only a run past the config checks needs them
            from components.example_gen.input_checks import check_input

            check_input(cfg)  # empty input, compressed bytes behind a plain name: refused before anything runs
    except ConfigError as e:
        print(error_line(e), file=sys.stderr)
        return EXIT_BAD_INPUT
    previous = signal.signal(signal.SIGTERM, runner.on_sigterm)  # SIGTERM ends the run as Ctrl-C does
    try:
        # with --json, stdout carries the JSON alone: the progress goes to stderr
        extra = {"extra_components": stock_data_components} if args.with_data_validation else {}
        result = runner.run(cfg, args.output_dir, quiet=True, cache=not args.no_cache, progress_to_stderr=args.json, **extra)
    except ConfigError as e:  # the output directory cannot be used, or another run holds it: nothing ran
        print(error_line(e), file=sys.stderr)
        return EXIT_BAD_INPUT
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return getattr(e, "status", EXIT_FAILED)
    finally:
        signal.signal(signal.SIGTERM, previous)
    emit(summary_report(result.summary), as_json=args.json)
    return result.exit_status


if __name__ == "__main__":
    sys.exit(main())
