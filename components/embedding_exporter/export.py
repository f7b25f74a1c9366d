"""Training checkpoint (layout A, B or C) -> verified CPU serving SavedModel, tables and report.

`export_serving_model` runs these steps over one `ExportContext`, each writing only into a
staging directory:
1. `prepare`: the plan and vocabulary manifest of the Model artifact, every table of the plan
   located in the checkpoint with its layout (layouts.py; a missing table, rows that disagree with
   the vocabulary or an inconsistent layout refuse the export) and a sample of raw eval examples
   drawn across the whole eval split, whatever its order (data_io/sampling.py);
2. `convert`: the serving model (RankingModel with plain tables, those of one dim stacked in one
   `ServingTables`, no optimizer, so no slot variables), its dense network restored from the checkpoint (every dense weight must match) and
   the tables converted one at a time into it (and into `tables/` as row-aligned arrays);
3. `verify`: the SavedModel (raw-feature transform + model, two signatures, serving.py) written
   and loaded back scores the sample raw, and the trainer's own SavedModel scores the same rows
   preprocessed by the preprocessing code: a difference above `export.parity_tolerance` refuses
   the export;
4. `compress`: with `export.table_dtype` float16/int8 (or `compare_compression`), the compressed
   models from the verified float32 tables and their eval AUC change; a chosen compression losing
   more than `export.max_auc_drop` is refused;
5. `build_report`, then `publish`: only then are the serving model, the tables and
   `export_report.json` moved into place. A refused or failed export leaves nothing where a pusher
   or a later step would look.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import components  # noqa: F401
import numpy as np
import tensorflow as tf
from tfx.utils import io_utils  # read_string_file: any filesystem TFX reads (gs://, local)
from tfx_bsl.coders import example_coder

from components.reporting import progress
from components.config.schema import PipelineConfig
from components.contracts import artifacts
from components.contracts.manifest import VocabularyManifest
from components.contracts.serving_inputs import serving_inputs_record
from components.contracts.plan import EmbeddingPlan
from components.data_io.sampling import sample_examples
from components.embedding_exporter import gate
from components.embedding_exporter.scoring import score
from components.embedding_model import layouts
from components.embedding_model.checkpoint_keys import OBJECT_GRAPH_KEY
from components.embedding_exporter import tables as tables_lib
from components.embedding_exporter import store_export
from components.embedding_model.restore import (
    RERUN_TRAINER, ExportRefused, build_serving_model, dense_variables, load_tables, open_checkpoint_tables, restore_dense,
)
from components.embedding_exporter.serving_check import write_expected
from components.embedding_exporter.serving import RawFeatureTransform, ServingModule
from components.embedding_preprocess.features import KIND_NONE, kind_of
from components.embedding_model.saving import save_serving_model
from components.embedding_preprocess.transform import make_lookups, transform_batch
from components.embedding_preprocess import vocabulary
from components.tfx_wiring.executor_base import read_json_if_exists
from components.embedding_model.input import parse_batch
from components.embedding_model.serving_model import ServingRankingModel
from components.embedding_model.unreadable import reading
from components.rules.metrics import auc_undefined_reason, reported, roc_auc
from components.model_registry.registry import Lookup
from components.config.choices import LayoutKind, TableDtype

# Names of optimizer slot variables as Keras and the TPU embedding API save them.
SLOT_MARKERS = ("OPTIMIZER_SLOT", "accumulator", "momenta", "velocities", "linears")


def read_raw_examples(file_pattern: str, limit: int, seed: int = 0) -> List[bytes]:
    """Reads raw eval rows as serialized tf.Examples (what a serving client sends), drawn across the split.

    The rows come from every part of the split (data_io/sampling.py), never its first rows only:
    on input sorted by label or time those hold one class or one day.

    Args:
      file_pattern: ExampleGen's Parquet files, or TFRecords of tf.Examples.
      limit: the most rows to read.
      seed: the draw's seed (the same seed, the same rows).

    Returns:
      Up to `limit` serialized tf.Examples, in a seeded random order.

    Raises:
      ExportRefused: no file matches `file_pattern`.
    """
    if not tf.io.gfile.glob(file_pattern):
        raise ExportRefused(f"no eval examples match {file_pattern}; cannot verify the export")
    return sample_examples(file_pattern, limit, seed)


def _model_file(model_uri: str, name: str, what: str) -> Tuple[str, str]:
    """(text, path) of the Model artifact's file `name`; ExportRefused, naming `what`, if it is absent."""
    path = os.path.join(model_uri, name)
    if not tf.io.gfile.exists(path):
        raise ExportRefused(f"no {what} at {path}; the Model artifact is not from this trainer")
    return io_utils.read_string_file(path), path


