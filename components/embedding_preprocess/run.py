"""Runs the preprocessing pipeline and writes its manifest and statistics.

`run_preprocessing` is what both the TFX executor and (later) the standalone CLI call; it takes a
ready `beam.Pipeline` so the caller decides the runner and its arguments.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Dict, List, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from components.rows import ledger
from components.reporting import progress
from components.rows import row_counts
from components.reporting.errors import LedgerError
from components.data_io.beam_runtime import add_worker_plugin, ensure_local_runner_safe
from components.data_io.out_of_space import out_of_space_named
from components.config.binding import table_optimizer
from components.config.schema import CategoricalFeature, PipelineConfig
from components.contracts import artifacts
from components.data_io.checksums import file_sha256
from components.config.choices import FORMAT_BLOCKS
from components.contracts.manifest import VocabularyEntry, VocabularyManifest, feature_entries
from components.planning.sizing import table_layout, table_memory, table_rows
from components.contracts.statistics import EmbeddingStatistics
from components.embedding_preprocess import beam_pipeline
from components.embedding_preprocess.counting import shared_table_features
from components.embedding_preprocess.health import check_health, feature_health
from components.embedding_preprocess import partials
from components.embedding_preprocess import spill
from components.embedding_preprocess import statistics
from components.embedding_preprocess.report import render_html
from components.embedding_preprocess import vocabulary as vocabulary_lib
from components.rules.rulebook import DROP_INVALID_LABEL, DROP_MISSING_LABEL, KIND_BYTES, KIND_FLOAT, KIND_NONE
from components.tfx_wiring.executor_base import read_json, write_text
from components.config.choices import InputFormat


def _makedirs(path: str) -> None:
    if not FileSystems.exists(path):
        FileSystems.mkdirs(path)


def _observed_kinds(raw: Dict[str, float]) -> Dict[str, set]:
    """The kinds each column's values had in the batches read (columns without a value: absent)."""
    seen: Dict[str, set] = {}
    for key in raw:
        parsed = partials.parse_raw_kind(key)
        if parsed is not None and parsed[1] != KIND_NONE:
            seen.setdefault(parsed[0], set()).add(parsed[1])
    return seen


def _raw_kinds(cfg: PipelineConfig, raw: Dict[str, float]) -> Dict[str, str]:
    """The tf.Example kind of every configured column, as ExampleGen stored it (a stock
    CsvExampleGen: int64 for integer-valued columns): what the serving model parses. A column
    without a value in any example gets its feature's natural kind."""
    seen = _observed_kinds(raw)
    kinds = {}
    defaults = [(cfg.label, KIND_FLOAT)]
    defaults += [(d.source, KIND_FLOAT) for d in cfg.dense_features]
    defaults += [(f.source, KIND_BYTES) for f in cfg.categorical_features]
    defaults += [(f.weight_column, KIND_FLOAT) for f in cfg.categorical_features if f.weight_column]
    for column, default in defaults:
        found = seen.get(column, set())
        if len(found) > 1:
            # The serving model parses each column as one type. A stock CsvExampleGen types each
            # input split's columns on their own: one cell of text (or a decimal point) in one split.
            raise ValueError(
                f"column {column!r} holds values of several types ({', '.join(sorted(found))}) across "
                "examples; store one type per column (a stock CsvExampleGen infers each input split's "
                "types on its own: make the column's cells alike in every split, or read one input split)"
            )
        kinds[column] = found.pop() if found else default
    return kinds


def column_notes(cfg: PipelineConfig, raw: Dict[str, float]) -> Dict[str, str]:
    """Per configured feature column whose type leaves it unusable, why, in words the feature
    health line carries: a column no example holds a value of, a dense or weight column stored as
    text (a stock CsvExampleGen stores a column as text when one cell is no number), a
    categorical column stored as float. Its rows stay (filled, or without IDs) and are counted."""
    seen = _observed_kinds(raw)
    numeric = [d.source for d in cfg.dense_features] + [f.weight_column for f in cfg.categorical_features if f.weight_column]
    notes: Dict[str, str] = {}
    for column in [*numeric, *(f.source for f in cfg.categorical_features)]:
        kinds = seen.get(column, set())
        if not kinds:
            notes[column] = f"column {column!r} holds no value in any example (absent from the input?)"
        elif column in numeric and KIND_BYTES in kinds:
            notes[column] = (f"the examples store column {column!r} as text (bytes), not numbers: fix its "
                             "non-numeric cells (a stock CsvExampleGen types a column as text when one cell is no number)")
        elif column not in numeric and KIND_FLOAT in kinds:
            notes[column] = (f"the examples store column {column!r} as float: categorical values must be "
                             "text or int64")
    return notes


