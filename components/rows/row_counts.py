"""Counting rows without the parser: the independent side of the row ledger.

The ledger (components/rows/ledger.py) compares what each stage's parser says it read with a count
taken another way, so that a parser, a runner or a writer that loses rows cannot hide it:
- `count_csv_records`: data records of a CSV file by a quote-aware scan of its bytes (RFC 4180:
  a line break inside double quotes belongs to the field; `""` is an escaped quote), blank lines
  apart, header excluded. Written by hand because no library counts records without parsing them.
- `count_tfrecords`: records of a TFRecord file (plain or gzip) by walking the length framing
  only: no CRC check, no proto parsing; a file that ends inside a record is reported as truncated.
- `count_block_rows`: rows of a TFRecord file of blocks of rows (`transformed_examples.format:
  blocks`): each block's label values, one per row, decoded by tfx_bsl with a schema that holds
  the label alone (the other features are skipped, not decoded).
- `count_full_blocks`: rows of a file whose blocks all hold the same number of rows (the
  `transformed_examples-*` files, see contracts.manifest): its records by their framing, times
  that number, the first block decoded to check it: walking the framing costs far less than
  decoding every block's protos back.
- `count_parquet_rows`: rows of the Parquet files matching a pattern, from their footers (what is
  on disk, not what the writer said).
All stream through Beam's FileSystems (local, gs://, ...), in blocks; none imports TensorFlow.
"""
from __future__ import annotations

import gzip
import io
import struct
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator, List, Optional

import numpy as np

from components.reporting.errors import LedgerError

BLOCK = 8 << 20


@dataclass
class CsvRecordCount:
    """What `count_csv_records` found in one CSV stream."""

    data_records: int = 0  # records after the header, blank lines excluded
    blank_lines: int = 0  # lines with nothing (or only a carriage return) outside quotes
    has_header: bool = False  # the file has at least one record (its header)
    unterminated_quote: bool = False  # the file ends inside a quoted field


@dataclass
class CsvScanState:
    """Where a scan of CSV bytes stands: lines ended so far, and the open line's state."""

    records: int = 0  # lines with content ended by a newline outside quotes
    blank_lines: int = 0  # lines with nothing (or only carriage returns) ended so far
    in_quote: bool = False  # inside a quoted field
    line_has_content: bool = False  # the open (unfinished) line has bytes other than \r


def scan_csv(stream: BinaryIO, in_quote: bool = False, line_has_content: bool = False, strip_bom: bool = True) -> CsvScanState:
    """Counts the CSV lines that end inside `stream`, starting from a given state.

    A byte range of a file can start inside quotes or inside a line (components/example_gen/ranges.py).

    Vectorised per block with numpy (a Python loop over the lines is a noticeable share of
    ExampleGen's CPU): a newline ends a line when an even number of quotes precede it (counting
    from the state); a line is blank when all its bytes are carriage returns (a quote, a quoted line
    break and any other byte are content). `tests/test_row_counts.py` holds it to a line-by-line scan.

    Args:
      stream: the bytes to scan.
      in_quote: the scan starts inside a quoted field.
      line_has_content: the scan starts inside a line that already has content.
      strip_bom: skip a UTF-8 byte-order mark at the start.

    Returns:
      The lines counted and the state at the stream's end.
    """
    records = blank = 0
    first = True
    while True:
        block = stream.read(BLOCK)
        if not block:
            break
        if first:
            first = False
            if strip_bom and block.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte-order mark
                block = block[3:]
                if not block:
                    continue
        a = np.frombuffer(block, np.uint8)
        none = np.zeros(0, np.int64)
        quotes = np.flatnonzero(a == 34) if b'"' in block else none  # (`in` is a memchr: most blocks have none)
        newlines = np.flatnonzero(a == 10)
        # the line open at the block's start: inside quotes it has content (its quote)
        line_has_content = line_has_content or in_quote
        if len(quotes):
            ends = newlines[((np.searchsorted(quotes, newlines) + int(in_quote)) & 1) == 0]
        else:
            ends = newlines if not in_quote else newlines[:0]
        if len(ends):
            cr = np.flatnonzero(a == 13) if b"\r" in block else none
            starts = np.concatenate([[-1], ends[:-1]])  # the newline before each line (-1: the block's start)
            if len(cr):
                crs = np.searchsorted(cr, ends) - np.searchsorted(cr, starts, side="right")
                empty = (ends - starts - 1) == crs  # nothing but carriage returns
            else:
                empty = ends - starts == 1
            empty[0] &= not line_has_content  # the first line began before the block
            blank += int(np.count_nonzero(empty))
            records += int(len(ends) - np.count_nonzero(empty))
            tail = len(a) - int(ends[-1]) - 1
            line_has_content = tail > int(len(cr) - np.searchsorted(cr, ends[-1], side="right"))
        else:
            line_has_content = line_has_content or bool(np.count_nonzero(a != 13))
        in_quote = bool((int(in_quote) + len(quotes)) & 1)
    return CsvScanState(records, blank, in_quote, line_has_content)


