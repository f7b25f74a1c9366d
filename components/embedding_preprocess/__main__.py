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
from typing import List, Optional

import components  # noqa: F401
from components.config.loading import load_config
from components.config.schema import ConfigError
from components.reporting.errors import one_line
from components.reporting import emit, error_line, write_traceback


def _pattern(path: str) -> str:
    if "://" not in path and os.path.isdir(path):
        return os.path.join(path, "*")
    return path


def main(argv: Optional[List[str]] = None) -> int:
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
    args, beam_args = parser.parse_known_args(argv)

    from apache_beam.io.filesystems import FileSystems

    from components.embedding_preprocess.csv_input import InputError, check_columns, read_header

    try:
        cfg = load_config(args.config)
        if args.format is None and cfg.input.format == "parquet":
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
            if not FileSystems.match([pattern])[0].metadata_list:
                raise InputError(f"--{'input' if split == 'train' else 'eval-input'} {pattern!r} matches no file")
            if fmt == "csv":
                check_columns(cfg, read_header(pattern), pattern)
        remote = "://" in args.output
        if not remote and os.path.exists(args.output) and os.listdir(args.output) and not args.overwrite:
            raise InputError(f"--output {args.output!r} exists and is not empty; pass --overwrite or another directory")
    except (ConfigError, InputError) as e:
        print(error_line(e), file=sys.stderr)
        return 2

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from components.embedding_preprocess.run import run_preprocessing

    work = args.output if remote else args.output.rstrip("/") + ".partial"
    if not remote and os.path.exists(work):
        shutil.rmtree(work)
    options = PipelineOptions(cfg.beam_pipeline_args() + beam_args)
    start = time.time()
    try:
        stats = run_preprocessing(
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


def preprocess_report(stats, output: str, seconds: float):
    """The run in brief, as every tool of the product prints it (components/reporting/__init__.py)."""
    from components.reporting import Report, count_list, reasons_list

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
