"""The records of one CSV byte range as Arrow RecordBatches: the one CSV reader of the product.

ExampleGen (`beam_io.ReadAndWriteRange`) and the standalone preprocessing CLI
(`components.embedding_preprocess.csv_input`) both read CSV through `read_csv_range`: the header by
`header.read_csv_header` (quoted names, CRLF, a byte-order mark), the records a range owns by
`ranges.read_owned_records` (quoted line breaks across range boundaries), and each record parsed
by pyarrow's CSV reader with `newlines_in_values`, every column as binary text. A compressed file
(`ranges.is_compressed`) is one range, streamed from its start. Rows with too few or too many
fields are skipped by pyarrow's invalid-row handler and counted by reason (`MalformedRows`).

Very wide rows never reach pyarrow: its reader (pyarrow 10) crashes the process (SIGSEGV) on a
record of about 327,000 fields or more. Any row with more fields than the header is malformed
(`too_many_fields`) anyway, so `blank_wide_records` finds the records longer than
`2 * WIDE_WINDOW` bytes (a record of more than 131,073 fields is one of them), counts their fields
(separators outside quotes) and, for those wider than the header, counts them as `too_many_fields`
and hands pyarrow their line breaks only (blank lines, which it skips). The scan costs one
`bytes.find` per 64 KiB window on data without quotes, and one quote count per window on data with
quotes (about 8% of parsing); records up to 128 KiB are left to pyarrow's invalid-row handler.

Very long records never reach pyarrow either: a record must fit in one of its blocks
(`READ_BLOCK_BYTES`), and one that does not (a 50 MB free-text cell) failed the whole run with
"straddling object straddles two block boundaries" from a worker. A record longer than
`MAX_RECORD_BYTES` is counted as malformed (`record_too_long`, its `file:line` and size among the
ledger's examples) and cut out the same way.
"""
from __future__ import annotations

import io
from collections import Counter
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa
from pyarrow import csv

from components.example_gen import ranges

READ_BLOCK_BYTES = 16 << 20  # pyarrow CSV block: one RecordBatch per block
MAX_RECORD_BYTES = 4 << 20  # a longer record is malformed (`record_too_long`): it must fit a block
WIDE_WINDOW = 1 << 16  # records longer than two windows have their fields counted before pyarrow reads them
STREAM_BLOCK = 1 << 20  # a compressed file's decompressed bytes are checked in blocks of whole records


class MalformedRows:
    """The rows of one range that pyarrow skipped for their number of fields.

    Attributes:
      counts: reason (`too_few_fields`, `too_many_fields`) -> rows skipped for it.
      examples: reason -> the first `max_examples` locations, as `path:line (n fields, header has m)`
        (a compressed file: `path: record k (...)`), filled once the range is read.
    """

    def __init__(self, max_examples: int):
        self.counts: Counter = Counter()
        self.examples: Dict[str, List[str]] = {}
        self._max_examples = max_examples
        self._kept: List[Tuple[str, int, int, int]] = []  # (reason, record number, fields, expected)

    @property
    def total(self) -> int:
        """Rows skipped for any reason."""
        return sum(self.counts.values())

    def skip(self, row) -> str:
        """pyarrow's invalid-row handler: counts the row by reason and tells pyarrow to skip it.

        Args:
          row: pyarrow's `InvalidRow` (`actual_columns`, `expected_columns`, `number`).

        Returns:
          "skip".
        """
        reason = "too_few_fields" if row.actual_columns < row.expected_columns else "too_many_fields"
        self.counts[reason] += 1
        if sum(1 for kept in self._kept if kept[0] == reason) < self._max_examples:
            self._kept.append((reason, row.number, row.actual_columns, row.expected_columns))
        return "skip"

    def cut(self, where: str, reason: str, detail: str) -> None:
        """Counts a record cut out before parsing (`blank_wide_records`).

        Args:
          where: its location, `path:line`.
          reason: `too_many_fields` or `record_too_long`.
          detail: what was wrong, e.g. `400,000 fields, header has 5`.
        """
        self.counts[reason] += 1
        kept = self.examples.setdefault(f"malformed/{reason}", [])
        if len(kept) < self._max_examples:
            kept.append(f"{where} ({detail})")

    def locate(self, path: str, lines: Optional[Dict[int, int]]) -> None:
        """Names the kept rows in `examples`: by file line (`lines`: pyarrow's record number -> line
        in the file), or by record number when `lines` is None (a streamed compressed file)."""
        for reason, number, got, want in self._kept:
            where = f"{path}: record {number}" if lines is None else f"{path}:{lines.get(number, '?')}"
            kept = self.examples.setdefault(f"malformed/{reason}", [])
            if len(kept) < self._max_examples:
                kept.append(f"{where} ({got} fields, header has {want})")

    def numbers(self) -> List[int]:
        """pyarrow's record numbers of the kept rows."""
        return [kept[1] for kept in self._kept]


