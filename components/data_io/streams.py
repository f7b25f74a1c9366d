"""File objects of other libraries as standard Python streams.

Beam's file handles (`CompressedFile` has no `readinto` or `writable`, and its `closed` is a
method) and TensorFlow's `GFile` (no `closed` at all) are taken by `io.TextIOWrapper`, Python's csv
and pyarrow's readers for closed or unreadable files; wrapped here they read as any raw stream.
"""
from __future__ import annotations

import io


class RawReader(io.RawIOBase):
    """A readable raw stream over any file object with `read` (and, when `seekable`, `seek`/`tell`).

    Args:
      fh: the file object; closed with this stream.
      seekable: whether random access is offered (pyarrow's Parquet reader needs it; a
        decompressing stream does not offer it).
    """

    def __init__(self, fh, seekable: bool = False):
        super().__init__()
        self._fh = fh
        self._seekable = seekable

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._seekable

    def readinto(self, buffer) -> int:
        data = self._fh.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if not self._seekable:
            raise io.UnsupportedOperation("seek")
        self._fh.seek(offset, whence)
        return self._fh.tell()

    def tell(self) -> int:
        if not self._seekable:
            raise io.UnsupportedOperation("tell")
        return self._fh.tell()

    def close(self) -> None:
        if not self.closed:
            self._fh.close()
        super().close()
