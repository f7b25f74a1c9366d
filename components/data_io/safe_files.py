"""Files a run writes into a directory a user may have planted links in: no write goes through a
symbolic link out of that directory.

`new_file` removes whatever is at a name (a link is removed, not followed) and creates the file
exclusively; `replace_text` writes a temporary name that way and renames it over the target, so
that a reader never sees a half-written file and a link at the target is replaced, not written
through. Python's `open(path, "w")` follows a link (and `os.replace` of a temporary file written
through one would already have written the link's target), which is why these exist.
"""
from __future__ import annotations

import os
from typing import IO

NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)


def new_file(path: str, mode: str = "wb") -> IO:
    """`path` opened for writing as a new file: whatever is there is removed, not followed.

    Args:
      path: the file.
      mode: "wb", or "w" for UTF-8 text.

    Returns:
      The open file.
    """
    if os.path.lexists(path):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NO_FOLLOW, 0o644)
    return os.fdopen(fd, mode, **({"encoding": "utf-8"} if "b" not in mode else {}))


def replace_text(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary name beside it and a rename.

    Args:
      path: the file (a link there is replaced by the file).
      text: its content.
    """
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with new_file(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
