"""Scoring a file with a serving model: `python -m pipelines score --model DIR --input FILE --output FILE`.

- **What it reads.** A CSV file (a header line, comma-separated, quoted fields and quoted line
  breaks as ExampleGen reads them) or a Parquet file, in batches of `BATCH_ROWS` rows: memory does
  not grow with the file. Only the columns the model needs (and those asked to carry) are read.
- **The columns and their types** come from what the exporter recorded with the model
  (`assets.extra/serving_inputs.json`: each JSON signature input, its raw column, its dtype); a
  model without that record is read by its `serve_features` signature (each input its own
  column). A file that lacks a column the model needs is refused in one line naming it, before
  anything is scored (`ScoreError`).
- **How it scores.** Each batch through the model's `serve_features` signature (stock TensorFlow
  ops: what a TF Serving client's JSON request runs): categorical columns as text ('' when
  missing), dense columns as float32 (NaN when missing or not a number: the model's fill value
  applies). The next batch is read while one is scored, and TensorFlow spreads each batch over
  every core.
- **What it writes.** One row per scored input row: `row` (the input's data row number, from 0,
  the header not counted), `score` (float32, the click probability), and each carried column as
  read. Parquet, or CSV when the output's name ends in `.csv`; written to a temporary name beside
  it and renamed when complete (no link followed: data_io/safe_files.py), so a failed run leaves
  nothing a later step would trust.
- **Malformed rows** (a CSV row with another number of fields than the header) are counted and
  reported by row number, never scored or silently dropped.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from components.contracts.artifacts import SERVING_INPUTS_FILE
from components.data_io.safe_files import new_file
from components.data_io.streams import RawReader
from components.example_gen.header import csv_header

BATCH_ROWS = 65_536  # rows scored at a time: what memory holds of the file
SIGNATURE = "serve_features"
MAX_NAMED = 5  # malformed rows named in the report


def is_remote(path: str) -> bool:
    """A path of a file system TensorFlow reads (gs://, s3://, ram:// ...), not a local one."""
    return "://" in path


def gfile():
    """tf.io.gfile: every file system TensorFlow reads (local, gs://, ...)."""
    import tensorflow as tf  # lazy: pyarrow's readers need none of it; TensorFlow loads with the model anyway

    return tf.io.gfile


@contextlib.contextmanager
def opened(path: str) -> Iterator[Any]:
    """What the readers open: a local path as it is, a remote file as a buffered stream, closed after."""
    if not is_remote(path):
        yield path
        return
    with io.BufferedReader(RawReader(gfile().GFile(path, "rb"), seekable=True), buffer_size=8 << 20) as fh:
        yield fh


class ScoreError(ValueError):
    """The model, the input or the output cannot be used; one line naming it and what to change."""


@dataclass(frozen=True)
class ModelInput:
    """One input of the model's `serve_features` signature: its name, the column it reads, its dtype."""

    input: str
    column: str
    dtype: str  # float32 or string


@dataclass
class ScoreReport:
    """What a scoring run did."""

    rows_read: int = 0
    rows_scored: int = 0
    malformed: List[int] = field(default_factory=list)  # data row numbers of rows not parsed
    seconds: float = 0.0
    read_seconds: float = 0.0
    output: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return {"rows_read": self.rows_read, "rows_scored": self.rows_scored, "malformed": len(self.malformed),
                "malformed_rows": self.malformed[:MAX_NAMED], "seconds": round(self.seconds, 3),
                "rows_per_second": round(self.rows_scored / self.seconds) if self.seconds else None,
                "output": self.output}


def model_inputs(model_dir: str, signature) -> List[ModelInput]:
    """The model's inputs: its recorded serving inputs, else its `serve_features` signature's."""
    path = os.path.join(model_dir, SERVING_INPUTS_FILE)
    if gfile().exists(path):  # a pushed version may be remote (gs://)
        with gfile().GFile(path) as fh:
            entries = json.load(fh)["serving_inputs"]
        return [ModelInput(e["input"], e["column"], e["dtype"]) for e in entries]
    specs = signature.structured_input_signature[1]
    return [ModelInput(name, name, "float32" if spec.dtype.is_floating else "string")
            for name, spec in sorted(specs.items())]


def load_scorer(model_dir: str) -> Tuple[Callable, List[ModelInput]]:
    """(the `serve_features` signature, the model's inputs) of a serving SavedModel directory."""
    import tensorflow as tf  # lazy: the command line checks its arguments before TensorFlow loads

    if not os.path.isfile(os.path.join(model_dir, "saved_model.pb")):
        raise ScoreError(f"--model {model_dir}: no saved_model.pb there; name a serving model directory (a pushed "
                         "version under the push destination, or the exporter's Format-Serving)")
    model = tf.saved_model.load(model_dir)
    if SIGNATURE not in model.signatures:
        raise ScoreError(f"--model {model_dir}: the model has no {SIGNATURE!r} signature (it has "
                         f"{', '.join(sorted(model.signatures))}); score a serving model this product exported")
    fn = model.signatures[SIGNATURE]
    fn._held_model = model  # the signature needs its model's variables alive
    return fn, model_inputs(model_dir, fn)


def input_format(path: str) -> str:
    """`parquet` or `csv`, by the file's name."""
    if path.lower().endswith((".parquet", ".pq")):
        return "parquet"
    if path.lower().endswith(".csv"):
        return "csv"
    raise ScoreError(f"--input {path}: name a .csv or .parquet file")


def available_columns(path: str, delimiter: str = ",") -> List[str]:
    """The input file's column names (a CSV file's header, by ExampleGen's rule: a byte-order mark,
    quoted names; a Parquet file's schema)."""
    if input_format(path) == "parquet":
        with opened(path) as src:
            return list(pq.ParquetFile(src).schema_arrow.names)
    with opened(path) as src, (open(src, "rb") if isinstance(src, str) else contextlib.nullcontext(src)) as fh:
        return csv_header(fh, delimiter) or []


def check_columns(path: str, inputs: Sequence[ModelInput], carry: Sequence[str], delimiter: str = ",") -> None:
    """Refuses, before anything is scored, a file without a column the model needs or one asked to carry."""
    have = set(available_columns(path, delimiter))
    missing = [i.column for i in inputs if i.column not in have]
    if missing:
        raise ScoreError(f"--input {path} lacks the column(s) {', '.join(repr(c) for c in missing)} the model reads; "
                         "add them (an empty column scores as missing values) or score another file")
    absent = [c for c in carry if c not in have]
    if absent:
        raise ScoreError(f"--carry {', '.join(absent)}: not a column of {path}")


def _csv_batches(path: str, columns: List[str], report: ScoreReport, delimiter: str = ","
                 ) -> Iterator[Tuple[pa.RecordBatch, np.ndarray]]:
    skipped: List[int] = []

    def malformed(row) -> str:
        skipped.append(int(row.number) - 2)  # pyarrow numbers rows from 1, the header first
        return "skip"

    with opened(path) as src:  # closed when the rows are read, or the scorer stops
        reader = pcsv.open_csv(
            src, read_options=pcsv.ReadOptions(block_size=8 << 20, use_threads=False),
            parse_options=pcsv.ParseOptions(delimiter=delimiter, newlines_in_values=True, invalid_row_handler=malformed),
            convert_options=pcsv.ConvertOptions(include_columns=columns, column_types={c: pa.string() for c in columns},
                                                strings_can_be_null=False, quoted_strings_can_be_null=False))
        position, seen = 0, 0  # the next data row number not yet given to a parsed row; skipped rows before it
        for batch in reader:  # the rows pyarrow skipped in this block were reported while it parsed it
            gaps = np.asarray(skipped[seen:], np.int64)  # skipped in row order: only the new ones lie ahead
            candidates = np.arange(position, position + batch.num_rows + len(gaps), dtype=np.int64)
            numbers = candidates[~np.isin(candidates, gaps)][:batch.num_rows]
            position = int(numbers[-1]) + 1 if len(numbers) else position
            seen += int(np.count_nonzero(gaps < position))
            report.malformed = list(skipped)
            for k in range(0, batch.num_rows, BATCH_ROWS):
                yield batch.slice(k, BATCH_ROWS), numbers[k:k + BATCH_ROWS]
    report.malformed = list(skipped)  # rows after the last parsed one too


def _parquet_batches(path: str, columns: List[str]) -> Iterator[Tuple[pa.RecordBatch, np.ndarray]]:
    position = 0
    with opened(path) as src:
        for batch in pq.ParquetFile(src).iter_batches(batch_size=BATCH_ROWS, columns=columns):
            yield batch, np.arange(position, position + batch.num_rows, dtype=np.int64)
            position += batch.num_rows


def _as_float32(column: pa.Array) -> np.ndarray:
    """Dense values as float32: numbers as they are, missing or non-numeric text as NaN."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        text = pc.utf8_trim_whitespace(column)
        numeric = pc.match_substring_regex(text, r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^[-+]?(inf|nan)$",
                                           ignore_case=True)
        numeric = pc.fill_null(numeric, False)
        column = pc.if_else(numeric, text, pa.scalar(None, pa.string())).cast(pa.float32())
    else:
        column = column.cast(pa.float32())
    return column.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)


def _as_text(column: pa.Array) -> np.ndarray:
    """Categorical values as bytes ('' when missing). Through Arrow's binary buffers: a Python list of
    the values first took 30x as long and was most of the scorer's time."""
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_binary(column.type)):
        column = column.cast(pa.string())
    return pc.fill_null(column.cast(pa.binary()), b"").to_numpy(zero_copy_only=False)


