"""The records of one CSV byte range as Arrow RecordBatches: the one CSV reader of the product.

ExampleGen (`beam_io.ReadAndWriteRange`) and the standalone preprocessing CLI
(`components.embedding_preprocess.csv_input`) both read CSV through `read_csv_range`: the header by
`header.read_csv_header` (quoted names, CRLF, a byte-order mark), the records a range owns by
`ranges.read_owned_records` (quoted line breaks across range boundaries), and each record parsed
by pyarrow's CSV reader with `newlines_in_values`, every column as binary text. A compressed file
(`ranges.is_compressed`) is one range, streamed from its start. Rows with too few or too many
fields are skipped by pyarrow's invalid-row handler and counted by reason (`MalformedRows`).
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, Iterator, List, Optional, Tuple

import pyarrow as pa
from pyarrow import csv

from components.example_gen import ranges

READ_BLOCK_BYTES = 16 << 20  # pyarrow CSV block: one RecordBatch per block


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

    def locate(self, path: str, lines: Optional[Dict[int, int]]) -> None:
        """Names the kept rows in `examples`: by file line (`lines`: pyarrow's record number -> line
        in the file), or by record number when `lines` is None (a streamed compressed file)."""
        for reason, number, got, want in self._kept:
            where = f"{path}: record {number}" if lines is None else f"{path}:{lines.get(number, '?')}"
            self.examples.setdefault(f"malformed/{reason}", []).append(f"{where} ({got} fields, header has {want})")

    def numbers(self) -> List[int]:
        """pyarrow's record numbers of the kept rows."""
        return [kept[1] for kept in self._kept]


def _options(header: List[str], malformed: MalformedRows) -> Tuple[csv.ParseOptions, csv.ConvertOptions]:
    """Every column as binary text (empty cells stay empty, not null); quoted line breaks kept."""
    convert = csv.ConvertOptions(
        column_types={c: pa.binary() for c in header}, strings_can_be_null=False, quoted_strings_can_be_null=False
    )
    return csv.ParseOptions(newlines_in_values=True, invalid_row_handler=malformed.skip), convert


def _read_whole_file(r: ranges.ByteRange, header: List[str], malformed: MalformedRows) -> Iterator[pa.RecordBatch]:
    """A compressed file, streamed from its start; pyarrow reads its header line itself."""
    parse, convert = _options(header, malformed)
    with ranges.open_decompressed(r.path) as fh:
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
    parse, convert = _options(header, malformed)
    reader = csv.open_csv(
        pa.BufferReader(owned.data),
        read_options=csv.ReadOptions(column_names=header, use_threads=False, block_size=READ_BLOCK_BYTES),
        parse_options=parse, convert_options=convert,
    )
    for rb in reader:
        if rb.num_rows:
            yield rb
    malformed.locate(r.path, owned.record_lines(malformed.numbers()))
