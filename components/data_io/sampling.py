"""Samples of an Examples split drawn across the whole split, whatever the order of its rows.

The rows of a split are in the order of its input: a new user's logs sorted by time, or by label,
put one class (or one day) first. A sample read from the first rows then measures that part only
(its AUC can be undefined: one label). `sample_examples` draws from every part of the split,
deterministically for a seed, and returns the rows in a seeded random order, so that any prefix of
the sample (the exporter's parity rows) is itself spread across the split:
- Parquet (this project's ExampleGen): the split's rows are counted from the files' footers, cut into
  `blocks` equal strata, and a run of contiguous rows at a seeded random place in each stratum is
  read (stratified cluster sampling). Only the row groups those runs touch are decoded, and only
  the sampled rows encoded as tf.Examples, so the cost is bounded by `blocks` row groups whatever
  the split's size (20M rows included); memory holds one row group and the sample.
- TFRecords of tf.Examples (TFX's own ExampleGens): no random access, so one pass over every record
  with seeded reservoir sampling (Vitter's algorithm R, vectorised per batch); memory holds the
  sample.
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf
from apache_beam.io.filesystems import FileSystems
from tfx_bsl.coders import example_coder

from components.config.choices import FORMAT_BLOCKS
from components.data_io.examples_io import block_records_as_rows, is_parquet
from components.data_io.tfrecords import compression_type

# Strata of a Parquet sample: the number of places a sample is read from (each a run of rows).
SAMPLE_BLOCKS = 256
_RESERVOIR_BATCH = 4096


def sample_examples(file_pattern: str, size: int, seed: int, blocks: int = SAMPLE_BLOCKS) -> List[bytes]:
    """Serialized tf.Examples drawn across the whole split, in a seeded random order.

    Args:
      file_pattern: the split's files (Parquet, or TFRecords of tf.Examples, plain or gzipped).
      size: how many rows to draw; a split of at most this many rows is returned whole.
      seed: the draw's seed: the same seed and files give the same rows in the same order.
      blocks: Parquet only: how many places (strata) the rows are read from.

    Returns:
      min(size, rows in the split) serialized tf.Examples.

    Raises:
      ValueError: `size` or `blocks` is not positive, or the pattern matches Parquet and TFRecord
        files both.
    """
    if size <= 0 or blocks <= 0:
        raise ValueError(f"sample size {size} and blocks {blocks} must be positive")
    files = sorted(tf.io.gfile.glob(file_pattern))
    if not files:
        return []
    rng = np.random.default_rng(seed)
    out = _parquet_sample(files, size, blocks, rng) if is_parquet(files) else _reservoir_sample(files, size, rng)
    return [out[i] for i in rng.permutation(len(out))]


def sample_transformed_rows(file_pattern: str, manifest, size: int, seed: int) -> List[bytes]:
    """Transformed rows drawn across a split as serialized tf.Examples (what the Trainer's signature
    takes), whatever `transformed_examples.format` wrote.

    Records are drawn by `sample_examples`; rows written as blocks are drawn a block at a time:
    `size` blocks, cut back into rows (`examples_io.block_records_as_rows`), of which `size` are kept
    at random.

    Args:
      file_pattern: the transformed split's files.
      manifest: the preprocessing manifest (`VocabularyManifest`): how the rows were written.
      size: how many rows.
      seed: the draw's seed (the same seed and split give the same rows).

    Returns:
      min(size, rows in the split) serialized tf.Examples.
    """
    records = sample_examples(file_pattern, size, seed)
    if manifest.transformed_format != FORMAT_BLOCKS:
        return records
    rows = block_records_as_rows(manifest, records)
    keep = np.random.default_rng(seed).choice(len(rows), min(size, len(rows)), replace=False)
    return [rows[i] for i in keep]


def stratified_runs(total: int, size: int, blocks: int, rng: np.random.Generator) -> List[Tuple[int, int]]:
    """The rows a sample of `size` out of `total` takes: one run of contiguous rows per stratum.

    Args:
      total: rows in the split.
      size: rows to take.
      blocks: strata (at most `size` are used).
      rng: the seeded generator that places each run in its stratum.

    Returns:
      [(first row, rows)] in row order, the rows adding up to min(size, total).
    """
    if total <= size:
        return [(0, total)] if total else []
    n = min(blocks, size)
    edges = [j * total // n for j in range(n + 1)]
    runs = []
    for j in range(n):
        take = size // n + (1 if j < size % n else 0)
        lo, hi = edges[j], edges[j + 1]
        take = min(take, hi - lo)
        runs.append((lo + int(rng.integers(0, hi - lo - take + 1)), take))
    return runs


def _parquet_sample(files: List[str], size: int, blocks: int, rng: np.random.Generator) -> List[bytes]:
    """The stratified runs of a Parquet split, reading only the row groups they touch."""
    groups: List[Tuple[int, int, int]] = []  # (file index, row group, first row of the split)
    total = 0
    for i, path in enumerate(files):
        with FileSystems.open(path) as fh:
            md = pq.ParquetFile(fh).metadata
            for g in range(md.num_row_groups):
                groups.append((i, g, total))
                total += md.row_group(g).num_rows
    wanted = np.concatenate([np.arange(first, first + n, dtype=np.int64)
                             for first, n in stratified_runs(total, size, blocks, rng)] or [np.zeros(0, np.int64)])
    starts = np.asarray([s for _, _, s in groups] + [total], dtype=np.int64)
    group_of = np.searchsorted(starts, wanted, side="right") - 1
    encoder = example_coder.RecordBatchToExamplesEncoder()
    out: List[bytes] = []
    by_file: dict = {}
    for k in np.unique(group_of):
        by_file.setdefault(groups[k][0], []).append(int(k))
    for i, ks in sorted(by_file.items()):
        with FileSystems.open(files[i]) as fh:  # local or gs://, seekable (pyarrow reads the footer first)
            pf = pq.ParquetFile(fh)
            for k in ks:
                rows = wanted[group_of == k] - groups[k][2]
                table = pf.read_row_group(groups[k][1]).take(pa.array(rows))
                for rb in table.combine_chunks().to_batches():
                    out += encoder.encode(rb)
    return out


def _reservoir_sample(files: List[str], size: int, rng: np.random.Generator) -> List[bytes]:
    """Algorithm R over every record of the TFRecord files, one batch of draws at a time."""
    reservoir: List[bytes] = []
    seen = 0
    ds = tf.data.TFRecordDataset(files, compression_type=compression_type(files)).batch(_RESERVOIR_BATCH)
    for batch in ds.as_numpy_iterator():
        batch = list(batch)
        fill = min(size - len(reservoir), len(batch))
        reservoir += batch[:fill]
        rest = batch[fill:]
        if rest:
            # record t (0-based over the split) replaces a random slot with probability size / (t + 1)
            t = seen + fill + np.arange(len(rest), dtype=np.int64)
            slots = (rng.random(len(rest)) * (t + 1)).astype(np.int64)
            for j in np.nonzero(slots < size)[0]:
                reservoir[slots[j]] = rest[j]
        seen += len(batch)
    return reservoir
