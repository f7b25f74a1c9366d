"""The exporter's store step (`export.store.enabled`): row files, the dense model, and their parity.

Writes under the staged export `store/`: `rows/` (row_files.py, from the staged `tables/`) and
`dense_model/` (store_model.py). Then, before anything is published, scores the parity sample's
raw eval rows, and the same rows with one categorical column set to a token no vocabulary holds
and another emptied, two ways: through the full serving model's `serve_features`, and through the
store path (keys by the manifest's rule, rows read back from the row files, pooled by
store_client.py, then the dense model). Every score must agree within `export.parity_tolerance`,
or the export is refused with the worst row named.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Sequence

import numpy as np

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.contracts import artifacts
from components.data_io import row_files, row_files_beam
from components.embedding_exporter import store_client, store_model
from components.embedding_exporter.serving import RawFeatureTransform
from components.model_registry import registry
from components.reporting import progress

STORE_DIR = artifacts.STORE_DIR
ROWS_SUBDIR = registry.STORE_ROWS
UNKNOWN_TOKEN = b"__a token no vocabulary holds__"
UNKNOWN_ID = b"987654321987"  # an int64 ID no vocabulary holds and no identity table reaches


def example_requests(serialized: Sequence[bytes], inputs: Sequence[Any]) -> List[Dict[str, Any]]:
    """Raw tf.Examples as `serve_features` requests: {column: bytes (b"" missing) or float (NaN missing)}.

    Args:
      serialized: raw tf.Examples (each column with at most one value, as ExampleGen writes them).
      inputs: the serving model's inputs (`ServingInput`: column, dtype).
    """
    out = []
    for record in serialized:
        feats = tf.train.Example.FromString(record).features.feature
        row: Dict[str, Any] = {}
        for i in inputs:
            f = feats.get(i.column)
            values = list(getattr(f, f.WhichOneof("kind")).value) if f is not None and f.WhichOneof("kind") else []
            if i.dtype == "float32":
                row[i.column] = float(values[0]) if values else float("nan")
            else:
                v = values[0] if values else b""
                row[i.column] = v if isinstance(v, bytes) else (str(v).encode() if isinstance(v, int) else b"")
        out.append(row)
    return out


def with_edge_rows(requests: List[Dict[str, Any]], string_columns: Sequence[str],
                   int_columns: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """The requests and, per string column, a copy of a request with that column unknown (an
    unseen token; an unseen ID for an int64 column) and, when there is another, the next one
    emptied: an unknown token takes its OOV row (an identity table's default row, or none), an
    empty feature pools nothing."""
    extra = []
    for k, column in enumerate(string_columns):
        row = dict(requests[k % len(requests)])
        row[column] = UNKNOWN_ID if column in int_columns else UNKNOWN_TOKEN
        if len(string_columns) > 1:
            row[string_columns[(k + 1) % len(string_columns)]] = b""
        extra.append(row)
    return requests + extra


def _columns(requests: Sequence[Dict[str, Any]], inputs: Sequence[Any]) -> Dict[str, tf.Tensor]:
    return {i.input: tf.constant([r[i.column] for r in requests], tf.float32 if i.dtype == "float32" else tf.string)
            for i in inputs}


def check_store_parity(serving_dir: str, store_dir: str, manifest, inputs: Sequence[Any], raw: Sequence[bytes],
                       tolerance: float) -> Dict[str, Any]:
    """The store path's scores against the full model's on the same requests.

    Args:
      inputs: the serving model's inputs (`RawFeatureTransform.serving_inputs`).

    Returns:
      {"rows", "edge_rows", "max_abs_diff", "tolerance", "passed", "worst"}.
    """
    full = tf.saved_model.load(serving_dir)
    serve = full.signatures["serve_features"]
    strings = [i.column for i in inputs if i.dtype == "string"]
    base = example_requests(raw, inputs)
    ints = [c for c in strings if manifest.raw_feature_kinds.get(c) == "int64"]
    requests = with_edge_rows(base, strings, ints) if strings else base
    expected = serve(**_columns(requests, inputs))["probabilities"].numpy().reshape(-1)
    dense = tf.saved_model.load(os.path.join(store_dir, store_model.STORE_MODEL_DIR))
    record = store_model.read_inputs(os.path.join(store_dir, store_model.STORE_MODEL_DIR))
    feed = store_client.dense_model_inputs(store_client.RowFileStore(os.path.join(store_dir, ROWS_SUBDIR)), record,
                                           requests)
    got = dense.signatures["serve_vectors"](**{k: tf.constant(v) for k, v in feed.items()})["probabilities"]
    diff = np.abs(got.numpy().reshape(-1) - expected)
    worst = int(diff.argmax()) if len(diff) else 0
    return {"rows": len(base), "edge_rows": len(requests) - len(base), "max_abs_diff": float(diff.max()) if len(diff) else 0.0,
            "tolerance": tolerance, "passed": bool(len(diff) == 0 or diff.max() <= tolerance),
            "worst": {"row": worst, "full_model": float(expected[worst]), "store": float(got.numpy().reshape(-1)[worst])}
            if len(diff) else None}


def write_store(ctx, staging: str) -> Dict[str, Any]:
    """The store step of an export (`export.store.enabled`): row files, dense model, parity.

    Args:
      ctx: the export after `build_report` (its staged `tables/` complete).
      staging: the staged export directory.

    Returns:
      The report's `store` section.

    Raises:
      ValueError (ExportRefused by the caller): the store path's scores differ from the full model's.
    """
    store_dir = os.path.join(staging, STORE_DIR)
    cfg = ctx.cfg.export.store
    tables, rows_dir = os.path.join(staging, artifacts.TABLES_DIR), os.path.join(store_dir, ROWS_SUBDIR)
    if cfg.beam:  # the chunks spread over the workers of the run's Beam options (Dataflow for tens of millions of rows)
        rows = row_files_beam.write_row_files_beam(tables, rows_dir, cfg.max_file_mib * 2**20,
                                                   beam_args=ctx.cfg.beam_pipeline_args())
    else:
        rows = row_files.write_row_files(tables, rows_dir, max_file_bytes=cfg.max_file_mib * 2**20)
    progress.phase(progress.EXPORTER, f"store: {rows['rows']:,} rows of {len(rows['tables'])} tables as row files "
                                      f"({rows['bytes']:,} bytes)")
    transform = RawFeatureTransform(ctx.manifest, ctx.manifest.vocabulary_dir)
    inputs = store_model.save_dense_model(ctx.model, transform, ctx.manifest, os.path.join(store_dir, store_model.STORE_MODEL_DIR))
    parity = check_store_parity(os.path.join(staging, artifacts.SERVING_DIR), store_dir, ctx.manifest, transform.serving_inputs(),
                                ctx.sample.raw[: ctx.sample.parity_examples], ctx.cfg.export.parity_tolerance)
    progress.phase(progress.EXPORTER, f"store parity: max |full - store| {parity['max_abs_diff']:.2e} on "
                                      f"{parity['rows']} raw eval rows and {parity['edge_rows']} with an unknown or "
                                      f"empty feature ({'passed' if parity['passed'] else 'FAILED'})")
    return {"rows": rows["rows"], "tables": len(rows["tables"]), "row_file_bytes": rows["bytes"],
            # the Pusher writes the delta with the same Beam options (None: in its process)
            "beam_args": ctx.cfg.beam_pipeline_args() if cfg.beam else None,
            "files": sum(len(t["files"]) for t in rows["tables"].values()),
            "dense_model_bytes": _dir_bytes(os.path.join(store_dir, store_model.STORE_MODEL_DIR)),
            "vector_inputs": len(inputs["vector_inputs"]), "parity": parity}


def _dir_bytes(path: str) -> int:
    return sum(tf.io.gfile.stat(os.path.join(root, f)).length for root, _, files in tf.io.gfile.walk(path) for f in files)
