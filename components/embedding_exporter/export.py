"""Training checkpoint (layout A, B or C) -> verified CPU serving SavedModel, tables and report.

`export_serving_model`:
1. locates every table of the plan in the checkpoint and its layout (layouts.py); a missing table,
   rows that disagree with the vocabulary or an inconsistent layout refuse the export;
2. builds the serving model (RankingModel with plain `ServingTable`s, no optimizer, so no slot
   variables), restores the dense network from the checkpoint (every dense weight must match) and
   converts the tables one at a time into it (and into `tables/` as row-aligned arrays);
3. writes the SavedModel (raw-feature transform + model, two signatures, serving.py) to a staging
   directory and scores a sample of raw eval examples with it, and the same rows preprocessed by
   the preprocessing code with the trainer's own SavedModel: a difference above
   `export.parity_tolerance` refuses the export;
4. with `export.table_dtype` float16/int8 (or `compare_compression`), builds the compressed models
   from the verified float32 tables and measures their eval AUC change; a chosen compression losing
   more than `export.max_auc_drop` is refused;
5. only then moves the serving model, the tables and `export_report.json` into place. A refused or
   failed export leaves nothing where a pusher or a later step would look.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional

import components  # noqa: F401
import numpy as np
import tensorflow as tf

from components.config import PipelineConfig
from components.embedding_exporter import layouts as L
from components.embedding_exporter import tables as T
from components.embedding_exporter.restore import (  # noqa: F401  (re-exported)
    ExportRefused, build_serving_model, cfg_hint, dense_variables, load_tables, open_checkpoint_tables, restore_dense,
)
from components.embedding_exporter.serving import RawFeatureTransform, ServingModule, save_serving_model
from components.embedding_preprocess import transform as preprocess_transform
from components.embedding_preprocess import vocabulary as V
from components.embedding_preprocess.run import EMBEDDING_MANIFEST_FILE, read_json
from components.embedding_trainer import plan as P
from components.embedding_trainer import trainer_module
from components.embedding_trainer.input import parse_batch
from components.embedding_trainer.model import RankingModel
from components.metrics import roc_auc

SERVING_DIR = "Format-Serving"
REPORT_FILE = "export_report.json"
STAGING_DIR = "_incomplete_export"
SLOT_MARKERS = ("OPTIMIZER_SLOT", "accumulator", "momenta", "velocities", "linears")
SCORE_BATCH = 1024


def read_raw_examples(file_pattern: str, limit: int) -> List[bytes]:
    files = sorted(tf.io.gfile.glob(file_pattern))
    if not files:
        raise ExportRefused(f"no eval examples match {file_pattern}; cannot verify the export")
    out: List[bytes] = []
    from components.tfrecords import compression_type

    for record in tf.data.TFRecordDataset(files, compression_type=compression_type(files)).take(limit):
        out.append(record.numpy())
    return out


def read_model_plan(model_uri: str) -> Dict[str, Any]:
    """The embedding plan the Model artifact was trained with (the exporter trusts nothing else)."""
    plan_path = os.path.join(model_uri, P.PLAN_FILE)
    if not tf.io.gfile.exists(plan_path):
        raise ExportRefused(f"no embedding plan at {plan_path}; the Model artifact is not from this trainer")
    return trainer_module.read_plan(model_uri)


def saved_variable_shapes(saved_model_dir: str) -> Dict[str, List[int]]:
    """Every variable a SavedModel holds, with its shape (the object graph entry excluded)."""
    reader = tf.train.load_checkpoint(os.path.join(saved_model_dir, "variables", "variables"))
    shapes = reader.get_variable_to_shape_map()
    shapes.pop("_CHECKPOINTABLE_OBJECT_GRAPH", None)
    return shapes


def check_no_optimizer_state(saved_model_dir: str, model: tf.keras.Model) -> int:
    """The SavedModel must hold exactly the model's weights: slot variables would be extra entries
    (Keras saves them under opaque positional names, so counting and shapes are the real check)."""
    saved = saved_variable_shapes(saved_model_dir)
    named_slots = [n for n in saved if any(m in n for m in SLOT_MARKERS)]
    expected = sorted(tuple(v.shape.as_list()) for v in model.variables)
    got = sorted(tuple(s) for s in saved.values())
    if named_slots or got != expected:
        raise ExportRefused(
            f"serving model holds {len(got)} variables but the model has {len(expected)} weights "
            f"(slot-like names: {named_slots[:5]}); optimizer state must not be exported"
        )
    return len(got)



def latest_checkpoint(model_uri: str) -> str:
    ckpt_dir = os.path.join(model_uri, trainer_module.CHECKPOINT_DIR)
    path = tf.train.latest_checkpoint(ckpt_dir)
    if path is None:
        raise ExportRefused(f"no training checkpoint in {ckpt_dir}")
    return path


def score(fn, serialized: List[bytes], batch: int = SCORE_BATCH) -> np.ndarray:
    out = [fn(examples=tf.constant(serialized[i: i + batch]))["probabilities"].numpy().ravel()
           for i in range(0, len(serialized), batch)]
    return np.concatenate(out) if out else np.zeros([0], np.float32)


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in tf.io.gfile.walk(path):
        total += sum(tf.io.gfile.stat(os.path.join(root, f)).length for f in files)
    return total


def _checkpoint_bytes(checkpoint_path: str) -> int:
    return sum(tf.io.gfile.stat(f).length for f in tf.io.gfile.glob(checkpoint_path + ".*"))


class _Clock:
    def __init__(self):
        self.laps: Dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._t, 2)
        self._t = now


def _move(src: str, dst: str) -> None:
    if tf.io.gfile.exists(dst):
        if tf.io.gfile.isdir(dst):
            tf.io.gfile.rmtree(dst)
        else:
            tf.io.gfile.remove(dst)
    tf.io.gfile.rename(src, dst)


def export_serving_model(
    cfg: PipelineConfig,
    model_uri: str,
    raw_eval_pattern: str,
    output_uri: str,
    checkpoint_path: Optional[str] = None,
) -> Dict[str, Any]:
    """Writes `output_uri/Format-Serving`, `output_uri/tables/` (export.write_tables) and
    `output_uri/export_report.json`; returns the report. Raises ExportRefused, writing nothing there."""
    e = cfg.export
    plan = read_model_plan(model_uri)
    manifest_path = os.path.join(model_uri, EMBEDDING_MANIFEST_FILE)
    if not tf.io.gfile.exists(manifest_path):
        raise ExportRefused(f"no vocabulary manifest at {manifest_path}; the Model artifact is not from this trainer")
    manifest = read_json(manifest_path)
    vocab_dir = manifest["vocabulary_dir"]
    checkpoint_path = checkpoint_path or latest_checkpoint(model_uri)
    tables = open_checkpoint_tables(checkpoint_path, plan, e.layout)

    # Eval rows, raw (for the serving model) and through the preprocessing code (for the trained one).
    from tfx_bsl.coders import example_coder

    raw = read_raw_examples(raw_eval_pattern, max(e.parity_sample_size, e.auc_sample_size))
    vocabularies = {name: V.read_vocabulary(vocab_dir, name) for name in manifest["vocabularies"]}
    rb = example_coder.ExamplesToRecordBatchDecoder().DecodeBatch(raw)
    transformed, keep, _ = preprocess_transform.transform_record_batch(
        cfg, preprocess_transform.make_lookups(cfg, vocabularies), rb, "export"
    )
    if transformed is None:
        raise ExportRefused(f"no labelled eval example among the {len(raw)} read from {raw_eval_pattern}")
    labels = np.asarray(transformed.column(transformed.schema.get_field_index(cfg.label)).flatten())
    transformed_serialized = example_coder.RecordBatchToExamplesEncoder().encode(transformed)
    raw_labelled = [r for r, k in zip(raw, keep) if k]
    n_parity = min(e.parity_sample_size, len(raw_labelled))
    sample_features, _ = parse_batch(tf.constant(transformed_serialized[:8]), manifest)

    staging = os.path.join(output_uri, STAGING_DIR)
    if tf.io.gfile.exists(staging):
        tf.io.gfile.rmtree(staging)
    tf.io.gfile.makedirs(staging)
    try:
        report = _export(
            cfg, plan, manifest, tables, checkpoint_path, sample_features, staging,
            raw_labelled, transformed_serialized, labels, n_parity, model_uri,
        )
        for name in (SERVING_DIR, T.TABLES_DIR):
            if tf.io.gfile.exists(os.path.join(staging, name)):
                _move(os.path.join(staging, name), os.path.join(output_uri, name))
            elif tf.io.gfile.exists(os.path.join(output_uri, name)):  # a previous export's: stale now
                tf.io.gfile.rmtree(os.path.join(output_uri, name))
        with tf.io.gfile.GFile(os.path.join(output_uri, REPORT_FILE), "w") as fh:
            fh.write(json.dumps(report, indent=2, sort_keys=True))
        return report
    finally:
        if tf.io.gfile.exists(staging):
            tf.io.gfile.rmtree(staging)


def _export(cfg, plan, manifest, tables: L.CheckpointTables, checkpoint_path, sample_features, staging,
            raw_labelled, transformed_serialized, labels, n_parity, model_uri) -> Dict[str, Any]:
    e = cfg.export
    vocab_dir = manifest["vocabulary_dir"]
    chosen = e.table_dtype
    clock = _Clock()
    model = build_serving_model(plan, manifest, cfg, "float32", sample_features)
    num_dense = restore_dense(model, checkpoint_path)
    writer = T.TableWriter(staging, manifest, vocab_dir) if e.write_tables else None

    # Tables one at a time: read (layout-aware), check, into the model, and to its file.
    table_report: Dict[str, Any] = {}
    start = time.perf_counter()
    last = [start]  # when the previous table was done: each table's seconds include its read

    def report_table(name: str, source, values: np.ndarray) -> None:
        if writer is not None and chosen == "float32":
            writer.write(name, plan["tables"][name], values, None)
        slots = plan["tables"][name].get("memory", {}).get("slots_per_row", 0)
        trained_weights = (  # B: with the row and column padding the SparseCores held
            source.shard["size"] * source.shard["num_sparse_cores"] * source.shard["padded_cols"] * 4
            if source.kind == "B" else values.nbytes
        )
        now = time.perf_counter()
        table_report[name] = {
            "rows": source.rows,
            "dim": source.dim,
            "placement": plan["tables"][name]["placement"],
            "layout": source.kind,
            "checkpoint_key": source.key,
            "layout_source": source.source,
            "trained_bytes": int(trained_weights * (1 + slots)),  # weights (with any padding) + slots
            "float32_bytes": int(values.nbytes),
            "seconds": round(now - last[0], 4),
        }
        last[0] = now

    load_tables(model, tables, report_table)
    convert_seconds = time.perf_counter() - start
    clock.lap("build model, restore dense, convert tables")

    # The float32 serving model, written and loaded back, against the trainer's own SavedModel.
    f32_dir = os.path.join(staging, SERVING_DIR if chosen == "float32" else "_float32_check")
    module = ServingModule(model, RawFeatureTransform(manifest, vocab_dir))
    save_serving_model(module, f32_dir)
    num_variables = check_no_optimizer_state(f32_dir, model)
    clock.lap("save float32 serving model")
    trained = tf.saved_model.load(os.path.join(model_uri, SERVING_DIR))
    serving = tf.saved_model.load(f32_dir)
    p_trained = score(trained.signatures["serving_default"], transformed_serialized)
    p_float32 = score(serving.signatures["serving_default"], raw_labelled)
    clock.lap("load and score trained and serving models")
    diff = np.abs(p_trained[:n_parity] - p_float32[:n_parity])
    max_diff = float(diff.max())
    parity = {
        "examples": int(n_parity),
        "max_abs_diff": max_diff,
        "tolerance": e.parity_tolerance,
        "passed": bool(max_diff <= e.parity_tolerance),
        "compared": "trainer's SavedModel on preprocessed rows vs float32 serving model on the raw rows",
    }
    if not parity["passed"]:
        worst = int(diff.argmax())
        raise ExportRefused(
            f"serving model differs from the trained model by {max_diff:.3g} > tolerance {e.parity_tolerance:g} "
            f"on {n_parity} eval examples (worst: example {worst}, trained {p_trained[worst]:.6f}, serving "
            f"{p_float32[worst]:.6f}); nothing exported"
        )
    auc_trained, auc_float32 = roc_auc(p_trained, labels), roc_auc(p_float32, labels)
    compression: Dict[str, Any] = {
        "float32": {"table_bytes": sum(t["float32_bytes"] for t in table_report.values()), "eval_auc": auc_float32,
                    "auc_change": 0.0, "max_abs_diff_vs_float32": 0.0},
    }
    variants = [d for d in ("float16", "int8") if d == chosen or e.compare_compression]
    for dtype in variants:
        compression[dtype] = _compressed_variant(
            cfg, plan, manifest, model, dtype, sample_features, staging, raw_labelled, labels,
            p_float32, auc_float32, writer if dtype == chosen else None, save=dtype == chosen,
        )
        clock.lap(f"{dtype} variant")
        if dtype == chosen:
            num_variables = compression[dtype].pop("serving_variables")
            drop = auc_float32 - compression[dtype]["eval_auc"]
            if drop > e.max_auc_drop:
                raise ExportRefused(
                    f"export.table_dtype {dtype} loses {drop:.4f} eval AUC ({auc_float32:.4f} -> "
                    f"{compression[dtype]['eval_auc']:.4f} on {len(labels)} examples) > export.max_auc_drop "
                    f"{e.max_auc_drop}; use float16/float32 or raise max_auc_drop"
                )
    for name, t in table_report.items():
        t["serving_bytes"] = compression[chosen].get("tables", {}).get(name, t["float32_bytes"])
    for d in compression.values():
        d.pop("tables", None)
    if chosen != "float32":
        tf.io.gfile.rmtree(f32_dir)
    tables_manifest = writer.finish() if writer is not None else None
    trained_bytes = sum(t["trained_bytes"] for t in table_report.values())
    serving_bytes = sum(t["serving_bytes"] for t in table_report.values())
    return {
        "checkpoint": checkpoint_path,
        "layout": tables.summary(),
        "tables": table_report,
        "conversion": {
            "tables": len(table_report),
            "seconds": round(convert_seconds, 3),
            "trained_table_bytes": trained_bytes,
            "serving_table_bytes": serving_bytes,
            "checkpoint_file_bytes": _checkpoint_bytes(checkpoint_path),
            "serving_model_bytes": _dir_bytes(os.path.join(staging, SERVING_DIR)),
        },
        "table_dtype": chosen,
        "compression": compression,
        "serving_variables": num_variables,
        "dense_variables_restored": num_dense,
        "parity": parity,
        "eval_auc": {"examples": int(len(labels)), "trained_model": auc_trained, "serving_float32": auc_float32,
                     "serving": compression[chosen]["eval_auc"]},
        "signatures": ["serving_default", "serve_features"],
        "tables_manifest": os.path.join(T.TABLES_DIR, T.TABLES_MANIFEST) if tables_manifest else None,
        "seconds": clock.laps,
    }


def _compressed_variant(cfg, plan, manifest, model32: RankingModel, dtype: str, sample_features, staging,
                        raw_labelled, labels, p_float32, auc_float32, writer, save: bool) -> Dict[str, Any]:
    """The serving model with `dtype` tables (from the verified float32 ones): size and AUC change."""
    variant = build_serving_model(plan, manifest, cfg, dtype, sample_features)
    for dst, src in zip(dense_variables(variant), dense_variables(model32)):
        dst.assign(src)
    sizes: Dict[str, int] = {}
    max_err = 0.0
    for name, table in variant.serving_tables.items():
        values = model32.serving_tables[name].embeddings.numpy()
        try:
            stored, scale = T.compress(values, dtype, name)
        except T.CompressionError as err:
            raise ExportRefused(str(err)) from None
        max_err = max(max_err, float(np.abs(T.decompress(stored, scale) - values).max()) if values.size else 0.0)
        table.embeddings.assign(stored)
        if scale is not None:
            table.scale.assign(scale)
        sizes[name] = T.stored_bytes(stored, scale)
        if writer is not None:
            writer.write(name, plan["tables"][name], stored, scale)
    module = ServingModule(variant, RawFeatureTransform(manifest, manifest["vocabulary_dir"]))
    out: Dict[str, Any] = {}
    if save:
        path = os.path.join(staging, SERVING_DIR)
        save_serving_model(module, path)
        out["serving_variables"] = check_no_optimizer_state(path, variant)
        fn = tf.saved_model.load(path).signatures["serving_default"]
    else:
        fn = module.serve_examples
    p = score(fn, raw_labelled)
    auc = roc_auc(p, labels)
    out.update({
        "table_bytes": sum(sizes.values()),
        "tables": sizes,
        "eval_auc": auc,
        "auc_change": auc - auc_float32,
        "max_abs_diff_vs_float32": float(np.abs(p - p_float32).max()),
        "max_table_value_error": max_err,
    })
    return out
