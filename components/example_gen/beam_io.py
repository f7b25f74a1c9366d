"""Beam reading and writing of ExampleGen: input files in, typed Parquet splits out, every row
counted on two sides, no row data crossing a stage boundary.

`WriteExamples` (what the ExampleGen executor runs):
- plans byte ranges (`ranges.plan_ranges`): an uncompressed CSV file is cut into ranges of
  `input.range_mb`, so one big file is read by every worker; a compressed file or a TFRecord file
  is one range. The ranges (small elements: path, start, end) are spread over the workers;
- CSV ranges: a first pass counts each range's quotes and newlines, so each range knows whether it
  starts inside a quoted field, and hashes the blocks that start in it (`ranges.scan_range`: one
  read for both; the blocks' digests are the input's identity); each range then parses the whole records that
  start in it (`ranges.read_owned_records`) with pyarrow's CSV reader (`newlines_in_values`, so
  quoted separators and line breaks, CRLF and a byte-order mark are read as written; rows with too
  few or too many fields are skipped by pyarrow's invalid-row handler and counted by reason, with the
  first few file:line locations kept). TFRecord files: each record's framing and CRC checked and
  decoded with tfx_bsl (a record that fails either is counted as corrupt);
- types the rows by the configuration (`records.type_rows`), assigns each row its split by a hash of
  its content (`split_hash`) and writes it, in the same worker, to that range's Parquet file of the
  split (written to a temporary name, renamed when the range is done, so a retried or failed range
  never leaves a file that a reader would take for output). Only counts leave the worker;
- Parquet input (`parquet_input`): units of row groups instead of byte ranges, their schemas
  checked before the pipeline, each unit read with pyarrow and conformed to the kinds TFRecord
  input decodes to, then typed and written as above;
- counts every file's data rows a second way (`ranges.count_range_lines` per range, or
  `components.rows.row_counts` per whole file, or a Parquet unit's rows in the file's footer: not the
  parser) and writes the merged counts next to the output; the executor turns them into the
  ExampleGen ledger.
"""
from __future__ import annotations

import json
import struct
import uuid
from collections import Counter
from typing import Any, Dict, Iterable, List, Optional, Tuple

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from tfx_bsl.coders import example_coder

from components.config.loading import config_from_json
from components.reporting import progress
from components.rows import row_counts
from components.example_gen import ranges, split_hash
from components.example_gen.csv_records import MalformedRows, read_csv_range
from components.example_gen.header import read_csv_header
from components.example_gen.parquet_input import read_unit, unit_counts
from components.example_gen.records import type_rows
from components.config.choices import InputFormat

# Live progress (components/reporting/progress.py): the rows read and the byte ranges finished.
ROWS_READ, RANGES_DONE = "rows read", "byte ranges"
TFRECORD_BATCH = 4096
MAX_EXAMPLES = 5  # malformed / corrupt rows named per reason


