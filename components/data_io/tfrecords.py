"""TFRecord files as this project writes them: plain, or gzipped with a `.gz` suffix.

Preprocessing writes one Beam element per *batch* of records (the records already framed as
TFRecord bytes) instead of one element per record: Beam's per-element work (windowed values,
per-record sink calls, two pure-Python-dispatched CRCs per record) cost more than encoding the
examples. The Beam sink that writes such blocks is `beam_pipeline.FramedTFRecordSink` (this module
stays free of Beam: the trainer and the exporter read `compression_type`). Framing here follows the TFRecord format (tensorflow/core/lib/io/record_writer.h):
uint64 little-endian length, masked CRC32C of the length, the bytes, masked CRC32C of the bytes.
"""
from __future__ import annotations

import struct
from typing import Iterable, Sequence

import google_crc32c  # C (hardware-accelerated) CRC32C; a dependency of the Google Cloud clients


def compression_type(files: Sequence[str]) -> str:
    """tf.data's compression_type for a split's files.

    Args:
      files: the split's TFRecord paths.

    Returns:
      `"GZIP"` when every file ends in `.gz`, `""` when none does.

    Raises:
      ValueError: some files are gzipped and some are not.
    """
    gz = {str(f).endswith(".gz") for f in files}
    if len(gz) > 1:
        raise ValueError(f"mixed gzipped and plain TFRecord files, e.g. {sorted(files)[:2]}; keep one kind per split")
    return "GZIP" if gz == {True} else ""


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(records: Iterable[bytes]) -> bytes:
    """Frames records as TFRecord file bytes (concatenations of framed blocks are valid files).

    Args:
      records: serialized records, in order.

    Returns:
      Each record as length, masked CRC32C of the length, the bytes, masked CRC32C of the bytes.
    """
    parts = []
    for r in records:
        length = struct.pack("<Q", len(r))
        parts.append(length)
        parts.append(struct.pack("<I", _masked_crc(length)))
        parts.append(r)
        parts.append(struct.pack("<I", _masked_crc(r)))
    return b"".join(parts)
