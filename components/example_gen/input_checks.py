"""Checks of the input files before any row is read, each refusal one line naming the file and
what to change:

- **compressed bytes behind a name that does not say so** (a gzip file named `.csv`, which
  would be read as text and fail with "line contains NUL"): the first bytes are compared with the
  magic numbers of gzip, bzip2, zstd, xz, zip, lz4 and snappy. CSV is decompressed by its name's
  suffix (Beam's `CompressionTypes`: `.gz`, `.bz2`, `.zst`/`.zstd`, `.xz`/`.lzma`, `.deflate`), so a
  CSV file must carry the suffix of its compression (and a suffix must match the bytes); TFRecord
  files are inflated when gzipped whatever their name (`row_counts.open_maybe_gzip`), but no other
  compression; Parquet files are never compressed as a whole. `.zip`, `.lz4` and `.snappy` files
  are not read.
- **input without a data row** (every file empty, blank, a CSV header only, or a Parquet file of
  0 rows or no columns), which would otherwise pass ExampleGen counted as 0 rows and fail later.
  A file among others that holds rows is still only counted (the ledger's `files_without_header`,
  `files_without_rows`).

Only the start of each file is read (`PEEK_BYTES`, decompressed when the name says so), or a
Parquet file's footer: a file whose header does not end within the first 64 KiB is taken to hold
rows. The compression check reads 16 bytes of every file, `PEEK_THREADS` files at a time: on a
remote store each read waits tens of milliseconds, which thousands of files would add up serially. `check_files` is what ExampleGen's executor calls on the files its driver resolved
(`InputError`); `check_input` runs the same checks from a configuration before a pipeline starts
(`ConfigError`, as the command line's other checks of `input.path`).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Tuple

import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from components.config.choices import InputFormat
from components.config.schema import SPAN_SPEC, ConfigError, PipelineConfig
from components.example_gen import input_folder, ranges
from components.reporting.errors import InputError

PEEK_BYTES = 1 << 16
PEEK_THREADS = 32  # files whose first bytes are read at once (each read waits on the store, not the CPU)
# (compression, its magic numbers at byte 0, the suffixes Beam decompresses it by)
COMPRESSIONS = (
    ("gzip", (b"\x1f\x8b",), (".gz",)),
    ("bzip2", tuple(b"BZh" + bytes([level]) + block for level in b"123456789"
                    for block in (b"\x31\x41\x59\x26\x53\x59", b"\x17\x72\x45\x38\x50\x90")), (".bz2",)),
    ("zstd", (b"\x28\xb5\x2f\xfd",), (".zst", ".zstd")),
    ("xz", (b"\xfd7zXZ\x00",), (".xz",)),  # (Beam also reads .lzma: xz or the older LZMA format)
    ("zip", (b"PK\x03\x04", b"PK\x05\x06"), ()),
    ("lz4", (b"\x04\x22\x4d\x18",), ()),
    ("snappy", (b"\xff\x06\x00\x00sNaPpY",), ()),
)
NOT_READ_SUFFIXES = (".zip", ".lz4", ".snappy")  # names ExampleGen does not decompress
MAX_NAMED = 3  # empty files named in a refusal
# Byte ranges one run may cut its CSV input into (input.range_mb): each is a Beam element and a
# ledger entry, and `input.range_mb: 1e-9` (one range a byte) hung the run planning them. 64 MiB
# ranges of 100,000 ranges are 6.4 TB.
MAX_RANGES = 100_000


def _compression_of(head: bytes) -> Optional[str]:
    for name, magics, _ in COMPRESSIONS:
        if head.startswith(magics):
            return name
    return None


def _suffixes(name: str) -> Tuple[str, ...]:
    return next(s for n, _, s in COMPRESSIONS if n == name)


def _head(path: str, n: int) -> bytes:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
        return fh.read(n)


def check_compression(path: str, input_format: str) -> None:
    """Refuses a file whose bytes are compressed in a way its name does not say (or that ExampleGen
    does not read), or whose name promises a compression its bytes do not have.

    Args:
      path: the file.
      input_format: `csv`, `tfrecord` or `parquet`.

    Raises:
      InputError: naming the file and what to do.
    """
    lower = path.lower()
    base = os.path.basename(path)
    if input_format == InputFormat.CSV and lower.endswith(NOT_READ_SUFFIXES):
        raise InputError(
            f"{path}: ExampleGen does not decompress {os.path.splitext(base)[1]} files; decompress it and point "
            "input.path at the CSV (or recompress it as .gz)")
    found = _compression_of(_head(path, 16))
    named = CompressionTypes.detect_compression_type(path)
    if input_format == InputFormat.CSV and named != CompressionTypes.UNCOMPRESSED:
        # (.deflate has no magic number; .lzma may be xz or the older LZMA format: not compared)
        expected = next((n for n, _, suffixes in COMPRESSIONS if lower.endswith(suffixes)), None)
        if expected is not None and found != expected:
            what = f"{found}-compressed" if found else "not compressed"
            raise InputError(
                f"{path}: its name says {expected}, but its bytes are {what}; rename it to match its content "
                f"(or recompress it), then rerun")
        return
    if found is None or (found == "gzip" and input_format == InputFormat.TFRECORD):
        return
    if found in ("zip", "lz4", "snappy") or input_format != InputFormat.CSV:
        fix = ("unzip it and point input.path at the file(s) inside" if found == "zip"
               else f"decompress it (ExampleGen reads {input_format} files "
                    f"{'plain or gzipped' if input_format == InputFormat.TFRECORD else 'uncompressed'})")
        raise InputError(f"{path}: holds {found}-compressed bytes, which ExampleGen does not read as "
                         f"{input_format}; {fix}, then rerun")
    raise InputError(
        f"{path}: holds {found}-compressed bytes, but its name does not end in {' or '.join(_suffixes(found))}, so "
        f"it would be read as plain CSV; decompress it, or rename it to {base}{_suffixes(found)[0]} and point "
        "input.path at it (a directory reads its *.csv files only), then rerun")


def _csv_rows(path: str) -> Optional[str]:
    """Why a CSV file holds no data row ("0 bytes", "blank lines only", "a header only"), from its
    first PEEK_BYTES (decompressed); None when it holds one, or when its start cannot tell."""
    try:
        with ranges.open_decompressed(path) as fh:
            head = fh.read(PEEK_BYTES + 1)
    except Exception:  # noqa: BLE001 - unreadable here: ExampleGen's reader names the problem
        return None
    if len(head) > PEEK_BYTES:
        head = head[:PEEK_BYTES]
        complete = False
    else:
        complete = True
    if not head:
        return "0 bytes" if complete else None
    start = 0
    for end in list(ranges.record_ends(head, 0)) + [len(head)]:
        line = head[start:int(end)]
        start = int(end) + 1
        if line.strip(b"\r"):  # the header: the first line with content (ranges' rule)
            if int(end) == len(head) and not complete:
                return None  # the header goes on past the peek
            rest = head[start:]
            if complete and not rest.strip(b"\r\n"):
                return "a header only"
            return None
    return "blank lines only" if complete else None


def _tfrecord_rows(path: str, size: int) -> Optional[str]:
    if size == 0:
        return "0 bytes"
    # lazy: row_counts' gzip-aware opener is only needed for a file that has bytes
    from components.rows.row_counts import open_maybe_gzip

    try:
        with open_maybe_gzip(path) as fh:
            return None if fh.read(1) else "0 records (an empty gzip stream)"
    except Exception:  # noqa: BLE001 - unreadable here: ExampleGen's reader names the problem
        return None


def _parquet_rows(path: str, size: int) -> Optional[str]:
    if size == 0:
        return "0 bytes"
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            meta = pq.ParquetFile(fh).metadata
    except Exception:  # noqa: BLE001 - not Parquet: ExampleGen's planning names the file
        return None
    if meta.num_columns == 0:
        return "no columns"
    return "0 rows" if meta.num_rows == 0 else None


def why_no_rows(path: str, size: int, input_format: str) -> Optional[str]:
    """Why a file holds no data row (e.g. "a header only"), read from its start or its footer;
    None when it holds one or when that cannot be told from there."""
    if input_format == InputFormat.CSV:
        return "0 bytes" if size == 0 else _csv_rows(path)
    if input_format == InputFormat.PARQUET:
        return _parquet_rows(path, size)
    return _tfrecord_rows(path, size)


def check_files(cfg: PipelineConfig, files: List[Tuple[str, int]]) -> None:
    """Refuses input that cannot be read as named, or that holds no data row at all.

    Args:
      cfg: the configuration (`input.format`, and `input.path` for messages).
      files: (path, size in bytes) of every input file (hidden names left out: input_folder.py).

    Raises:
      InputError: a file is compressed otherwise than its name says, or no file holds a data row;
        one line naming the file(s) and what to change.
    """
    fmt = cfg.input.format
    check_range_count(cfg, files)
    # Threads, not processes: each check waits on a read. `map` raises the first refusal in the
    # files' order; the checks still queued are cancelled.
    pool = ThreadPoolExecutor(max_workers=max(1, min(PEEK_THREADS, len(files))))
    try:
        for _ in pool.map(lambda f: check_compression(f[0], fmt), files):
            pass
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    empty = []
    for path, size in files:
        why = why_no_rows(path, size, fmt)
        if why is None:
            return
        empty.append((path, why))
    if not empty:
        return
    fix = ("add data rows below a header line, or point input.path at the data" if fmt == InputFormat.CSV
           else "point input.path at files that hold rows")
    if len(empty) == 1:
        path, why = empty[0]
        where = path if path == cfg.input.path else f"{cfg.input.path} ({path})"
        raise InputError(f"input.path {where}: no data rows ({why}); {fix}, then rerun")
    named = "; ".join(f"{os.path.basename(p)}: {w}" for p, w in empty[:MAX_NAMED])
    more = f"; and {len(empty) - MAX_NAMED} more" if len(empty) > MAX_NAMED else ""
    raise InputError(f"input.path {cfg.input.path}: no data rows in any of its {len(empty)} files ({named}{more}); "
                     f"{fix}, then rerun")


def check_range_count(cfg: PipelineConfig, files: List[Tuple[str, int]]) -> None:
    """Refuses an `input.range_mb` that cuts the CSV input into more than MAX_RANGES byte ranges.

    Args:
      cfg: the configuration (`input.format`, `input.range_mb`).
      files: (path, size in bytes) of every input file.

    Raises:
      InputError: one line naming the field, the input's size and the ranges it would make.
    """
    if cfg.input.format != InputFormat.CSV:
        return  # Parquet is cut by whole row groups, a TFRecord file is read whole
    range_bytes = max(1, int(cfg.input.range_mb * (1 << 20)))
    splittable = [n for p, n in files if not ranges.is_compressed(p)]
    count = sum(-(-n // range_bytes) for n in splittable) + (len(files) - len(splittable))
    if count > MAX_RANGES:
        raise InputError(
            f"input.range_mb {cfg.input.range_mb:g} cuts the input's {sum(n for _, n in files):,} bytes into {count:,} "
            f"byte ranges, more than {MAX_RANGES:,}: raise input.range_mb (64 MiB by default) to at least "
            f"{sum(splittable) / MAX_RANGES / (1 << 20):.3g}")


def input_files(cfg: PipelineConfig) -> Optional[List[Tuple[str, int]]]:
    """(path, size) of the files `input.path` names (a file, a directory: its `*.csv` files for CSV,
    every file otherwise, or a glob; local or remote), as ExampleGen will read them; None for a
    span pattern (ExampleGen's driver picks the span) or when nothing matches (the pipeline's own
    check of `input.path` says so)."""
    path = cfg.input.path
    if not path or SPAN_SPEC.search(path):
        return None
    pattern = path
    if "://" not in path and os.path.isdir(path):
        pattern = os.path.join(path, cfg.input.directory_files())
    try:
        found = FileSystems.match([pattern])[0].metadata_list
    except Exception:  # noqa: BLE001 - e.g. a bucket not reachable from here: ExampleGen lists it itself
        return None
    files = sorted((m.path, m.size_in_bytes) for m in found if "://" in m.path or not os.path.isdir(m.path))
    files, _ = input_folder.screen(files, os.path.basename(pattern))  # as ExampleGen reads them
    return files or None


def check_input(cfg: PipelineConfig) -> None:
    """The checks of `check_files` on the files `input.path` names, before a pipeline starts (a
    span input is checked by ExampleGen, on the span its driver resolves).

    Args:
      cfg: the resolved configuration.

    Raises:
      ConfigError: `<config file>: <the InputError's line>`.
    """
    try:
        files = input_files(cfg)
        if files is not None:
            check_files(cfg, files)
    except InputError as e:
        raise ConfigError(f"{cfg.resolved.source_file}: {e}") from e
