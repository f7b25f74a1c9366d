"""A full disk, a quota or a file-size limit met while a stage writes, as one line that names the
stage, where it was writing and what to do.

A Beam worker's failure reaches the executor as the runner's `RuntimeError` holding the worker's
traceback as text; a write in the executor itself raises `OSError`. `out_of_space_named` finds
ENOSPC, EDQUOT or EFBIG in either (the exception chain's errno, or the text's `[Errno 28]`) and
raises `OutOfSpaceError` instead, whose message the pipeline's command line prints as its one
`error:` line. TFX's launcher removes a failed execution's outputs and never publishes them, so
nothing of the failed attempt is reused; a rerun with space starts the stage again.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from contextlib import contextmanager
from typing import Iterator, Optional

SPACE_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large",
}
# `[Errno 28]` (Python), `[errno 28]` (Arrow's "Detail:"), or the C library's text alone, as it
# spells it (TensorFlow's file IO): "No space left on device", "File too large", "Disk quota exceeded".
_ERRNO_TEXT = re.compile(r"\[errno (\d+)\]", re.IGNORECASE)
_STRERROR_TEXT = {os.strerror(code): code for code in SPACE_ERRNOS}
# SQLite's words for SQLITE_FULL (ML Metadata's local store): a write that found the disk full.
SQLITE_FULL = "database or disk is full"


class OutOfSpaceError(OSError):
    """A stage could not write its output: the disk (or a quota) is full, or a file grew past a
    file-size limit. The message is one line naming the stage, the path and what to do."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.errno = code

    def __str__(self) -> str:
        return self.args[0]


def space_errno(e: BaseException) -> Optional[int]:
    """ENOSPC, EDQUOT or EFBIG when `e` (or an exception it was raised from) is a write that ran
    out of space, by its errno or by its text (a Beam worker's traceback); None otherwise."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in SPACE_ERRNOS:
            return e.errno
        text = str(e)
        for m in _ERRNO_TEXT.finditer(text):
            if int(m.group(1)) in SPACE_ERRNOS:
                return int(m.group(1))
        for words, code in _STRERROR_TEXT.items():
            if words in text:
                return code
        e = e.__cause__ or e.__context__
    return None


def _free_bytes(path: str) -> Optional[int]:
    """Free bytes on the local disk holding `path` (its nearest existing folder); None for a remote path."""
    if "://" in path:
        return None
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def message(stage: str, path: str, code: int) -> str:
    """The one line for a stage that ran out of space while writing under `path`."""
    free = _free_bytes(path)
    room = f" ({free / 1e6:,.1f} MB free after the failed write)" if free is not None and code == errno.EFBIG else ""
    if code == errno.EFBIG:
        what = ("a file grew past the largest size allowed (the process's file-size limit, `ulimit -f`, "
                "or the filesystem's)")
        fix = "raise the limit or write to another filesystem"
    else:
        what = "the disk is full" if code == errno.ENOSPC else "the disk quota is used up"
        fix = "free space there or point the output at a larger disk"
    return (f"{stage}: {SPACE_ERRNOS[code]} (errno {code}) while writing under {path}: {what}{room}; "
            f"{fix}, then rerun (nothing of this attempt is kept or reused)")


def store_full(e: BaseException) -> bool:
    """Whether `e` (or an exception it was raised from) is SQLite's SQLITE_FULL."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if SQLITE_FULL in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


@contextmanager
def out_of_space_named(stage: str, path: str) -> Iterator[None]:
    """Turns a failure that ran out of space into `OutOfSpaceError`; other failures pass unchanged.

    Args:
      stage: the stage's name, e.g. `EmbeddingExampleGen`.
      path: where the stage writes (its output artifact's folder).

    Raises:
      OutOfSpaceError: the body failed with ENOSPC, EDQUOT or EFBIG (in a Beam worker or here).
    """
    try:
        yield
    except OutOfSpaceError:
        raise
    except Exception as e:  # noqa: BLE001 - only those that ran out of space are renamed; others re-raised as they are
        code = space_errno(e)
        if code is None:
            raise
        raise OutOfSpaceError(message(stage, path, code), code) from e
