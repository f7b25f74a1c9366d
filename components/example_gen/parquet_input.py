"""Parquet input of ExampleGen (`input.format: parquet`): files planned by row groups, their schemas
checked before Beam starts, and their rows read in the worker that writes them.

- **Planning** (`plan_units`, before the pipeline): every file's footer is read; a file that is not
  Parquet, or whose schema lacks a configured column or holds it in a type the config cannot read,
  is refused with one line naming the file and the column(s). Each file's row groups are cut into
  units of consecutive row groups of about `input.range_mb` (their uncompressed size, from the
  footer; at least one row group a unit), spread over the workers as CSV byte ranges are. A file
  with no row group is one unit of 0 rows, so the ledger still counts the file.
- **The independent count** of a unit is its rows in the footer (`unit_counts`), not what the reader
  decoded; the ledger checks that rows decoded + rows of unreadable row groups equal it.
- **Reading** (`read_unit`): pyarrow reads each row group of the unit in batches, only the
  configured columns and the other columns of a tf.Example kind (numbers, bools, text, and flat
  lists of them; structs, maps, timestamps and nested lists are not read). A row group that fails
  to decode (a corrupt page) counts its unread rows as `unreadable_row_group`, naming the file and
  the group, and the unit goes on with the next group.
- **Types** (`conform`): Arrow types become the tf.Example kinds that a TFRecord input decodes to
  (int64, float, bytes): numbers of a configured numeric column float64 (then float32, as parsed
  CSV text), integer IDs int64 (the rulebook's T2 makes them the tokens their decimal text is),
  text bytes; dictionary columns are decoded, and null values inside lists are removed and counted
  (`cells/null_values/<column>`). `records.type_rows` then types and labels the rows by the same
  rules as CSV and TFRecord input (one source of truth).

Written with pyarrow rather than Beam's `parquetio.ReadFromParquetBatched` (which also splits by row
group) because ExampleGen writes each unit's rows in the worker that read them, so no row crosses
the runner; Beam's source would hand every batch to the next stage through the runner, and would
not let a corrupt row group be counted and skipped.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from components.config.schema import PipelineConfig
from components.example_gen.header import check_header
from components.example_gen.records import _rebuild, unnamed_or_repeated
from components.reporting.errors import InputError

BATCH_ROWS = 65536  # rows per RecordBatch read from a row group (pyarrow's default)
MAX_EXAMPLES = 5  # unreadable row groups named in the ledger

# Scalar kinds of a column's values; a role lists the kinds it reads.
INTEGER, FLOAT, TEXT, NULL = "integer", "float", "text", "null"
NUMERIC_KINDS = (INTEGER, FLOAT, NULL)  # dense features, weights, the label's source
CATEGORICAL_KINDS = (TEXT, INTEGER, NULL)  # tokens, or integer IDs


@dataclass(frozen=True)
class RowGroupRange:
    """Row groups [first, stop) of one Parquet file: one unit of work."""

    path: str
    first: int
    stop: int
    index: int  # this unit's number among all units of the run (output file names)
    rows: int  # rows of these row groups, from the file's footer

    def key(self) -> Tuple[str, int]:
        return (self.path, self.first)


def _scalar_kind(t: pa.DataType) -> Optional[str]:
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_null(t):
        return NULL
    if pa.types.is_boolean(t) or pa.types.is_integer(t):
        return INTEGER
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return FLOAT
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)):
        return TEXT
    return None


def _is_list_type(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def column_kind(t: pa.DataType) -> Optional[str]:
    """The kind of a column's values (a flat column or a list of values), None for what a
    tf.Example cannot hold (structs, maps, timestamps, lists of lists or of structs)."""
    return _scalar_kind(t.value_type) if _is_list_type(t) else _scalar_kind(t)


def _role(cfg: PipelineConfig, name: str) -> Optional[Tuple[str, Tuple[str, ...]]]:
    if name in set(cfg.numeric_columns()):
        what = "the label's source" if name == cfg.label_source() else "a dense feature or weight"
        return f"numbers ({what})", NUMERIC_KINDS
    if name in set(cfg.categorical_columns()):
        return "categorical tokens (text or integer IDs)", CATEGORICAL_KINDS
    return None


def check_schema(path: str, schema: pa.Schema, cfg: PipelineConfig) -> None:
    """Raises InputError naming the file when its schema lacks a configured column or holds one in
    a type the config cannot read (e.g. text for a dense feature, a list of structs)."""
    check_header(path, list(schema.names), cfg.numeric_columns() + cfg.categorical_columns(), cfg.label,
                 cfg.label_rule is not None, source="Parquet schema")
    wrong = []
    for field in schema:
        role = _role(cfg, field.name)
        if role is not None and column_kind(field.type) not in role[1]:
            wrong.append(f"{field.name!r} is {field.type}, the config reads {role[0]}")
    if wrong:
        raise InputError(
            f"{path}: column(s) of the wrong type in the Parquet schema: {'; '.join(wrong)}; write each as "
            "those values (a flat column, or a list of them), or fix the config"
        )


def columns_to_read(schema: pa.Schema, cfg: PipelineConfig) -> List[str]:
    """The configured columns and the other columns of a tf.Example kind, in the file's order; not
    the other columns with an empty or repeated name (`records.unnamed_or_repeated`)."""
    left_out = unnamed_or_repeated(schema.names, cfg.numeric_columns() + cfg.categorical_columns())
    return [f.name for f in schema if f.name not in left_out and (
        _role(cfg, f.name) is not None or column_kind(f.type) not in (None, NULL))]


def _open(path: str):
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def read_footer(path: str, size: int):
    """The file's Parquet metadata (None for a file of 0 bytes: no rows); InputError naming the
    file when it is not Parquet."""
    if size == 0:
        return None
    try:
        with _open(path) as fh:
            return pq.ParquetFile(fh).metadata
    except (pa.ArrowException, OSError) as e:
        raise InputError(
            f"{path}: not a readable Parquet file ({_first_line(e)}); rewrite it or remove it from the input"
        ) from None


def plan_units(cfg: PipelineConfig, files: List[Tuple[str, int]], unit_bytes: int) -> List[RowGroupRange]:
    """(path, size) of every input file -> its row-group units, numbered in file order; every file's
    schema checked first (`check_schema`)."""
    if unit_bytes < 1:
        raise ValueError(f"unit_bytes must be positive, got {unit_bytes}")
    cuts: List[Tuple[str, int, int, int]] = []
    for path, size in sorted(files):
        md = read_footer(path, size)
        if md is None or (md.num_columns == 0 and md.num_rows == 0):  # nothing in it: counted as an empty file
            cuts.append((path, 0, 0, 0))
            continue
        check_schema(path, md.schema.to_arrow_schema(), cfg)
        if md.num_row_groups == 0:
            cuts.append((path, 0, 0, 0))
            continue
        first, rows, nbytes = 0, 0, 0
        for g in range(md.num_row_groups):
            group = md.row_group(g)
            if g > first and nbytes + group.total_byte_size > unit_bytes:
                cuts.append((path, first, g, rows))
                first, rows, nbytes = g, 0, 0
            rows += group.num_rows
            nbytes += group.total_byte_size
        cuts.append((path, first, md.num_row_groups, rows))
    return [RowGroupRange(p, a, b, i, n) for i, (p, a, b, n) in enumerate(cuts)]


def unit_counts(u: RowGroupRange) -> Dict[str, int]:
    """The independent count of a unit: its rows and row groups as the footer gives them."""
    return {"input/data_rows": u.rows, "input/row_groups": u.stop - u.first}


def _values(arr: pa.Array, kind: Optional[str], role: Optional[Tuple[str, Tuple[str, ...]]]) -> pa.Array:
    """Flat values as a tf.Example kind: numbers of a configured numeric column as float64 (typed to
    float32 by `records.type_rows`, as parsed text is), other numbers int64 / float32, text bytes."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if role is not None and role[1] == NUMERIC_KINDS:
        return pc.cast(arr, pa.float64(), safe=False) if kind != NULL else pa.nulls(len(arr), pa.float64())
    if kind == TEXT or (kind == NULL and role is not None):
        return pc.cast(arr, pa.binary()) if kind == TEXT else pa.nulls(len(arr), pa.binary())
    if kind == INTEGER:
        if pa.types.is_uint64(arr.type):  # no int64 for IDs from 2**63: their decimal text, rulebook T2's token
            return pc.cast(pc.cast(arr, pa.string()), pa.binary())
        return pc.cast(arr, pa.int64())
    return pc.cast(arr, pa.float32(), safe=False)


