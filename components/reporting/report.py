"""One report model and one renderer for every command-line tool of the product.

A `Report` is a title, aligned `label: text` rows (a row may be indented under the one above it)
and the data behind them. `render` prints the rows the same way for the pipeline, continuous
training, the preprocessing CLI and the exporter CLI; `--json` prints `data` instead, for
machines. `error_line` is the one line every tool prints when it fails; `kept_model` is how
every report names the checkpoint a run kept as its model.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, TextIO

LABEL_WIDTH = 22

# How the Trainer chose the checkpoint it kept as the model (training_run.json and eval_metrics.json
# `model_choice`); every report names that model with `kept_model`.
KEPT_BEST = "best on the held-out slice"
KEPT_LAST = "the last step"


def kept_model(step: int, choice: str) -> str:
    """Names the model a run kept, as the progress line, the summary and the run report say it.

    Args:
      step: the training step of the kept checkpoint.
      choice: how it was chosen (`KEPT_BEST`, `KEPT_LAST`).

    Returns:
      E.g. `the kept model (step 400, best on the held-out slice)`.
    """
    return f"the kept model (step {int(step):,}, {choice})"


@dataclass
class Report:
    """A titled list of aligned `label: text` rows, and the data `--json` prints instead.

    Attributes:
      title: printed as `=== title ===`.
      data: what `--json` prints.
      rows: (indent, label, text) in order; indent 1 sits under the row above.
    """

    title: str
    data: Dict[str, Any] = field(default_factory=dict)
    rows: List[tuple] = field(default_factory=list)

    def add(self, label: str, text: Any) -> "Report":
        """Appends a row.

        Args:
          label: the row's label (empty: the text alone).
          text: the row's text (`str()` of it).

        Returns:
          This report, to chain calls.
        """
        self.rows.append((0, label, str(text)))
        return self

    def sub(self, label: str, text: Any) -> "Report":
        """Appends a row indented under the previous one.

        Args:
          label: the row's label.
          text: the row's text (`str()` of it).

        Returns:
          This report, to chain calls.
        """
        self.rows.append((1, label, str(text)))
        return self


def render(report: Report) -> str:
    """The report as text: its title line, then one line per row, texts aligned.

    Args:
      report: the report.

    Returns:
      Lines joined by newlines, no trailing newline.
    """
    lines = [f"=== {report.title} ==="]
    for indent, label, text in report.rows:
        pad = "  " * indent
        head = f"{pad}{label}:" if label else pad
        width = max(LABEL_WIDTH, len(head) + 1)
        lines.append(f"{head:<{width}}{text}".rstrip())
    return "\n".join(lines)


def emit(report: Report, as_json: bool = False, stream: Optional[TextIO] = None) -> None:
    """Writes the report, as text or as its data in JSON.

    Args:
      report: the report.
      as_json: write `report.data` as indented JSON instead of the rows.
      stream: where to write (default stdout).
    """
    stream = stream or sys.stdout
    if as_json:
        json.dump(report.data, stream, indent=2, sort_keys=True, default=str)
        stream.write("\n")
    else:
        stream.write("\n" + render(report) + "\n")
    stream.flush()


def error_line(cause: str, where: Optional[str] = None, log: Optional[str] = None) -> str:
    """The one line a tool prints when it fails.

    Args:
      cause: the failure (an exception or text); only its first line is kept.
      where: what failed, e.g. a component's name.
      log: the full log's path.

    Returns:
      `error: <where> failed: <cause> (full log: <log>)`, the parts given.
    """
    first = (str(cause).strip().splitlines() or [""])[0]
    text = f"{where} failed: {first}" if where else first
    return f"error: {text}" + (f" (full log: {log})" if log else "")


def write_traceback(path: Optional[str], prefix: str) -> str:
    """Writes the traceback of the exception being handled to a file.

    Args:
      path: a local file beside the output; None, or one that cannot be written (a gs:// output,
        a missing folder), sends it to a temporary file instead.
      prefix: the temporary file's name starts with `<prefix>-` (and ends with `.log`).

    Returns:
      The path the traceback went to.
    """
    try:
        fh = open(path, "w", encoding="utf-8") if path else None
    except OSError:
        fh = None
    if fh is None:
        fd, path = tempfile.mkstemp(prefix=prefix + "-", suffix=".log")
        fh = os.fdopen(fd, "w", encoding="utf-8")
    with fh:
        traceback.print_exc(file=fh)
    return path


def count_list(counts: Dict[str, Any]) -> str:
    """Counts per name as text, nested dicts summed.

    Args:
      counts: name -> count, or name -> nested dict of counts.

    Returns:
      E.g. {'train': 299730, 'eval': 75270} -> 'train 299,730, eval 75,270'; 'none' when empty.
    """
    def total(v: Any) -> Any:
        return sum(total(x) for x in v.values()) if isinstance(v, dict) else v

    parts = []
    for k, v in counts.items():
        v = total(v)
        parts.append(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}")
    return ", ".join(parts) if parts else "none"


def reasons_list(counts: Dict[str, Any]) -> str:
    """The non-zero counts of a (nested) dict of reasons as text, paths joined by `/`.

    Args:
      counts: reason -> count, or name -> nested dict of reasons.

    Returns:
      E.g. {'missing_label': 3, 'invalid_label': 0} -> 'missing_label 3'; 'none' when all are zero.
    """
    flat: Dict[str, int] = {}

    def walk(prefix: str, v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}{k}" if not prefix else f"{prefix}/{k}", x)
        elif v:
            flat[prefix] = v

    walk("", counts)
    return ", ".join(f"{k} {v:,}" for k, v in flat.items()) if flat else "none"


MAX_LISTED = 20  # input entries not read, recorded by name (ExampleGen's ledger); more are counted


def skipped_line(skipped: Sequence[Dict[str, str]]) -> str:
    """Input entries not read, in one line: `._a.csv (hidden name ...), b.CSV (not *.csv)`.

    Args:
      skipped: {"path", "reason"} entries (components/example_gen/input_folder.py).

    Returns:
      The line (at most MAX_LISTED named).
    """
    shown = ", ".join(f"{os.path.basename(e['path'].rstrip('/'))} ({e['reason']})" for e in skipped[:MAX_LISTED])
    return shown + (f", and {len(skipped) - MAX_LISTED} more" if len(skipped) > MAX_LISTED else "")
