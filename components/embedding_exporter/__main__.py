"""Standalone exporter: the pipeline's conversion, outside a pipeline.

    python -m components.embedding_exporter --model MODEL_DIR --output OUT_DIR --examples 'EVAL_GLOB' \
        [--config FILE] [--checkpoint PREFIX] [--table-dtype float32|float16|int8] [--no-tables] \
        [--layout auto|A|B|C] [--partition-strategy div|mod] [--num-partitions N] \
        [--num-sparse-cores N] [--sparse-cores-per-chip N] [--table-key TABLE=CHECKPOINT_KEY ...]

MODEL_DIR is a Model artifact of this product's trainer (embedding_plan.json, embedding_manifest.json,
checkpoints/, Format-Serving/). The config defaults to the one the trainer stored beside the model
(pipeline_config.json); options override its `export` section. EVAL_GLOB: raw eval tf.Examples as
ExampleGen wrote them (e.g. .../EmbeddingExampleGen/examples/<id>/Split-eval/*), used for the parity
check and the AUC figures. Prints a summary (`--json`: export_report.json's content). Exit status
0: exported; 2: bad arguments or config; 3: export refused (the reason is printed; nothing is
written under OUT_DIR); 1: failed (one line; the traceback goes to OUT_DIR.log, or a temporary
file when that cannot be written).
"""
from __future__ import annotations

import argparse
import os
import sys

import components  # noqa: F401
from components.config.loading import config_from_json, load_config
from components.config.schema import LAYOUT_KINDS, PARTITION_STRATEGIES, TABLE_DTYPES, ConfigError, PipelineConfig
from components.config.validation import check_export_config
from components.contracts.artifacts import TRAINER_CONFIG_FILE
from components.contracts.serving_inputs import renamed_inputs_line
from components.reporting.errors import one_line
from components.reporting.report import Report, emit, error_line, write_traceback


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m components.embedding_exporter", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Model artifact directory written by this product's trainer")
    p.add_argument("--output", required=True, help="where Format-Serving/, tables/ and export_report.json go")
    p.add_argument("--examples", required=True, help="file pattern of raw eval tf.Example TFRecords (parity, AUC)")
    p.add_argument("--config", help="pipeline YAML (default: MODEL_DIR/pipeline_config.json)")
    p.add_argument("--checkpoint", help="checkpoint prefix (default: the latest in MODEL_DIR/checkpoints)")
    p.add_argument("--table-dtype", choices=TABLE_DTYPES, help="tables of the serving model")
    p.add_argument("--no-tables", action="store_true", help="do not write tables/ (row-aligned arrays)")
    p.add_argument("--layout", choices=LAYOUT_KINDS, help="checkpoint table layout (default auto)")
    p.add_argument("--partition-strategy", choices=PARTITION_STRATEGIES, help="layout C: how training partitioned tables")
    p.add_argument("--num-partitions", type=int, help="layout C with one sliced key per table: host count")
    p.add_argument("--num-sparse-cores", type=int, help="layout B without a layout record: total SparseCores")
    p.add_argument("--sparse-cores-per-chip", type=int, help="layout B without a layout record")
    p.add_argument("--table-key", action="append", default=[], metavar="TABLE=KEY",
                   help="checkpoint key of a table saved by another trainer (repeatable)")
    p.add_argument("--json", action="store_true", help="print the export report as JSON instead of a summary")
    return p


