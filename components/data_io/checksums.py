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


# A sampled fingerprint (`sampled_fingerprint`): windows of a file's bytes, head and tail among them.
WINDOW = 1 << 16
WINDOWS = 8


def _windows(size: int) -> list:
    """Offsets of the WINDOW-byte windows of a file of `size` bytes that its fingerprint reads: the
    whole file when it is small, else WINDOWS windows spread from its head to its tail."""
    if size <= WINDOW * WINDOWS:
        return list(range(0, size, WINDOW))
    return [round(i * (size - WINDOW) / (WINDOWS - 1)) for i in range(WINDOWS)]


def sampled_fingerprint(path: str, size: int, opener: Callable[[str], IO[bytes]] = _local) -> str:
    """The SHA-256 (hex) of a file's size and of windows of its bytes: all of a file up to 512 KiB;
    8 windows of 64 KiB of a larger one, its first and last bytes among them. What identifies a
    run's data (components/data_io/data_identity.py), read in constant time whatever the file's size:
    it tells files of other rows apart, not a same-sized edit between its windows.

    Args:
      path: the file.
      size: its size in bytes.
      opener: as `file_sha256`'s.

    Returns:
      The hex digest.
    """
    digest = hashlib.sha256(f"{size}\0".encode())
    with opener(path) as fh:
        for offset in _windows(size):
            fh.seek(offset)
            digest.update(fh.read(WINDOW))
    return digest.hexdigest()
