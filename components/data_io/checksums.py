"""A file's SHA-256, one rule for every reader: the data generator knows its own CSV by it, and a
vocabulary file is recorded by it in the manifest and checked by it before a warm start carries
rows by line."""
from __future__ import annotations

import hashlib
from typing import IO, Callable

PIECE = 1 << 20  # bytes read at a time: memory does not grow with the file


def _local(path: str) -> IO[bytes]:
    return open(path, "rb")


def file_sha256(path: str, opener: Callable[[str], IO[bytes]] = _local) -> str:
    """The SHA-256 (hex) of a file's bytes.

    Args:
      path: the file.
      opener: opens a path for binary reading (default a local file; Beam's `FileSystems.open` or
        `tf.io.gfile.GFile(path, "rb")` for object stores).

    Returns:
      The hex digest.
    """
    digest = hashlib.sha256()
    with opener(path) as fh:
        for piece in iter(lambda: fh.read(PIECE), b""):
            digest.update(piece)
    return digest.hexdigest()