def _vocabulary_sha256(vocabulary_dir: str, table: str) -> Optional[str]:
    """The SHA-256 of a table's vocabulary file as written (None where there is no file)."""
    from apache_beam.io.filesystems import FileSystems  # lazy: keeps Beam off the manifest reader's import path

    path = artifacts.vocabulary_file(vocabulary_dir, table)
    return file_sha256(path, FileSystems.open) if FileSystems.exists(path) else None


def build_manifest(cfg: PipelineConfig, raw: Dict[str, float], vocabulary_dir: str) -> VocabularyManifest:
    vocabularies = {}
    for t in cfg.tables:
        size, num_oov_buckets = table_layout(t.vocabulary, len(vocabulary_lib.read_vocabulary_tokens(vocabulary_dir, t.name)))
        vocabularies[t.name] = VocabularyEntry(
            file=os.path.basename(artifacts.vocabulary_file(vocabulary_dir, t.name)),
            counts_file=os.path.basename(artifacts.counts_file(vocabulary_dir, t.name)),
            size=size,
            distinct_before_pruning=raw.get(partials.vocabulary_info(t.name), {}).get("distinct_values", 0),
            num_oov_buckets=num_oov_buckets,
            rows=table_rows(size, num_oov_buckets),
            kind=t.vocabulary.kind,
            default_value=t.vocabulary.default_value,
            dim=t.dim,
            combiner=t.combiner,
            features=tuple(cfg.resolved.table(t.name).features),
            sha256=_vocabulary_sha256(vocabulary_dir, t.name),
        )
    dense, categorical = feature_entries(cfg)
    return VocabularyManifest(
        vocabulary_dir=vocabulary_dir,
        label=cfg.label,
        raw_feature_kinds=_raw_kinds(cfg, raw),
        dense_features=dense,
        categorical_features=categorical,
        vocabularies=vocabularies,
        transformed_format=cfg.transformed_examples.format,
        block_rows=cfg.transformed_examples.block_rows if cfg.transformed_examples.format == FORMAT_BLOCKS else 0,
    )


def build_statistics(
    cfg: PipelineConfig, raw: Dict[str, Any], manifest: VocabularyManifest, splits: List[str]
) -> EmbeddingStatistics:
    """The statistics from the merged partials `raw`: per split, per feature, per dense feature and
    per table (the manifest's vocabularies); the ledger and feature health are added after."""
    split_stats = {s: _split_statistics(raw, s) for s in splits}
    shared = set(shared_table_features(cfg))  # the pipeline describes these features' own values
    return EmbeddingStatistics(
        global_batch_size=cfg.training.batch_size,
        shard_counts=tuple(cfg.statistics.shard_counts),
        splits=split_stats,
        features={
            f.name: _feature_statistics(cfg, raw, f, split_stats, f.name in shared) for f in cfg.categorical_features
        },
        dense_features={
            d.name: {s: _dense_statistics(raw, s, d.name, split_stats[s]["examples_written"]) for s in splits}
            for d in cfg.dense_features
        },
        tables={name: _table_statistics(cfg, raw, name, v) for name, v in manifest.vocabularies.items()},
        train_partial_batches=int(raw.get(partials.partial_batches("train"), 0)),
        input={
            "malformed_rows": int(raw.get(partials.MALFORMED_ROWS, 0)),
            "not_numeric": _by_reason(raw, partials.NOT_NUMERIC),
        },
    )


def _by_reason(raw: Dict[str, Any], prefix: str) -> Dict[str, int]:
    """`{reason: count}` of the counters `<prefix><reason>` (prefix: partials.NOT_NUMERIC,
    partials.feature_invalid_prefix, partials.dense_invalid_prefix); the rest of the key after the
    prefix, whole: a column's name may hold "/"."""
    return {k[len(prefix):]: int(v) for k, v in sorted(raw.items()) if k.startswith(prefix)}


