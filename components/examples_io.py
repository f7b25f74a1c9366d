"""Examples split files as serialized tf.Examples, whatever their payload: Parquet (this project's
ExampleGen) is encoded row by row with tfx_bsl's encoder, TFRecords of tf.Examples (TFX's own
ExampleGens) are read as they are. For the few places that need what a serving client sends: the
exporter's parity and AUC sample, the serving benchmarks and tests."""
from __future__ import annotations

from typing import List


def _is_parquet(files: List[str]) -> bool:
    kinds = {str(f).endswith(".parquet") for f in files}
    if len(kinds) > 1:
        raise ValueError(f"mixed Parquet and TFRecord files, e.g. {sorted(files)[:2]}; keep one kind per split")
    return kinds == {True}


def serialized_examples(file_pattern: str, limit: int) -> List[bytes]:
    """Up to `limit` serialized tf.Examples of the files matching `file_pattern`, in file order."""
    import tensorflow as tf

    files = sorted(tf.io.gfile.glob(file_pattern))
    if not files:
        return []
    out: List[bytes] = []
    if _is_parquet(files):
        import pyarrow.parquet as pq
        from apache_beam.io.filesystems import FileSystems
        from tfx_bsl.coders import example_coder

        encoder = example_coder.RecordBatchToExamplesEncoder()
        for path in files:
            with FileSystems.open(path) as fh:  # local or gs://, seekable (pyarrow reads the footer first)
                for rb in pq.ParquetFile(fh).iter_batches(batch_size=4096):
                    out += encoder.encode(rb.slice(0, limit - len(out)))
                    if len(out) >= limit:
                        return out
        return out
    from components.tfrecords import compression_type

    for record in tf.data.TFRecordDataset(files, compression_type=compression_type(files)).take(limit):
        out.append(record.numpy())
    return out
