"""A file's SHA-256, one rule for every reader: the data generator knows its own CSV by it, and a
vocabulary file is recorded by it in the manifest and checked by it before a warm start carries
rows by line. Input files are known by every byte in blocks hashed where ExampleGen's workers
read them (`block_digests`, `content_fingerprint`), or by a sample of their bytes where no worker
reads them whole (`sampled_fingerprint`: Parquet)."""
from __future__ import annotations

import hashlib
from typing import IO, Callable, Iterable, List, Optional, Tuple

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


# Every byte (`content_fingerprint`): the SHA-256 of each BLOCK-byte block at its offset in the
# file, then of the blocks' digests in order. The blocks are aligned to the file, not to the byte
# ranges ExampleGen cuts it into, so any cut hashes the same blocks: each range's worker hashes
# the blocks that start inside it (reading at most one block past its end), and the driver
# combines them. Written by hand: hashlib has no digest that combines pieces hashed apart.
BLOCK = 1 << 22


def block_digests(path: str, start: int, end: Optional[int], opener: Callable[[str], IO[bytes]] = _local,
                  block: int = BLOCK, range_bytes: Optional[Callable[[bytes], None]] = None) -> List[Tuple[int, str]]:
    """(block index, SHA-256 hex) of every block of `path` that starts in [start, end).

    Args:
      path: the file.
      start: the first byte of the range.
      end: the range's end (exclusive); None: the file's end.
      opener: opens a path for binary reading, the raw bytes (no decompression).
      block: the block size (BLOCK; smaller in tests).
      range_bytes: None, or called with the range's own bytes [start, end) in order, in the same
        read (which then starts at `start`, not at the first block): ExampleGen counts a CSV
        range's quotes by it.

    Returns:
      The blocks in order; none for a range in which no block starts.
    """
    out: List[Tuple[int, str]] = []
    inside = lambda offset: end is None or offset < end  # noqa: E731
    pos = start if range_bytes is not None else -(-start // block) * block  # or the first block
    digest = hashlib.sha256()
    with opener(path) as fh:
        fh.seek(pos)
        while True:
            k = pos // block
            hashed = start <= k * block and inside(k * block)  # this byte's block starts in the range
            counted = range_bytes is not None and inside(pos)
            if not (hashed or counted):
                break
            if hashed and pos == k * block:
                digest = hashlib.sha256()
            # each read lies in one block, and wholly inside or past the range
            stop = min((k + 1) * block, pos + PIECE, end if counted and end is not None else (k + 1) * block)
            piece = fh.read(stop - pos)
            if counted:
                range_bytes(piece)
            if hashed:
                digest.update(piece)
            short = len(piece) < stop - pos  # the file ends here
            pos += len(piece)
            if hashed and pos > k * block and (short or pos == (k + 1) * block):
                out.append((k, digest.hexdigest()))
            if short:
                return out
    return out


def content_fingerprint(size: int, digests: Iterable[Tuple[int, str]], block: int = BLOCK) -> str:
    """The SHA-256 (hex) of a file's size and of its blocks' digests in order (`block_digests`).

    Raises:
      ValueError: a block was hashed twice or not at all (the ranges did not cover the file).
    """
    got = {}
    for k, hexdigest in digests:
        if k in got:
            raise ValueError(f"block {k} of a {size}-byte file was hashed twice")
        got[k] = hexdigest
    n = -(-size // block)
    if sorted(got) != list(range(n)):
        missing = sorted(set(range(n)) - set(got))[:5]
        raise ValueError(f"blocks {missing} of a {size}-byte file ({n} blocks) were not hashed, or blocks beyond it were")
    digest = hashlib.sha256(f"{size}\0".encode())
    for k in range(n):
        digest.update(bytes.fromhex(got[k]))
    return digest.hexdigest()
