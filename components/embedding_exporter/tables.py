"""Table compression and the tables on their own (row-aligned arrays + manifest) for other stores.

Compression (`export.table_dtype`):
- float16: the table cast to IEEE half (values beyond +-65504 are refused, not turned into inf);
- int8 with a per-row scale: scale[r] = max |row r| / 127 (1 for an all-zero row), stored
  q[r] = round(row r / scale[r]) in [-127, 127]; a row is q[r] x scale[r], so every value is within
  scale[r] / 2 of the trained one.

Files (`<output>/tables/`): per table `<table>.npy` (numpy format, row i = vocabulary entry i, then
the OOV buckets), `<table>.scale.npy` for int8, the vocabulary file it is aligned with under
`vocabularies/`, and `tables_manifest.json` listing table, rows, dim, dtype, files, features and how
OOV values are bucketed, so another store can look up a raw value without this code.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

from components.contracts.artifacts import TABLES_DIR, named_file
from components.contracts.artifacts import TABLES_MANIFEST_FILE as TABLES_MANIFEST
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import TablePlan
from components.config.choices import TableDtype
FLOAT16_MAX = float(np.finfo(np.float16).max)


class CompressionError(ValueError):
    """A table cannot be stored in the asked dtype (its values are out of range, or the dtype is unknown)."""


def compress(table: np.ndarray, dtype: str, name: str = "") -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Compresses a float32 table.

    Args:
      table: float32 [rows, dim].
      dtype: float32, float16 or int8.
      name: the table's name, for the error message.

    Returns:
      (stored, scale): the stored values [rows, dim] in `dtype`, and for int8 the float32 per-row
      scale [rows] (None otherwise).

    Raises:
      CompressionError: float16 and a value beyond its range, or an unknown dtype.
    """
    if dtype == TableDtype.FLOAT32:
        return table.astype(np.float32, copy=False), None
    if dtype == TableDtype.FLOAT16:
        peak = float(np.abs(table).max()) if table.size else 0.0
        if peak > FLOAT16_MAX:
            raise CompressionError(
                f"table {name!r} holds |value| {peak:.3g} > {FLOAT16_MAX:g}, beyond float16; use int8 or float32"
            )
        return table.astype(np.float16), None
    if dtype == TableDtype.INT8:
        peak = np.abs(table).max(axis=1) if table.size else np.zeros([table.shape[0]], np.float32)
        scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        q = np.clip(np.rint(table / scale[:, None]), -127, 127).astype(np.int8)
        return q, scale
    raise CompressionError(f"unknown table dtype {dtype!r}; use float32, float16 or int8")


def decompress(stored: np.ndarray, scale: Optional[np.ndarray]) -> np.ndarray:
    """Turns a stored table back into float32.

    Args:
      stored: [rows, dim] as `compress` stored it.
      scale: its float32 per-row scale [rows] (int8), or None.

    Returns:
      float32 [rows, dim].
    """
    values = stored.astype(np.float32)
    return values * scale[:, None] if scale is not None else values


def stored_bytes(stored: np.ndarray, scale: Optional[np.ndarray]) -> int:
    """Counts the bytes a stored table takes, its scale included.

    Args:
      stored: [rows, dim] as `compress` stored it.
      scale: its per-row scale [rows], or None.

    Returns:
      The bytes of both arrays.
    """
    return int(stored.nbytes + (scale.nbytes if scale is not None else 0))


def _save_npy(path: str, array: np.ndarray) -> None:
    with tf.io.gfile.GFile(path, "wb") as fh:
        np.save(fh, array, allow_pickle=False)


class TableWriter:
    """Writes each table as it is converted (one in memory at a time) and then the manifest.

    Args:
      output_dir: the directory `tables/` is created in.
      manifest: the vocabulary manifest (each table's vocabulary file and OOV buckets).
      vocabulary_dir: the directory holding the vocabulary files (copied beside the tables).
    """

    def __init__(self, output_dir: str, manifest: VocabularyManifest, vocabulary_dir: str):
        self.dir = os.path.join(output_dir, TABLES_DIR)
        tf.io.gfile.makedirs(os.path.join(self.dir, "vocabularies"))
        self._manifest = manifest
        self._vocabulary_dir = vocabulary_dir
        self.entries: Dict[str, Any] = {}

    def write(self, name: str, plan_table: TablePlan, stored: np.ndarray, scale: Optional[np.ndarray]) -> Dict[str, Any]:
        """Writes one table's files and its vocabulary file beside them.

        Args:
          name: the table's name.
          plan_table: its plan entry (combiner, features, the table a wide table belongs to).
          stored: the table as `compress` stored it, [rows, dim].
          scale: its per-row scale [rows] (int8), or None.

        Returns:
          The table's manifest entry.
        """
        vocab = self._manifest.vocabulary(plan_table.wide_of or name)  # a wide table's rows are its table's
        files = {"values": os.path.basename(named_file(self.dir, name, ".npy"))}
        _save_npy(named_file(self.dir, name, ".npy"), stored)
        if scale is not None:
            files["scale"] = os.path.basename(named_file(self.dir, name, ".scale.npy"))
            _save_npy(named_file(self.dir, name, ".scale.npy"), scale)
        vocab_file = os.path.join("vocabularies", os.path.basename(vocab.file))
        tf.io.gfile.copy(os.path.join(self._vocabulary_dir, vocab.file), os.path.join(self.dir, vocab_file), overwrite=True)
        entry = {
            "table": name,
            "rows": int(stored.shape[0]),
            "dim": int(stored.shape[1]),
            "dtype": str(stored.dtype),
            "files": files,
            "dequantize": "values * scale[:, None]" if scale is not None else "values",
            "vocabulary_file": vocab_file,
            "vocabulary_size": int(vocab.size),
            "num_oov_buckets": int(vocab.num_oov_buckets),
            "oov_rule": (
                "row of a value not in the vocabulary file = vocabulary_size + "
                "Fingerprint64(value) % num_oov_buckets (tf.lookup.StaticVocabularyTable; rule V2 of components/rules/rulebook.py)"
            ),
            "combiner": plan_table.combiner,
            "features": list(plan_table.features),
            # what row_files.py keys each row by (rulebook V1-V4)
            "vocabulary_kind": str(vocab.kind),
            "default_value": vocab.default_value,
            "wide_of": plan_table.wide_of,
        }
        self.entries[name] = entry
        return entry

    def finish(self) -> str:
        """Writes the manifest of the tables written.

        Returns:
          The manifest's path.
        """
        path = os.path.join(self.dir, TABLES_MANIFEST)
        with tf.io.gfile.GFile(path, "w") as fh:
            fh.write(json.dumps({"tables": self.entries}, indent=2, sort_keys=True))
        return path
