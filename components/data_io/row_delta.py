"""The delta of two row-file exports: what a store applies to go from the last pushed tables to these.

Per table, against the previous export's row files (row_files.py), keyed by (key, oov):

- `put` rows: a key whose stored vector (or int8 scale) differs in any byte, and a key the previous
  export did not have;
- `delete` rows (tombstones): a key the previous export had and this one has not (a token the new
  vocabulary dropped, an OOV bucket of a table that now has fewer).

Applying the delta to the previous rows (`apply`: deletes removed, puts written over) gives these
rows, row for row. A table new in this export is all puts; a table dropped is all deletes.

Files: `<dir>/<table>/part-SSSSS-of-NNNNN.parquet` with the row files' columns (`vector`, `scale`
zeros on a delete, to be ignored) and `op`, sharded by the shard rule (SHARD_RULE) with the new
export's shard count (a dropped table's: its previous one), and `delta_manifest.json`: the base export (its manifest's SHA-256), per table the rows
put (changed, new), deleted and unchanged, and the delta's bytes against the full export's.

Memory: one new shard at a time, against the previous export's rows of the same keys (shard counts
are powers of two, so a new shard's keys lie in one previous shard, or in the previous shards
that fold onto it); each pair is matched by key with Arrow's `index_in` kernel (not its Acero
join, which hung in a process that had run Beam).
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.contracts.artifacts import named_file
from components.data_io import row_files
from components.data_io.checksums import file_sha256

DELTA_MANIFEST_FILE = "delta_manifest.json"


class NoDelta(row_files.RowFilesError):
    """The two exports cannot be told apart row by row (a table's key type changed): load the full rows."""
PUT, DELETE = "put", "delete"


def delta_schema(table_schema: pa.Schema) -> pa.Schema:
    """A table's delta rows: its row files' columns and `op` (a delete's payload is zeros, ignored)."""
    fields = [table_schema.field("key"), table_schema.field("oov"), pa.field("op", pa.string(), nullable=False)]
    fields += [table_schema.field(n) for n in table_schema.names[2:]]
    return pa.schema(fields)


def _row_bytes(rows: pa.Table) -> np.ndarray:
    """Each row's stored payload (vector, and scale) as one bytes object, for an exact comparison."""
    vec = rows["vector"].combine_chunks()
    flat = vec.flatten().to_numpy(zero_copy_only=False) if len(vec) else np.zeros(0, np.float32)
    payload = np.ascontiguousarray(flat).view(np.uint8).reshape(len(rows), -1) if len(rows) else np.zeros((0, 0), np.uint8)
    if "scale" in rows.column_names:
        scale = np.ascontiguousarray(rows["scale"].to_numpy()).view(np.uint8).reshape(len(rows), -1)
        payload = np.concatenate([payload, scale], axis=1)
    return payload


def match(keys: pa.Array, oov: np.ndarray, other_keys: pa.Array, other_oov: np.ndarray) -> np.ndarray:
    """For each (key, oov) of the first rows, the index of the same (key, oov) among the others,
    -1 where there is none. Keys are unique per flag in both (row files never repeat a key)."""
    out = np.full(len(keys), -1, np.int64)
    for flag in (False, True):
        mine, theirs = np.flatnonzero(oov == flag), np.flatnonzero(other_oov == flag)
        if len(mine) and len(theirs):
            found = pc.index_in(keys.take(pa.array(mine)), value_set=other_keys.take(pa.array(theirs)))
            at = found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
            out[mine[at >= 0]] = theirs[at[at >= 0]]
    return out


def _zeros(kind: pa.DataType, n: int) -> pa.Array:
    """A delete's payload: zeros (Parquet stores no null fixed-size list; the op says to ignore it)."""
    if pa.types.is_fixed_size_list(kind):
        return pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n * kind.list_size), kind.value_type), kind.list_size)
    return pa.array(np.zeros(n), kind)


