"""CSV input for the standalone preprocessing CLI (the pipeline reads ExampleGen's output).

The files are read by ExampleGen's CSV reader (`components.example_gen.csv_records`): the same
header rules (quoted names, a byte-order mark; every file's header checked before Beam starts),
the same byte ranges (a range owns the records that start in it, quoted line breaks included; a
compressed file is one range) and the same label rule (`records.derive_label`: the label column,
or `label_rule` applied to its source column). Each range's records become RecordBatches shaped
like the tf.Example decoder's: categorical columns as binary (so non-UTF-8 bytes survive to be
counted as invalid), dense and weight columns as float64 (null when empty or not a number), the
label as float64 (0/1; null when missing, NaN when invalid, so that preprocessing drops and counts
the row by the same reason as ExampleGen). Rows with the wrong number of fields are skipped and
counted as `malformed_rows`; non-numeric values as `not_numeric`.
"""
from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Tuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from components.config.loading import config_from_json
from components.config.schema import PipelineConfig
from components.embedding_preprocess import partials
from components.embedding_preprocess.transform import read_batch_rows
from components.example_gen import ranges
from components.example_gen.csv_records import MalformedRows, read_csv_range
from components.example_gen.header import check_csv_headers, read_csv_header
from components.example_gen.records import as_list_column, derive_label, unnamed_or_repeated
from components.reporting.errors import InputError

# A range's rows are held whole to cut them into training-batch-aligned slices: ranges stay smaller
# than ExampleGen's (input.range_mb), which only streams them.
RANGE_BYTES = 16 << 20


def _matching_files(pattern: str) -> List[Tuple[str, int]]:
    """(path, size) of every file matching `pattern`, sorted; InputError when there is none."""
    matches = FileSystems.match([pattern])[0].metadata_list
    if not matches:
        raise InputError(f"input {pattern!r} matches no file; pass an existing CSV file, directory glob or pattern")
    return sorted((m.path, m.size_in_bytes) for m in matches)


def read_header(pattern: str) -> List[str]:
    """The columns the CSV reader's batches carry: the header of the first matching file that has one.

    Args:
      pattern: a file, glob or directory pattern.

    Returns:
      The column names, as ExampleGen reads them (`header.read_csv_header`).

    Raises:
      InputError: no file matches, or every matching file is empty.
    """
    paths = [path for path, _ in _matching_files(pattern)]
    for path in paths:
        header = read_csv_header(path)
        if header is not None:
            return header
    raise InputError(f"{paths[0]}: empty file or no header line; CSV input needs a header naming the columns")


def check_csv_input(cfg: PipelineConfig, pattern: str) -> None:
    """Checks every matching CSV file's header by ExampleGen's rules (`header.check_csv_headers`).

    Args:
      cfg: the configuration whose columns the files must hold.
      pattern: a file, glob or directory pattern.

    Raises:
      InputError: no file matches, every file is empty, or a header cannot feed `cfg`.
    """
    paths = [path for path, _ in _matching_files(pattern)]
    if not check_csv_headers(cfg, paths):
        raise InputError(f"{paths[0]}: empty file or no header line; CSV input needs a header naming the columns")


def csv_ranges(pattern: str) -> List[ranges.ByteRange]:
    """The byte ranges of every matching file (`ranges.plan_ranges`), about `RANGE_BYTES` each."""
    return ranges.plan_ranges(_matching_files(pattern), RANGE_BYTES)


def _to_float(col: pa.Array) -> Tuple[pa.Array, int]:
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


def label_column(cfg: PipelineConfig, source: Optional[pa.Array], num_rows: int) -> pa.Array:
    """The label by ExampleGen's rule (`records.derive_label`), as preprocessing's L1 reads it.

    Args:
      cfg: the configuration (`label_rule`, if any).
      source: the label's source column as read (binary text, one value per row), or None when
        the file lacks it.
      num_rows: rows of the batch.

    Returns:
      float64 of shape [num_rows]: the 0/1 label, null where it is missing, NaN where it is invalid.
    """
    if source is None:
        source = pa.nulls(num_rows, pa.binary())
    label, missing, invalid = derive_label(cfg, as_list_column(source), num_rows)
    values = np.where(invalid, np.nan, label.astype(np.float64))
    return pa.array(values, pa.float64(), mask=missing)


