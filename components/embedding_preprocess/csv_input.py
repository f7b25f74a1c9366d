"""CSV input for the standalone preprocessing CLI (the pipeline reads ExampleGen's tf.Examples).

Lines are read with Beam's text source (files are split across workers), batched, and parsed by
pyarrow's CSV reader into RecordBatches shaped like the tf.Example decoder's: categorical columns
as binary (so non-UTF-8 bytes survive to be counted as invalid), dense columns and the label as
float64 (null when empty or not a number). Rows with the wrong number of fields are skipped by
pyarrow's invalid-row handler and counted as `malformed_rows`; non-numeric dense values are counted
as `not_numeric`. Quoted fields spanning several lines are not supported (one record per line).
"""
from __future__ import annotations

import io
from typing import Dict, List

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from components.config import PipelineConfig


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
    missing = [c for c in dict.fromkeys(wanted) if c not in header]
    if missing:
        raise InputError(
            f"{source}: columns {missing} named in the config are not in the CSV header {header[:8]}...; "
            "fix the header or the config's column names"
        )


class _LinesToRecordBatch(beam.DoFn):
    def __init__(self, header: List[str], config_json: str):
        self._header = header
        self._config_json = config_json

    def setup(self):
        from pyarrow import csv

        from components.config import config_from_json

        cfg = config_from_json(self._config_json)
        numeric = {cfg.label} | {d.source for d in cfg.dense_features}
        self._numeric = [c for c in self._header if c in numeric]
        self._csv = csv
        self._convert = csv.ConvertOptions(
            column_types={c: pa.binary() for c in self._header},
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        )

    def process(self, lines: List[bytes]):
        malformed = []
        parse = self._csv.ParseOptions(invalid_row_handler=lambda row: malformed.append(1) or "skip")
        data = b",".join(h.encode() for h in self._header) + b"\n" + b"\n".join(lines) + b"\n"
        table = self._csv.read_csv(
            io.BytesIO(data),
            read_options=self._csv.ReadOptions(use_threads=False),
            parse_options=parse,
            convert_options=self._convert,
        )
        stats: Dict[str, int] = {"input/malformed_rows": len(malformed)}
        columns = {}
        for name in self._header:
            col = table.column(name).combine_chunks() if table.num_rows else pa.array([], pa.binary())
            if name in self._numeric:
                col, bad = _to_float(col)
                if bad:
                    stats[f"input/not_numeric/{name}"] = bad
            columns[name] = col
        if columns:
            yield pa.RecordBatch.from_arrays(list(columns.values()), list(columns.keys()))
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


@beam.ptransform_fn
def ReadCsvRecordBatches(pipeline, pattern: str, header: List[str], cfg: PipelineConfig):  # pylint: disable=invalid-name
    """Returns (record batches, statistics partials)."""
    from components.embedding_preprocess.beam_pipeline import read_batch_rows

    rows = read_batch_rows(cfg.training.batch_size)
    result = (
        pipeline
        | "ReadLines" >> beam.io.ReadFromText(pattern, skip_header_lines=1, coder=beam.coders.BytesCoder())
        | "DropBlank" >> beam.Filter(lambda line: bool(line.strip(b"\r\n")))
        | "Batch" >> beam.BatchElements(min_batch_size=rows, max_batch_size=rows)
        | "Parse" >> beam.ParDo(_LinesToRecordBatch(header, cfg.to_json())).with_outputs("stats", main="batches")
    )
    return result.batches, result.stats