def _split_statistics(raw: Dict[str, Any], split: str) -> Dict[str, Any]:
    """Rows read, dropped by reason and written (the labelled ones), and the positive rate."""
    read = int(raw.get(partials.examples_read(split), 0))
    dropped = {r: int(raw.get(partials.dropped(split, r), 0)) for r in (DROP_MISSING_LABEL, DROP_INVALID_LABEL)}
    kept = read - sum(dropped.values())
    return {
        "examples_read": read,
        "examples_dropped": dropped,
        "examples_written": kept,
        "positive_rate": raw.get(partials.positives(split), 0) / kept if kept else None,
    }


def _feature_split_statistics(raw: Dict[str, Any], split: str, feature: str, kept: int) -> Dict[str, Any]:
    """One categorical feature on one split's `kept` rows: presence, IDs per example, OOV, invalid values."""
    present, ids, oov = (raw.get(partials.feature(split, feature, what), 0) for what in ("present", "ids", "oov"))
    return {
        "examples_present": int(present),
        "present_rate": present / kept if kept else None,
        "ids": int(ids),
        "ids_per_example": statistics.pooling_summary(list(raw.get(partials.ids_per_example_histogram(split, feature), []))),
        "truncated_ids": int(raw.get(partials.feature(split, feature, "truncated"), 0)),
        "oov_ids": int(oov),
        "oov_rate": oov / ids if ids else None,
        "invalid_values": _by_reason(raw, partials.feature_invalid_prefix(split, feature)),
    }


def _feature_statistics(
    cfg: PipelineConfig,
    raw: Dict[str, Any],
    feature: CategoricalFeature,
    split_stats: Dict[str, Dict[str, Any]],
    shared_table: bool,
) -> Dict[str, Any]:
    """One categorical feature: its table, its own value distribution (train) and its statistics per split."""
    table = cfg.feature_table(feature).name
    # The feature's own value distribution on the train split (exact): for a feature with a table
    # of its own it is the table's; a feature of a shared table has its own counts.
    if shared_table:
        values = raw.get(partials.feature_values_info(feature.name), {})
    else:
        values = {k: v for k, v in raw.get(partials.vocabulary_info(table), {}).items() if k in statistics.DISTRIBUTION_KEYS}
    splits = {
        s: _feature_split_statistics(raw, s, feature.name, v["examples_written"]) for s, v in split_stats.items()
    }
    return {"table": table, "values": values, "splits": splits}


def _dense_statistics(raw: Dict[str, Any], split: str, feature: str, rows: int) -> Dict[str, Any]:
    """One dense feature on one split: values missing (filled), invalid ones by reason, and the
    mean and standard deviation of the model's input (signed log1p of the filled values; rounded
    to 9 significant digits: Beam adds the partial sums in any order)."""
    s1, s2 = float(raw.get(partials.dense_sum(split, feature, 1), 0.0)), float(raw.get(partials.dense_sum(split, feature, 2), 0.0))
    mean = s1 / rows if rows else 0.0
    std = math.sqrt(max(s2 / rows - mean * mean, 0.0)) if rows else 0.0
    out = {
        "missing": int(raw.get(partials.dense_missing(split, feature), 0)),
        "invalid_values": _by_reason(raw, partials.dense_invalid_prefix(split, feature)),
        "input_mean": float(f"{mean:.9g}"),
        "input_std": float(f"{std:.9g}"),
    }
    quantiles = raw.get(partials.dense_quantiles(split, feature))
    if quantiles is not None:  # train only: the filled values' 0th, 1st, ..., 100th percentiles (a sketch's)
        out["quantiles"] = quantiles if isinstance(quantiles, list) else statistics.sketch_quantiles(quantiles)
    return out


