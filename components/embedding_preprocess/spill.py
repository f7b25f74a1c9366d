"""Spill files of the vocabulary pass: one bundle's value counts of one hash bucket, every feature.

A bundle of the vocabulary pass counts its values (`counting.FeatureValueCounter`), cuts each
feature's counts by `counting.value_buckets` and writes one file per non-empty bucket; only the
file's path and the features in it cross the shuffle. One worker then reads every file of one
bucket and adds them up. Without this, Beam's local runner holds every bundle's partial counts in
its own memory between the two steps (its shuffle is in memory), and that grows with the rows:
about 1.2 GB in the runner at 20M rows, where most of 12M distinct values come once per bundle.

The file is an Arrow IPC file (random access per record batch, read without copying) with one record
batch per feature, in the order its reference lists them: `value` (binary), and `count` (int64
occurrences) or `weight` (float64 summed weights, `vocabulary.weight_column`), the other null. It is
written and read through Beam's FileSystems, so the spill directory can be local or on GCS.
"""
from __future__ import annotations

import os
import uuid
from typing import Iterator, Sequence, Tuple

import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from components.embedding_preprocess.counting import ValueCounts
from components.rows.row_counts import files_in

SCHEMA = pa.schema([("value", pa.binary()), ("count", pa.int64()), ("weight", pa.float64())])
SUFFIX = ".arrow"

# (path, the features of its record batches, in order): what a bundle emits per bucket
SpillRef = Tuple[str, Tuple[str, ...]]


def spill_path(directory: str, bucket: int) -> str:
    """A new file name for one bundle's counts of `bucket` (unique per bundle attempt: a retried
    bundle writes new files, and the failed attempt's files are never referenced)."""
    return os.path.join(directory, f"b{bucket:04d}-{uuid.uuid4().hex}{SUFFIX}")


def _batch(counts: ValueCounts) -> pa.RecordBatch:
    n = len(counts.values)
    if pa.types.is_integer(counts.counts.type):
        count, weight = counts.counts.cast(pa.int64()), pa.nulls(n, pa.float64())
    else:
        count, weight = pa.nulls(n, pa.int64()), counts.counts.cast(pa.float64())
    return pa.RecordBatch.from_arrays([counts.values.cast(pa.binary()), count, weight], schema=SCHEMA)


def write(path: str, parts: Sequence[Tuple[str, ValueCounts]]) -> SpillRef:
    """Writes `parts` ((feature, counts) in order) to `path`; returns the reference to it."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, SCHEMA) as writer:
        for _, counts in parts:
            writer.write_batch(_batch(counts))
    with FileSystems.create(path) as fh:
        fh.write(sink.getvalue().to_pybytes())
    return path, tuple(name for name, _ in parts)


def read(ref: SpillRef) -> Iterator[Tuple[str, ValueCounts]]:
    """(feature, counts) of each record batch of a spill file, in the order it was written."""
    path, names = ref
    with FileSystems.open(path) as fh:
        data = fh.read()
    reader = pa.ipc.open_file(pa.py_buffer(data))
    if reader.num_record_batches != len(names):
        raise ValueError(f"spill file {path}: {reader.num_record_batches} record batches, its reference names "
                         f"{len(names)} features; the file was cut or overwritten")
    for i, name in enumerate(names):
        batch = reader.get_batch(i)
        counts = batch.column(1) if batch.column(2).null_count == len(batch) else batch.column(2)
        yield name, ValueCounts(batch.column(0), counts)


def delete(directory: str) -> None:
    """Removes the spill files and their directory, if they exist. The files are matched and
    deleted one by one: object stores (GCS, S3) have no directories, so there `exists(directory)`
    is false while files under it exist."""
    files = files_in(directory)
    if files:
        FileSystems.delete(files)
    if FileSystems.exists(directory):  # a local directory, now empty
        FileSystems.delete([directory])
