"""Scoring from a store: a request's raw values -> store keys -> rows -> pooled inputs -> the dense model.

The reference client of the row files (row_files.py), their delta (row_delta.py) and the dense
model (store_model.py), in plain Python over Python's own SQLite, rule for rule as the full serving
model applies them (components/rules/rulebook.py is the one statement of the rules):

1. tokens: J1-J3 and T1-T6 on the request's string for the feature's column (`json_row_tokens`,
   without T7);
2. keys (V1-V4, the row files' `lookup` rule): a vocabulary table's token (key=token) if the store
   has it, else its OOV bucket (key=Fingerprint64(token) % num_oov_buckets, oov); an identity
   table's ID below its rows, else its default row, else none (the token is dropped); a hashed
   table's bucket;
3. T7: the first max_length tokens that have a row (a sequence feature: its first
   max_sequence_length);
4. pooling by the table's combiner (sum, mean, sqrtn), with the weight column's first value as every
   token's weight (W1; none: 1; a row whose weight is missing or invalid pools nothing), an empty
   row pooling to zeros; a sequence feature's rows one per position, zeros after its last, with
   their count.

`SqliteStore` loads a full export, applies a delta in place and fetches rows by key.
"""
from __future__ import annotations

import json
import os
import sqlite3
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from components.config.choices import VocabularyKind
from components.data_io import row_delta, row_files
from components.data_io.checksums import file_sha256
from components.embedding_exporter.tables import decompress
from components.rules import rulebook

Key = Tuple[Any, bool]


class SqliteStore:
    """Every table's rows in one SQLite database: (tbl, key, oov) -> the stored vector's bytes, scale.

    Args:
      path: the database file (":memory:" for one in memory).
    """

    def __init__(self, path: str = ":memory:"):
        self.db = sqlite3.connect(path)
        self.db.execute("CREATE TABLE IF NOT EXISTS rows (tbl TEXT, key, oov INTEGER, vector BLOB, scale REAL, "
                        "PRIMARY KEY (tbl, key, oov)) WITHOUT ROWID")
        self.db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)")
        self.tables: Dict[str, Dict[str, Any]] = {}

    def _records(self, table: str, rows: pa.Table) -> Iterable[Tuple]:
        vec = rows["vector"].combine_chunks()
        flat = vec.flatten().to_numpy(zero_copy_only=False).reshape(len(rows), -1) if len(rows) else []
        scales = rows["scale"].to_pylist() if "scale" in rows.column_names else [None] * len(rows)
        for key, oov, v, s in zip(rows["key"].to_pylist(), rows["oov"].to_pylist(), flat, scales):
            yield table, key, int(oov), np.ascontiguousarray(v).tobytes(), s

    def load_full(self, rows_dir: str) -> int:
        """Loads every table of a full export (replacing what was there); returns the rows loaded."""
        manifest = row_files.read_manifest(rows_dir)
        with self.db:
            self.db.execute("DELETE FROM rows")
            n = 0
            for name in manifest["tables"]:
                for shard in row_files.iter_rows(rows_dir, name):
                    n += len(shard)
                    self.db.executemany("INSERT INTO rows VALUES (?, ?, ?, ?, ?)", self._records(name, shard))
            self._set_tables(manifest["tables"])
            self._set_meta("rows_sha256", _manifest_sha256(rows_dir))
        return n

    def apply_delta(self, delta_dir: str, rows_dir: str) -> Dict[str, int]:
        """Applies a delta in place (one transaction): puts written over, deletes removed.

        Args:
          delta_dir: the delta (row_delta.py).
          rows_dir: the full export the delta leads to (its manifest: tables, dims, dtypes).

        Returns:
          {"put": rows written, "deleted": rows removed}.
        """
        delta = row_delta.read_delta_manifest(delta_dir)
        held = self._meta("rows_sha256")
        if delta["base"]["rows_manifest_sha256"] != held:
            raise row_files.RowFilesError(
                f"{delta_dir}: a delta against other rows than the store holds (base {delta['base']['rows_manifest_sha256'][:12]}, "
                f"held {str(held)[:12]}): load the full rows of {rows_dir} instead")
        if delta["target"]["rows_manifest_sha256"] != _manifest_sha256(rows_dir):
            raise row_files.RowFilesError(f"{delta_dir}: not the delta that leads to {rows_dir}")
        counts = {"put": 0, "deleted": 0}
        with self.db:
            for name in delta["tables"]:
                rows = row_delta.read_table_delta(delta_dir, name)
                puts = rows.filter(pa.compute.equal(rows["op"], row_delta.PUT))
                gone = rows.filter(pa.compute.equal(rows["op"], row_delta.DELETE))
                self.db.executemany("INSERT OR REPLACE INTO rows VALUES (?, ?, ?, ?, ?)", self._records(name, puts))
                self.db.executemany("DELETE FROM rows WHERE tbl = ? AND key = ? AND oov = ?",
                                    [(name, k, int(o)) for k, o in zip(gone["key"].to_pylist(), gone["oov"].to_pylist())])
                counts["put"] += len(puts)
                counts["deleted"] += len(gone)
            self._set_tables(row_files.read_manifest(rows_dir)["tables"])
            self._set_meta("rows_sha256", delta["target"]["rows_manifest_sha256"])
        return counts

    def _set_meta(self, name: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (name, value))

    def _meta(self, name: str) -> Optional[str]:
        got = self.db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return got[0] if got else None

    def _set_tables(self, tables: Dict[str, Any]) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('tables', ?)", (json.dumps(tables),))
        self.tables = tables

    def count(self, table: str) -> int:
        return self.db.execute("SELECT COUNT(*) FROM rows WHERE tbl = ?", (table,)).fetchone()[0]

    def fetch(self, table: str, keys: Sequence[Key]) -> Dict[Key, np.ndarray]:
        """The float32 rows of `keys` that the store has (int8 rows dequantized by their scale)."""
        t = self.tables[table]
        dtype = np.int8 if t["dtype"] == "int8" else np.float32
        out: Dict[Key, np.ndarray] = {}
        for key, oov in set(keys):
            got = self.db.execute("SELECT vector, scale FROM rows WHERE tbl = ? AND key = ? AND oov = ?",
                                  (table, key, int(oov))).fetchone()
            if got is not None:  # the exporter's own dequantizing rule (tables.py)
                scale = np.array([got[1]], np.float32) if got[1] is not None else None
                out[(key, oov)] = decompress(np.frombuffer(got[0], dtype)[None, :], scale)[0]
        return out