def _table_batch_statistics(raw: Dict[str, Any], table: str) -> Dict[str, Any]:
    """IDs and unique IDs per full training batch of the train split (mean and max)."""
    batches = raw.get(partials.table_batch("train", table, "batches"), 0)
    return {
        "full_batches": int(batches),
        "ids_per_batch_mean": raw.get(partials.table_batch("train", table, "batch_ids"), 0) / batches if batches else None,
        "ids_per_batch_max": raw.get(partials.table_batch_max("train", table, "batch_ids")),
        "unique_ids_per_batch_mean": raw.get(partials.table_batch("train", table, "batch_unique_ids"), 0) / batches if batches else None,
        "unique_ids_per_batch_max": raw.get(partials.table_batch_max("train", table, "batch_unique_ids")),
    }


def _table_memory(cfg: PipelineConfig, name: str, vocabulary: VocabularyEntry) -> Dict[str, Any]:
    """Bytes of a table's weights and of its optimizer's slots (the table's own optimizer, or
    training.embedding_optimizer; planning.sizing; the placement is the trainer's plan's to
    decide, so no per-chip figure here)."""
    optimizer = table_optimizer(cfg, name).name
    m = table_memory(vocabulary.rows, vocabulary.dim, optimizer)
    return {
        "weight_bytes": m.weight_bytes,
        "optimizer": optimizer,
        "slots_per_row": m.slots_per_row,
        "total_bytes": m.total_bytes,
    }


def _table_statistics(cfg: PipelineConfig, raw: Dict[str, Any], name: str, vocabulary: VocabularyEntry) -> Dict[str, Any]:
    """One table: its vocabulary (the manifest's entry and its value distribution), per-batch and
    per-shard ID counts on the train split, and its memory."""
    return {
        "features": list(vocabulary.features),
        "kind": vocabulary.kind,  # the column kind (vocabulary.kind: counted, list, file, hashed, identity)
        "distinct_values": vocabulary.distinct_before_pruning,
        "vocabulary_size": vocabulary.size,
        "rows": vocabulary.rows,
        "dim": vocabulary.dim,
        "vocabulary": raw.get(partials.vocabulary_info(name), {}),
        "batches": _table_batch_statistics(raw, name),
        "shards": statistics.shard_summary(raw, "train", name, cfg.statistics.shard_counts, cfg.statistics.headroom),
        "memory": _table_memory(cfg, name, vocabulary),
    }


def _csv_data_rows(pattern: str) -> int:
    return sum(
        row_counts.count_file(m.path, row_counts.count_csv_records).data_records
        for m in FileSystems.match([pattern])[0].metadata_list
    )


def build_ledger(
    raw: Dict[str, Any],
    stats: EmbeddingStatistics,
    split_patterns: Dict[str, str],
    transformed_dirs: Dict[str, str],
    input_format: str,
    upstream_ledger: Optional[Dict[str, Any]],
) -> Dict[str, Any]:
    """The ledger so far (ExampleGen's stages, or the CLI's CSV reading) plus this stage's."""
    read = {s: v["examples_read"] for s, v in stats.splits.items()}
    stages = list(upstream_ledger["stages"]) if upstream_ledger else []
    upstream = dict(stages[-1]["rows_out"]) if stages else None
    if not stages and input_format == InputFormat.CSV:
        data_rows = {s: _csv_data_rows(p) for s, p in split_patterns.items()}
        stages.append(ledger.csv_input_stage(data_rows, read, stats.input["malformed_rows"]))
    # The written files were read back inside the pipeline (beam_pipeline.CountWrittenRows), spread
    # over the workers; here only the directory is listed, so that a file the count did not see
    # (which a later reader of `<dir>/*` would read) stops the run as well.
    written = {}
    for s, d in transformed_dirs.items():
        written[s] = int(raw.get(partials.written_rows(s), 0))
        found = len(row_counts.files_in(d))
        counted = int(raw.get(partials.written_files(s), 0))
        if found != counted:
            raise LedgerError(f"{progress.PREPROCESS}: {d} holds {found} files, but the pipeline wrote and counted {counted}; "
                              "a file there was not written by this run (or was removed): clear the directory and run again")
    dropped = {s: v["examples_dropped"] for s, v in stats.splits.items()}
    stages.append(ledger.preprocess_stage(read, dropped, written, upstream))
    return ledger.ledger(stages)