def read_model_plan(model_uri: str) -> EmbeddingPlan:
    """Reads the embedding plan the Model artifact was trained with (the exporter trusts nothing else).

    Args:
      model_uri: the trainer's Model artifact directory.

    Returns:
      The plan stored beside the model.

    Raises:
      ExportRefused: the artifact holds no plan.
    """
    return EmbeddingPlan.from_json(*_model_file(model_uri, artifacts.PLAN_FILE, "embedding plan"))


def read_model_manifest(model_uri: str) -> VocabularyManifest:
    """Reads the vocabulary manifest the Model artifact was trained with.

    Args:
      model_uri: the trainer's Model artifact directory.

    Returns:
      The manifest stored beside the model.

    Raises:
      ExportRefused: the artifact holds no manifest.
    """
    return VocabularyManifest.from_json(*_model_file(model_uri, artifacts.EMBEDDING_MANIFEST_FILE, "vocabulary manifest"))


def saved_variable_shapes(saved_model_dir: str) -> Dict[str, List[int]]:
    """Lists every variable a SavedModel holds, with its shape (the object graph entry excluded).

    Args:
      saved_model_dir: a SavedModel directory.

    Returns:
      {checkpoint key: shape as a list of ints}.
    """
    reader = tf.train.load_checkpoint(os.path.join(saved_model_dir, "variables", "variables"))
    shapes = reader.get_variable_to_shape_map()
    shapes.pop(OBJECT_GRAPH_KEY, None)
    return shapes


def check_no_optimizer_state(saved_model_dir: str, model: tf.keras.Model) -> int:
    """Checks that a SavedModel holds exactly the model's weights, so no optimizer slot variable.

    Keras saves slot variables under opaque positional names, so counting the variables and
    comparing their shapes is the real check; the names catch the rest.

    Args:
      saved_model_dir: the serving SavedModel just written.
      model: the model it was written from.

    Returns:
      How many variables the SavedModel holds.

    Raises:
      ExportRefused: the SavedModel holds other variables than the model's weights.
    """
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
    """Finds the newest training checkpoint of a Model artifact.

    Args:
      model_uri: the trainer's Model artifact directory.

    Returns:
      The checkpoint's path prefix.

    Raises:
      ExportRefused: the artifact holds no checkpoint.
    """
    ckpt_dir = os.path.join(model_uri, artifacts.CHECKPOINT_DIR)
    path = tf.train.latest_checkpoint(ckpt_dir)
    if path is None:
        raise ExportRefused(f"no training checkpoint in {ckpt_dir}")
    return path


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

    def restart(self) -> None:
        self.laps, self._t = {}, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._t, 2)
        self._t = now
        progress.phase(progress.EXPORTER, f"{name}: {self.laps[name]:.1f}s")


def _move(src: str, dst: str) -> None:
    if tf.io.gfile.exists(dst):
        if tf.io.gfile.isdir(dst):
            tf.io.gfile.rmtree(dst)
        else:
            tf.io.gfile.remove(dst)
    tf.io.gfile.rename(src, dst)


# ---- the export's state and its steps ------------------------------------------------------------


@dataclass
class EvalSample:
    """Labelled eval rows for the checks, raw and through the preprocessing code, in the same order.

    Attributes:
      raw: serialized raw tf.Examples (the serving model's input), [n].
      transformed: the same rows as preprocessing writes them (the trained model's input), [n].
      labels: their labels, float32 [n].
      parity_examples: the first this many rows are compared example by example (the rows are in
        a random order, so these too come from across the split).
      features: a few rows as model features: what builds a model's variables.
    """

    raw: List[bytes]
    transformed: List[bytes]
    labels: np.ndarray
    parity_examples: int  # the first this many rows are compared example by example
    features: Dict[str, Any]  # a few rows as model features: what builds a model's variables


