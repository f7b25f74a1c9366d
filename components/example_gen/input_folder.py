"""Which of the files an input pattern matches are read, and what in its folder is not, said aloud.

- **Not a regular file** (a FIFO named `x.csv`, a device, a socket): refused in one line naming
  it. Opening a FIFO to peek at its first bytes waits for a writer forever: the run hung.
- **Hidden names** (`.x`, `_x`: macOS's `._x.csv` resource forks, `_SUCCESS`, `.crc` files) are
  skipped, in every format, by the rule of pyarrow.dataset's default `ignore_prefixes`, unless
  `input.path` names the file itself. A `._x.csv` was read as CSV and failed the run without
  naming the file.
- **What the folder holds that the pattern leaves out** (`x.CSV`, `x.csv.gz` under `*.csv`, a
  subfolder): listed, so that a file left out is never left out without a word.

ExampleGen's executor records both lists in its ledger stage (`files_skipped`), prints them as a
progress line, and the summary shows them; the command line's check before a run applies the same
rule (input_checks.input_files).
"""
from __future__ import annotations

import fnmatch
import os
import stat
from typing import Dict, List, Sequence, Tuple

from apache_beam.io.filesystems import FileSystems

from components.reporting.errors import InputError

GLOB_CHARACTERS = ("*", "?", "[")
HIDDEN = "hidden name (starting with '.' or '_'; e.g. macOS's ._ files, _SUCCESS)"

_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def is_hidden(path: str) -> bool:
    """A name data lakes and file managers keep beside data (`_SUCCESS`, `.crc`, `._x.csv`)."""
    return os.path.basename(path.rstrip("/")).startswith(("_", "."))


def special_kind(path: str) -> str:
    """What a local path is when it is not a regular file or a folder ('' otherwise, and for remote paths)."""
    if "://" in path:
        return ""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""
    return next((kind for test, kind in _SPECIAL if test(mode)), "")


def screen(files: Sequence[Tuple[str, int]], pattern: str) -> Tuple[List[Tuple[str, int]], List[Dict[str, str]]]:
    """The files to read of those `pattern` matched, and those skipped with why.

    Args:
      files: (path, size) of every match.
      pattern: the pattern that matched them (a name without glob characters names its file
        itself: read even when hidden).

    Returns:
      (kept, skipped): skipped entries are {"path", "reason"}.

    Raises:
      InputError: a match is not a regular file (module docstring).
    """
    exact = not any(c in pattern for c in GLOB_CHARACTERS)
    kept, skipped = [], []
    for path, size in files:
        kind = special_kind(path)
        if kind:
            raise InputError(f"input file {path} is {kind}, not a regular file: reading it would wait or fail; move it "
                             "out of the input folder, or narrow input.path to the data files")
        if not exact and is_hidden(path):
            skipped.append({"path": path, "reason": HIDDEN})
        else:
            kept.append((path, size))
    return kept, skipped


def left_out(base: str, pattern: str, matched: Sequence[str]) -> List[Dict[str, str]]:
    """What the input folder holds that a one-level pattern (`*.csv`) does not match.

    Args:
      base: the input folder.
      pattern: the file pattern inside it; a pattern reaching into subfolders lists nothing.
      matched: the paths it matched.

    Returns:
      {"path", "reason"} of each entry left out, hidden names apart (they are not data).
    """
    if "/" in pattern or not any(c in pattern for c in GLOB_CHARACTERS):
        return []
    if "://" in base:
        found = [m.path for m in FileSystems.match([base.rstrip("/") + "/*"])[0].metadata_list]
    elif os.path.isdir(base):
        found = [os.path.join(base, n) for n in os.listdir(base)]
    else:
        return []
    seen = set(matched)
    out = []
    for path in sorted(found):
        if path in seen or is_hidden(path) or fnmatch.fnmatchcase(os.path.basename(path), pattern):
            continue
        what = "a folder (not read: name its files with a glob)" if os.path.isdir(path) else f"not {pattern}"
        out.append({"path": path, "reason": what})
    return out