def _range_table(r: ranges.ByteRange, before: Dict, malformed: MalformedRows) -> Optional[pa.Table]:
    """The range's records as one table of binary columns (None: an empty file, or no record)."""
    header = read_csv_header(r.path)
    if header is None:
        return None
    batches = list(read_csv_range(r, header, before, malformed))
    return pa.Table.from_batches(batches).combine_chunks() if batches else None


class _ParseCsvRange(beam.DoFn):
    """One byte range of a CSV file -> RecordBatches of `rows` rows, plus input statistics."""

    def __init__(self, columns: List[str], config_json: str, rows: int):
        self._columns = columns
        self._config_json = config_json
        self._rows = rows

    def setup(self):
        self._cfg = config_from_json(self._config_json)
        self._numeric = set(self._cfg.numeric_columns())

    def _typed(self, table: Optional[pa.Table], stats: Dict[str, int]) -> pa.RecordBatch:
        """The batch's columns (`columns`: a column a file lacks is null), numbers parsed, the label derived."""
        n = table.num_rows if table is not None else 0
        columns = {}
        for name in self._columns:
            present = table is not None and name in table.column_names
            col = table.column(name).combine_chunks() if present else pa.nulls(n, pa.binary())
            if name in self._numeric:
                col, bad = _to_float(col)
                if bad:
                    stats[partials.not_numeric(name)] = bad
            columns[name] = col
        source = self._cfg.label_source()
        raw_label = table.column(source).combine_chunks() if table is not None and source in table.column_names else None
        columns[self._cfg.label] = label_column(self._cfg, raw_label, n)
        return pa.RecordBatch.from_arrays(list(columns.values()), list(columns.keys()))

    def process(self, r: ranges.ByteRange, before: Dict) -> Iterator:
        malformed = MalformedRows(max_examples=0)
        table = _range_table(r, before, malformed)
        if table is None and not malformed.total:
            return
        stats: Dict[str, int] = {partials.MALFORMED_ROWS: malformed.total}
        batch = self._typed(table, stats)
        # consecutive slices of whole training batches (statistics cut them into training batches)
        for offset in range(0, batch.num_rows, self._rows):
            yield batch.slice(offset, self._rows)
        yield beam.pvalue.TaggedOutput("stats", stats)


class ReadCsvRecordBatches(beam.PTransform):
    """PBegin -> (RecordBatches of the CSV files `pattern`, statistics partials of the input).

    Batches have `transform.read_batch_rows(batch_size)` rows (consecutive whole training batches)
    and the columns `columns` (the CLI passes `read_header(pattern)`) plus the label, shaped as
    the module docstring says; the partials count malformed rows and non-numeric values per range.
    """

    def __init__(self, pattern: str, columns: List[str], cfg: PipelineConfig):
        super().__init__()
        self._pattern = pattern
        # not the unread columns with an empty or repeated name, as ExampleGen (records.unnamed_or_repeated)
        left_out = unnamed_or_repeated(columns, cfg.numeric_columns() + cfg.categorical_columns())
        self._columns = [c for c in columns if c not in left_out]
        self._config_json = cfg.to_json()
        self._rows = read_batch_rows(cfg.training.batch_size)

    def expand(self, pbegin):
        # Byte ranges instead of Beam's line-per-element text source: a 1M-row file is a few
        # elements, not 1M, and pyarrow's C++ parser does the line work. Reshuffle spreads ranges
        # over workers; the quote counts tell each range whether it starts inside a quoted field.
        rs = (
            pbegin
            | "Ranges" >> beam.Create(csv_ranges(self._pattern))
            | "Spread" >> beam.Reshuffle()
        )
        before = (
            rs
            | "CountQuotes" >> beam.Map(ranges.count_quotes)
            | "AllQuoteCounts" >> beam.combiners.ToList()
            | "BeforeEachRange" >> beam.Map(ranges.before_each_range)
        )
        result = rs | "Parse" >> beam.ParDo(
            _ParseCsvRange(self._columns, self._config_json, self._rows), beam.pvalue.AsSingleton(before)
        ).with_outputs("stats", main="batches")
        return result.batches, result.stats