@dataclass
class ExportContext:
    """One export: what it reads (set by `prepare`), the staging directory the steps write into,
    and what each step leaves for the next and for the report.

    `convert` sets `model`, `writer`, `table_report`, `convert_seconds` and `dense_restored`;
    `verify` sets `float32_dir`, `serving_variables`, `parity`, `p_float32` (float32 [n]) and the
    AUCs (None, with `auc_undefined`, when the sample's labels leave them undefined); `compress` adds its dtype to `compression` ({dtype: size and AUC figures}).
    The step that writes the exported model (verify for float32 tables, else compress) keeps it as
    loaded back in `served`: the serving check's record is scored on it, not on a second load.
    """

    cfg: PipelineConfig
    model_uri: str
    plan: EmbeddingPlan
    manifest: VocabularyManifest
    checkpoint_path: str
    tables: layouts.CheckpointTables
    sample: EvalSample
    staging: str
    clock: _Clock = field(default_factory=_Clock)
    # convert
    model: Optional[ServingRankingModel] = None  # the float32 serving model
    writer: Optional[tables_lib.TableWriter] = None
    table_report: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    convert_seconds: float = 0.0
    dense_restored: int = 0
    # verify
    float32_dir: str = ""
    serving_variables: int = 0  # of the model that is exported
    signatures: List[str] = field(default_factory=list)  # the serving model's signature names
    serving_inputs: Dict[str, Any] = field(default_factory=dict)  # contracts.serving_inputs.serving_inputs_record
    parity: Dict[str, Any] = field(default_factory=dict)
    p_float32: Optional[np.ndarray] = None
    auc_trained: Optional[float] = None  # None: undefined on the sample (`auc_undefined` says why)
    auc_float32: Optional[float] = None
    auc_undefined: Optional[str] = None  # why the sample's AUC is undefined (e.g. one label only)
    # compress: dtype -> size and AUC figures ("float32" set by verify)
    compression: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    served: Any = None  # the exported SavedModel, loaded back

    @property
    def table_dtype(self) -> str:
        return self.cfg.export.table_dtype


def read_eval_sample(cfg: PipelineConfig, manifest: VocabularyManifest, raw_eval_pattern: str) -> EvalSample:
    """Reads eval rows, raw (for the serving model) and through the preprocessing code (for the trained one).

    Args:
      cfg: the pipeline config (label, features, `export` sample sizes).
      manifest: the Model artifact's vocabulary manifest (vocabularies, raw column kinds).
      raw_eval_pattern: ExampleGen's raw eval files.

    Returns:
      The labelled rows, raw and transformed, in the same order: drawn across the whole eval
      split (`read_raw_examples`), in a seeded random order.

    Raises:
      ExportRefused: no file matches, a column's kind differs from the one preprocessing read, or
        no row has a usable label.
    """
    e = cfg.export
    raw = read_raw_examples(raw_eval_pattern, max(e.parity_sample_size, e.auc_sample_size), cfg.training.seed)
    vocabularies = {name: vocabulary.read_vocabulary(manifest.vocabulary_dir, name) for name in manifest.vocabularies}
    rb = example_coder.ExamplesToRecordBatchDecoder().DecodeBatch(raw)
    found = {n: kind_of(rb.column(i)) for i, n in enumerate(rb.schema.names)}
    mismatched = manifest.kind_mismatches({n: k for n, k in found.items() if k != KIND_NONE})
    if mismatched:
        raise ExportRefused(
            f"eval examples at {raw_eval_pattern} hold {', '.join(mismatched)}: the serving model parses each "
            "column as the examples preprocessing read held it; give the exporter the Examples artifact preprocessing read"
        )
    result = transform_batch(cfg, make_lookups(cfg, vocabularies), rb)
    transformed = result.batch
    if transformed is None:
        raise ExportRefused(f"no labelled eval example among the {len(raw)} read from {raw_eval_pattern}")
    labels = np.asarray(transformed.column(transformed.schema.get_field_index(cfg.label)).flatten())
    transformed_serialized = example_coder.RecordBatchToExamplesEncoder().encode(transformed)
    raw_labelled = [r for r, k in zip(raw, result.keep) if k]
    features, _ = parse_batch(tf.constant(transformed_serialized[:8]), manifest)
    return EvalSample(
        raw=raw_labelled, transformed=transformed_serialized, labels=labels,
        parity_examples=min(e.parity_sample_size, len(raw_labelled)), features=features,
    )


