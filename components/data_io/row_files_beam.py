"""Row files written by a Beam pipeline: the chunks of every table spread over the workers.

The delta of two exports too (`delta_runner`: one shard pair per work item, row_delta.py's
`shard_job`). The same two steps as `row_files.write_row_files`, and the same files: each chunk of rows (a .npy
range read by seek, its vocabulary lines from their byte offset) is keyed and cut by shard on a
worker (`row_files.spill_pieces`); Beam's GroupByKey brings each shard's pieces together (Dataflow
spills them to its shuffle, not to one machine's memory); each shard is sorted and written by one
worker (`row_files.write_shard`); the driver writes the manifest last. The driver reads only the
tables' manifest and each vocabulary file once, for its line offsets.

    python -m components.data_io.row_files_beam --tables DIR --output DIR [--max-file-mib 128] [Beam options]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import apache_beam as beam
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.contracts.artifacts import named_file
from components.data_io import beam_runtime, row_delta, row_files

ENTRIES_DIR = "_shard_entries"


def _pieces(item: Tuple[row_files.RowTable, int, int, Optional[int], int]) -> Iterator[Tuple[Tuple[str, int], bytes]]:
    table, start, stop, offset, shards = item
    for s, piece in row_files.spill_pieces(table, start, stop, offset, shards):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, piece.schema) as w:
            w.write_batch(piece)
        yield (table.name, s), sink.getvalue().to_pybytes()


def _write(grouped: Tuple[Tuple[str, int], Sequence[bytes]], tables: Dict[str, row_files.RowTable],
           shards: Dict[str, int], out_dir: str) -> str:
    (name, s), pieces = grouped
    table = tables[name]
    batches = [b for p in pieces for b in pa.ipc.open_stream(pa.BufferReader(p))]
    path = os.path.join(named_file(out_dir, name, ""), row_files.part_name(s, shards[name]))
    return json.dumps({"table": name, "shard": s, "entry": row_files.write_shard(batches, row_files.schema(table), path)})


def write_row_files_beam(tables_dir: str, out_dir: str, max_file_bytes: int = row_files.DEFAULT_MAX_FILE_BYTES,
                         every: int = row_files.CHUNK_ROWS, beam_args: Optional[List[str]] = None) -> Dict[str, Any]:
    """`row_files.write_row_files` as a Beam pipeline (`beam_args`: its options; none: the local runner).

    Returns:
      The manifest, written last.

    Raises:
      RowFilesError: as `write_row_files`, and when a shard the tables need was not written.
    """
    beam_runtime.ensure_local_runner_safe(beam_args or [])
    tables = {t.name: t for t in row_files.read_tables(tables_dir)}
    shards = {n: row_files.shard_count(t, max_file_bytes) for n, t in tables.items()}
    work = [(t, start, stop, offset, shards[n]) for n, t in tables.items() for start, stop, offset in row_files.chunks(t, every)]
    entries_dir = os.path.join(out_dir, ENTRIES_DIR)
    tf.io.gfile.makedirs(out_dir)
    with beam.Pipeline(options=PipelineOptions(beam_args or [])) as p:
        _ = (p
             | "Chunks" >> beam.Create(work)
             | "KeyAndCut" >> beam.FlatMap(_pieces)
             | "ByShard" >> beam.GroupByKey()
             | "SortAndWrite" >> beam.Map(_write, tables, shards, out_dir)
             | "Entries" >> beam.io.WriteToText(os.path.join(entries_dir, "entries"), file_name_suffix=".jsonl"))
    found: Dict[str, Dict[int, Dict[str, Any]]] = {}
    for path in tf.io.gfile.glob(os.path.join(entries_dir, "entries*")):
        with tf.io.gfile.GFile(path) as fh:
            for line in fh:
                e = json.loads(line)
                found.setdefault(e["table"], {})[e["shard"]] = e["entry"]
    tf.io.gfile.rmtree(entries_dir)
    out = {}
    for n, t in tables.items():
        files = []
        for s in range(shards[n]):
            if s not in found.get(n, {}):  # a shard no key hashed to: an empty file, as the local writer leaves
                path = os.path.join(named_file(out_dir, n, ""), row_files.part_name(s, shards[n]))
                found.setdefault(n, {})[s] = row_files.write_shard([], row_files.schema(t), path)
            files.append(found[n][s])
        out[n] = row_files.table_entry(t, shards[n], files)
    return row_files.write_manifest(out_dir, out)


def delta_runner(beam_args: Optional[List[str]] = None):
    """A `run` for `row_delta.write_delta` that runs its shard jobs on Beam's workers (one shard pair
    each), their results gathered through text files the driver reads back."""
    def run(old_dir: str, new_dir: str, out_dir: str, todo: List[Any]) -> List[Dict[str, Any]]:
        beam_runtime.ensure_local_runner_safe(beam_args or [])
        results_dir = os.path.join(out_dir, ENTRIES_DIR)
        with beam.Pipeline(options=PipelineOptions(beam_args or [])) as p:
            _ = (p
                 | "ShardPairs" >> beam.Create(todo)
                 | "Delta" >> beam.Map(lambda job: json.dumps(row_delta.shard_job(old_dir, new_dir, out_dir, job)))
                 | "Results" >> beam.io.WriteToText(os.path.join(results_dir, "results"), file_name_suffix=".jsonl"))
        out = []
        for path in tf.io.gfile.glob(os.path.join(results_dir, "results*")):
            with tf.io.gfile.GFile(path) as fh:
                out += [json.loads(line) for line in fh]
        tf.io.gfile.rmtree(results_dir)
        if len(out) != len(todo):
            raise row_files.RowFilesError(f"the Beam delta job returned {len(out)} shard results of {len(todo)}")
        return out

    return run


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Row files of an export's tables/, written by a Beam pipeline")
    ap.add_argument("--tables", required=True, help="the exporter's tables/ directory")
    ap.add_argument("--output", required=True, help="the row files' directory")
    ap.add_argument("--max-file-mib", type=int, default=row_files.DEFAULT_MAX_FILE_BYTES // 2**20)
    args, beam_args = ap.parse_known_args(argv)
    try:
        m = write_row_files_beam(args.tables, args.output, args.max_file_mib * 2**20, beam_args=beam_args)
    except row_files.RowFilesError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{m['rows']:,} rows of {len(m['tables'])} tables in {args.output} ({m['bytes']:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