def score_inputs(batch: pa.RecordBatch, inputs: Sequence[ModelInput]) -> Dict[str, np.ndarray]:
    """A batch's columns as the model's `serve_features` inputs."""
    cols = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
    return {i.input: (_as_float32(cols[i.column]) if i.dtype == "float32" else _as_text(cols[i.column]))
            for i in inputs}


def _prefetched(batches: Iterator[Any], report: ScoreReport, depth: int = 2) -> Iterator[Any]:
    """`batches` read ahead in a thread while the caller scores: reading overlaps scoring."""
    q: "queue.Queue" = queue.Queue(maxsize=depth)
    done = object()

    def read() -> None:
        try:
            while True:
                start = time.perf_counter()
                item = next(batches, done)
                report.read_seconds += time.perf_counter() - start
                q.put(item)
                if item is done:
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the caller, raised there
            q.put(e)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    while True:
        item = q.get()
        if item is done:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


class OutputWriter:
    """The output, written to a temporary name beside it and renamed when complete."""

    def __init__(self, path: str, carry: Sequence[str]):
        self.path, self.carry = path, list(carry)
        # a remote output is written locally, then uploaded to a temporary name and renamed
        self.local_dir = tempfile.mkdtemp(prefix="scores-") if is_remote(path) else None
        folder = self.local_dir or os.path.dirname(os.path.abspath(path))
        self.tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
        self.fh = new_file(self.tmp)  # never through a link planted at the temporary name
        self.csv = path.lower().endswith(".csv")
        self.writer = None

    def write(self, rows: np.ndarray, scores: np.ndarray, batch: pa.RecordBatch) -> None:
        table = pa.table({"row": pa.array(rows, pa.int64()), "score": pa.array(scores, pa.float32()),
                          **{c: batch.column(batch.schema.get_field_index(c)) for c in self.carry}})
        if self.writer is None:
            self.writer = (pcsv.CSVWriter(self.fh, table.schema) if self.csv else pq.ParquetWriter(self.fh, table.schema))
        self.writer.write_table(table)

    def close(self, ok: bool) -> None:
        try:
            if self.writer is not None:
                self.writer.close()
            self.fh.close()
            if ok and self.local_dir:
                _upload(self.tmp, self.path)
            elif ok:
                os.replace(self.tmp, self.path)  # a link at the output's name is replaced, not followed
        finally:
            if os.path.lexists(self.tmp):
                os.unlink(self.tmp)
            if self.local_dir:
                shutil.rmtree(self.local_dir, ignore_errors=True)


