"""Scoring a Parquet file too big for one machine: `python -m pipelines score ... --beam [Beam options]`.

The same scoring as batch_scoring.py (the model's recorded inputs, `serve_features`, the same
columns read the same way, the same output: `row`, `score`, the carried columns), as a Beam
pipeline whose unit of work is one Parquet row group: the driver reads the file's footer (its row
groups and their first row numbers) and refuses a missing column before anything runs; each worker
loads the model once (`DoFn.setup`) and scores its row groups into part files beside the output;
the driver then streams the parts, in row order, into the output at a temporary name and renames it
(data_io/safe_files.py's rules), and removes the parts. Input, model, parts and output go through
TensorFlow's file systems (`gs://` for Dataflow's workers, which share no disk). With Beam's local runner (`beam` options
as the pipeline's, `--direct_num_workers`) the row groups spread over local processes; with
`--runner=DataflowRunner` over Dataflow's workers (then input, model and output must be paths they
all reach).

CSV input is refused with --beam: a CSV file cannot be cut into ranges that start at a row without
reading it (quoted fields may hold line breaks); convert it to Parquet, or score it without --beam.
"""
from __future__ import annotations

import os
import time
from typing import Iterator, List, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions

from components.data_io import beam_runtime
from components.embedding_exporter import batch_scoring
from components.embedding_exporter.batch_scoring import BATCH_ROWS, ScoreError, ScoreReport


# `--beam` without options: Beam's local runner, one process per core (a --runner option replaces it)
LOCAL_BEAM_SCORING = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=0"]


def row_groups(path: str) -> List[Tuple[int, int, int]]:
    """(row group, its first row number, its rows) of a Parquet file, from its footer."""
    with batch_scoring.opened(path) as src:
        meta = pq.ParquetFile(src).metadata
    out, first = [], 0
    for i in range(meta.num_row_groups):
        rows = meta.row_group(i).num_rows
        out.append((i, first, rows))
        first += rows
    return out


def part_path(parts_dir: str, group: int) -> str:
    return f"{parts_dir}/part-{group:08d}.parquet"


def parts_folder(output_path: str) -> str:
    """Where the workers put their parts: a hidden folder beside the output (a remote output's
    too: every worker reaches it)."""
    parent = os.path.dirname(output_path) if batch_scoring.is_remote(output_path) else os.path.dirname(os.path.abspath(output_path))
    return f"{parent}/.{os.path.basename(output_path)}.parts-{os.getpid()}"


class ScoreRowGroups(beam.DoFn):
    """Scores row groups of one Parquet file into part files; the model loaded once per worker."""

    def __init__(self, model_dir: str, input_path: str, carry: Sequence[str], parts_dir: str):
        self.model_dir, self.input_path, self.carry, self.parts_dir = model_dir, input_path, list(carry), parts_dir
        self.fn = self.inputs = None

    def setup(self) -> None:
        self.fn, self.inputs = batch_scoring.load_scorer(self.model_dir)

    def process(self, item: Tuple[int, int, int]) -> Iterator[int]:
        group, first, rows = item
        columns = sorted({i.column for i in self.inputs} | set(self.carry))
        with batch_scoring.opened(self.input_path) as src:
            table = pq.ParquetFile(src).read_row_group(group, columns=columns)
        parts = []
        for k in range(0, table.num_rows, BATCH_ROWS):
            batch = table.slice(k, BATCH_ROWS).combine_chunks().to_batches()[0] if table.num_rows else None
            scores = self.fn(**batch_scoring.score_inputs(batch, self.inputs))["probabilities"].numpy().reshape(-1)
            numbers = np.arange(first + k, first + k + batch.num_rows, dtype=np.int64)
            parts.append(pa.table({"row": numbers, "score": pa.array(scores, pa.float32()),
                                   **{c: batch.column(batch.schema.get_field_index(c)) for c in self.carry}}))
        if parts:  # whole or not at all: a temporary name, then a rename (tf.io.gfile: local or remote)
            sink = pa.BufferOutputStream()
            pq.write_table(pa.concat_tables(parts), sink)
            tmp = part_path(self.parts_dir, group) + ".tmp"
            with batch_scoring.gfile().GFile(tmp, "wb") as fh:
                fh.write(sink.getvalue().to_pybytes())
            batch_scoring.gfile().rename(tmp, part_path(self.parts_dir, group), overwrite=True)
        yield table.num_rows


def score_file_beam(model_dir: str, input_path: str, output_path: str, carry: Sequence[str] = (),
                    beam_args: Optional[List[str]] = None) -> ScoreReport:
    """`batch_scoring.score_file` as a Beam pipeline over the input's row groups.

    Raises:
      ScoreError: CSV input, or as `score_file` (one line, before anything is scored).
    """
    if batch_scoring.input_format(input_path) != "parquet":
        raise ScoreError(f"--input {input_path}: --beam scores Parquet files (cut by row group); a CSV file "
                         "cannot be cut without reading it: convert it to Parquet, or score it without --beam")
    batch_scoring.check_paths(input_path, output_path)
    _, inputs = batch_scoring.load_scorer(model_dir)
    batch_scoring.check_columns(input_path, inputs, carry)
    beam_args = list(beam_args or [])
    if any(a.startswith("--runner") for a in beam_args[len(LOCAL_BEAM_SCORING):]):
        beam_args = [a for a in beam_args if a not in LOCAL_BEAM_SCORING]
    beam_runtime.ensure_local_runner_safe(beam_args)
    groups = row_groups(input_path)
    parts_dir, fs = parts_folder(output_path), batch_scoring.gfile()
    report, start, ok, writer = ScoreReport(output=output_path), time.perf_counter(), False, None
    try:
        fs.makedirs(parts_dir)
        writer = batch_scoring.OutputWriter(output_path, carry)
        with beam.Pipeline(options=PipelineOptions(beam_args)) as p:
            _ = (p | "RowGroups" >> beam.Create(groups)
                 | "Score" >> beam.ParDo(ScoreRowGroups(model_dir, input_path, carry, parts_dir)))
        for group, _, rows in groups:  # in row order, one part in memory at a time
            if rows and not fs.exists(part_path(parts_dir, group)):
                raise ScoreError(f"the Beam job left no scores for row group {group} of {input_path} "
                                 f"({part_path(parts_dir, group)} missing): nothing written")
            if rows:
                with fs.GFile(part_path(parts_dir, group), "rb") as fh:
                    part = pq.read_table(pa.BufferReader(fh.read()))
                writer.write(part["row"].to_numpy(), part["score"].to_numpy(), part)
                report.rows_scored += part.num_rows
        expected = sum(rows for _, _, rows in groups)
        if report.rows_scored != expected:
            raise ScoreError(f"the Beam job scored {report.rows_scored:,} rows of {expected:,} in {input_path}: "
                             f"parts missing under {parts_dir}")
        ok = True
    finally:
        if writer is not None:
            writer.close(ok)
        if fs.exists(parts_dir):
            fs.rmtree(parts_dir)
    report.rows_read = report.rows_scored
    report.seconds = time.perf_counter() - start
    return report
