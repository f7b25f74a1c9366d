"""Examples split files as serialized tf.Examples, whatever their payload: Parquet (this project's
ExampleGen) is encoded row by row with tfx_bsl's encoder, TFRecords of tf.Examples (TFX's own
ExampleGens) are read as they are. For the few places that need what a serving client sends: the
exporter's parity and AUC sample, the serving benchmarks and tests."""
from __future__ import annotations

import os
from typing import List

import pyarrow.parquet as pq
import tensorflow as tf
from apache_beam.io.filesystems import FileSystems
from tfx_bsl.coders import example_coder

from components.config.choices import FORMAT_BLOCKS
from components.contracts.manifest import TAIL_PREFIX
from components.data_io.tfrecords import compression_type
from components.data_io.blocks import from_blocks


def is_parquet(files: List[str]) -> bool:
    """Whether a split's files are Parquet (else TFRecords of tf.Examples).

    Args:
      files: the split's files.

    Returns:
      True for Parquet files.

    Raises:
      ValueError: the files mix both kinds.
    """
    kinds = {str(f).endswith(".parquet") for f in files}
    if len(kinds) > 1:
        raise ValueError(f"mixed Parquet and TFRecord files, e.g. {sorted(files)[:2]}; keep one kind per split")
    return kinds == {True}


def serialized_examples(file_pattern: str, limit: int) -> List[bytes]:
    """Reads serialized tf.Examples from an Examples split, whatever its payload.

    Args:
      file_pattern: the split's files (Parquet, or TFRecords of tf.Examples).
      limit: at most this many.

    Returns:
      Up to `limit` serialized tf.Examples, in file order.

    Raises:
      ValueError: the pattern matches Parquet and TFRecord files both, or gzipped and plain
        TFRecords.
    """
    files = sorted(tf.io.gfile.glob(file_pattern))
    if not files:
        return []
    out: List[bytes] = []
    if is_parquet(files):
        encoder = example_coder.RecordBatchToExamplesEncoder()
        for path in files:
            with FileSystems.open(path) as fh:  # local or gs://, seekable (pyarrow reads the footer first)
                for rb in pq.ParquetFile(fh).iter_batches(batch_size=4096):
                    out += encoder.encode(rb.slice(0, limit - len(out)))
                    if len(out) >= limit:
                        return out
        return out
    for record in tf.data.TFRecordDataset(files, compression_type=compression_type(files)).take(limit):
        out.append(record.numpy())
    return out


def block_records_as_rows(manifest, records: List[bytes]) -> List[bytes]:
    """Serialized block records (`transformed_examples.format: blocks`) cut back into one serialized
    tf.Example per row (`blocks.from_blocks`).

    Args:
      manifest: the preprocessing manifest (`VocabularyManifest`): the blocks' layout.
      records: serialized block records.

    Returns:
      The rows' serialized tf.Examples, block by block in order.
    """
    if len(records) == 0:  # a list or a numpy array of records
        return []
    decoder, encoder = example_coder.ExamplesToRecordBatchDecoder(), example_coder.RecordBatchToExamplesEncoder()
    return encoder.encode(from_blocks(manifest, decoder.DecodeBatch(list(records))))


def transformed_rows(file_pattern: str, manifest, limit: int) -> List[bytes]:
    """Reads transformed rows as serialized tf.Examples, whatever `transformed_examples.format` wrote.

    The result is what the Trainer's SavedModel signature on transformed examples takes. Blocks
    are decoded and cut back into rows (`blocks.from_blocks`).

    Args:
      file_pattern: the transformed split's files.
      manifest: the preprocessing manifest (`VocabularyManifest`): it says how the rows were written.
      limit: at most this many rows.

    Returns:
      Up to `limit` serialized tf.Examples, in file order.

    Raises:
      ValueError: rows not written as blocks, in a split that mixes Parquet and TFRecord files
        or gzipped and plain ones.
    """
    if manifest.transformed_format != FORMAT_BLOCKS:
        return serialized_examples(file_pattern, limit)
    files = sorted(tf.io.gfile.glob(file_pattern), key=lambda f: (os.path.basename(f).startswith(TAIL_PREFIX), f))
    out: List[bytes] = []
    for path in files:
        for batch in tf.data.TFRecordDataset([path], compression_type=compression_type([path])).batch(64):
            out += block_records_as_rows(manifest, batch.numpy())
            if len(out) >= limit:
                return out[:limit]
    return out