def _config_from_args(args: argparse.Namespace) -> PipelineConfig:
    """The pipeline config (--config, or the one stored beside the model) with the options'
    overrides of its `export` section, checked. Raises ConfigError."""
    if args.config:
        cfg = load_config(args.config)
    else:
        path = os.path.join(args.model, TRAINER_CONFIG_FILE)
        if not os.path.exists(path):
            raise ConfigError(f"--config: not given and {path} does not exist (models trained before it was written); pass the pipeline YAML")
        with open(path, encoding="utf-8") as fh:
            cfg = config_from_json(fh.read())
    e = cfg.export
    if args.table_dtype:
        e.table_dtype = args.table_dtype
    if args.no_tables:
        e.write_tables = False
    lay = e.layout
    for opt, name in (("layout", "kind"), ("partition_strategy", "partition_strategy"),
                      ("num_partitions", "num_partitions"), ("num_sparse_cores", "num_sparse_cores"),
                      ("sparse_cores_per_chip", "sparse_cores_per_chip")):
        if getattr(args, opt) is not None:
            setattr(lay, name, getattr(args, opt))
    for item in args.table_key:
        table, sep, key = item.partition("=")
        if not sep or not table or not key:
            raise ConfigError(f"--table-key {item!r}: expected TABLE=CHECKPOINT_KEY")
        lay.table_keys[table] = key
    check_export_config(e)  # the overrides get the config's own checks
    return cfg


def main(argv=None) -> int:
    """Runs the standalone exporter.

    Args:
      argv: the command line's arguments (None: sys.argv's).

    Returns:
      The exit status: 0 exported, 1 failed, 2 bad arguments or config, 3 export refused.
    """
    args = _parser().parse_args(argv)
    # lazy: TensorFlow and TFX load only once the arguments parse (--help stays fast)
    from components.embedding_exporter.export import export_serving_model
    from components.embedding_model.restore import ExportRefused

    try:
        cfg = _config_from_args(args)
    except ConfigError as err:
        print(error_line(err), file=sys.stderr)
        return 2
    try:
        report = export_serving_model(cfg, args.model, args.examples, args.output, checkpoint_path=args.checkpoint)
    except ExportRefused as err:
        print(error_line(f"export refused: {err}"), file=sys.stderr)  # its first line
        return 3
    except Exception as err:  # noqa: BLE001 - one line on the terminal, the traceback in a log file
        log = write_traceback(args.output.rstrip("/") + ".log", "embedding_exporter")
        print(error_line(one_line(err), "export", log), file=sys.stderr)
        return 1
    emit(export_summary(report, args.output), as_json=args.json)
    return 0


def export_summary(report, output: str) -> Report:
    """Summarises an export, as every tool of the product prints it (components/reporting/report.py).

    Args:
      report: the export report (`export_serving_model`'s).
      output: the serving Model directory it was written to.

    Returns:
      The summary.
    """
    r = Report("export summary", data=report)
    p = report["parity"]
    r.add("serving model", os.path.join(output, "Format-Serving"))
    r.add("table layout", f"{report['layout']['detected']}; serving tables {report['table_dtype']}")
    r.add("parity", f"{'passed' if p['passed'] else 'FAILED'}: max |trained - serving| = {p['max_abs_diff']:.2e} "
                    f"on {p['examples']} raw eval examples (tolerance {p['tolerance']:g})")
    if report.get("serving_inputs_renamed"):
        r.add("serving inputs", renamed_inputs_line(report["serving_inputs_renamed"]))
    auc = report["eval_auc"]
    if auc.get("serving") is not None and auc.get("trained_model") is not None:
        r.add("eval AUC", f"serving {auc['serving']:.4f}, trained model {auc['trained_model']:.4f} "
                          f"on {auc['examples']:,} eval rows")
    else:  # undefined on the sample, e.g. one label only: the reason instead of a NaN
        r.add("eval AUC", f"{auc.get('undefined') or 'undefined'} ({auc['examples']:,} eval rows)")
    for dtype, c in sorted((report.get("compression") or {}).items()):
        if "table_bytes" in c:
            change = c.get("auc_change", 0)
            r.sub(dtype, f"{c['table_bytes'] / 1e6:.1f} MB of tables, AUC "
                         + (f"{change:+.1e}" if change is not None else c.get("auc_undefined") or "change undefined"))
    r.add("report", os.path.join(output, "export_report.json"))
    return r


if __name__ == "__main__":
    sys.exit(main())
