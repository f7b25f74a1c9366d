"""Byte ranges of CSV files, so that one big file is read by every worker.

A file is cut into ranges of about `range_bytes` (a compressed file cannot be entered in the
middle: it is one range). A range owns the records that *start* inside it; it reads on past its
end to finish its last record, and skips the record it begins inside.

Quoted line breaks: a line break inside double quotes belongs to its field (RFC 4180; `""` is an
escaped quote, so it changes nothing), so whether a newline ends a record depends on how many
quotes come before it in the whole file. Reading therefore takes two passes over the bytes:
1. `count_quotes`: every range counts its `"` bytes (C speed, `bytes.count`), in parallel;
2. the prefix sums of those counts give each range the number of quotes before its start
   (`quotes_before`), and `read_owned_records` finds its record boundaries: the newlines with an
   even number of quotes before them (numpy over the block).
A quote inside an unquoted field (`ab"c`, which RFC 4180 does not allow) throws the count off; the
row ledger then finds the parser's rows and the independent count apart and the run stops.

The independent count (`count_range_lines`) counts the records and blank lines whose line break
lies in the range's own bytes [start, end), not the extended block the parser reads, so summed over
a file's ranges it does not depend on where the boundaries were drawn; it gives the same result as
`components.rows.row_counts.count_csv_records` on the whole file.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from components.data_io.checksums import BLOCK, block_digests
from components.data_io.streams import RawReader
from components.rows import row_counts

SCAN_BLOCK = 8 << 20
# What Beam's FileSystems decompress by name (CompressionTypes.detect_compression_type); a file
# named otherwise is read as it is (input_checks refuses compressed bytes behind a plain name).
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".zst", ".zstd", ".deflate", ".xz", ".lzma")
TO_END = -1  # a range's end when it runs to the end of the file (compressed files)
QuoteCount = Tuple[Tuple[str, int], Tuple[int, int]]  # ((path, start), (`"` bytes, newlines))
BlockDigest = Tuple[str, int, str]  # (path, block index, SHA-256 hex)


@dataclass(frozen=True)
class ByteRange:
    path: str
    start: int
    end: int  # exclusive; TO_END for a whole compressed file
    index: int  # this range's number among all ranges of the run (output file names)
    last: bool  # the last range of its file

    @property
    def whole_file(self) -> bool:
        return self.end == TO_END

    def key(self) -> Tuple[str, int]:
        return (self.path, self.start)


def is_compressed(path: str) -> bool:
    return path.lower().endswith(COMPRESSED_SUFFIXES)


def plan_ranges(files: Iterable[Tuple[str, int]], range_bytes: int, splittable: bool = True) -> List[ByteRange]:
    """(path, size) of every input file -> its ranges, numbered in file order.

    `splittable=False` (TFRecord input, whose records are not found by scanning) makes every file
    one range; so does compression."""
    if range_bytes < 1:
        raise ValueError(f"range_bytes must be positive, got {range_bytes}")
    cuts: List[Tuple[str, int, int, bool]] = []
    for path, size in sorted(files):
        if not splittable or is_compressed(path) or size <= range_bytes:
            cuts.append((path, 0, TO_END if (not splittable or is_compressed(path)) else size, True))
            continue
        starts = list(range(0, size, range_bytes))
        for k, s in enumerate(starts):
            cuts.append((path, s, min(s + range_bytes, size), k == len(starts) - 1))
    return [ByteRange(p, s, e, i, last) for i, (p, s, e, last) in enumerate(cuts)]


def _open(path: str):
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def open_decompressed(path: str) -> io.BufferedReader:
    """Opens a file for reading, decompressed by its extension (`.gz`, `.bz2`, ... as Beam's
    FileSystems detect them).

    Args:
      path: a local or remote path.

    Returns:
      A buffered binary stream of the file's decompressed bytes; close it (or use `with`).
    """
    return io.BufferedReader(RawReader(FileSystems.open(path)), buffer_size=1 << 20)


def count_quotes(r: ByteRange) -> QuoteCount:
    """((path, start), (`"` bytes, newlines)) in [start, end) of an uncompressed range."""
    counted = _QuoteCounter()
    if not r.whole_file:
        with _open(r.path) as fh:
            fh.seek(r.start)
            left = r.end - r.start
            while left > 0:
                block = fh.read(min(SCAN_BLOCK, left))
                if not block:
                    break
                counted(block)
                left -= len(block)
    return r.key(), counted.counts()


class _QuoteCounter:
    """The `"` bytes and newlines of the pieces it is called with (count_quotes and scan_range)."""

    def __init__(self):
        self.quotes = self.newlines = 0

    def __call__(self, piece: bytes) -> None:
        self.quotes += piece.count(b'"')
        self.newlines += piece.count(b"\n")

    def counts(self) -> Tuple[int, int]:
        return self.quotes, self.newlines


def range_blocks(r: ByteRange, block: Optional[int] = None) -> List[BlockDigest]:
    """(path, block index, SHA-256 hex) of the file's blocks that start in this range
    (checksums.block_digests: every byte once over all ranges, whatever the cut); a whole
    (compressed, or TFRecord) file's every block, of its raw bytes. `block`: None, BLOCK."""
    start, end = (0, None) if r.whole_file else (r.start, r.end)
    return [(r.path, k, h) for k, h in block_digests(r.path, start, end, _open, block or BLOCK)]