def _manifest_sha256(rows_dir: str) -> str:
    return file_sha256(os.path.join(rows_dir, row_files.ROWS_MANIFEST_FILE), row_files.open_binary)


def candidate_keys(table: Dict[str, Any], token: bytes) -> List[Key]:
    """V1-V4: the keys a token's row may have, in the order a store tries them (row files' `lookup`)."""
    kind = table["vocabulary_kind"]
    if kind == VocabularyKind.IDENTITY:
        row, _ = rulebook.identity_id(token, table["vocabulary_size"], table["default_row"])
        return [] if row is None else [(row, False)]
    bucket = rulebook.oov_bucket(token, table["num_oov_buckets"]) if table["num_oov_buckets"] else None
    if kind == VocabularyKind.HASHED:
        return [(bucket, True)]
    return [(token.decode("utf-8"), False)] + ([(str(bucket), True)] if bucket is not None else [])


def _weight(spec: Dict[str, Any], row: Dict[str, Any]) -> Optional[float]:
    """W1: the row's weight (None: the row pools nothing); 1.0 for an unweighted feature."""
    column = spec["weight_column"]
    if column is None:
        return 1.0
    value = row.get(column)
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    return rulebook.row_weight(rulebook.KIND_FLOAT, [value])


def _pool(vectors: List[np.ndarray], weight: float, combiner: str, dim: int) -> np.ndarray:
    if not vectors:
        return np.zeros(dim, np.float32)
    total = np.sum(vectors, axis=0, dtype=np.float32) * np.float32(weight)
    n = len(vectors)
    if combiner == "mean":
        return total / np.float32(n * weight) if weight else np.zeros(dim, np.float32)
    if combiner == "sqrtn":
        return total / np.float32(np.sqrt(n * weight * weight)) if weight else np.zeros(dim, np.float32)
    return total


def _candidates(store, spec: Dict[str, Any], text: bytes, kind: str) -> List[List[Key]]:
    """One request row's tokens of a feature (J1-J3, T1-T6), each as the keys its row may have."""
    table = store.tables[spec["table"]]
    return [candidate_keys(table, t) for t in rulebook.json_row_tokens(kind, text, spec["separator"]).tokens]