def _sum_counts(parts: Iterable[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for part in parts:
        for k, v in part.items():
            if k.startswith("examples/"):
                out[k] = sorted(out.get(k, []) + list(v))[:MAX_EXAMPLES]
            else:
                out[k] = out.get(k, 0) + v
    return out


class SumCountsFn(beam.CombineFn):
    """Adds count dicts; `examples/...` keys keep the first few sample locations."""

    def create_accumulator(self):
        return {}

    def add_input(self, acc, element):
        return _sum_counts([acc, element])

    def merge_accumulators(self, accumulators):
        return _sum_counts(accumulators)

    def extract_output(self, acc):
        return acc


def count_whole_file(path: str, input_format: str) -> Dict[str, int]:
    """The independent count of one whole file (compressed CSV, TFRecord): `row_counts`."""
    if input_format == InputFormat.CSV:
        c = row_counts.count_file(path, row_counts.count_csv_records)
        return {"input/lines": c.data_records + (1 if c.has_header else 0), "input/blank_lines": c.blank_lines,
                **({"input/files_ending_inside_quotes": 1} if c.unterminated_quote else {})}
    c = row_counts.count_file(path, row_counts.count_tfrecords)
    return {"input/data_rows": c.records, **({"input/files_truncated": 1} if c.truncated else {})}


def count_range(r, input_format: str, before: Dict) -> Tuple[str, Dict[str, int]]:
    """(file, independent counts of the range): lines counted on the bytes, not by the parser (a
    Parquet unit: its rows in the footer)."""
    if input_format == InputFormat.PARQUET:
        return r.path, unit_counts(r)
    if r.whole_file:
        return r.path, count_whole_file(r.path, input_format)
    return r.path, ranges.count_range_lines(r, before.get(r.key(), (0, 0))[0])


def file_totals(item: Tuple[str, Dict[str, int]], input_format: str) -> Dict[str, int]:
    """A file's summed range counts -> the ledger's input counts (the header is not a data row)."""
    _, c = item
    out = {k: v for k, v in c.items() if k != "input/lines"}
    out["input/files"] = 1
    if input_format == InputFormat.CSV:
        lines = c.get("input/lines", 0)
        out["input/data_rows"] = max(0, lines - 1)
        out.setdefault("input/blank_lines", 0)
        if lines == 0:
            out["input/files_without_header"] = 1
    elif input_format == InputFormat.PARQUET and not c.get("input/data_rows", 0):
        out["input/files_without_rows"] = 1
    return out


def _conform(rb: pa.RecordBatch, schema: pa.Schema) -> Optional[pa.RecordBatch]:
    """`rb` in `schema` (a column it lacks as nulls, a null-typed column cast), or None when it
    cannot be: a column the schema lacks, or one of another type (the writer starts a new file)."""
    if rb.schema.equals(schema):
        return rb
    if any(schema.get_field_index(n) < 0 for n in rb.schema.names):
        return None
    arrays = []
    for field in schema:
        i = rb.schema.get_field_index(field.name)
        if i < 0:
            arrays.append(pa.nulls(rb.num_rows, field.type))
            continue
        col = rb.column(i)
        if col.type != field.type:
            if not (pa.types.is_null(col.type) or _null_list(col.type)):
                return None
            col = pa.nulls(rb.num_rows, field.type) if pa.types.is_null(col.type) else col.cast(field.type)
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _null_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_null(t.value_type)


class SplitWriter:
    """One range's Parquet output of one split: `<split_dir>/<name>.parquet`, written under a
    temporary name in `tmp_dir` and renamed into place by `close` (a new part file when a batch's
    columns cannot join the open file's schema, e.g. a TFRecord feature typed differently)."""

    def __init__(self, split_dir: str, tmp_dir: str, name: str):
        self._split_dir, self._tmp_dir, self._name = split_dir, tmp_dir, name
        self._writer = None
        self._schema: Optional[pa.Schema] = None
        self._parts: List[Tuple[str, str]] = []  # (temporary, final)
        self.rows = 0

    def write(self, rb: pa.RecordBatch) -> None:
        if not rb.num_rows:
            return
        conformed = _conform(rb, self._schema) if self._schema is not None else None
        if conformed is None:
            self._open(rb.schema)
            conformed = rb
        self._writer.write_batch(conformed)
        self.rows += rb.num_rows

    def _open(self, schema: pa.Schema) -> None:
        self._close_writer()
        part = len(self._parts)
        final = FileSystems.join(self._split_dir, f"{self._name}{'' if part == 0 else f'-part{part}'}.parquet")
        tmp = FileSystems.join(self._tmp_dir, f"{uuid.uuid4().hex}.parquet")
        self._fh = FileSystems.create(tmp)
        # No column statistics (min/max per page and row group): nothing downstream filters on them,
        # and on these list columns they cost 16% of the write (bench/data_path_profile.py).
        self._writer = pq.ParquetWriter(self._fh, schema, compression="snappy", write_statistics=False)
        self._schema = schema
        self._parts.append((tmp, final))

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._fh.close()
            self._writer = None

    def close(self) -> None:
        """Finishes the files and moves them into the split."""
        self._close_writer()
        if self._parts:
            FileSystems.rename([t for t, _ in self._parts], [f for _, f in self._parts])


class ReadAndWriteRange(beam.DoFn):
    """One byte range (or whole file) -> its rows typed and written to the splits' Parquet files;
    yields one count dict (rows parsed, malformed, dropped and written per split, with examples)."""

    def __init__(self, config_json: str, split_dirs: Dict[str, str], bounds: List[int], tmp_dir: str, total: int):
        self._config_json = config_json
        self._split_dirs = split_dirs  # split name -> directory, in split order
        self._bounds = bounds
        self._tmp_dir = tmp_dir
        self._total = total

    def setup(self):
        self._cfg = config_from_json(self._config_json)
        self._decoder_cls = example_coder.ExamplesToRecordBatchDecoder
        self._hashed = sorted(set(self._cfg.numeric_columns() + self._cfg.categorical_columns() + [self._cfg.label]))

    def process(self, r, before: Dict):
        """`r`: a ranges.ByteRange, or a parquet_input.RowGroupRange for Parquet input."""
        counts: Counter = Counter()
        samples: Dict[str, List[str]] = {}
        if self._cfg.input.format == InputFormat.CSV:
            batches = self._read_csv_range(r, before, counts, samples)
        elif self._cfg.input.format == InputFormat.PARQUET:
            batches = read_unit(r, self._cfg, counts, samples)
        else:
            batches = self._read_tfrecord(r.path, counts, samples)
        names = list(self._split_dirs)
        name = f"data_parquet-{r.index:05d}-of-{self._total:05d}"
        writers = {s: SplitWriter(d, self._tmp_dir, name) for s, d in self._split_dirs.items()}
        for rb in batches:
            counts["rows/parsed"] += rb.num_rows
            progress.count(progress.EXAMPLE_GEN, ROWS_READ, rb.num_rows)
            typed, c = type_rows(self._cfg, rb)
            counts.update(c)
            if not typed.num_rows:
                continue
            split = split_hash.assign_splits(split_hash.row_hashes(typed, self._hashed), self._bounds)
            for k, s in enumerate(names):
                mask = split == k
                if mask.all():
                    writers[s].write(typed)
                elif mask.any():
                    writers[s].write(typed.filter(pa.array(mask)))
        for s, w in writers.items():
            w.close()
            counts[f"split/{s}"] += w.rows
        progress.count(progress.EXAMPLE_GEN, RANGES_DONE, 1, total=self._total, unit="ranges")
        out: Dict[str, Any] = dict(counts)
        out.update({f"examples/{k}": v for k, v in samples.items()})
        yield out

    def _read_csv_range(self, r: ranges.ByteRange, before: Dict, counts: Counter, samples: Dict[str, List[str]]):
        """The range's records (`csv_records.read_csv_range`); malformed rows counted into `counts`
        and located in `samples`, an empty file counted as `files/empty`."""
        header = read_csv_header(r.path)
        if header is None:  # an empty file: no header, no rows (the ledger says so)
            if r.start == 0:
                counts["files/empty"] += 1
            return
        malformed = MalformedRows(MAX_EXAMPLES)
        yield from read_csv_range(r, header, before, malformed)
        counts.update({f"rows/malformed/{reason}": c for reason, c in malformed.counts.items()})
        for key, where in malformed.examples.items():
            samples.setdefault(key, []).extend(where)

    def _read_tfrecord(self, path: str, counts: Counter, samples: Dict[str, List[str]]):
        decoder = self._decoder_cls()
        pending: List[bytes] = []
        for index, record in _tfrecord_payloads(path):
            if record is None:
                counts["rows/malformed/corrupt_record"] += 1
                kept = samples.setdefault("malformed/corrupt_record", [])
                if len(kept) < MAX_EXAMPLES:
                    kept.append(f"{path}: record {index} (CRC mismatch)")
                continue
            pending.append(record)
            if len(pending) >= TFRECORD_BATCH:
                yield from _decode(decoder, pending, path, counts, samples)
                pending = []
        if pending:
            yield from _decode(decoder, pending, path, counts, samples)


def _decode(decoder, records: List[bytes], path: str, counts: Counter, samples: Dict[str, List[str]]):
    try:
        yield decoder.DecodeBatch(records)
        return
    except Exception:  # noqa: BLE001 - some record is not a tf.Example: find which, one by one
        pass
    good = []
    for r in records:
        try:
            decoder.DecodeBatch([r])
            good.append(r)
        except Exception:  # noqa: BLE001
            counts["rows/malformed/not_a_tf_example"] += 1
            kept = samples.setdefault("malformed/not_a_tf_example", [])
            if len(kept) < MAX_EXAMPLES:
                kept.append(f"{path}: a record of {len(r)} bytes")
    if good:
        # Columns typed differently across records cannot form one batch: decode them one by one.
        try:
            yield decoder.DecodeBatch(good)
        except Exception:  # noqa: BLE001
            for r in good:
                yield decoder.DecodeBatch([r])


def _masked_crc(data: bytes) -> int:
    import google_crc32c  # lazy: google_crc32c comes with Beam's GCP extra: only TFRecord input, which checks CRCs, needs it

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class CorruptFramingError(ValueError):
    """A TFRecord length header is corrupt: the records after it cannot be located."""


def _tfrecord_payloads(path: str):
    """(index, payload or None when its CRC fails) of each record; raises on corrupt framing."""
    with row_counts.open_maybe_gzip(path) as fh:
        index, offset = 0, 0
        while True:
            header = fh.read(12)
            if not header:
                return
            if len(header) < 12:
                raise CorruptFramingError(f"{path}: the file ends inside record {index}'s header (byte {offset})")
            (length,) = struct.unpack("<Q", header[:8])
            (length_crc,) = struct.unpack("<I", header[8:])
            if _masked_crc(header[:8]) != length_crc:
                raise CorruptFramingError(
                    f"{path}: the length of record {index} (byte {offset}) fails its CRC; the records after "
                    "it cannot be located. Rewrite the file, or remove it from the input"
                )
            payload = fh.read(length)
            crc = fh.read(4)
            if len(payload) < length or len(crc) < 4:
                raise CorruptFramingError(f"{path}: the file ends inside record {index} (byte {offset})")
            ok = _masked_crc(payload) == struct.unpack("<I", crc)[0]
            yield index, payload if ok else None
            index += 1
            offset += 16 + length


def scan_outputs(r):
    """A CSV range's (range key, (quotes, newlines)), then each of its blocks' digests as the
    "blocks" output (`ranges.scan_range`: one read for both)."""
    counted, blocks = ranges.scan_range(r)
    yield counted
    for b in blocks:
        yield beam.pvalue.TaggedOutput("blocks", b)


class WriteExamples(beam.PTransform):
    """PBegin -> nothing: reads `byte_ranges` (Parquet: row-group units), writes each split's Parquet files into `split_dirs`,
    the merged counts (JSON) to `counts_path` and, but for Parquet, every file's block digests
    (JSON [[path, block, sha256], ...]: ranges.scan_range for CSV, range_blocks for TFRecord) to `blocks_path`."""

    def __init__(self, config_json: str, byte_ranges: List[Any], split_dirs: Dict[str, str],
                 bounds: List[int], tmp_dir: str, counts_path: str, blocks_path: str):
        super().__init__()
        self._blocks_path = blocks_path
        self._config_json = config_json
        self._ranges = byte_ranges
        self._split_dirs = split_dirs
        self._bounds = bounds
        self._tmp_dir = tmp_dir
        self._counts_path = counts_path
        self._format = json.loads(config_json)["input"]["format"]

    def expand(self, pbegin):
        rs = pbegin | "Ranges" >> beam.Create(self._ranges) | "SpreadRanges" >> beam.Reshuffle()
        # Every byte but Parquet's hashed on the workers (the input's identity): a CSV range in the
        # same read as its quote count, where each range starts (quotes and newlines before it).
        blocks = None
        if self._format == InputFormat.CSV:
            scanned = rs | "ScanRanges" >> beam.FlatMap(scan_outputs).with_outputs("blocks", main="quotes")
            before = (
                scanned.quotes
                | "AllQuoteCounts" >> beam.combiners.ToList()
                | "BeforeEachRange" >> beam.Map(ranges.before_each_range)
            )
            blocks = scanned.blocks
        else:
            before = pbegin | "NoQuotes" >> beam.Create([{}])
            if self._format != InputFormat.PARQUET:
                blocks = rs | "HashBlocks" >> beam.FlatMap(ranges.range_blocks)
        side = beam.pvalue.AsSingleton(before)
        if blocks is not None:
            _ = (
                blocks
                | "AllBlocks" >> beam.combiners.ToList()
                | "BlocksToJson" >> beam.Map(lambda found: json.dumps(sorted(found)))
                | "WriteBlocks" >> beam.io.WriteToText(self._blocks_path, shard_name_template="")
            )
        written = rs | "ReadAndWrite" >> beam.ParDo(
            ReadAndWriteRange(self._config_json, self._split_dirs, self._bounds, self._tmp_dir, len(self._ranges)), side
        )
        independent = (
            rs
            | "CountLines" >> beam.Map(count_range, self._format, side)
            | "SumPerFile" >> beam.CombinePerKey(SumCountsFn())
            | "FileTotals" >> beam.Map(file_totals, self._format)
        )
        return (
            (written, independent)
            | "AllCounts" >> beam.Flatten()
            | "SumCounts" >> beam.CombineGlobally(SumCountsFn())
            | "CountsToJson" >> beam.Map(lambda c: json.dumps(c, sort_keys=True))
            | "WriteCounts" >> beam.io.WriteToText(self._counts_path, shard_name_template="")
        )