def scan_range(r: ByteRange, block: Optional[int] = None) -> Tuple[QuoteCount, List[BlockDigest]]:
    """`count_quotes(r)` and `range_blocks(r)` in one read of the range's bytes
    (checksums.block_digests, counting the range's own bytes as it hashes its blocks), instead of
    a pass for each. `block`: None, BLOCK (checksums'; smaller in tests)."""
    if r.whole_file:
        return count_quotes(r), range_blocks(r, block)
    counted = _QuoteCounter()
    digests = block_digests(r.path, r.start, r.end, _open, block or BLOCK, counted)
    return (r.key(), counted.counts()), [(r.path, k, h) for k, h in digests]


def before_each_range(counts: Iterable[Tuple[Tuple[str, int], Tuple[int, int]]]) -> Dict[Tuple[str, int], Tuple[int, int]]:
    """(path, start) -> (quotes, newlines) in the file before that start, from every range's own count."""
    by_file: Dict[str, List[Tuple[int, int, int]]] = {}
    for (path, start), (q, n) in counts:
        by_file.setdefault(path, []).append((start, q, n))
    out: Dict[Tuple[str, int], Tuple[int, int]] = {}
    for path, parts in by_file.items():
        q_seen = n_seen = 0
        for start, q, n in sorted(parts):
            out[(path, start)] = (q_seen, n_seen)
            q_seen += q
            n_seen += n
    return out


def record_ends(chunk: bytes, quotes_before_chunk: int) -> np.ndarray:
    """Offsets in `chunk` of the newlines that end a record (an even number of quotes before them)."""
    a = np.frombuffer(chunk, np.uint8)
    newlines = np.flatnonzero(a == 10)
    if not len(newlines):
        return newlines
    quotes = np.flatnonzero(a == 34)
    parity = (quotes_before_chunk + np.searchsorted(quotes, newlines)) & 1
    return newlines[parity == 0]


def _blank(line: bytes) -> bool:
    return not line.strip(b"\r")


@dataclass
class OwnedRecords:
    """The whole records that start inside a range (no header), and where they start in the file."""

    data: bytes
    first_line: int  # 1-based line number in the file of the first byte of `data`

    def record_lines(self, numbers: Iterable[int]) -> Dict[int, int]:
        """pyarrow's 1-based record numbers within `data` (blank lines not counted) -> file line numbers."""
        wanted = set(numbers)
        if not wanted:
            return {}
        ends = record_ends(self.data, 0)
        starts = np.concatenate([[0], ends + 1])
        out: Dict[int, int] = {}
        k = 0
        for i, s in enumerate(starts):
            e = int(ends[i]) if i < len(ends) else len(self.data)
            if s >= len(self.data) or _blank(self.data[int(s):e]):
                continue
            k += 1
            if k in wanted:
                out[k] = self.first_line + self.data[: int(s)].count(b"\n")
                if len(out) == len(wanted):
                    break
        return out


def read_owned_records(r: ByteRange, quotes_before_start: int, newlines_before_start: int = 0) -> OwnedRecords:
    """The records that start inside `r`, as one block of bytes, the header skipped.

    A record starts after a record-ending newline; the file's first line with content is its
    header. `newlines_before_start` (from `before_each_range`) only numbers lines for messages."""
    if r.whole_file:
        raise ValueError("read_owned_records: a whole compressed file is streamed, not cut")
    with _open(r.path) as fh:
        base = max(r.start - 1, 0)  # from the byte before the range: a record starting at `start` follows it
        fh.seek(base)
        chunk = fh.read(r.end - base)
        first_byte = chunk[:1] if r.start > 0 else b""
        q = quotes_before_start - (1 if first_byte == b'"' else 0)  # quotes before `base`
        newlines_before_base = newlines_before_start - (1 if first_byte == b"\n" else 0)
        data_start = _data_start(fh)  # nothing before the header's end is a row, in any range
        if data_start is None:
            return OwnedRecords(b"", 0)
        fh.seek(base + len(chunk))  # where the range's bytes end: reading on finishes its last record
        first: Optional[int] = None  # offset in chunk where the first owned record starts
        if r.start == 0:
            first = data_start
        else:
            e = _first_boundary(chunk, q, 0)
            if e is not None:
                first = max(e + 1, data_start - base)
        limit = r.end - base  # an owned record starts before this offset
        if first is None or first >= limit:
            return OwnedRecords(b"", 0)
        end, tail = _to_record_end(fh, chunk, _first_boundary(chunk, q, max(limit - 1, 0)), q, limit)
        data = chunk[first:end] + tail if tail else chunk[first:end]  # one copy of the range's bytes
        return OwnedRecords(data, newlines_before_base + chunk[:first].count(b"\n") + 1)