def prepare(
    cfg: PipelineConfig, model_uri: str, raw_eval_pattern: str, staging: str, checkpoint_path: Optional[str] = None
) -> ExportContext:
    """Reads what the export needs; writes nothing.

    Args:
      cfg: the pipeline config.
      model_uri: the trainer's Model artifact directory.
      raw_eval_pattern: ExampleGen's raw eval files.
      staging: the directory the steps will write into.
      checkpoint_path: the checkpoint to export (None: the newest of the artifact).

    Returns:
      The context: plan, manifest, the checkpoint's tables located in their layout, the eval sample.

    Raises:
      ExportRefused: the Model artifact is not one this exporter reads, or the eval rows are unusable.
    """
    plan = read_model_plan(model_uri)
    manifest = read_model_manifest(model_uri)
    checkpoint_path = checkpoint_path or latest_checkpoint(model_uri)
    tables = open_checkpoint_tables(checkpoint_path, plan, cfg.export.layout)
    sample = read_eval_sample(cfg, manifest, raw_eval_pattern)
    return ExportContext(cfg, model_uri, plan, manifest, checkpoint_path, tables, sample, staging)


def convert(ctx: ExportContext) -> None:
    """Builds the float32 CPU serving model from the checkpoint, and `tables/` files for float32 exports.

    The dense network is restored first, then the tables one at a time: read in their layout,
    checked, assigned.

    Args:
      ctx: the export; sets its `model`, `writer`, `table_report`, `convert_seconds`, `dense_restored`.

    Raises:
      ExportRefused: a dense weight or a table does not match the model.
    """
    ctx.clock.restart()
    plan, manifest = ctx.plan, ctx.manifest
    ctx.model = build_serving_model(plan, manifest, ctx.cfg, "float32", ctx.sample.features)
    ctx.dense_restored = restore_dense(ctx.model, ctx.checkpoint_path)
    if ctx.cfg.export.write_tables:
        ctx.writer = tables_lib.TableWriter(ctx.staging, manifest, manifest.vocabulary_dir)
    start = time.perf_counter()
    last = [start]  # when the previous table was done: each table's seconds include its read

    def report_table(name: str, source: layouts.TableSource, values: np.ndarray) -> None:
        if ctx.writer is not None and ctx.table_dtype == TableDtype.FLOAT32:
            ctx.writer.write(name, plan.tables[name], values, None)
        slots = plan.tables[name].memory.slots_per_row
        trained_weights = (  # B: with the row and column padding the SparseCores held
            source.shard["size"] * source.shard["num_sparse_cores"] * source.shard["padded_cols"] * 4
            if source.kind == LayoutKind.B else values.nbytes
        )
        now = time.perf_counter()
        ctx.table_report[name] = {
            "rows": source.rows,
            "dim": source.dim,
            "placement": plan.tables[name].placement,
            "layout": source.kind,
            "checkpoint_key": source.key,
            "layout_source": source.source,
            "trained_bytes": int(trained_weights * (1 + slots)),  # weights (with any padding) + slots
            "float32_bytes": int(values.nbytes),
            "seconds": round(now - last[0], 4),
        }
        last[0] = now

    load_tables(ctx.model, ctx.tables, report_table)
    ctx.convert_seconds = time.perf_counter() - start
    ctx.clock.lap("build model, restore dense, convert tables")


