"""Runs the preprocessing pipeline and writes its manifest and statistics.

`run_preprocessing` is what both the TFX executor and (later) the standalone CLI call; it takes a
ready `beam.Pipeline` so the caller decides the runner and its arguments.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from components import ledger as L
from components import row_counts
from components.beam_runtime import ensure_local_runner_safe
from components.config import PipelineConfig
from components.embedding_preprocess import beam_pipeline
from components.embedding_preprocess.health import check_health, feature_health
from components.embedding_preprocess import features as F
from components.embedding_preprocess import statistics as S
from components.embedding_preprocess.report import render_html
from components.embedding_preprocess import vocabulary as V

MANIFEST_FILE = "manifest.json"
STATISTICS_FILE = "statistics.json"  # version 4: + ledger, feature_health, examples_dropped by reason
REPORT_FILE = "statistics.html"
EMBEDDING_MANIFEST_FILE = "embedding_manifest.json"  # copy beside the transformed examples, for the trainer
# Copy of statistics.json beside the transformed examples: TFX's standard Trainer takes only the
# examples artifact, and the embedding plan sizes SparseCore limits from these statistics.
EMBEDDING_STATISTICS_FILE = "embedding_statistics.json"
MANIFEST_VERSION = 1


# Beam's FileSystems reach local disk, GCS, S3, HDFS alike, without importing TensorFlow (which
# costs ~20 s of start-up in every process that imports it).


def write_text(path: str, text: str) -> None:
    with FileSystems.create(path) as fh:
        fh.write(text.encode("utf-8"))


def _write_json(path: str, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str) -> Any:
    with FileSystems.open(path) as fh:
        return json.loads(fh.read().decode("utf-8"))


def _makedirs(path: str) -> None:
    if not FileSystems.exists(path):
        FileSystems.mkdirs(path)


def _raw_kinds(cfg: PipelineConfig, raw: Dict[str, float]) -> Dict[str, str]:
    """The tf.Example kind of every configured column, as ExampleGen stored it."""
    seen: Dict[str, set] = {}
    for key in raw:
        if key.startswith("kind/"):
            _, column, kind = key.split("/", 2)
            if kind != F.KIND_NONE:
                seen.setdefault(column, set()).add(kind)
    kinds = {}
    defaults = [(cfg.label, F.KIND_FLOAT)]
    defaults += [(d.source, F.KIND_FLOAT) for d in cfg.dense_features]
    defaults += [(f.source, F.KIND_BYTES) for f in cfg.categorical_features]
    for column, default in defaults:
        found = seen.get(column, set())
        if len(found) > 1:
            raise ValueError(
                f"column {column!r} holds values of several types ({', '.join(sorted(found))}) across "
                "examples; store one type per column"
            )
        kinds[column] = found.pop() if found else default
    return kinds


def build_manifest(cfg: PipelineConfig, raw: Dict[str, float], vocabulary_dir: str) -> Dict[str, Any]:
    vocabularies = {}
    for t in cfg.tables:
        size = len(V.read_vocabulary(vocabulary_dir, t.name))
        vocabularies[t.name] = {
            "file": os.path.basename(V.vocabulary_file(vocabulary_dir, t.name)),
            "counts_file": os.path.basename(V.counts_file(vocabulary_dir, t.name)),
            "size": size,
            "distinct_before_pruning": raw.get(f"info/vocab/{t.name}", {}).get("distinct_values", 0),
            "num_oov_buckets": t.vocabulary.num_oov_buckets,
            "rows": size + t.vocabulary.num_oov_buckets,
            "dim": t.dim,
            "combiner": t.combiner,
            "features": list(cfg.resolved.table(t.name).features),
        }
    return {
        "version": MANIFEST_VERSION,
        "vocabulary_dir": vocabulary_dir,
        "label": cfg.label,
        "raw_feature_kinds": _raw_kinds(cfg, raw),
        "dense_features": [{"name": d.name, "column": d.source, "fill_value": d.fill_value} for d in cfg.dense_features],
        "categorical_features": [
            {
                "name": f.name,
                "column": f.source,
                "table": cfg.feature_table(f).name,
                "separator": f.separator,
                "max_length": f.max_length,
            }
            for f in cfg.categorical_features
        ],
        "vocabularies": vocabularies,
    }


def build_statistics(cfg: PipelineConfig, raw: Dict[str, Any], manifest: Dict[str, Any], splits: List[str]):
    """The versioned statistics.json: per split, per feature, per dense feature and per table."""

    def g(key: str) -> float:
        return raw.get(key, 0)

    out: Dict[str, Any] = {
        "version": S.STATISTICS_VERSION,
        "global_batch_size": cfg.training.batch_size,
        "shard_counts": list(cfg.statistics.shard_counts),
        "splits": {},
        "features": {},
        "dense_features": {},
        "tables": {},
    }
    for s in splits:
        read = int(g(f"{s}/examples_read"))
        dropped = {r: int(g(f"{s}/dropped/{r}")) for r in (F.DROP_MISSING_LABEL, F.DROP_INVALID_LABEL)}
        kept = read - sum(dropped.values())
        out["splits"][s] = {
            "examples_read": read,
            "examples_dropped": dropped,
            "examples_written": kept,
            "positive_rate": g(f"{s}/positives") / kept if kept else None,
        }
    for f in cfg.categorical_features:
        per_split = {}
        for s in splits:
            p = f"{s}/feature/{f.name}"
            read = out["splits"][s]["examples_written"]  # kept rows
            ids = g(f"{p}/ids")
            per_split[s] = {
                "examples_present": int(g(f"{p}/present")),
                "present_rate": g(f"{p}/present") / read if read else None,
                "ids": int(ids),
                "ids_per_example": S.pooling_summary(list(raw.get(f"vec/{p}/ids_per_example_histogram", []))),
                "truncated_ids": int(g(f"{p}/truncated")),
                "oov_ids": int(g(f"{p}/oov")),
                "oov_rate": g(f"{p}/oov") / ids if ids else None,
                "invalid_values": {
                    k.rsplit("/", 1)[1]: int(v) for k, v in sorted(raw.items()) if k.startswith(f"{p}/invalid/")
                },
            }
        table = cfg.feature_table(f)
        # The feature's own value distribution on the train split (exact): for a feature with a table
        # of its own it is the table's; a feature of a shared table has its own counts.
        if cfg.resolved.table(table.name).shared:
            values = raw.get(f"info/feature_values/{f.name}", {})
        else:
            values = {k: v for k, v in raw.get(f"info/vocab/{table.name}", {}).items() if k in S.DISTRIBUTION_KEYS}
        out["features"][f.name] = {"table": table.name, "values": values, "splits": per_split}
    for d in cfg.dense_features:
        out["dense_features"][d.name] = {
            s: {
                "missing": int(g(f"{s}/dense/{d.name}/missing")),
                "invalid_values": {
                    k.rsplit("/", 1)[1]: int(v)
                    for k, v in sorted(raw.items())
                    if k.startswith(f"{s}/dense/{d.name}/invalid/")
                },
            }
            for s in splits
        }
    slots = S.OPTIMIZER_SLOTS[cfg.training.embedding_optimizer.name]
    for name, v in manifest["vocabularies"].items():
        p = f"train/table/{name}"
        batches = g(f"{p}/batches")
        out["tables"][name] = {
            "features": v["features"],
            "distinct_values": v["distinct_before_pruning"],
            "vocabulary_size": v["size"],
            "rows": v["rows"],
            "dim": v["dim"],
            "vocabulary": raw.get(f"info/vocab/{name}", {}),
            "batches": {
                "full_batches": int(batches),
                "ids_per_batch_mean": g(f"{p}/batch_ids") / batches if batches else None,
                "ids_per_batch_max": raw.get(f"max/{p}/batch_ids"),
                "unique_ids_per_batch_mean": g(f"{p}/batch_unique_ids") / batches if batches else None,
                "unique_ids_per_batch_max": raw.get(f"max/{p}/batch_unique_ids"),
            },
            "shards": S.shard_summary(raw, "train", name, cfg.statistics.shard_counts, cfg.statistics.headroom),
            "memory": {
                "weight_bytes": v["rows"] * v["dim"] * 4,
                "optimizer": cfg.training.embedding_optimizer.name,
                "slots_per_row": slots,
                # rows x dim x 4 bytes x (1 + optimizer slots)
                "total_bytes": v["rows"] * v["dim"] * 4 * (1 + slots),
            },
        }
    out["train_partial_batches"] = int(g("train/partial_batches"))
    out["input"] = {
        "malformed_rows": int(g("input/malformed_rows")),
        "not_numeric": {k.rsplit("/", 1)[1]: int(v) for k, v in sorted(raw.items()) if k.startswith("input/not_numeric/")},
    }
    return out


def _csv_data_rows(pattern: str) -> int:
    return sum(
        row_counts.count_file(m.path, row_counts.count_csv_records).data_records
        for m in FileSystems.match([pattern])[0].metadata_list
    )


def build_ledger(
    cfg: PipelineConfig,
    stats: Dict[str, Any],
    split_patterns: Dict[str, str],
    transformed_dirs: Dict[str, str],
    input_format: str,
    upstream_ledger: Optional[Dict[str, Any]],
) -> Dict[str, Any]:
    """The ledger so far (ExampleGen's stages, or the CLI's CSV reading) plus this stage's."""
    read = {s: v["examples_read"] for s, v in stats["splits"].items()}
    stages = list(upstream_ledger["stages"]) if upstream_ledger else []
    upstream = dict(stages[-1]["rows_out"]) if stages else None
    if not stages and input_format == "csv":
        data_rows = {s: _csv_data_rows(p) for s, p in split_patterns.items()}
        stages.append(L.csv_input_stage(data_rows, read, stats["input"]["malformed_rows"]))
    written = {s: row_counts.count_records_in(d, L.PREPROCESS) for s, d in transformed_dirs.items()}
    dropped = {s: v["examples_dropped"] for s, v in stats["splits"].items()}
    stages.append(L.preprocess_stage(read, dropped, written, upstream))
    return L.ledger(stages)