def shard_delta(old: Optional[pa.Table], new: Optional[pa.Table], table_schema: pa.Schema) -> Dict[str, Any]:
    """The delta of one shard's rows, and its counts.

    Args:
      old: the previous export's rows of this shard's keys (None: none).
      new: this export's rows of the shard (None: the table is gone).
      table_schema: the schema of the delta's payload: this export's rows' (the previous one's
        when the table is gone). Rows stored in another dtype or dim than before all differ.

    Returns:
      {"rows": the delta rows (delta_schema), sorted by (oov, key), "changed", "new", "deleted", "unchanged"}.
    """
    old = old if old is not None else table_schema.empty_table()
    new = new if new is not None else table_schema.empty_table()
    key_type = table_schema.field("key").type
    new_keys, old_keys = new["key"].combine_chunks().cast(key_type), old["key"].combine_chunks().cast(key_type)
    new_oov = new["oov"].combine_chunks().to_numpy(zero_copy_only=False)
    old_oov = old["oov"].combine_chunks().to_numpy(zero_copy_only=False)
    in_old = match(new_keys, new_oov, old_keys, old_oov)  # each new row's previous row, or -1
    unmatched = np.ones(len(old), bool)  # previous rows no new row matched (keys are unique per flag)
    unmatched[in_old[in_old >= 0]] = False
    i_new = np.concatenate([np.arange(len(new)), np.full(int(unmatched.sum()), -1)])
    i_old = np.concatenate([in_old, np.flatnonzero(unmatched)])
    both = (i_new >= 0) & (i_old >= 0)
    if old.schema.equals(new.schema) and both.any():
        differs = np.any(_row_bytes(new.take(i_new[both])) != _row_bytes(old.take(i_old[both])), axis=1)
    else:
        differs = np.ones(int(both.sum()), bool)
    added = (i_new >= 0) & (i_old < 0)
    gone = np.sort(i_old[(i_old >= 0) & (i_new < 0)])
    schema = delta_schema(table_schema)
    puts = new.take(pa.array(np.sort(np.concatenate([i_new[both][differs], i_new[added]])), pa.int64()))
    put_cols = {"key": puts["key"], "oov": puts["oov"], "op": pa.array([PUT] * len(puts), pa.string())}
    put_cols.update({n: puts[n] for n in schema.names[3:]})
    deletes = old.take(pa.array(gone, pa.int64()))
    del_cols = {"key": deletes["key"].cast(key_type), "oov": deletes["oov"], "op": pa.array([DELETE] * len(deletes), pa.string())}
    del_cols.update({n: _zeros(schema.field(n).type, len(deletes)) for n in schema.names[3:]})
    rows = pa.concat_tables([pa.table(put_cols, schema=schema), pa.table(del_cols, schema=schema)])
    return {"rows": rows.sort_by(row_files.SORT_KEYS), "changed": int(differs.sum()), "new": int(added.sum()),
            "deleted": int(len(gone)), "unchanged": int((~differs).sum())}


def _old_rows_for(old_dir: str, old_entry: Optional[Dict[str, Any]], table: str, shard: int,
                  shards: int) -> Optional[pa.Table]:
    """The previous export's rows whose keys fall in `shard` of `shards` (SHARD_RULE)."""
    if old_entry is None:
        return None
    old_shards = int(old_entry["shards"])
    if old_shards >= shards:  # the previous shards that fold onto this one (old % shards == shard)
        parts = [row_files.read_shard(old_dir, table, f["file"]) for i, f in enumerate(old_entry["files"])
                 if i % shards == shard]
        return pa.concat_tables(parts) if parts else None
    rows = row_files.read_shard(old_dir, table, old_entry["files"][shard % old_shards]["file"])
    return rows.filter(pa.array(row_files.shard_of(rows["key"].combine_chunks(), shards) == shard))


def _manifest_sha256(rows_dir: str) -> str:
    return file_sha256(os.path.join(rows_dir, row_files.ROWS_MANIFEST_FILE), row_files.open_binary)


def shard_job(old_dir: str, new_dir: str, out_dir: str, job: Tuple[str, Optional[Dict[str, Any]],
              Optional[Dict[str, Any]], int]) -> Dict[str, Any]:
    """One shard's delta file, from a job of `jobs`; its counts and file entry. What a worker runs."""
    table, old_entry, new_entry, s = job
    shards = int((new_entry or old_entry)["shards"])
    if new_entry is None:  # a dropped table: its previous shards, all deleted
        new = None
        old = row_files.read_shard(old_dir, table, old_entry["files"][s]["file"])
        table_schema = old.schema
    else:
        new = row_files.read_shard(new_dir, table, new_entry["files"][s]["file"])
        table_schema = new.schema
        old = _old_rows_for(old_dir, old_entry, table, s, shards)
    d = shard_delta(old, new, table_schema)
    path = os.path.join(named_file(out_dir, table, ""), row_files.part_name(s, shards))
    return {"table": table, "shard": s, "file": row_files.write_parquet(d["rows"], path),
            **{k: d[k] for k in ("changed", "new", "deleted", "unchanged")}}


def jobs(old_manifest: Dict[str, Any], new_manifest: Dict[str, Any]) -> List[Tuple[str, Any, Any, int]]:
    """Every (table, previous entry, this entry, shard) the delta is made of: this export's shards,
    a dropped table's previous ones."""
    out = []
    for name in sorted(set(old_manifest["tables"]) | set(new_manifest["tables"])):
        old_e, new_e = old_manifest["tables"].get(name), new_manifest["tables"].get(name)
        out += [(name, old_e, new_e, s) for s in range(int((new_e or old_e)["shards"]))]
    return out


def run_here(old_dir: str, new_dir: str, out_dir: str, todo: List[Tuple[str, Any, Any, int]]) -> List[Dict[str, Any]]:
    """The jobs one after the other in this process (one shard pair in memory at a time)."""
    return [shard_job(old_dir, new_dir, out_dir, job) for job in todo]


