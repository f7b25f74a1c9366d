"""Standalone preprocessing, the same Beam transforms without a TFX pipeline.

    python -m components.embedding_preprocess --config FILE --input PATH --output DIR \\
        [--eval-input PATH] [--format csv|tfrecord|parquet] [--overwrite] [beam pipeline args...]

`--format parquet` reads an ExampleGen split as EmbeddingExampleGen writes it (e.g.
.../EmbeddingExampleGen/examples/<id>/Split-train/*), `tfrecord` TFRecords of tf.Examples.

Writes DIR/vocabulary/ (vocabulary files + manifest.json), DIR/statistics/ (statistics.json and
statistics.html) and DIR/transformed/Split-<split>/ (gzipped TFRecords of embedding IDs). Local
output is written under DIR.partial and renamed at the end, so a failed run leaves no DIR that a
later step could trust. Unrecognised arguments are Beam pipeline arguments (e.g.
`--runner=DataflowRunner --project=... --temp_location=gs://...`); without them the config's
`beam:` settings apply. Prints a summary (`--json`: as JSON). Exit status: 0 done, 2 bad
configuration or input (one line), 1 a failed run (one line naming the cause and the log file
that holds the traceback: DIR.log beside a local DIR, else a temporary file).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import components  # noqa: F401
from components.config.loading import load_config
from components.config.schema import ConfigError, PipelineConfig
from components.contracts.statistics import EmbeddingStatistics
from components.reporting.errors import InputError, one_line
from components.reporting.report import Report, count_list, emit, error_line, reasons_list, write_traceback
from components.config.choices import InputFormat


def _pattern(path: str) -> str:
    if "://" not in path and os.path.isdir(path):
        return os.path.join(path, "*")
    return path


def _parse_args(argv: Optional[List[str]]) -> Tuple[argparse.Namespace, List[str]]:
    """The CLI's own arguments, and the rest (Beam pipeline arguments)."""
    parser = argparse.ArgumentParser(prog="python -m components.embedding_preprocess", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--input", required=True, help="train split: file, directory or glob")
    parser.add_argument("--eval-input", help="optional eval split, transformed with the train vocabularies")
    parser.add_argument("--output", required=True)
    parser.add_argument("--format", choices=("csv", "tfrecord", "parquet"), help="default: the config's input.format")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    parser.add_argument(
        "--analyze-only", action="store_true", help="vocabularies and their statistics only: no transformed examples"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON instead of text")
    return parser.parse_known_args(argv)


def _check_inputs(args: argparse.Namespace) -> Tuple[PipelineConfig, str, Dict[str, str]]:
    """The configuration, the input format and each split's file pattern, checked before Beam starts.

    Raises:
      ConfigError: the configuration cannot be loaded.
      InputError: the input cannot be read as configured, or the output directory is in use.
    """
    # lazy: keeps Beam off the CLI's startup (--help, a configuration error)
    from apache_beam.io.filesystems import FileSystems
    from components.embedding_preprocess.csv_input import check_csv_input
    from components.example_gen.input_checks import check_compression

    cfg = load_config(args.config)
    if args.format is None and cfg.input.format == InputFormat.PARQUET:
        # The config's input.format names raw Parquet files, which EmbeddingExampleGen types
        # (nulls, dictionaries, scalar or list columns); this CLI reads an ExampleGen split's.
        raise InputError(
            "input.format: parquet is typed by EmbeddingExampleGen; run the pipeline (python -m pipelines run), "
            "or pass --format parquet to read an ExampleGen split (.../EmbeddingExampleGen/examples/<id>/Split-train)")
    fmt = args.format or cfg.input.format
    patterns = {"train": _pattern(args.input)}
    if args.eval_input:
        patterns["eval"] = _pattern(args.eval_input)
    for split, pattern in patterns.items():
        found = FileSystems.match([pattern])[0].metadata_list
        if not found:
            raise InputError(f"--{'input' if split == 'train' else 'eval-input'} {pattern!r} matches no file")
        for m in found:  # compressed bytes behind a plain name, refused naming the file
            check_compression(m.path, fmt)
        if fmt == InputFormat.CSV:
            check_csv_input(cfg, pattern)
    if "://" not in args.output and os.path.exists(args.output) and os.listdir(args.output) and not args.overwrite:
        raise InputError(f"--output {args.output!r} exists and is not empty; pass --overwrite or another directory")
    return cfg, fmt, patterns


def _run(args: argparse.Namespace, beam_args: List[str], cfg: PipelineConfig, fmt: str, patterns: Dict[str, str],
         work: str) -> Callable[[], EmbeddingStatistics]:
    """The preprocessing run, writing into `work`, ready to start: call it for the statistics.
    Beam's options are parsed here, so that bad Beam arguments fail before the run starts."""
    # lazy: keeps Beam off the CLI's startup (--help, a configuration error)
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from components.embedding_preprocess.run import run_preprocessing

    options = PipelineOptions(cfg.beam_pipeline_args() + beam_args)
    return lambda: run_preprocessing(
        beam.Pipeline(options=options),
        cfg,
        patterns,
        vocabulary_dir=os.path.join(work, "vocabulary"),
        transformed_dirs=None
        if args.analyze_only
        else {s: os.path.join(work, "transformed", f"Split-{s}") for s in patterns},
        statistics_dir=os.path.join(work, "statistics"),
        input_format=fmt,
    )


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the CLI (see the module docstring).

    Args:
      argv: the arguments (default: the process's).

    Returns:
      The exit status: 0 done, 2 bad configuration or input, 1 a failed run.
    """
    args, beam_args = _parse_args(argv)
    try:
        cfg, fmt, patterns = _check_inputs(args)
    except (ConfigError, InputError) as e:
        print(error_line(e), file=sys.stderr)
        return 2
    remote = "://" in args.output
    work = args.output if remote else args.output.rstrip("/") + ".partial"
    run = _run(args, beam_args, cfg, fmt, patterns, work)
    if not remote and os.path.exists(work):
        shutil.rmtree(work)
    start = time.time()
    try:
        stats = run()
    except Exception as e:  # noqa: BLE001 - one line on the terminal, the traceback in a log file
        if not remote:
            shutil.rmtree(work, ignore_errors=True)
        log = write_traceback(None if remote else args.output.rstrip("/") + ".log", "embedding_preprocess")
        print(error_line(one_line(e), "preprocessing", log), file=sys.stderr)
        return 1
    if not remote:
        if os.path.exists(args.output):
            shutil.rmtree(args.output)
        os.replace(work, args.output)
    seconds = time.time() - start
    emit(preprocess_report(stats, args.output, seconds), as_json=args.json)
    return 0


def preprocess_report(stats: EmbeddingStatistics, output: str, seconds: float) -> Report:
    """The run in brief, as every tool of the product prints it (components/reporting/report.py).

    Args:
      stats: the run's statistics.
      output: the output directory.
      seconds: how long the run took.

    Returns:
      The report: rows read and dropped, input problems, the ledger, vocabulary sizes, where the output is.
    """
    read = {s: v["examples_read"] for s, v in stats.splits.items()}
    sizes = {t: v["vocabulary_size"] for t, v in stats.tables.items()}
    r = Report("preprocessing summary", data={
        "output": output, "seconds": round(seconds, 1), "rows_read": read,
        "rows_dropped": {s: v["examples_dropped"] for s, v in stats.splits.items()},
        "input": dict(stats.input), "vocabulary_sizes": sizes, "ledger": stats.ledger,
    })
    r.add("rows read", f"{count_list(read)} in {seconds:.1f}s ({sum(read.values()) / max(seconds, 1e-9):,.0f} rows/s)")
    r.add("rows dropped", reasons_list({s: v["examples_dropped"] for s, v in stats.splits.items()}))
    if stats.input:
        r.add("input", reasons_list(dict(stats.input)))
    for stage in (stats.ledger or {}).get("stages", []):
        r.add(f"ledger {stage['stage']}", f"in {count_list(stage['rows_in'])}; out {count_list(stage['rows_out'])} "
                                          f"({'adds up' if stage['balanced'] else 'DOES NOT ADD UP'})")
    r.add("vocabularies", f"{len(sizes)} tables, {sum(sizes.values()):,} entries in all")
    r.sub("", ", ".join(f"{k}={v:,}" for k, v in sizes.items()))
    r.add("output", output)
    r.add("report", os.path.join(output, "statistics", "statistics.html"))
    return r


if __name__ == "__main__":
    sys.exit(main())