def count_csv_records(stream: BinaryIO) -> CsvRecordCount:
    """Counts the records of one CSV stream by a quote-aware scan of its bytes.

    Args:
      stream: the whole file's bytes (a UTF-8 byte-order mark is skipped).

    Returns:
      The data records (header excluded; it sets `has_header`), blank lines, and whether the
      file ends inside a quoted field.
    """
    state = scan_csv(stream)
    records = state.records + (1 if state.line_has_content else 0)  # a last record without a newline
    return CsvRecordCount(max(0, records - 1), state.blank_lines, records > 0, state.in_quote)


def open_maybe_gzip(path: str) -> BinaryIO:
    """Opens a file on any Beam filesystem, inflating it when it is gzip (by extension or magic number).

    Args:
      path: the file's path (local, gs://, ...).

    Returns:
      A binary stream of the file's (inflated) bytes; the caller closes it.
    """
    # lazy: Beam's file systems only for paths; the counters read open files without Beam
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    head = raw.read(2)
    raw.close()
    fh = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    if head == b"\x1f\x8b" or path.endswith(".gz"):
        return gzip.GzipFile(fileobj=fh)  # type: ignore[return-value]
    return fh


@dataclass
class TFRecordCount:
    """What `count_tfrecords` found in one TFRecord stream."""

    records: int = 0
    truncated: bool = False  # the file ends inside a record's framing or payload


class _EndsInsideRecord(Exception):
    pass


def _framed(stream: BinaryIO, keep: bool) -> Iterator[Optional[bytes]]:
    """Walks a TFRecord stream's framing (8-byte length, 4-byte length CRC, payload, 4-byte CRC; no
    CRC check): yields each payload (`keep`) or None (skipped unread into memory). Both read in
    blocks, so a corrupt length field costs at most the file's bytes. Raises _EndsInsideRecord
    when the stream ends inside a record."""
    buffered = io.BufferedReader(stream, BLOCK) if not isinstance(stream, io.BufferedReader) else stream
    while True:
        header = buffered.read(12)
        if not header:
            return
        if len(header) < 12:
            raise _EndsInsideRecord()
        (length,) = struct.unpack("<Q", header[:8])
        parts = [] if keep else None
        if _skip(buffered, length + 4, parts) < length + 4:
            raise _EndsInsideRecord()
        yield b"".join(parts)[:length] if keep else None


def count_tfrecords(stream: BinaryIO) -> TFRecordCount:
    """Counts the records of one TFRecord stream by its framing alone (no CRC check, no parsing).

    Args:
      stream: the file's (inflated) bytes.

    Returns:
      The records, and whether the stream ends inside one (`truncated`).
    """
    records = 0
    try:
        for _ in _framed(stream, keep=False):
            records += 1
    except _EndsInsideRecord:
        return TFRecordCount(records, truncated=True)
    return TFRecordCount(records)


def tfrecord_payloads(stream: BinaryIO) -> Iterator[bytes]:
    """Yields the records of one TFRecord stream, in order (no CRC check).

    Args:
      stream: the file's (inflated) bytes.

    Yields:
      Each record's payload.

    Raises:
      ValueError: the stream ends inside a record.
    """
    try:
        yield from _framed(stream, keep=True)
    except _EndsInsideRecord:
        raise ValueError("the stream ends inside a record") from None


@dataclass
class BlockRowCount:
    """What `count_block_rows` found in one TFRecord stream of blocks."""

    rows: int = 0
    blocks: int = 0
    truncated: bool = False  # the file ends inside a record's framing or payload


def count_block_rows(stream: BinaryIO, label: str, chunk: int = 1024) -> BlockRowCount:
    """Counts the rows of one TFRecord stream of blocks by decoding every block's label values.

    Args:
      stream: the file's (inflated) bytes.
      label: the label feature, one value per row.
      chunk: how many blocks to decode at once.

    Returns:
      The rows, the blocks, and whether the stream ends inside a record (`truncated`).
    """
    rows_of = _block_rows_counter(label)
    out = BlockRowCount()
    pending: List[bytes] = []

    def add(records: List[bytes]) -> None:
        out.rows += rows_of(records)
        out.blocks += len(records)

    try:
        for record in tfrecord_payloads(stream):
            pending.append(record)
            if len(pending) == chunk:
                add(pending)
                pending = []
    except ValueError:
        out.truncated = True
    if pending:
        add(pending)
    return out