def _rows(candidates: List[List[Key]], found: Dict[Key, np.ndarray], spec: Dict[str, Any]) -> List[np.ndarray]:
    """The row of each token that has one, then T7 (and a sequence feature's length)."""
    rows = [next((found[k] for k in c if k in found), None) for c in candidates]
    rows = [r for r in rows if r is not None]
    if spec["max_length"]:
        rows = rows[: spec["max_length"]]
    return rows[: spec["sequence_length"]] if spec["sequence_length"] else rows


def dense_model_inputs(store, store_inputs: Dict[str, Any], requests: Sequence[Dict[str, Any]]
                       ) -> Dict[str, np.ndarray]:
    """The dense model's `serve_vectors` inputs for a batch of requests, the rows fetched once per table.

    Args:
      store: a `SqliteStore` or `RowFileStore` (anything with `tables` and `fetch(table, keys)`).
      store_inputs: the dense model's `store_inputs.json`.
      requests: one dict per row, {column: value} as `serve_features` takes them: bytes for
        categorical columns (b"" = missing), float for dense and weight columns (NaN = missing).
    """
    out: Dict[str, np.ndarray] = {d["input"]: np.array([r.get(d["column"], np.nan) for r in requests], np.float32)
                                  for d in store_inputs["dense_inputs"]}
    specs = store_inputs["vector_inputs"]
    candidates = [[_candidates(store, spec, r.get(spec["column"], b""), spec["kind"]) for r in requests]
                  for spec in specs]
    needed: Dict[str, set] = {}
    for spec, per_row in zip(specs, candidates):
        needed.setdefault(spec["table"], set()).update(k for row in per_row for c in row for k in c)
    found = {t: store.fetch(t, sorted(keys, key=repr)) for t, keys in needed.items()}
    for spec, per_row in zip(specs, candidates):
        width, seq = (1 if spec["wide_of"] else spec["dim"]), spec["sequence_length"]
        values, lengths = [], []
        for r, c in zip(requests, per_row):
            vectors, weight = _rows(c, found[spec["table"]], spec), _weight(spec, r)
            if weight is None:
                vectors, weight = [], 1.0
            if seq:
                block = np.zeros((seq, width), np.float32)
                block[: len(vectors)] = vectors if vectors else block[:0]
                values.append(block)
                lengths.append(len(vectors))
            else:
                values.append(_pool(vectors, weight, spec["combiner"], width))
        out[spec["input"]] = np.stack(values).astype(np.float32) if values else np.zeros((0, width), np.float32)
        if seq and not spec["wide_of"]:
            out[spec["input"] + store_inputs["length_suffix"]] = np.array(lengths, np.int64)
    return out


class RowFileStore:
    """Rows fetched straight from row files: each table's keys grouped by shard (SHARD_RULE), each
    shard read once per fetch and filtered to them. What the export's parity check reads; memory
    holds one shard.

    Args:
      rows_dir: the row files' directory.
    """

    def __init__(self, rows_dir: str):
        self.rows_dir = rows_dir
        self.tables = row_files.read_manifest(rows_dir)["tables"]

    def fetch(self, table: str, keys: Sequence[Key]) -> Dict[Key, np.ndarray]:
        t = self.tables[table]
        keys = list(set(keys))
        if not keys:
            return {}
        key_type = pa.int64() if t["key_type"] == "int64" else pa.string()
        shard = row_files.shard_of(pa.array([k for k, _ in keys], key_type), t["shards"])
        out: Dict[Key, np.ndarray] = {}
        for s in sorted(set(shard.tolist())):
            wanted = {k for k, sh in zip(keys, shard) if sh == s}
            rows = row_files.read_shard(self.rows_dir, table, t["files"][s]["file"])
            rows = rows.filter(pa.compute.is_in(rows["key"], value_set=pa.array([k for k, _ in wanted], key_type)))
            stored = rows["vector"].combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(len(rows), -1)
            scale = rows["scale"].to_numpy() if "scale" in rows.column_names else None
            for key, oov, v in zip(rows["key"].to_pylist(), rows["oov"].to_pylist(), decompress(stored, scale)):
                if (key, oov) in wanted:
                    out[(key, oov)] = v
        return out
