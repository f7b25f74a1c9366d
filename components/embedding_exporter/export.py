"""Checkpoint -> verified CPU serving SavedModel.

`export_serving_model` rebuilds the ranking model without optimizer (so no slot variables exist),
restores the trained tables and dense weights from the training checkpoint (every serving variable
must be matched), wraps it with the raw-feature transform, writes the SavedModel to a temporary
directory, and only after the parity check passes moves it into place. The parity check scores a
sample of raw eval examples with the loaded serving model and, after preprocessing the same rows
with the preprocessing code, with the trainer's own SavedModel; a difference above the tolerance
refuses the export.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import components  # noqa: F401
import numpy as np
import tensorflow as tf

from components.config import PipelineConfig
from components.embedding_exporter.serving import RawFeatureTransform, ServingModule
from components.embedding_preprocess import beam_pipeline
from components.embedding_preprocess import vocabulary as V
from components.embedding_preprocess.run import EMBEDDING_MANIFEST_FILE, read_json
from components.embedding_trainer import plan as P
from components.embedding_trainer import trainer_module
from components.embedding_trainer.input import parse_batch

SERVING_DIR = "Format-Serving"
REPORT_FILE = "export_report.json"
SLOT_MARKERS = ("OPTIMIZER_SLOT", "accumulator", "momenta", "velocities", "linears")


class ExportRefused(RuntimeError):
    """The export would not be the trained model; nothing was written where a pusher would look."""


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


def restore_serving_model(
    model_uri: str, plan: Dict[str, Any], manifest: Dict[str, Any], cfg: PipelineConfig, sample_features
):
    model = trainer_module.build_model(plan, manifest, cfg, for_training=False)
    model(sample_features)  # creates the variables so the restore can be checked
    ckpt_dir = os.path.join(model_uri, trainer_module.CHECKPOINT_DIR)
    path = tf.train.latest_checkpoint(ckpt_dir)
    if path is None:
        raise ExportRefused(f"no training checkpoint in {ckpt_dir}")
    try:
        # A table whose row count disagrees with its vocabulary fails here with both shapes named.
        status = tf.train.Checkpoint(model=model).restore(path)
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.InvalidArgumentError) as e:
        raise ExportRefused(f"checkpoint {path} does not match the model the vocabularies describe: {e}") from None
    status.expect_partial()  # optimizer slots are in the checkpoint and deliberately not restored
    return model, path


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


def export_serving_model(
    cfg: PipelineConfig,
    model_uri: str,
    raw_eval_pattern: str,
    output_uri: str,
) -> Dict[str, Any]:
    """Writes `output_uri/Format-Serving` and `output_uri/export_report.json`; returns the report."""
    plan = read_model_plan(model_uri)
    manifest = read_json(os.path.join(model_uri, EMBEDDING_MANIFEST_FILE))
    vocab_dir = manifest["vocabulary_dir"]
    raw = read_raw_examples(raw_eval_pattern, cfg.export.parity_sample_size)

    # The same rows through the preprocessing code path, for the trained model.
    from tfx_bsl.coders import example_coder

    vocabularies = {name: V.read_vocabulary(vocab_dir, name) for name in manifest["vocabularies"]}
    rb = example_coder.ExamplesToRecordBatchDecoder().DecodeBatch(raw)
    transformed, keep, _ = beam_pipeline.transform_record_batch(
        cfg, beam_pipeline.make_lookups(cfg, vocabularies), rb, "parity"
    )
    if transformed is None:
        raise ExportRefused("no labelled eval example in the parity sample")
    transformed_serialized = example_coder.RecordBatchToExamplesEncoder().encode(transformed)
    raw_labelled = [r for r, k in zip(raw, keep) if k]
    sample_features, _ = parse_batch(tf.constant(transformed_serialized[:8]), manifest)

    model, ckpt_path = restore_serving_model(model_uri, plan, manifest, cfg, sample_features)
    module = ServingModule(model, RawFeatureTransform(manifest, vocab_dir))

    final_dir = os.path.join(output_uri, SERVING_DIR)
    tmp_dir = os.path.join(output_uri, "_incomplete_" + SERVING_DIR)
    if tf.io.gfile.exists(tmp_dir):
        tf.io.gfile.rmtree(tmp_dir)
    tf.saved_model.save(module, tmp_dir, signatures=module.signatures())

    num_variables = check_no_optimizer_state(tmp_dir, model)

    trained = tf.saved_model.load(os.path.join(model_uri, SERVING_DIR))
    serving = tf.saved_model.load(tmp_dir)
    p_trained = trained.signatures["serving_default"](examples=tf.constant(transformed_serialized))["probabilities"]
    p_serving = serving.signatures["serving_default"](examples=tf.constant(raw_labelled))["probabilities"]
    diff = np.abs(p_trained.numpy().ravel() - p_serving.numpy().ravel())
    max_diff = float(diff.max())
    report = {
        "checkpoint": ckpt_path,
        "layout": "A (one logical table per table config, TPUEmbedding / CPU training)",
        "tables": {
            name: {"rows": v["rows"], "dim": v["dim"], "bytes": v["rows"] * v["dim"] * 4, "placement": v["placement"]}
            for name, v in plan["tables"].items()
        },
        "serving_variables": num_variables,
        "parity": {
            "examples": int(len(diff)),
            "max_abs_diff": max_diff,
            "tolerance": cfg.export.parity_tolerance,
            "passed": bool(max_diff <= cfg.export.parity_tolerance),
        },
        "signatures": ["serving_default", "serve_features"],
    }
    if not report["parity"]["passed"]:
        tf.io.gfile.rmtree(tmp_dir)
        raise ExportRefused(
            f"serving model differs from the trained model by {max_diff:.3g} > tolerance "
            f"{cfg.export.parity_tolerance:g} on {len(diff)} eval examples; nothing exported"
        )
    if tf.io.gfile.exists(final_dir):
        tf.io.gfile.rmtree(final_dir)
    tf.io.gfile.rename(tmp_dir, final_dir)
    with tf.io.gfile.GFile(os.path.join(output_uri, REPORT_FILE), "w") as fh:
        fh.write(json.dumps(report, indent=2, sort_keys=True))
    return report
