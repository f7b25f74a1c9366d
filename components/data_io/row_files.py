"""Row files: every exported table's rows keyed as serving looks them up, for a key-value store.

From the exporter's `tables/` (tables.py: `<table>.npy` row-aligned with its vocabulary file, then
the OOV buckets; `.scale.npy` for int8), one row per vocabulary token and per OOV bucket:

- `key`: the raw token (string) for vocabulary tables (counted, list, file); the ID (int64) for
  identity tables and the bucket (int64) for hashed ones.
- `oov`: true for an OOV bucket's row, keyed by its bucket index (the decimal text for a string
  key). A hashed table's rows are all buckets (rule V3 is V2 with an empty vocabulary).
- `vector`: the stored row, float32 (a float16 table's values widened, exactly) or int8;
  `scale`: the int8 row's float32 scale (a row is vector x scale, tables.py's scheme).

The lookup rule a store applies (rules V1-V4 of components/rules/rulebook.py, written into the
manifest per table): a token's row is (key=token, oov=false); when there is none, (key=bucket,
oov=true) with bucket = Fingerprint64(token) % num_oov_buckets; an identity table's token is
its ID's decimal text, an ID at or above the table's rows takes `default_row` (none: no row, the
feature pools nothing).

Files: `<dir>/<table>/part-SSSSS-of-NNNNN.parquet`, shard s holding the keys whose text (a
string key, or an int64 key's decimal text) has Fingerprint64(text) % N == s, N a power of two
chosen so that no file exceeds `max_file_bytes` by much (doubling N splits every shard in two);
each file's rows sorted by (oov, key). `rows_manifest.json` lists every table's features, dim,
dtype, combiner, key type, OOV rule, rows and files with their row counts, bytes and SHA-256.

Memory: a table is read in chunks of rows (the .npy by seek, the vocabulary by line offsets), each
chunk's rows spilled to their shard's Arrow stream; then one shard at a time is sorted and
written. Nothing holds more than a chunk and a shard.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.config.choices import VocabularyKind
from components.contracts.artifacts import TABLES_MANIFEST_FILE, named_file
from components.data_io.checksums import file_sha256

ROWS_MANIFEST_FILE = "rows_manifest.json"
ROWS_FORMAT = 1
DEFAULT_MAX_FILE_BYTES = 128 * 2**20
CHUNK_ROWS = 65536
INT_KEY_KINDS = (VocabularyKind.HASHED, VocabularyKind.IDENTITY)
SHARD_RULE = "Fingerprint64(key text) % shards (a string key's UTF-8 bytes; an int64 key's decimal text)"
SORT_KEYS = [("oov", "ascending"), ("key", "ascending")]


class RowFilesError(ValueError):
    """Row files cannot be written or read as asked (a file missing, a count that does not add up)."""


@dataclasses.dataclass(frozen=True)
class RowTable:
    """One table as the row files need it, from its `tables_manifest.json` entry.

    Attributes:
      name: the table.
      dim: its row width.
      dtype: its stored dtype (float32, float16 or int8).
      rows: its rows (vocabulary_size + num_oov_buckets).
      kind: its vocabulary kind (rulebook V1-V4).
      vocabulary_size: rows keyed by token (identity: by ID).
      num_oov_buckets: rows keyed by bucket.
      values: the .npy path; scale: the int8 scale .npy path or None.
      vocabulary: the vocabulary file's path (None for hashed and identity tables).
      entry: the manifest entry itself (combiner, features, default value).
    """

    name: str
    dim: int
    dtype: str
    rows: int
    kind: str
    vocabulary_size: int
    num_oov_buckets: int
    values: str
    scale: Optional[str]
    vocabulary: Optional[str]
    entry: Dict[str, Any]

    @property
    def int_keys(self) -> bool:
        return self.kind in INT_KEY_KINDS

    @property
    def stored_dtype(self) -> str:
        return "int8" if self.dtype == "int8" else "float32"


def read_tables(tables_dir: str) -> List[RowTable]:
    """The tables of an exporter's `tables/` directory.

    Raises:
      RowFilesError: no manifest there, or an entry from before tables recorded their vocabulary kind.
    """
    path = os.path.join(tables_dir, TABLES_MANIFEST_FILE)
    if not tf.io.gfile.exists(path):
        raise RowFilesError(f"{path}: no tables manifest; export with export.write_tables: true")
    with tf.io.gfile.GFile(path) as fh:
        entries = json.load(fh)["tables"]
    out = []
    for name in sorted(entries):
        e = entries[name]
        if "vocabulary_kind" not in e:
            raise RowFilesError(f"{path}: table {name!r} has no vocabulary_kind (written by an older exporter): "
                                f"export the model again")
        files = e["files"]
        out.append(RowTable(
            name=name, dim=int(e["dim"]), dtype=str(e["dtype"]), rows=int(e["rows"]), kind=e["vocabulary_kind"],
            vocabulary_size=int(e["vocabulary_size"]), num_oov_buckets=int(e["num_oov_buckets"]),
            values=os.path.join(tables_dir, files["values"]),
            scale=os.path.join(tables_dir, files["scale"]) if "scale" in files else None,
            vocabulary=(None if e["vocabulary_kind"] in INT_KEY_KINDS else os.path.join(tables_dir, e["vocabulary_file"])),
            entry=e))
    return out


def _npy_layout(path: str) -> Tuple[int, np.dtype, Tuple[int, ...]]:
    """(the data's byte offset, dtype, shape) of a C-ordered .npy file, read through tf.io.gfile."""
    with tf.io.gfile.GFile(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        shape, fortran, dtype = np.lib.format._read_array_header(fh, version)  # the public readers' core
        if fortran:
            raise RowFilesError(f"{path}: a Fortran-ordered array; the exporter writes C order")
        return fh.tell(), dtype, shape


def read_npy_rows(path: str, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of a .npy file, read by seek (the file is never read whole)."""
    offset, dtype, shape = _npy_layout(path)
    width = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    stop = min(stop, shape[0])
    with tf.io.gfile.GFile(path, "rb") as fh:
        fh.seek(offset + start * width * dtype.itemsize)
        data = fh.read((stop - start) * width * dtype.itemsize)
    return np.frombuffer(data, dtype).reshape((stop - start,) + tuple(shape[1:]))


def line_offsets(path: str, every: int, lines: int) -> List[int]:
    """The byte offset of lines 0, every, 2 x every, ... (< lines) of a vocabulary file: one pass,
    so that each chunk of rows reads its tokens by seek."""
    offsets, line, pos = [0], 0, 0
    with tf.io.gfile.GFile(path, "rb") as fh:
        while line < lines:
            block = fh.read(8 * 2**20)
            if not block:
                break
            start = 0
            while True:
                nl = block.find(b"\n", start)
                if nl < 0:
                    break
                line += 1
                start = nl + 1
                if line % every == 0 and line < lines:
                    offsets.append(pos + start)
            pos += len(block)
    if line < lines:
        raise RowFilesError(f"{path}: {line} complete lines, the table has {lines} vocabulary rows")
    return offsets


def read_lines(path: str, offset: int, count: int) -> List[bytes]:
    """`count` lines from byte `offset` of a vocabulary file, without their line breaks."""
    out: List[bytes] = []
    rest = b""
    with tf.io.gfile.GFile(path, "rb") as fh:
        fh.seek(offset)
        while len(out) < count:
            block = fh.read(2**20)
            if not block:
                break
            parts = (rest + block).split(b"\n")
            rest = parts.pop()
            out.extend(parts[: count - len(out)])
    if len(out) < count:
        raise RowFilesError(f"{path}: fewer lines than the table's vocabulary rows from byte {offset}")
    return out


def key_texts(keys: pa.Array) -> np.ndarray:
    """The bytes each key is hashed by: a string key's UTF-8 bytes, an int64 key's decimal text."""
    if pa.types.is_integer(keys.type):
        keys = keys.cast(pa.string())
    return np.asarray(keys.cast(pa.binary()).to_numpy(zero_copy_only=False), dtype=object)


def shard_of(keys: pa.Array, shards: int) -> np.ndarray:
    """SHARD_RULE: each key's shard, int64 [len(keys)]; TF's Fingerprint64 (the OOV rule's hash)."""
    if shards == 1 or len(keys) == 0:
        return np.zeros(len(keys), np.int64)
    return tf.strings.to_hash_bucket_fast(tf.constant(key_texts(keys), tf.string), shards).numpy()


def shard_count(table: RowTable, max_file_bytes: int) -> int:
    """The power of two of shards that keeps each file near `max_file_bytes` (a guess at a key's
    bytes: 24 for a string, 8 for an int64)."""
    row_bytes = table.dim * (1 if table.stored_dtype == "int8" else 4) + (4 if table.stored_dtype == "int8" else 0)
    row_bytes += 9 if table.int_keys else 25
    need = max(1, math.ceil(table.rows * row_bytes / max(1, max_file_bytes)))
    return 1 << (need - 1).bit_length()


def schema(table: RowTable) -> pa.Schema:
    """The row files' Arrow schema of a table."""
    value = pa.int8() if table.stored_dtype == "int8" else pa.float32()
    fields = [pa.field("key", pa.int64() if table.int_keys else pa.string(), nullable=False),
              pa.field("oov", pa.bool_(), nullable=False),
              pa.field("vector", pa.list_(pa.field("item", value, nullable=False), table.dim), nullable=False)]
    if table.stored_dtype == "int8":
        fields.append(pa.field("scale", pa.float32(), nullable=False))
    return pa.schema(fields)


def chunk_batch(table: RowTable, start: int, stop: int, line_offset: Optional[int] = None) -> pa.RecordBatch:
    """Rows [start, stop) of a table as a record batch of `schema(table)`.

    Args:
      table: the table.
      start, stop: the row range.
      line_offset: the byte offset of vocabulary line `start` (`line_offsets`; vocabulary tables).
    """
    n = stop - start
    ids = np.arange(start, stop, dtype=np.int64)
    token_rows = max(0, min(stop, table.vocabulary_size) - start)
    oov = ids >= table.vocabulary_size
    if table.int_keys:
        keys = pa.array(np.where(oov, ids - table.vocabulary_size, ids), pa.int64())
    else:
        tokens = []
        if token_rows:
            if line_offset is None:
                raise RowFilesError(f"table {table.name}: rows from {start} need the vocabulary's line offset")
            tokens = read_lines(table.vocabulary, line_offset, token_rows)
        buckets = [str(b).encode() for b in range(max(start, table.vocabulary_size) - table.vocabulary_size,
                                                  stop - table.vocabulary_size)]
        try:
            keys = pa.array(tokens + buckets, pa.binary()).cast(pa.string())
        except pa.ArrowInvalid as err:
            raise RowFilesError(f"table {table.name}: a vocabulary line between rows {start} and {stop} is not "
                                f"UTF-8 ({err}); tokens are UTF-8 (rule T6)") from err
    values = read_npy_rows(table.values, start, stop)
    if values.shape != (n, table.dim):
        raise RowFilesError(f"table {table.name}: {table.values} holds {values.shape} from row {start}, the manifest "
                            f"says {table.rows} rows of dim {table.dim}: export the model again")
    flat = values.astype(np.int8 if table.stored_dtype == "int8" else np.float32, copy=False).reshape(-1)
    columns = [keys, pa.array(oov), pa.FixedSizeListArray.from_arrays(pa.array(flat), table.dim)]
    if table.scale is not None:
        columns.append(pa.array(read_npy_rows(table.scale, start, stop).astype(np.float32, copy=False)))
    if len(keys) != n:
        raise RowFilesError(f"table {table.name}: {len(keys)} keys for {n} rows from row {start}")
    return pa.RecordBatch.from_arrays(columns, schema=schema(table))


def chunks(table: RowTable, every: int = CHUNK_ROWS) -> List[Tuple[int, int, Optional[int]]]:
    """The table's row ranges of `every` rows, each with its first vocabulary line's byte offset
    (None past the vocabulary, or without one): one pass over the vocabulary file."""
    offsets = line_offsets(table.vocabulary, every, table.vocabulary_size) if table.vocabulary else []
    return [(s, min(s + every, table.rows), offsets[s // every] if s // every < len(offsets) and s < table.vocabulary_size
             else None) for s in range(0, table.rows, every)]


def spill_pieces(table: RowTable, start: int, stop: int, line_offset: Optional[int], shards: int
                 ) -> Iterator[Tuple[int, pa.RecordBatch]]:
    """A chunk's rows cut by shard (SHARD_RULE): (shard, its rows of the chunk)."""
    batch = chunk_batch(table, start, stop, line_offset)
    shard = shard_of(batch.column(0), shards)
    for s in np.unique(shard):
        yield int(s), batch.filter(pa.array(shard == s))


def part_name(shard: int, shards: int) -> str:
    return f"part-{shard:05d}-of-{shards:05d}.parquet"


def write_shard(batches: Sequence[pa.RecordBatch], table_schema: pa.Schema, path: str) -> Dict[str, Any]:
    """One shard's rows, sorted by (oov, key), as a Parquet file (written whole: a temporary name,
    then a rename). Returns its manifest entry (file name, rows, bytes, sha256)."""
    rows = pa.Table.from_batches(list(batches), schema=table_schema).sort_by(SORT_KEYS)
    if len(rows) > 1:
        keys, oov = rows["key"].combine_chunks(), rows["oov"].combine_chunks()
        same = pa.compute.and_(pa.compute.equal(keys[1:], keys[:-1]), pa.compute.equal(oov[1:], oov[:-1]))
        if pa.compute.any(same).as_py():
            raise RowFilesError(f"{path}: a key appears twice (a vocabulary file with a repeated line)")
    entry = write_parquet(rows, path)
    entry["oov_rows"] = int(pa.compute.sum(rows["oov"]).as_py() or 0)
    return entry


def open_binary(path: str):
    """A file opened for reading bytes through tf.io.gfile (local, gs://)."""
    return tf.io.gfile.GFile(path, "rb")


def write_parquet(rows: pa.Table, path: str) -> Dict[str, Any]:
    """A Parquet file written whole (a temporary name, then a rename); its entry: file, rows, bytes, sha256."""
    tf.io.gfile.makedirs(os.path.dirname(path))
    tmp = f"{path}.tmp"
    sink = pa.BufferOutputStream()  # pyarrow cannot write to a GFile: the file (one shard) in memory first
    pq.write_table(rows, sink, compression="zstd")
    with tf.io.gfile.GFile(tmp, "wb") as fh:
        fh.write(sink.getvalue().to_pybytes())
    tf.io.gfile.rename(tmp, path, overwrite=True)
    return {"file": os.path.basename(path), "rows": len(rows), "bytes": int(tf.io.gfile.stat(path).length),
            "sha256": file_sha256(path, open_binary)}


def table_entry(table: RowTable, shards: int, files: List[Dict[str, Any]]) -> Dict[str, Any]:
    """A table's `rows_manifest.json` entry; its files' rows must add up to the table's."""
    total = sum(f["rows"] for f in files)
    if total != table.rows:
        raise RowFilesError(f"table {table.name}: the row files hold {total} rows, the table {table.rows}")
    e = table.entry
    default = e.get("default_value") if table.kind == VocabularyKind.IDENTITY else None
    return {
        "table": table.name, "features": list(e["features"]), "combiner": e["combiner"], "wide_of": e.get("wide_of"),
        "dim": table.dim, "dtype": table.stored_dtype, "trained_dtype": table.dtype,
        "dequantize": "vector * scale" if table.stored_dtype == "int8" else "vector",
        "key_type": "int64" if table.int_keys else "string", "vocabulary_kind": table.kind,
        "vocabulary_size": table.vocabulary_size, "num_oov_buckets": table.num_oov_buckets, "default_row": default,
        "lookup": lookup_rule(table.kind, table.num_oov_buckets, default),
        "rows": total, "oov_rows": sum(f["oov_rows"] for f in files), "shards": shards, "files": files,
    }


def lookup_rule(kind: str, num_oov_buckets: int, default_row: Optional[int]) -> str:
    """The rule, in words, by which a store finds a raw token's row (rulebook V1-V4)."""
    if kind == VocabularyKind.IDENTITY:
        other = (f"(key={default_row}, oov=false)" if default_row is not None else "no row (the token pools nothing)")
        return (f"a token that is the decimal text of an int64 ID below the table's rows: (key=ID, oov=false); "
                f"any other token: {other}")
    if kind == VocabularyKind.HASHED:
        return f"every token: (key=Fingerprint64(token) % {num_oov_buckets}, oov=true)"
    return (f"(key=token, oov=false) when present, else (key=Fingerprint64(token) % {num_oov_buckets} as decimal "
            f"text, oov=true)")


def write_table_rows(table: RowTable, out_dir: str, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                     every: int = CHUNK_ROWS) -> Dict[str, Any]:
    """One table's row files in bounded memory: each chunk's rows spilled to their shard's Arrow
    stream in a temporary directory, then each shard sorted and written (`write_shard`)."""
    shards = shard_count(table, max_file_bytes)
    spill = tempfile.mkdtemp(prefix=f"rows-{table.name}-")
    table_schema = schema(table)
    try:
        writers = [pa.ipc.new_stream(os.path.join(spill, str(s)), table_schema) for s in range(shards)]
        try:
            for start, stop, offset in chunks(table, every):
                for s, piece in spill_pieces(table, start, stop, offset, shards):
                    writers[s].write_batch(piece)
        finally:
            for w in writers:
                w.close()
        files = []
        directory = named_file(out_dir, table.name, "")
        for s in range(shards):
            with pa.memory_map(os.path.join(spill, str(s))) as source:
                batches = list(pa.ipc.open_stream(source))
            files.append(write_shard(batches, table_schema, os.path.join(directory, part_name(s, shards))))
            os.remove(os.path.join(spill, str(s)))
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    return table_entry(table, shards, files)


def write_manifest(out_dir: str, tables: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """`rows_manifest.json`, written last and whole: its presence means complete row files."""
    manifest = {"format": ROWS_FORMAT, "shard_rule": SHARD_RULE, "sort": "oov, key", "tables": tables,
                "rows": sum(t["rows"] for t in tables.values()),
                "bytes": sum(f["bytes"] for t in tables.values() for f in t["files"])}
    tmp = os.path.join(out_dir, f".{ROWS_MANIFEST_FILE}.tmp")
    with tf.io.gfile.GFile(tmp, "w") as fh:
        fh.write(json.dumps(manifest, indent=2, sort_keys=True))
    tf.io.gfile.rename(tmp, os.path.join(out_dir, ROWS_MANIFEST_FILE), overwrite=True)
    return manifest


def write_row_files(tables_dir: str, out_dir: str, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                    every: int = CHUNK_ROWS) -> Dict[str, Any]:
    """Every table of `tables_dir` as row files under `out_dir`, then the manifest.

    Returns:
      The manifest.
    """
    tf.io.gfile.makedirs(out_dir)
    if tf.io.gfile.exists(os.path.join(out_dir, ROWS_MANIFEST_FILE)):  # an earlier write's: not trusted while rewriting
        tf.io.gfile.remove(os.path.join(out_dir, ROWS_MANIFEST_FILE))
    return write_manifest(out_dir, {t.name: write_table_rows(t, out_dir, max_file_bytes, every)
                                    for t in read_tables(tables_dir)})


def read_manifest(rows_dir: str) -> Dict[str, Any]:
    """A row files directory's manifest.

    Raises:
      RowFilesError: there is none (the row files are incomplete or absent).
    """
    path = os.path.join(rows_dir, ROWS_MANIFEST_FILE)
    if not tf.io.gfile.exists(path):
        raise RowFilesError(f"{path}: no rows manifest (row files incomplete or never written)")
    with tf.io.gfile.GFile(path) as fh:
        return json.load(fh)


def read_shard(rows_dir: str, table: str, file: str) -> pa.Table:
    """One row file of a table."""
    with tf.io.gfile.GFile(os.path.join(named_file(rows_dir, table, ""), file), "rb") as fh:
        return pq.read_table(pa.BufferReader(fh.read()))


def iter_rows(rows_dir: str, table: str) -> Iterator[pa.Table]:
    """A table's row files, one shard at a time."""
    for f in read_manifest(rows_dir)["tables"][table]["files"]:
        yield read_shard(rows_dir, table, f["file"])


def read_table_rows(rows_dir: str, table: str) -> pa.Table:
    """A table's rows, every shard (for tests and small tables: this one is whole in memory)."""
    return pa.concat_tables(list(iter_rows(rows_dir, table))).sort_by(SORT_KEYS)