def _upload(local: str, path: str) -> None:
    """A local file to a remote path, whole: copied to a temporary name beside it, then renamed."""
    fs = gfile()
    fs.makedirs(os.path.dirname(path))
    tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}.tmp-{os.getpid()}"
    try:
        fs.copy(local, tmp, overwrite=True)
        fs.rename(tmp, path, overwrite=True)
    finally:
        if fs.exists(tmp):
            fs.remove(tmp)


def check_paths(input_path: str, output_path: str) -> None:
    """Refuses an input that is no file and a local output whose folder does not exist (a remote
    output's folder is made as the file is written: object stores have none)."""
    if is_remote(input_path):
        if not gfile().exists(input_path) or gfile().isdir(input_path):
            raise ScoreError(f"--input {input_path}: no such file")
    elif not os.path.isfile(input_path):
        raise ScoreError(f"--input {input_path}: no such file")
    if is_remote(output_path):
        return
    out_dir = os.path.dirname(os.path.abspath(output_path))
    if not os.path.isdir(out_dir):
        raise ScoreError(f"--output {output_path}: its folder {out_dir} does not exist")


def score_file(model_dir: str, input_path: str, output_path: str, carry: Sequence[str] = (),
               on_batch: Optional[Callable[[int], None]] = None, delimiter: str = ",") -> ScoreReport:
    """Scores every row of `input_path` with the serving model in `model_dir` into `output_path`.

    Args:
      model_dir: a serving SavedModel directory (a pushed version, the exporter's Format-Serving).
      input_path: a .csv or .parquet file.
      output_path: the scores' file (.parquet, or .csv).
      carry: input columns copied beside each score (an ID).
      on_batch: called with the rows scored so far after each batch (live progress).
      delimiter: a CSV file's field separator, one character (ExampleGen's: a comma); quoting and
        quoted line breaks as ExampleGen reads them.

    Returns:
      The report (rows read, scored, malformed, seconds).

    Raises:
      ScoreError: the model, a column or the output cannot be used (one line, before any scoring).
    """
    fmt = input_format(input_path)
    check_paths(input_path, output_path)
    fn, inputs = load_scorer(model_dir)
    if len(delimiter) != 1 or delimiter in '"\r\n':
        raise ScoreError(f"--delimiter {delimiter!r}: one character, not a quote or a line break (e.g. ';' or a tab)")
    check_columns(input_path, inputs, carry, delimiter)
    columns = sorted({i.column for i in inputs} | set(carry))
    report, start = ScoreReport(output=output_path), time.perf_counter()
    batches = (_csv_batches(input_path, columns, report, delimiter) if fmt == "csv"
               else _parquet_batches(input_path, columns))
    writer, ok = OutputWriter(output_path, carry), False
    try:
        for batch, rows in _prefetched(batches, report):
            scores = fn(**score_inputs(batch, inputs))["probabilities"].numpy().reshape(-1)
            writer.write(rows, scores, batch)
            report.rows_scored += len(rows)
            if on_batch is not None:
                on_batch(report.rows_scored)
        ok = True
    finally:
        writer.close(ok)
    report.rows_read = report.rows_scored + len(report.malformed)
    report.seconds = time.perf_counter() - start
    return report