def verify(ctx: ExportContext) -> None:
    """Checks that the float32 serving model, written and loaded back, scores as the trained one.

    The serving model scores the raw eval rows, the trainer's own SavedModel the same rows
    preprocessed.

    Args:
      ctx: the export after `convert`; sets its parity, AUC and `compression["float32"]` figures.

    Raises:
      ExportRefused: the SavedModel holds optimizer state, or the scores differ by more than
        `export.parity_tolerance`.
    """
    e, s = ctx.cfg.export, ctx.sample
    ctx.float32_dir = os.path.join(ctx.staging, artifacts.SERVING_DIR if ctx.table_dtype == TableDtype.FLOAT32 else "_float32_check")
    module = ServingModule(ctx.model, RawFeatureTransform(ctx.manifest, ctx.manifest.vocabulary_dir))
    ctx.signatures = list(module.signatures())
    ctx.serving_inputs = serving_inputs_record(module.serving_inputs())
    save_serving_model(module, ctx.float32_dir)
    ctx.serving_variables = check_no_optimizer_state(ctx.float32_dir, ctx.model)
    ctx.clock.lap("save float32 serving model")
    trained_dir = os.path.join(ctx.model_uri, artifacts.SERVING_DIR)
    with reading(trained_dir, "the Trainer's SavedModel", RERUN_TRAINER, ExportRefused):
        trained = tf.saved_model.load(trained_dir)
    serving = tf.saved_model.load(ctx.float32_dir)
    ctx.served = serving if ctx.table_dtype == TableDtype.FLOAT32 else None  # else compress writes the model
    p_trained = score(trained.signatures["serving_default"], s.transformed)
    p_float32 = score(serving.signatures["serving_default"], s.raw)
    ctx.clock.lap("load and score trained and serving models")
    n = s.parity_examples
    diff = np.abs(p_trained[:n] - p_float32[:n])
    max_diff = float(diff.max())
    ctx.parity = {"examples": int(n), "max_abs_diff": max_diff, "tolerance": e.parity_tolerance,
                  "passed": bool(max_diff <= e.parity_tolerance),
                  "compared": "trainer's SavedModel on preprocessed rows vs float32 serving model on the raw rows"}
    progress.phase(progress.EXPORTER, f"parity: max |trained - serving| {max_diff:.2e} on {n} raw eval rows "
                                      f"({'passed' if ctx.parity['passed'] else 'FAILED'}, tolerance {e.parity_tolerance:g})")
    if not ctx.parity["passed"]:
        worst = int(diff.argmax())
        raise ExportRefused(
            f"serving model differs from the trained model by {max_diff:.3g} > tolerance {e.parity_tolerance:g} "
            f"on {n} eval examples (worst: example {worst}, trained {p_trained[worst]:.6f}, serving "
            f"{p_float32[worst]:.6f}); nothing exported"
        )
    ctx.p_float32 = p_float32
    ctx.auc_undefined = auc_undefined_reason(s.labels, "eval sample")
    ctx.auc_trained, why_trained = sample_auc(p_trained, s.labels, ctx.auc_undefined)
    ctx.auc_float32, why = sample_auc(p_float32, s.labels, ctx.auc_undefined)
    ctx.auc_undefined = ctx.auc_undefined or why or why_trained
    if ctx.auc_undefined:
        progress.phase(progress.EXPORTER, f"eval AUC of the serving model: {ctx.auc_undefined}")
    ctx.compression["float32"] = {
        "table_bytes": sum(t["float32_bytes"] for t in ctx.table_report.values()), "eval_auc": ctx.auc_float32,
        "auc_change": 0.0 if ctx.auc_float32 is not None else None, "max_abs_diff_vs_float32": 0.0,
    }
    if ctx.auc_float32 is None:
        ctx.compression["float32"]["auc_undefined"] = ctx.auc_undefined


def sample_auc(scores: np.ndarray, labels: np.ndarray, reason: Optional[str] = None) -> Tuple[Optional[float], Optional[str]]:
    """A model's AUC on the eval sample, as the report holds it.

    Args:
      scores: the model's scores of the sample's rows.
      labels: their labels.
      reason: why the AUC is undefined on these labels, when already known.

    Returns:
      (AUC, None), or (None, why it is undefined): one label only, or scores that are not numbers.
    """
    return reported(roc_auc(scores, labels), reason or auc_undefined_reason(labels, "eval sample"))


def compression_variants(ctx: ExportContext) -> List[str]:
    """Lists the compressed variants to build.

    Args:
      ctx: the export.

    Returns:
      The chosen table dtype when it is compressed, and both float16 and int8 with
      `export.compare_compression`.
    """
    return [d for d in ("float16", "int8") if d == ctx.table_dtype or ctx.cfg.export.compare_compression]


def _assign_compressed_tables(ctx: ExportContext, variant: ServingRankingModel, dtype: str,
                              writer: Optional[tables_lib.TableWriter]) -> Tuple[Dict[str, int], float]:
    """Assigns the float32 model's tables, compressed to `dtype`, to `variant` (and to `writer`'s
    `tables/` files). Returns {table: stored bytes} and the largest error of a stored value."""
    sizes: Dict[str, int] = {}
    max_err = 0.0
    for name, stack in variant.serving_tables.items():
        values = ctx.model.serving_tables[name].read(name)
        try:
            # a wide table's weights stay float32 (model.ServingTables: 4 bytes a row)
            stored, scale = (values, None) if ctx.plan.tables[name].wide_of else tables_lib.compress(values, dtype, name)
        except tables_lib.CompressionError as err:
            raise ExportRefused(str(err)) from None
        max_err = max(max_err, float(np.abs(tables_lib.decompress(stored, scale) - values).max()) if values.size else 0.0)
        stack.assign(name, stored, scale)
        sizes[name] = tables_lib.stored_bytes(stored, scale)
        if writer is not None:
            writer.write(name, ctx.plan.tables[name], stored, scale)
    return sizes, max_err


