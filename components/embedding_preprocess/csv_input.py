"""CSV input for the standalone preprocessing CLI (the pipeline reads ExampleGen's tf.Examples).

Files are cut into byte ranges (whole lines belong to the range they start in; compressed files
are one range), spread over workers, and each range is parsed by pyarrow's CSV reader into RecordBatches shaped like the tf.Example decoder's: categorical columns
as binary (so non-UTF-8 bytes survive to be counted as invalid), dense columns and the label as
float64 (null when empty or not a number). Rows with the wrong number of fields are skipped by
pyarrow's invalid-row handler and counted as `malformed_rows`; non-numeric dense values are counted
as `not_numeric`. Quoted fields spanning several lines are not supported (one record per line).
"""
from __future__ import annotations

import io
from typing import Dict, List, Tuple

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from components.config.schema import PipelineConfig
from components.embedding_preprocess import partials
from components.embedding_preprocess.transform import read_batch_rows


CHUNK_BYTES = 16 << 20


class InputError(ValueError):
    """An input problem found before Beam starts (no file, no header, missing columns)."""


def read_header(pattern: str) -> List[str]:
    matches = FileSystems.match([pattern])[0].metadata_list
    if not matches:
        raise InputError(f"input {pattern!r} matches no file; pass an existing CSV file, directory glob or pattern")
    first = sorted(m.path for m in matches)[0]
    with FileSystems.open(first) as fh:
        header = fh.readline().decode("utf-8", "replace").strip("\r\n")
    if not header:
        raise InputError(f"{first}: empty file or no header line; CSV input needs a header naming the columns")
    return header.split(",")


def check_columns(cfg: PipelineConfig, header: List[str], source: str) -> None:
    wanted = [cfg.label] + [d.source for d in cfg.dense_features] + [f.source for f in cfg.categorical_features]
    wanted += cfg.weight_columns()
    missing = [c for c in dict.fromkeys(wanted) if c not in header]
    if missing:
        raise InputError(
            f"{source}: columns {missing} named in the config are not in the CSV header {header[:8]}...; "
            "fix the header or the config's column names"
        )


def split_ranges(pattern: str, chunk_bytes: int) -> List[Tuple[str, int, int]]:
    """(file, start, end) byte ranges of every matching file, about `chunk_bytes` each."""
    ranges = []
    for m in FileSystems.match([pattern])[0].metadata_list:
        if _compressed(m.path):  # cannot seek: one range for the whole file
            ranges.append((m.path, 0, 1 << 62))
            continue
        for start in range(0, max(m.size_in_bytes, 1), chunk_bytes):
            ranges.append((m.path, start, min(start + chunk_bytes, m.size_in_bytes)))
    return sorted(ranges)


def read_range_lines(path: str, start: int, end: int) -> bytes:
    """The complete lines that start inside [start, end) (the header excluded), as one bytes block.

    A line belongs to the range where it starts, so every line is read exactly once: a range that
    does not start at 0 skips the partial line it begins in, and reads on past `end` to finish its last.
    """
    with FileSystems.open(path) as fh:
        if start == 0:
            fh.readline()  # the header
        else:
            fh.seek(start - 1)
            fh.readline()  # the rest of the line that started before this range
        pos = fh.tell()
        if pos >= end:
            return b""
        data = fh.read(max(0, end - pos))
        if data and not data.endswith(b"\n"):
            data += fh.readline()
        return data


def _compressed(path: str) -> bool:
    return path.endswith((".gz", ".bz2", ".zst", ".deflate"))


class _ParseCsvRange(beam.DoFn):
    """One byte range of a CSV file -> RecordBatches of `rows` rows, plus input statistics."""

    def __init__(self, header: List[str], config_json: str, rows: int):
        self._header = header
        self._config_json = config_json
        self._rows = rows

    def setup(self):
        from pyarrow import csv

        from components.config.loading import config_from_json

        cfg = config_from_json(self._config_json)
        numeric = {cfg.label} | {d.source for d in cfg.dense_features} | set(cfg.weight_columns())
        self._numeric = [c for c in self._header if c in numeric]
        self._csv = csv
        self._convert = csv.ConvertOptions(
            column_types={c: pa.binary() for c in self._header},
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        )

    def process(self, byte_range: Tuple[str, int, int]):
        block = read_range_lines(*byte_range)
        if not block.strip():
            return
        malformed = []
        parse = self._csv.ParseOptions(invalid_row_handler=lambda row: malformed.append(1) or "skip")
        data = b",".join(h.encode() for h in self._header) + b"\n" + block
        # open_csv(...).read_all(), not read_csv: pyarrow 10's read_csv scans the whole heap on Python
        # 3.10 (gc.get_referrers, its workaround for bpo-42248), a cost that grows with the heap (39 ms
        # to 0.2 s a call in the test processes); the streaming reader does not
        table = self._csv.open_csv(
            io.BytesIO(data),
            read_options=self._csv.ReadOptions(use_threads=False),
            parse_options=parse,
            convert_options=self._convert,
        ).read_all()
        stats: Dict[str, int] = {partials.MALFORMED_ROWS: len(malformed)}
        columns = {}
        for name in self._header:
            col = table.column(name).combine_chunks() if table.num_rows else pa.array([], pa.binary())
            if name in self._numeric:
                col, bad = _to_float(col)
                if bad:
                    stats[partials.not_numeric(name)] = bad
            columns[name] = col
        batch = pa.RecordBatch.from_arrays(list(columns.values()), list(columns.keys()))
        # consecutive slices of whole training batches (statistics cut them into training batches)
        for offset in range(0, batch.num_rows, self._rows):
            yield batch.slice(offset, self._rows)
        yield beam.pvalue.TaggedOutput("stats", stats)


def _to_float(col: pa.Array):
    """binary -> float64: empty cells become null; so do non-numbers, which are also counted."""
    text = pc.cast(col, pa.string(), safe=False)
    empty = pc.equal(pc.binary_length(col), 0)
    try:
        values = pc.cast(pc.if_else(empty, pa.scalar(None, pa.string()), text), pa.float64())
        return values, 0
    except pa.ArrowInvalid:
        out, bad = [], 0
        for v in col.to_pylist():
            try:
                out.append(float(v) if v else None)
            except (ValueError, UnicodeDecodeError):
                out.append(None)
                bad += 1
        return pa.array(out, pa.float64()), bad


class ReadCsvRecordBatches(beam.PTransform):
    """PBegin -> (RecordBatches of the CSV files `pattern`, statistics partials of the input).

    Batches have `transform.read_batch_rows(batch_size)` rows (consecutive whole training batches)
    and the columns of `header`, shaped as the module docstring says; the partials count malformed
    rows and non-numeric values per byte range."""

    def __init__(self, pattern: str, header: List[str], cfg: PipelineConfig):
        super().__init__()
        self._pattern = pattern
        self._header = header
        self._config_json = cfg.to_json()
        self._rows = read_batch_rows(cfg.training.batch_size)

    def expand(self, pbegin):
        # Byte ranges instead of Beam's line-per-element text source: a 1M-row file is ~60 elements,
        # not 1M, and pyarrow's C++ parser does the line work. Reshuffle spreads ranges over workers.
        result = (
            pbegin
            | "Ranges" >> beam.Create(split_ranges(self._pattern, CHUNK_BYTES))
            | "Spread" >> beam.Reshuffle()
            | "Parse"
            >> beam.ParDo(_ParseCsvRange(self._header, self._config_json, self._rows)).with_outputs(
                "stats", main="batches"
            )
        )
        return result.batches, result.stats