class _RecordEnds:
    """Record-ending newlines of `data` (which starts at a record's start): newlines with an even
    number of quotes before them, found window by window from running quote counts."""

    def __init__(self, data: bytes):
        self.data = data
        self.quoted = data.find(b'"') >= 0
        self._windows = -(-len(data) // WIDE_WINDOW)
        self._quotes_before: Optional[np.ndarray] = None  # quotes before each window's start
        if self.quoted:
            counts = [data.count(b'"', k * WIDE_WINDOW, (k + 1) * WIDE_WINDOW) for k in range(self._windows)]
            self._quotes_before = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])

    def in_window(self, k: int) -> np.ndarray:
        """The record ends inside window `k`, as offsets in `data`."""
        s, e = k * WIDE_WINDOW, min((k + 1) * WIDE_WINDOW, len(self.data))
        window = np.frombuffer(self.data, np.uint8, e - s, s)
        newlines = np.flatnonzero(window == 10)
        if self.quoted and len(newlines):
            quotes = np.flatnonzero(window == 34)
            newlines = newlines[((self._quotes_before[k] + np.searchsorted(quotes, newlines)) & 1) == 0]
        return newlines + s

    def window_has_end(self, k: int) -> bool:
        """Whether window `k` holds a record end (its first newline, mostly, tells)."""
        s, e = k * WIDE_WINDOW, min((k + 1) * WIDE_WINDOW, len(self.data))
        first = self.data.find(b"\n", s, e)
        if first < 0:
            return False
        if not self.quoted or (self._quotes_before[k] + self.data.count(b'"', s, first)) % 2 == 0:
            return True
        return len(self.in_window(k)) > 0  # the first newline is inside quotes: look at them all

    def long_records(self) -> Iterator[Tuple[int, int]]:
        """(start, end) of every record that fills a whole window: every record longer than two
        windows, and some longer than one; `end` is its newline's offset (or the data's end)."""
        k = 0
        while k < self._windows:
            if self.window_has_end(k) or (k + 1) * WIDE_WINDOW > len(self.data):
                k += 1
                continue
            first = k  # windows first..k-1 hold no record end: one record covers them
            while k < self._windows and not self.window_has_end(k):
                k += 1
            start = 0
            for j in range(first - 1, -1, -1):
                ends = self.in_window(j)
                if len(ends):
                    start = int(ends[-1]) + 1
                    break
            end = len(self.data)
            for j in range(k, self._windows):
                ends = self.in_window(j)
                if len(ends):
                    end = int(ends[0])
                    break
            yield start, end
            k = max(k, -(-end // WIDE_WINDOW))

    def fields(self, start: int, end: int) -> int:
        """The fields of the record [start, end): its separators outside quotes, plus one."""
        if not self.quoted or self.data.find(b'"', start, end) < 0:
            return self.data.count(b",", start, end) + 1
        a = np.frombuffer(self.data, np.uint8, end - start, start)
        commas, quotes = np.flatnonzero(a == 44), np.flatnonzero(a == 34)
        return int(np.count_nonzero((np.searchsorted(quotes, commas) & 1) == 0)) + 1


def _why_cut(ends: "_RecordEnds", start: int, end: int, width: int) -> Optional[Tuple[str, str]]:
    """(reason, detail) when the record [start, end) is cut out before parsing, else None."""
    n = ends.fields(start, end)
    if n > width:
        return "too_many_fields", f"{n:,} fields, header has {width}"
    if end - start > MAX_RECORD_BYTES:
        return "record_too_long", f"{(end - start) / (1 << 20):,.1f} MiB, more than {MAX_RECORD_BYTES / (1 << 20):g} MiB"
    return None


def blank_wide_records(data: bytes, width: int) -> Tuple[bytes, List[Tuple[int, str, str]]]:
    """Cuts the records wider than the header, or longer than MAX_RECORD_BYTES, out of `data` before
    pyarrow parses it (see the module docstring): each becomes its own line breaks, blank lines that
    pyarrow skips and that keep every later line's number.

    Args:
      data: whole CSV records, from a record's start (a range's owned records, or a block of a
        streamed file).
      width: the header's number of fields.

    Returns:
      (the data to parse, [(offset in `data`, reason, detail) of each record cut out]); `data`
      itself when nothing was cut. Only records longer than `WIDE_WINDOW` bytes are looked at.
    """
    if len(data) < WIDE_WINDOW:
        return data, []
    ends = _RecordEnds(data)
    cuts = [(start, end, why) for start, end in ends.long_records() if (why := _why_cut(ends, start, end, width))]
    if not cuts:
        return data, []
    parts, at = [], 0
    for start, end, _ in cuts:
        parts += [data[at:start], b"\n" * data.count(b"\n", start, end)]
        at = end
    parts.append(data[at:])
    return b"".join(parts), [(start, *why) for start, _, why in cuts]


class _WideRecordFilter(io.RawIOBase):
    """A streamed CSV file (decompressed) with its wide records blanked (`blank_wide_records`),
    passed on in blocks of whole records; counts each record cut in `malformed`."""

    def __init__(self, fh, path: str, width: int, malformed: "MalformedRows"):
        self._fh, self._path, self._width, self._malformed = fh, path, width, malformed
        self._parts: List[bytes] = []  # read, not passed on yet: from a record's start, no record end in them
        self._quotes = 0  # quotes in `_parts`
        self._out, self._at = b"", 0  # checked bytes, passed on from `_at`
        self._lines = 0  # line breaks passed on
        self._eof = False

    def readable(self) -> bool:
        return True

    def _last_record_end(self, block: bytes) -> int:
        """The offset in `block` of its last record-ending newline (-1: none), `_parts` before it."""
        quotes = self._quotes + block.count(b'"')
        end = len(block)
        while True:
            nl = block.rfind(b"\n", 0, end)
            if nl < 0:
                return -1
            quotes -= block.count(b'"', nl, end)
            if quotes % 2 == 0:
                return nl
            end = nl

    def _emit(self, chunk: bytes) -> None:
        kept, cuts = blank_wide_records(chunk, self._width)
        for offset, reason, detail in cuts:
            line = self._lines + chunk.count(b"\n", 0, offset) + 1
            self._malformed.cut(f"{self._path}:{line}", reason, detail)
        self._lines += chunk.count(b"\n")
        self._out, self._at = kept, 0

    def _fill(self) -> None:
        while self._at >= len(self._out) and not (self._eof and not self._parts):
            block = b"" if self._eof else self._fh.read(STREAM_BLOCK)
            if not block:  # the end: what is left is the last record (without a newline)
                self._eof = True
                chunk, self._parts = b"".join(self._parts), []
                self._emit(chunk)
                continue
            cut = self._last_record_end(block)
            if cut < 0:  # a long record goes on: keep it whole (no copy until it ends)
                self._parts.append(block)
                self._quotes += block.count(b'"')
                continue
            chunk = b"".join(self._parts + [block[: cut + 1]])
            self._parts, self._quotes = [block[cut + 1 :]], block.count(b'"', cut + 1)
            self._emit(chunk)

    def readinto(self, buffer) -> int:
        self._fill()
        n = min(len(buffer), len(self._out) - self._at)
        buffer[:n] = memoryview(self._out)[self._at : self._at + n]
        self._at += n
        return n


def _options(header: List[str], malformed: MalformedRows) -> Tuple[csv.ParseOptions, csv.ConvertOptions]:
    """Every column as binary text (empty cells stay empty, not null); quoted line breaks kept."""
    convert = csv.ConvertOptions(
        column_types={c: pa.binary() for c in header}, strings_can_be_null=False, quoted_strings_can_be_null=False
    )
    return csv.ParseOptions(newlines_in_values=True, invalid_row_handler=malformed.skip), convert


def _read_whole_file(r: ranges.ByteRange, header: List[str], malformed: MalformedRows) -> Iterator[pa.RecordBatch]:
    """A compressed file, streamed from its start; pyarrow reads its header line itself."""
    parse, convert = _options(header, malformed)
    with ranges.open_decompressed(r.path) as raw:
        fh = io.BufferedReader(_WideRecordFilter(raw, r.path, len(header), malformed), buffer_size=STREAM_BLOCK)
        reader = csv.open_csv(fh, read_options=csv.ReadOptions(use_threads=False, block_size=READ_BLOCK_BYTES),
                              parse_options=parse, convert_options=convert)
        for rb in reader:
            if rb.num_rows:
                yield rb
    malformed.locate(r.path, None)


def read_csv_range(
    r: ranges.ByteRange, header: List[str], before: Dict[Tuple[str, int], Tuple[int, int]], malformed: MalformedRows
) -> Iterator[pa.RecordBatch]:
    """The records that start inside a byte range, parsed.

    Args:
      r: the range (`ranges.plan_ranges`); a whole compressed file when `r.whole_file`.
      header: the file's column names (`header.read_csv_header`; not None: an empty file has no rows).
      before: (path, start) -> (quotes, newlines) in the file before each range (`ranges.before_each_range`).
      malformed: collects the rows skipped for their number of fields, located once the range is read.

    Yields:
      RecordBatches of the range's well-formed records in file order, one per pyarrow block, every
      column of `header` as binary.
    """
    if r.whole_file:
        yield from _read_whole_file(r, header, malformed)
        return
    q, n = before.get(r.key(), (0, 0))
    owned = ranges.read_owned_records(r, q, n)
    if not owned.data or owned.data.isspace():  # (no strip(): that copies the range's bytes)
        return
    data, cuts = blank_wide_records(owned.data, len(header))
    for offset, reason, detail in cuts:
        line = owned.first_line + owned.data.count(b"\n", 0, offset)
        malformed.cut(f"{r.path}:{line}", reason, detail)
    parse, convert = _options(header, malformed)
    reader = csv.open_csv(
        pa.BufferReader(data),
        read_options=csv.ReadOptions(column_names=header, use_threads=False, block_size=READ_BLOCK_BYTES),
        parse_options=parse, convert_options=convert,
    )
    for rb in reader:
        if rb.num_rows:
            yield rb
    malformed.locate(r.path, owned.record_lines(malformed.numbers()))