def compress(ctx: ExportContext, dtype: str) -> None:
    """Builds the serving model with `dtype` tables from the verified float32 ones, with its size and AUC change.

    The chosen dtype's model is written (and its `tables/` files).

    Args:
      ctx: the export after `verify`; `compression[dtype]` gets the variant's figures.
      dtype: float16 or int8.

    Raises:
      ExportRefused: a table cannot be compressed, or the chosen dtype loses more than
        `export.max_auc_drop` eval AUC.
    """
    e, s = ctx.cfg.export, ctx.sample
    chosen = dtype == ctx.table_dtype
    writer = ctx.writer if chosen else None
    variant = build_serving_model(ctx.plan, ctx.manifest, ctx.cfg, dtype, s.features)
    for dst, src in zip(dense_variables(variant), dense_variables(ctx.model)):
        dst.assign(src)
    sizes, max_err = _assign_compressed_tables(ctx, variant, dtype, writer)
    module = ServingModule(variant, RawFeatureTransform(ctx.manifest, ctx.manifest.vocabulary_dir))
    if chosen:
        path = os.path.join(ctx.staging, artifacts.SERVING_DIR)
        save_serving_model(module, path)
        ctx.serving_variables = check_no_optimizer_state(path, variant)
        ctx.served = tf.saved_model.load(path)
        fn = ctx.served.signatures["serving_default"]
    else:
        fn = module.serve_examples
    p = score(fn, s.raw)
    auc, why = sample_auc(p, s.labels, ctx.auc_undefined)
    ctx.compression[dtype] = {
        "table_bytes": sum(sizes.values()),
        "tables": sizes,
        "eval_auc": auc,
        "auc_change": auc - ctx.auc_float32 if auc is not None and ctx.auc_float32 is not None else None,
        "max_abs_diff_vs_float32": float(np.abs(p - ctx.p_float32).max()),
        "max_table_value_error": max_err,
    }
    ctx.clock.lap(f"{dtype} variant")
    if auc is None or ctx.auc_float32 is None:
        # The AUC change cannot be measured: the check is not made, and the report says why.
        ctx.compression[dtype]["auc_undefined"] = why or ctx.auc_undefined
        if chosen:
            progress.phase(progress.EXPORTER, f"export.max_auc_drop not checked for {dtype} tables: "
                                              f"{why or ctx.auc_undefined}")
        return
    drop = ctx.auc_float32 - auc
    if chosen and drop > e.max_auc_drop:
        raise ExportRefused(
            f"export.table_dtype {dtype} loses {drop:.4f} eval AUC ({ctx.auc_float32:.4f} -> "
            f"{auc:.4f} on {len(s.labels)} examples) > export.max_auc_drop "
            f"{e.max_auc_drop}; use float16/float32 or raise max_auc_drop"
        )


def build_report(ctx: ExportContext) -> Dict[str, Any]:
    """Writes the staged `tables/` manifest, removes a compressed export's float32 check model, and reports.

    Args:
      ctx: the verified export.

    Returns:
      The export report, without its `validation` and `continuous` sections.
    """
    chosen = ctx.table_dtype
    for name, t in ctx.table_report.items():
        t["serving_bytes"] = ctx.compression[chosen].get("tables", {}).get(name, t["float32_bytes"])
    for d in ctx.compression.values():
        d.pop("tables", None)
    if chosen != TableDtype.FLOAT32:
        tf.io.gfile.rmtree(ctx.float32_dir)
    tables_manifest = ctx.writer.finish() if ctx.writer is not None else None
    write_serving_inputs(os.path.join(ctx.staging, artifacts.SERVING_DIR), ctx.serving_inputs)
    # TF Serving's warm-up file of real eval rows and their scores: what check-serving compares against
    write_expected(os.path.join(ctx.staging, artifacts.SERVING_DIR), ctx.sample.raw, ctx.served)
    ctx.clock.lap("record the serving check's warm-up requests")
    trained_bytes = sum(t["trained_bytes"] for t in ctx.table_report.values())
    serving_bytes = sum(t["serving_bytes"] for t in ctx.table_report.values())
    return {
        "checkpoint": ctx.checkpoint_path,
        "layout": ctx.tables.summary(),
        "tables": ctx.table_report,
        "conversion": {
            "tables": len(ctx.table_report),
            "seconds": round(ctx.convert_seconds, 3),
            "trained_table_bytes": trained_bytes,
            "serving_table_bytes": serving_bytes,
            "checkpoint_file_bytes": _checkpoint_bytes(ctx.checkpoint_path),
            "serving_model_bytes": _dir_bytes(os.path.join(ctx.staging, artifacts.SERVING_DIR)),
        },
        "table_dtype": chosen,
        "compression": ctx.compression,
        "serving_variables": ctx.serving_variables,
        "dense_variables_restored": ctx.dense_restored,
        "parity": ctx.parity,
        "eval_auc": {"examples": int(len(ctx.sample.labels)), "trained_model": ctx.auc_trained,
                     "serving_float32": ctx.auc_float32, "serving": ctx.compression[chosen]["eval_auc"],
                     # why any of these is null (e.g. "undefined: the 400-row eval sample holds only label 0")
                     "undefined": ctx.compression[chosen].get("auc_undefined") or (
                         ctx.auc_undefined if ctx.auc_trained is None else None)},
        "signatures": ctx.signatures,
        # each JSON signature input's raw column (docs/export.md, "Serving input names")
        "serving_inputs": ctx.serving_inputs["serving_inputs"],
        "serving_inputs_renamed": ctx.serving_inputs["renamed"],
        "tables_manifest": os.path.join(artifacts.TABLES_DIR, artifacts.TABLES_MANIFEST_FILE) if tables_manifest else None,
        "seconds": ctx.clock.laps,
    }