def run_preprocessing(
    pipeline: beam.Pipeline,
    cfg: PipelineConfig,
    split_patterns: Dict[str, str],
    vocabulary_dir: str,
    transformed_dirs: Optional[Dict[str, str]],
    statistics_dir: str,
    input_format: str = "tfrecord",
    upstream_ledger: Optional[Dict[str, Any]] = None,
) -> EmbeddingStatistics:
    """Runs Beam, then writes the manifest, the statistics and their report.

    Writes manifest.json (vocabulary dir), statistics.json and statistics.html, and copies of the
    manifest and statistics beside the transformed examples (for the trainer). The statistics
    carry the row ledger and the feature health; they are checked only after they are written
    (the run stops before training; the report says why).

    Args:
      pipeline: a ready Beam pipeline (the caller chooses the runner and its arguments).
      cfg: the pipeline's config.
      split_patterns: the file pattern of each split; needs a `train` split.
      vocabulary_dir: where the vocabularies and the manifest go.
      transformed_dirs: each split's output directory; None analyses only (vocabularies and their
        statistics, row counts).
      statistics_dir: where statistics.json and statistics.html go.
      input_format: the input files' format.
      upstream_ledger: ExampleGen's row ledger; this stage's rows in must equal its rows out.

    Returns:
      The statistics written.

    Raises:
      ValueError: `split_patterns` has no `train` split.
      ConfigError: a given vocabulary file cannot be read or is empty.
      LedgerError: the row ledger does not add up.
      FeatureHealthError: a feature is unhealthy.
      OutOfSpaceError: a write ran out of space (a full disk, a quota, a file-size limit).
    """
    ensure_local_runner_safe(list(pipeline.options.get_all_options(drop_default=True).get("experiments") or []))
    add_worker_plugin(pipeline.options)  # a worker whose stderr is on a full disk still reports its failure
    if "train" not in split_patterns:
        raise ValueError(f"preprocessing needs a 'train' split to build vocabularies; got {sorted(split_patterns)}")
    outputs = [vocabulary_dir, statistics_dir, *(transformed_dirs or {}).values()]
    with out_of_space_named(progress.PREPROCESS, _common_folder(outputs)):
        _prepare_outputs(cfg, vocabulary_dir, transformed_dirs, statistics_dir)
        _announce_progress(split_patterns, transformed_dirs, upstream_ledger)
        raw = _run_beam(pipeline, cfg, split_patterns, vocabulary_dir, transformed_dirs, statistics_dir, input_format)
        for t in cfg.tables:  # a vocabulary no train example fed still gets (empty) files
            if not FileSystems.exists(artifacts.vocabulary_file(vocabulary_dir, t.name)):
                vocabulary_lib.write_vocabulary(vocabulary_dir, t.name, [])
        manifest = build_manifest(cfg, raw, vocabulary_dir)
        stats = _summarize(cfg, raw, manifest, split_patterns, transformed_dirs, input_format, upstream_ledger)
        _write_outputs(cfg, manifest, stats, vocabulary_dir, transformed_dirs, statistics_dir)
    if stats.ledger is not None:
        for stage in stats.ledger["stages"]:
            ledger.check_stage(stage)
    if stats.feature_health is not None:
        check_health(stats.feature_health)
    return stats


def _common_folder(paths: List[str]) -> str:
    """The deepest folder holding every path (compared part by part, so `gs://` stays as written)."""
    parts = [p.rstrip("/").split("/") for p in paths]
    common = []
    for names in zip(*parts):
        if len(set(names)) > 1:
            break
        common.append(names[0])
    return "/".join(common) or "/"


def _prepare_outputs(
    cfg: PipelineConfig, vocabulary_dir: str, transformed_dirs: Optional[Dict[str, str]], statistics_dir: str
) -> None:
    """Creates the output directories and writes the given vocabularies (list / file) into the vocabulary directory."""
    # Given vocabularies are read and checked before Beam starts, and written into the vocabulary
    # directory: every later reader (the transform pass, the exporter) reads this copy, never the
    # config's file (which a Kubeflow task may not reach).
    given = {t.name: vocabulary_lib.given_vocabulary(t.vocabulary) for t in cfg.tables if t.vocabulary.kind in vocabulary_lib.GIVEN_KINDS}
    for d in [vocabulary_dir, statistics_dir, *(transformed_dirs or {}).values()]:
        _makedirs(d)
    for name, tokens in given.items():  # counts 0 until the vocabulary writer counts the train split
        vocabulary_lib.write_vocabulary(vocabulary_dir, name, [(tok, 0) for tok in tokens])