def _table_totals(name: str, results: List[Dict[str, Any]], old_rows: int, new_rows: int) -> Dict[str, Any]:
    """A table's delta entry from its shards' results; its counts must add up to both exports' rows."""
    results = sorted(results, key=lambda r: r["shard"])
    t = {k: sum(r[k] for r in results) for k in ("changed", "new", "deleted", "unchanged")}
    if t["changed"] + t["unchanged"] + t["deleted"] != old_rows or t["changed"] + t["unchanged"] + t["new"] != new_rows:
        raise row_files.RowFilesError(
            f"table {name}: the delta's counts do not add up (changed {t['changed']}, unchanged {t['unchanged']}, "
            f"new {t['new']}, deleted {t['deleted']}; {old_rows} rows before, {new_rows} after)")
    files = [r["file"] for r in results]
    return dict(t, table=name, shards=len(files), files=files, put=t["changed"] + t["new"],
                rows=sum(f["rows"] for f in files), bytes=sum(f["bytes"] for f in files))


def write_delta(old_dir: str, new_dir: str, out_dir: str, run: Optional[Callable[..., List[Dict[str, Any]]]] = None
                ) -> Dict[str, Any]:
    """The delta from the row files in `old_dir` (the last pushed) to those in `new_dir`.

    Args:
      old_dir, new_dir: the two exports' row files.
      out_dir: where the delta goes.
      run: runs the shard jobs (`run_here`: in this process; row_files_beam.delta_runner: on Beam's workers).

    Returns:
      The delta manifest (written last, whole, as `delta_manifest.json` under `out_dir`).

    Raises:
      RowFilesError: either side has no rows manifest; a table's counts do not add up.
    """
    old_m, new_m = row_files.read_manifest(old_dir), row_files.read_manifest(new_dir)
    changed = sorted(n for n in set(old_m["tables"]) & set(new_m["tables"])
                     if old_m["tables"][n]["key_type"] != new_m["tables"][n]["key_type"])
    if changed:
        raise NoDelta(f"table(s) {', '.join(changed)} changed key type (a vocabulary kind changed): no delta; "
                      f"load the full rows")
    tf.io.gfile.makedirs(out_dir)
    by_table: Dict[str, List[Dict[str, Any]]] = {}
    for r in (run or run_here)(old_dir, new_dir, out_dir, jobs(old_m, new_m)):
        by_table.setdefault(r["table"], []).append(r)
    tables = {name: _table_totals(name, by_table.get(name, []), (old_m["tables"].get(name) or {}).get("rows", 0),
                                  (new_m["tables"].get(name) or {}).get("rows", 0))
              for name in sorted(set(old_m["tables"]) | set(new_m["tables"]))}
    delta_bytes = sum(t["bytes"] for t in tables.values())
    manifest = {"format": row_files.ROWS_FORMAT, "shard_rule": row_files.SHARD_RULE, "sort": "oov, key",
                "base": {"rows_manifest_sha256": _manifest_sha256(old_dir)},
                "target": {"rows_manifest_sha256": _manifest_sha256(new_dir)},
                "tables": tables, "bytes": delta_bytes, "full_bytes": new_m["bytes"],
                "bytes_vs_full": round(delta_bytes / new_m["bytes"], 4) if new_m["bytes"] else None}
    tmp = os.path.join(out_dir, f".{DELTA_MANIFEST_FILE}.tmp")
    with tf.io.gfile.GFile(tmp, "w") as fh:
        fh.write(json.dumps(manifest, indent=2, sort_keys=True))
    tf.io.gfile.rename(tmp, os.path.join(out_dir, DELTA_MANIFEST_FILE), overwrite=True)
    return manifest


def read_delta_manifest(delta_dir: str) -> Dict[str, Any]:
    path = os.path.join(delta_dir, DELTA_MANIFEST_FILE)
    if not tf.io.gfile.exists(path):
        raise row_files.RowFilesError(f"{path}: no delta manifest (the delta is incomplete or was never written)")
    with tf.io.gfile.GFile(path) as fh:
        return json.load(fh)


def apply(rows: pa.Table, delta: pa.Table) -> pa.Table:
    """A table's rows with a delta applied: deletes removed, puts written over or added; sorted by (oov, key).

    Args:
      rows: the previous rows (row files' schema).
      delta: the delta rows of the same table (delta_schema).
    """
    touched = match(rows["key"].combine_chunks(), rows["oov"].combine_chunks().to_numpy(zero_copy_only=False),
                    delta["key"].combine_chunks().cast(rows.schema.field("key").type),
                    delta["oov"].combine_chunks().to_numpy(zero_copy_only=False))
    kept = pa.array(np.flatnonzero(touched < 0))
    puts = delta.filter(pc.equal(delta["op"], PUT)).drop(["op"])
    puts = pa.table({n: puts[n].cast(rows.schema.field(n).type) for n in rows.column_names}, schema=rows.schema)
    return pa.concat_tables([rows.take(kept), puts]).sort_by(row_files.SORT_KEYS)


def read_table_delta(delta_dir: str, table: str) -> pa.Table:
    """A table's delta rows, every shard (whole in memory: for tests and small tables)."""
    files = read_delta_manifest(delta_dir)["tables"][table]["files"]
    parts = []
    for f in files:
        with tf.io.gfile.GFile(os.path.join(named_file(delta_dir, table, ""), f["file"]), "rb") as fh:
            parts.append(pq.read_table(pa.BufferReader(fh.read())))
    return pa.concat_tables(parts).sort_by(row_files.SORT_KEYS)