def _data_start(fh) -> Optional[int]:
    """Where the first data record starts: after the file's first line with content (its header);
    None when the header is the last line (or the file holds blank lines only)."""
    fh.seek(0)
    head = b""
    while True:
        block = fh.read(1 << 16)
        if not block:
            return None
        head += block
        prev = 0
        for e in record_ends(head, 0):
            if not _blank(head[prev : int(e)]):
                return int(e) + 1
            prev = int(e) + 1


def _first_boundary(chunk: bytes, quotes_before_chunk: int, at: int) -> Optional[int]:
    """The offset of the first record-ending newline at or after `at` in `chunk` (None: none).
    Scans windows growing from `at` instead of the whole chunk: the owned records' bounds are the
    range's first record end and the one at its end, and finding every newline of a 64 MB range
    (with its quote parity) cost more than parsing's share of the range."""
    q = quotes_before_chunk + chunk.count(b'"', 0, at)
    step = 1 << 16
    while at < len(chunk):
        window = chunk[at : at + step]
        found = record_ends(window, q)
        if len(found):
            return at + int(found[0])
        q += window.count(b'"')
        at += len(window)
        step *= 4
    return None


def _to_record_end(fh, chunk: bytes, end_at_limit: Optional[int], q: int, limit: int) -> Tuple[int, bytes]:
    """Where the last record that starts before `limit` ends: the first record-ending newline at
    offset >= limit - 1 (`end_at_limit`, when `chunk` holds it), or the end of the file. Returns
    (end offset in `chunk`, the bytes read past `chunk` up to that end), so the caller copies the
    range's bytes once."""
    if end_at_limit is not None:
        return end_at_limit + 1, b""
    parts = []
    q_seen = q + chunk.count(b'"')
    while True:
        more = fh.read(1 << 20)
        if not more:
            return len(chunk), b"".join(parts)
        found = record_ends(more, q_seen)
        if len(found):
            parts.append(more[: int(found[0]) + 1])
            return len(chunk), b"".join(parts)
        parts.append(more)
        q_seen += more.count(b'"')


def line_has_content_before(r: ByteRange, quotes_before_start: int) -> bool:
    """Whether the line that is open at `r.start` already has content (anything but carriage
    returns since the last record-ending newline); False at the start of a file."""
    if r.start == 0:
        return False
    with _open(r.path) as fh:
        pos = r.start
        step = 64
        while pos > 0:
            lo = max(0, pos - step)
            fh.seek(lo)
            window = fh.read(pos - lo)
            for k in range(len(window) - 1, -1, -1):
                b = window[k]
                if b == 13:  # "\r" is not content
                    continue
                if b == 10:  # a newline; only carriage returns follow it: inside quotes it is content
                    return quotes_before_start % 2 == 1
                return True
            pos = lo
            step *= 4
    return False


def count_range_lines(r: ByteRange, quotes_before_start: int) -> Dict[str, int]:
    """Records and blank lines whose record-ending newline lies in [start, end) of `r`, counted by
    `row_counts.scan_csv` from the range's state; the last range also counts a final record
    without a newline, the header (`input/headers`) and a file that ends inside quotes."""
    in_quote = quotes_before_start % 2 == 1
    has_content = line_has_content_before(r, quotes_before_start)
    with _open(r.path) as fh:
        fh.seek(r.start)
        stream = _Limited(fh, r.end - r.start)
        state = row_counts.scan_csv(stream, in_quote, has_content, strip_bom=r.start == 0)
    records, blank = state.records, state.blank_lines
    out = {"input/lines": records, "input/blank_lines": blank}
    if r.last:
        if state.line_has_content:
            out["input/lines"] += 1
        if state.in_quote:
            out["input/files_ending_inside_quotes"] = 1
    return out


class _Limited(io.RawIOBase):
    """At most `n` bytes of a stream."""

    def __init__(self, fh, n: int):
        self._fh, self._left = fh, n

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        want = self._left if size is None or size < 0 else min(size, self._left)
        data = self._fh.read(want)
        self._left -= len(data)
        return data