def _conform_column(arr: pa.Array, kind: Optional[str], role) -> Tuple[pa.Array, int]:
    """One column as ExampleGen's reader hands it to `type_rows`, and the null values removed."""
    if not _is_list_type(arr.type):
        return _values(arr, kind, role), 0
    if pa.types.is_fixed_size_list(arr.type):  # pyarrow 10 has no cast from it to a list
        size, n = arr.type.list_size, len(arr)
        absent = np.asarray(pc.is_null(arr).to_numpy(zero_copy_only=False), dtype=bool)
        arr = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * size),
                                       arr.values.slice(arr.offset * size, n * size), mask=pa.array(absent))
    values = _values(arr.flatten(), kind, role)
    present = np.asarray(pc.is_valid(values).to_numpy(zero_copy_only=False), dtype=bool)
    return _rebuild(arr, values, present), int(len(values) - np.count_nonzero(present))


def conform(rb: pa.RecordBatch, cfg: PipelineConfig, counts: Counter) -> pa.RecordBatch:
    """A batch as read from a Parquet file -> the tf.Example kinds `records.type_rows` takes (list
    columns of int64, float or bytes, or flat columns of them), counting null values inside lists."""
    arrays, names = [], []
    for field, arr in zip(rb.schema, rb.columns):
        kind, role = column_kind(field.type), _role(cfg, field.name)
        if role is None and kind in (None, NULL):
            continue
        col, nulls = _conform_column(arr, kind, role)
        if nulls:
            counts[f"cells/null_values/{field.name}"] += nulls
        arrays.append(col)
        names.append(field.name)
    return pa.RecordBatch.from_arrays(arrays, names) if names else pa.RecordBatch.from_pydict({})


def read_unit(u: RowGroupRange, cfg: PipelineConfig, counts: Counter, samples: Dict[str, List[str]],
              batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The rows of a unit's row groups, conformed; a row group that fails to decode counts its
    unread rows as `rows/malformed/unreadable_row_group` and names itself in `samples`."""
    if u.stop == u.first:
        return
    with _open(u.path) as fh:
        pf = pq.ParquetFile(fh)
        columns = columns_to_read(pf.schema_arrow, cfg)
        for g in range(u.first, u.stop):
            expected = pf.metadata.row_group(g).num_rows
            done = 0
            batches = pf.iter_batches(batch_size=batch_rows, row_groups=[g], columns=columns, use_threads=False)
            while True:
                try:
                    rb = next(batches)
                except StopIteration:
                    break
                except (pa.ArrowException, OSError) as e:
                    counts["rows/malformed/unreadable_row_group"] += expected - done
                    kept = samples.setdefault("malformed/unreadable_row_group", [])
                    if len(kept) < MAX_EXAMPLES:
                        kept.append(f"{u.path}: row group {g} ({expected - done} of {expected} rows unread: {_first_line(e)})")
                    break
                done += rb.num_rows
                if rb.num_rows:
                    yield conform(rb, cfg, counts)