def run_preprocessing(
    pipeline: beam.Pipeline,
    cfg: PipelineConfig,
    split_patterns: Dict[str, str],
    vocabulary_dir: str,
    transformed_dirs: Optional[Dict[str, str]],
    statistics_dir: str,
    input_format: str = "tfrecord",
    upstream_ledger: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Runs Beam, then writes manifest.json (vocabulary dir), statistics.json and statistics.html,
    and copies of the manifest and statistics beside the transformed examples (for the trainer). Returns the statistics.

    `transformed_dirs=None` analyses only (vocabularies and their statistics, row counts).
    `upstream_ledger`: ExampleGen's row ledger; this stage's rows in must equal its rows out.
    The statistics carry the row ledger and the feature health; after they are written, a ledger
    that does not add up raises LedgerError and an unhealthy feature FeatureHealthError (the run
    stops before training; the report says why)."""
    ensure_local_runner_safe(list(pipeline.options.get_all_options(drop_default=True).get("experiments") or []))
    if "train" not in split_patterns:
        raise ValueError(f"preprocessing needs a 'train' split to build vocabularies; got {sorted(split_patterns)}")
    for d in [vocabulary_dir, statistics_dir, *(transformed_dirs or {}).values()]:
        _makedirs(d)
    with pipeline as p:
        beam_pipeline.build_pipeline(
            p, cfg, split_patterns, vocabulary_dir, transformed_dirs, statistics_dir, input_format
        )
    partial = os.path.join(statistics_dir, beam_pipeline.STATS_FILE_PREFIX)
    raw = read_json(partial)
    FileSystems.delete([partial])
    for t in cfg.tables:  # a vocabulary no train example fed still gets (empty) files
        if not FileSystems.exists(V.vocabulary_file(vocabulary_dir, t.name)):
            V.write_vocabulary(vocabulary_dir, t.name, [])
    manifest = build_manifest(cfg, raw, vocabulary_dir)
    stats = build_statistics(cfg, raw, manifest, sorted(split_patterns) if transformed_dirs else ["train"])
    stats["ledger"] = (
        build_ledger(cfg, stats, split_patterns, transformed_dirs, input_format, upstream_ledger) if transformed_dirs else None
    )
    # Analysis only reads no feature presence: health needs the transform pass.
    stats["feature_health"] = feature_health(cfg, stats) if transformed_dirs else None
    _write_json(os.path.join(vocabulary_dir, MANIFEST_FILE), manifest)
    _write_json(os.path.join(statistics_dir, STATISTICS_FILE), stats)
    write_text(os.path.join(statistics_dir, REPORT_FILE), render_html(stats, f"Embedding-ID statistics: {cfg.name}"))
    if transformed_dirs:
        root = os.path.dirname(next(iter(transformed_dirs.values())).rstrip("/"))
        _write_json(os.path.join(root, EMBEDDING_STATISTICS_FILE), stats)
        _write_json(os.path.join(root, EMBEDDING_MANIFEST_FILE), manifest)
    if stats["ledger"] is not None:
        for stage in stats["ledger"]["stages"]:
            L.check_stage(stage)
    if stats["feature_health"] is not None:
        check_health(stats["feature_health"])
    return stats
