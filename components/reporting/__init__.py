"""One report model and one renderer for every command-line tool of the product.

A `Report` is a title, aligned `label: text` rows (a row may be indented under the one above it)
and the data behind them. `render` prints the rows the same way for the pipeline, continuous
training, the preprocessing CLI and the exporter CLI; `--json` prints `data` instead, for
machines. `error_line` is the one line every tool prints when it fails.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, TextIO

LABEL_WIDTH = 22


@dataclass
class Report:
    title: str
    data: Dict[str, Any] = field(default_factory=dict)  # what --json prints
    rows: List[tuple] = field(default_factory=list)  # (indent, label, text)

    def add(self, label: str, text: Any) -> "Report":
        self.rows.append((0, label, str(text)))
        return self

    def sub(self, label: str, text: Any) -> "Report":
        """A row under the previous one (indented)."""
        self.rows.append((1, label, str(text)))
        return self


def render(report: Report) -> str:
    lines = [f"=== {report.title} ==="]
    for indent, label, text in report.rows:
        pad = "  " * indent
        head = f"{pad}{label}:" if label else pad
        width = max(LABEL_WIDTH, len(head) + 1)
        lines.append(f"{head:<{width}}{text}".rstrip())
    return "\n".join(lines)


def emit(report: Report, as_json: bool = False, stream: Optional[TextIO] = None) -> None:
    stream = stream or sys.stdout
    if as_json:
        json.dump(report.data, stream, indent=2, sort_keys=True, default=str)
        stream.write("\n")
    else:
        stream.write("\n" + render(report) + "\n")
    stream.flush()


def error_line(cause: str, where: Optional[str] = None, log: Optional[str] = None) -> str:
    """`error: <where> failed: <cause> (full log: <log>)` on one line."""
    first = (str(cause).strip().splitlines() or [""])[0]
    text = f"{where} failed: {first}" if where else first
    return f"error: {text}" + (f" (full log: {log})" if log else "")


def write_traceback(path: Optional[str], prefix: str) -> str:
    """The exception being handled, its traceback written to `path` (a local file beside the
    output), or to a temporary file named `<prefix>-*.log` when there is none or it cannot be
    written (a gs:// output, a missing folder); returns where it went."""
    import os
    import tempfile
    import traceback

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
    """{'train': 299730, 'eval': 75270} -> 'train 299,730, eval 75,270' (nested dicts summed)."""
    def total(v: Any) -> Any:
        return sum(total(x) for x in v.values()) if isinstance(v, dict) else v

    parts = []
    for k, v in counts.items():
        v = total(v)
        parts.append(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}")
    return ", ".join(parts) if parts else "none"


def reasons_list(counts: Dict[str, Any]) -> str:
    """Non-zero reasons only: {'missing_label': 3, 'invalid_label': 0} -> 'missing_label 3' ('none')."""
    flat: Dict[str, int] = {}

    def walk(prefix: str, v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}{k}" if not prefix else f"{prefix}/{k}", x)
        elif v:
            flat[prefix] = v

    walk("", counts)
    return ", ".join(f"{k} {v:,}" for k, v in flat.items()) if flat else "none"