def write_serving_inputs(saved_model_dir: str, record: Dict[str, Any]) -> str:
    """Writes the serving inputs' record into a serving SavedModel (`artifacts.SERVING_INPUTS_FILE`).

    Args:
      saved_model_dir: the serving SavedModel's directory.
      record: `contracts.serving_inputs.serving_inputs_record` of its module.

    Returns:
      The file's path.
    """
    path = os.path.join(saved_model_dir, artifacts.SERVING_INPUTS_FILE)
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.gfile.GFile(path, "w") as fh:
        fh.write(json.dumps(record, indent=2, ensure_ascii=False))
    return path


def validate(ctx: ExportContext, last_blessed: Optional[Lookup]) -> Dict[str, Any]:
    """Decides whether the export is blessed (gate.py), with the figures the gate used.

    Args:
      ctx: the verified export.
      last_blessed: what the push destination serves (LastBlessedModel's registry lookup; None:
        not looked up).

    Returns:
      The report's `validation` section: `gate.decide`'s decision with the trainer's figures and
      the last blessed model's.

    Raises:
      ExportRefused: the last blessed model cannot be loaded and scored while the gate compares with it.
    """
    metrics = read_json_if_exists(os.path.join(ctx.model_uri, artifacts.EVAL_METRICS_FILE))
    previous = None
    served = last_blessed.served_model if last_blessed is not None and last_blessed.found else None
    if served is not None and ctx.cfg.validation.regression_margin is not None:
        try:
            previous = gate.score_previous(served, ctx.sample.raw, ctx.sample.labels)
        except (OSError, ValueError, KeyError, IndexError, tf.errors.OpError) as err:  # KeyError: no serving_default
            # IndexError: a variables file cut short ("Read less bytes than requested", unreadable.py)
            raise ExportRefused(
                f"the last blessed serving model {served} cannot be loaded and scored ({err!r}); the new "
                "model cannot be compared with it: restore that model (push it again, or remove the damaged "
                "version directory), or set validation.regression_margin: null for this run") from None
        ctx.clock.lap("score the last blessed model")
    chosen = ctx.compression[ctx.table_dtype]
    decision = gate.decide(ctx.cfg, metrics, chosen["eval_auc"], previous,
                           no_previous=last_blessed.note if last_blessed is not None else None,
                           serving_auc_undefined=chosen.get("auc_undefined"))
    progress.phase(progress.EXPORTER, "validation gate: " + (
        "blessed" if decision["blessed"] else "not blessed: " + "; ".join(decision["reasons"])))
    decision["model_eval_auc"] = reported(metrics.get("auc"))[0] if metrics else None
    decision["baseline"] = metrics.get("baseline") if metrics else None
    decision["last_blessed"] = None
    if last_blessed is not None:
        entry = last_blessed.entry or {}
        decision["last_blessed"] = {
            "found": last_blessed.found, "note": last_blessed.note, "served_model": served,
            "version": last_blessed.version,
            # the served model scored on this run's raw eval rows (the gate's reference)
            "reference_auc": previous["eval_auc"] if previous else None,
            "examples": previous["examples"] if previous else None,
            # what its registry entry says of it: its AUC on its own run's eval rows, its run
            "registered_eval_auc": entry.get("eval_auc"), "pipeline": entry.get("pipeline"),
            "run": entry.get("run"), "trainer_model": entry.get("trainer_model"),
            "skipped": last_blessed.skipped,
        }
    return decision