def _announce_progress(
    split_patterns: Dict[str, str], transformed_dirs: Optional[Dict[str, str]], upstream_ledger: Optional[Dict[str, Any]]
) -> None:
    """Starts the live progress (a no-op unless a local run's terminal watches): the rows each pass
    will read, where ExampleGen's ledger says."""
    expected = ((upstream_ledger or {}).get("stages") or [{}])[-1].get("rows_out") or {}
    progress.phase(progress.PREPROCESS, "counting the train split's values" + (
        f", transforming {' and '.join(sorted(split_patterns))}" if transformed_dirs else ""))
    progress.count(progress.PREPROCESS, beam_pipeline.COUNTING, 0, total=expected.get("train"))
    for split in sorted(split_patterns) if transformed_dirs else []:
        progress.count(progress.PREPROCESS, beam_pipeline.transforming(split), 0, total=expected.get(split))


def _run_beam(
    pipeline: beam.Pipeline,
    cfg: PipelineConfig,
    split_patterns: Dict[str, str],
    vocabulary_dir: str,
    transformed_dirs: Optional[Dict[str, str]],
    statistics_dir: str,
    input_format: str,
) -> Dict[str, Any]:
    """Runs the Beam pipeline and gives its merged statistics partial (the file it wrote is deleted)."""
    spill_dir = beam_pipeline.spill_dir_of(statistics_dir)
    try:
        with pipeline as p:
            beam_pipeline.build_pipeline(
                p, cfg, split_patterns, vocabulary_dir, transformed_dirs, statistics_dir, input_format, spill_dir
            )
    finally:  # the vocabulary pass's spilled counts, whether the run succeeded or not
        spill.delete(spill_dir)
    progress.phase(progress.PREPROCESS, "vocabularies written; building the statistics and the row ledger")
    partial = os.path.join(statistics_dir, beam_pipeline.STATS_FILE_PREFIX)
    raw = read_json(partial)
    FileSystems.delete([partial])
    return raw


def _summarize(
    cfg: PipelineConfig,
    raw: Dict[str, Any],
    manifest: VocabularyManifest,
    split_patterns: Dict[str, str],
    transformed_dirs: Optional[Dict[str, str]],
    input_format: str,
    upstream_ledger: Optional[Dict[str, Any]],
) -> EmbeddingStatistics:
    """The run's statistics; with a transform pass, also its row ledger and feature health."""
    stats = build_statistics(cfg, raw, manifest, sorted(split_patterns) if transformed_dirs else ["train"])
    if transformed_dirs:
        stats = dataclasses.replace(
            stats, ledger=build_ledger(raw, stats, split_patterns, transformed_dirs, input_format, upstream_ledger)
        )
        # Analysis only reads no feature presence: health needs the transform pass.
        stats = dataclasses.replace(stats, feature_health=feature_health(cfg, stats, notes=column_notes(cfg, raw)))
    return stats


def _write_outputs(
    cfg: PipelineConfig,
    manifest: VocabularyManifest,
    stats: EmbeddingStatistics,
    vocabulary_dir: str,
    transformed_dirs: Optional[Dict[str, str]],
    statistics_dir: str,
) -> None:
    """Writes the manifest, the statistics and their HTML report, and copies of the first two
    beside the transformed examples (for the trainer)."""
    write_text(os.path.join(vocabulary_dir, artifacts.VOCABULARY_MANIFEST_FILE), manifest.to_json())
    write_text(os.path.join(statistics_dir, artifacts.STATISTICS_FILE), stats.to_json())
    write_text(
        os.path.join(statistics_dir, artifacts.STATISTICS_REPORT_FILE), render_html(stats.to_dict(), f"Embedding-ID statistics: {cfg.name}")
    )
    if transformed_dirs:
        root = os.path.dirname(next(iter(transformed_dirs.values())).rstrip("/"))
        write_text(os.path.join(root, artifacts.EMBEDDING_STATISTICS_FILE), stats.to_json())
        write_text(os.path.join(root, artifacts.EMBEDDING_MANIFEST_FILE), manifest.to_json())
