"""CSV headers, read with Python's csv module (quoted names, CRLF, a UTF-8 byte-order mark), and
the check that a header (or a Parquet schema's column names) can feed the configuration.

A column name is any text (spaces, dots, slashes, non-ASCII letters, a leading digit). A column
the configuration reads must be named once; a column it does not read may have an empty name
(pandas' unnamed index column) or share its name with another such column: ExampleGen does not
read it (`records.unnamed_or_repeated`)."""
from __future__ import annotations

import csv
import io
from typing import List, Optional

from components.config.schema import PipelineConfig
from components.example_gen.ranges import open_decompressed
from components.reporting.errors import InputError


def read_csv_header(path: str) -> Optional[List[str]]:
    """The column names of a CSV file: its first line with content, by the byte-range reader's rule
    (`ranges._data_start`: a line that is not empty or a lone carriage return), so that both agree
    on where the rows start; None for a file with no bytes (or only blank lines)."""
    with open_decompressed(path) as fh:
        return csv_header(fh)


def csv_header(fh, delimiter: str = ",") -> Optional[List[str]]:
    """`read_csv_header` of an open binary stream (the file's decompressed bytes), fields split at
    `delimiter` (ExampleGen's: a comma)."""
    text = io.TextIOWrapper(fh, encoding="utf-8-sig", errors="replace", newline="")
    for row in csv.reader(text, delimiter=delimiter):
        if row:  # csv.reader gives [] for an empty line only
            return row
    return None


def check_header(path: str, header: List[str], wanted: List[str], label: str, label_derived: bool,
                 source: str = "CSV header") -> None:
    """Raises InputError naming the file when the header (or a Parquet file's schema: `source`)
    cannot feed the configuration."""
    if not any(c.strip() for c in header):
        raise InputError(
            f"{path}: the first line with content ({','.join(header)!r}) names no column; the header must be "
            "the file's first non-blank line: remove the lines above it"
        )
    configured = set(wanted)
    dupes = sorted({c for c in header if c in configured and header.count(c) > 1})
    if dupes:
        where = "; ".join(
            f"{c!r} at columns {', '.join(str(i + 1) for i, h in enumerate(header) if h == c)}" for c in dupes)
        raise InputError(
            f"{path}: the {source} names column(s) the config reads more than once ({where}); give every column "
            "one name (other columns with an empty or repeated name are not read)"
        )
    missing = [c for c in dict.fromkeys(wanted) if c not in header]
    if missing:
        shown = ", ".join(header[:12]) + (", ..." if len(header) > 12 else "")
        raise InputError(
            f"{path}: column(s) {missing} named in the config are not in the {source} ({shown}); "
            f"fix the {source.split()[-1]} or the config's column names"
        )
    if label_derived and label in header:
        raise InputError(
            f"{path}: the input has a column {label!r}, but with label_rule the label is derived and written "
            f"under that name; rename `label` in the config (e.g. label: derived_label)"
        )


def check_csv_headers(cfg: PipelineConfig, files: List[str]) -> List[str]:
    """Checks that every CSV file's header holds the configured columns.

    Args:
      cfg: the configuration (its numeric and categorical columns, the label and its rule).
      files: paths of the CSV files.

    Returns:
      The files that have a header (an empty file has none, holds no row and is not refused:
      ExampleGen counts it).

    Raises:
      InputError: a header names no column, names a configured column twice, lacks a configured
        column, or holds the derived label's name.
    """
    wanted = cfg.numeric_columns() + cfg.categorical_columns()
    with_header = []
    for path in files:
        header = read_csv_header(path)
        if header is not None:
            check_header(path, header, wanted, cfg.label, cfg.label_rule is not None)
            with_header.append(path)
    return with_header