def publish(ctx: ExportContext, output_uri: str, report: Dict[str, Any]) -> None:
    """Moves the staged serving model and tables into place, then writes the report.

    A previous export's serving model or tables that this export has none of are removed; the
    report is written last, so a report means a complete export.

    Args:
      ctx: the export, staged.
      output_uri: the serving Model artifact directory.
      report: the export report.
    """
    for name in (artifacts.SERVING_DIR, artifacts.TABLES_DIR, store_export.STORE_DIR):
        if tf.io.gfile.exists(os.path.join(ctx.staging, name)):
            _move(os.path.join(ctx.staging, name), os.path.join(output_uri, name))
        elif tf.io.gfile.exists(os.path.join(output_uri, name)):  # a previous export's: stale now
            tf.io.gfile.rmtree(os.path.join(output_uri, name))
    with tf.io.gfile.GFile(os.path.join(output_uri, artifacts.EXPORT_REPORT_FILE), "w") as fh:
        fh.write(json.dumps(report, indent=2, sort_keys=True))


def _store_step(ctx: ExportContext) -> Optional[Dict[str, Any]]:
    """`export.store.enabled`: the staged row files and dense model, refused when the store path's
    scores differ from the serving model's (store_export.py); None when not enabled."""
    if not ctx.cfg.export.store.enabled:
        return None
    section = store_export.write_store(ctx, ctx.staging)
    ctx.clock.lap("store: row files, dense model, parity")
    p = section["parity"]
    if not p["passed"]:
        w = p["worst"]
        raise ExportRefused(
            f"the store path (row files, pooled, through the dense model) differs from the serving model by "
            f"{p['max_abs_diff']:.3g} > tolerance {p['tolerance']:g} (worst: request {w['row']}, serving "
            f"{w['full_model']:.6f}, store {w['store']:.6f}); nothing exported")
    return section


def export_serving_model(
    cfg: PipelineConfig,
    model_uri: str,
    raw_eval_pattern: str,
    output_uri: str,
    checkpoint_path: Optional[str] = None,
    last_blessed: Optional[Lookup] = None,
) -> Dict[str, Any]:
    """Exports a trained model as a verified CPU serving model.

    Writes `output_uri/Format-Serving` (with its JSON inputs' record,
    `artifacts.SERVING_INPUTS_FILE`), `output_uri/tables/` (export.write_tables) and
    `output_uri/export_report.json`. A model the gate refuses is exported all the same; the caller
    withholds the blessing.

    Args:
      cfg: the pipeline config.
      model_uri: the trainer's Model artifact directory.
      raw_eval_pattern: ExampleGen's raw eval files.
      output_uri: the serving Model artifact directory.
      checkpoint_path: the checkpoint to export (None: the newest of the artifact).
      last_blessed: the model served at the push destination (model_registry's Lookup; None:
        not looked up).

    Returns:
      The export report. Its `validation` is the gate's decision (gate.py): against the trainer's
      baseline and, given `last_blessed`, against that model scored on the same raw eval rows;
      `continuous` is the Trainer's continuous.json (warm start and drift; null when the model
      artifact has none).

    Raises:
      ExportRefused: the export is refused; nothing is written under `output_uri`.
    """
    staging = os.path.join(output_uri, artifacts.EXPORT_STAGING_DIR)
    ctx = prepare(cfg, model_uri, raw_eval_pattern, staging, checkpoint_path)
    if tf.io.gfile.exists(staging):
        tf.io.gfile.rmtree(staging)
    tf.io.gfile.makedirs(staging)
    try:
        convert(ctx)
        verify(ctx)
        for dtype in compression_variants(ctx):
            compress(ctx, dtype)
        report = build_report(ctx)
        report["store"] = _store_step(ctx)
        report["validation"] = validate(ctx, last_blessed)
        report["continuous"] = read_json_if_exists(os.path.join(ctx.model_uri, artifacts.CONTINUOUS_FILE))
        publish(ctx, output_uri, report)
        return report
    finally:
        if tf.io.gfile.exists(staging):
            tf.io.gfile.rmtree(staging)