def _block_rows_counter(label: str) -> Callable[[List[bytes]], int]:
    """serialized blocks -> their rows: their `label` values (one per row), decoded by tfx_bsl."""
    # lazy: tfx_bsl and pyarrow only for block files; the record counters run without them
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.coders import example_coder
    import pyarrow.compute as pc

    schema = schema_pb2.Schema()
    schema.feature.add(name=label, type=schema_pb2.FLOAT)
    decoder = example_coder.ExamplesToRecordBatchDecoder(schema.SerializeToString())

    def rows(records: List[bytes]) -> int:
        labels = decoder.DecodeBatch(records).column(0)
        return int(pc.sum(pc.list_value_length(labels)).as_py() or 0)

    return rows


@dataclass
class FullBlockCount:
    """What `count_full_blocks` found in one TFRecord stream of equal blocks."""

    blocks: int = 0
    first_block_rows: Optional[int] = None  # rows of the first block (None: no block)
    truncated: bool = False  # the file ends inside a record's framing or payload


def count_full_blocks(stream: BinaryIO, label: str) -> FullBlockCount:
    """Counts the blocks of one TFRecord stream by their framing, decoding only the first block's rows.

    Args:
      stream: the file's (inflated) bytes.
      label: the label feature, one value per row.

    Returns:
      The blocks, the rows of the first block (None without a block), and whether the stream ends
      inside a record (`truncated`).
    """
    out = FullBlockCount()
    buffered = io.BufferedReader(stream, BLOCK)  # one buffer for both walks below
    try:
        first = next(_framed(buffered, keep=True), None)
        if first is None:
            return out
        out.blocks, out.first_block_rows = 1, _block_rows_counter(label)([first])
        for _ in _framed(buffered, keep=False):  # the same stream, after the first record
            out.blocks += 1
    except _EndsInsideRecord:
        out.truncated = True
    return out


def _skip(stream: BinaryIO, n: int, parts: Optional[List[bytes]] = None) -> int:
    """Reads past up to `n` bytes in blocks (appending them to `parts` when given); returns how many."""
    done = 0
    while done < n:
        chunk = stream.read(min(BLOCK, n - done))
        if not chunk:
            break
        done += len(chunk)
        if parts is not None:
            parts.append(chunk)
    return done


def count_file(path: str, counter: Callable[[BinaryIO], object]):
    """Runs a counter over one file's bytes (inflated when gzip).

    Args:
      path: the file's path, on any Beam filesystem.
      counter: one of the stream counters above.

    Returns:
      What the counter returns.
    """
    with open_maybe_gzip(path) as fh:
        return counter(fh)


def count_written_file(path: str, stage: str, block_label: Optional[str] = None,
                       block_rows: Optional[int] = None) -> int:
    """Counts the rows of one written TFRecord file, read back from the file itself.

    Args:
      path: the file.
      stage: the writing stage's name, used in the message.
      block_label: for a file of blocks, the label feature whose values count the rows
        (`count_block_rows`); None counts records (`count_tfrecords`).
      block_rows: with `block_label`, the rows every block holds: only the framing is walked
        and the first block decoded (`count_full_blocks`).

    Returns:
      The file's rows.

    Raises:
      LedgerError: the file ends inside a record, or its first block holds another number of
        rows than `block_rows`.
    """
    if block_label is None:
        c = count_file(path, count_tfrecords)
        n = c.records
    elif block_rows is None:
        c = count_file(path, lambda fh: count_block_rows(fh, block_label))
        n = c.rows
    else:
        c = count_file(path, lambda fh: count_full_blocks(fh, block_label))
        n = c.blocks * block_rows
    if c.truncated:
        raise LedgerError(f"{stage}: output file {path} ends inside a record")
    if isinstance(c, FullBlockCount) and c.first_block_rows not in (None, block_rows):
        raise LedgerError(f"{stage}: output file {path} should hold blocks of {block_rows} rows each, "
                          f"but its first block holds {c.first_block_rows}")
    return n


def count_parquet_rows(pattern: str) -> int:
    """Counts the rows in the Parquet files matching a pattern, from their footers.

    Args:
      pattern: a file pattern on any Beam filesystem.

    Returns:
      The total rows.
    """
    # lazy: Beam's file systems and pyarrow only for paths; the counters read open files without them
    from apache_beam.io.filesystems import FileSystems
    import pyarrow.parquet as pq

    total = 0
    for m in FileSystems.match([pattern])[0].metadata_list:
        with FileSystems.open(m.path) as fh:
            total += pq.ParquetFile(fh).metadata.num_rows
    return total


def files_in(directory: str) -> List[str]:
    """Lists the files directly in a directory, on any Beam filesystem (local, GCS, ...).

    Args:
      directory: the directory.

    Returns:
      The files' paths; none when the directory does not exist.
    """
    # lazy: Beam's file systems only for paths; the counters read open files without Beam
    from apache_beam.io.filesystems import FileSystems

    return [m.path for m in FileSystems.match([directory.rstrip("/") + "/*"])[0].metadata_list]
