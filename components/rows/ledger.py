"""The row ledger: rows in and rows out of every stage, by reason, and the checks that they add up.

One stage entry per stage, in order:
- `EmbeddingExampleGen`: the input's data rows (counted by `row_counts`, not by the parser) =
  malformed rows (by reason) + rows parsed; rows parsed = rows dropped (by reason) + rows written;
  rows written = the records found in the written split files (counted again after the write).
- `EmbeddingPreprocess`: per split, rows read = the rows ExampleGen wrote to that split (when the
  upstream ledger is known); rows read = rows dropped (by reason) + rows written; rows written = the
  records found in the transformed files.
A stage whose sums fail gets `balanced: false` and its `problems` name the sum and the missing
count; `check_stage` raises LedgerError with them. The trainer and the exporter refuse an input whose
ledger is not balanced. Pure Python: no Beam, no TensorFlow.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from components.reporting.errors import LedgerError
from components.reporting.progress import EXAMPLE_GEN, PREPROCESS  # the stages' names are the ledger's stage names

LEDGER_FILE = "ledger.json"
LEDGER_VERSION = 1


def _by_prefix(counts: Dict[str, Any], prefix: str) -> Dict[str, int]:
    return {k[len(prefix):]: int(v) for k, v in sorted(counts.items()) if k.startswith(prefix) and not isinstance(v, list)}


def _equal(problems: List[str], what: str, left: int, right: int, left_name: str, right_name: str) -> None:
    if left != right:
        diff = left - right
        problems.append(
            f"{what}: {left_name} {left:,} != {right_name} {right:,} "
            f"({abs(diff):,} rows {'missing' if diff > 0 else 'more than expected'})"
        )


def example_gen_stage(counts: Dict[str, Any], written_files: Dict[str, int]) -> Dict[str, Any]:
    """Builds the ExampleGen stage entry and checks that its sums add up.

    Args:
      counts: the Beam counters (`beam_io`), by name (`input/data_rows`, `rows/parsed`,
        `rows/malformed/<reason>`, `rows/dropped/<reason>`, `rows/written`, ...).
      written_files: the records found in the written files, per split.

    Returns:
      The stage entry: rows in, parsed, malformed and dropped by reason, rows out per split,
      cell counts, `balanced` and the `problems` that fail.
    """
    data_rows = int(counts.get("input/data_rows", 0))
    parsed = int(counts.get("rows/parsed", 0))
    malformed = _by_prefix(counts, "rows/malformed/")
    dropped = _by_prefix(counts, "rows/dropped/")
    written = int(counts.get("rows/written", 0))
    problems: List[str] = []
    _equal(problems, "input rows", data_rows, parsed + sum(malformed.values()), "counted in the files", "parsed + malformed")
    _equal(problems, "parsed rows", parsed, written + sum(dropped.values()), "parsed", "written + dropped")
    _equal(problems, "written rows", written, sum(written_files.values()), "sent to the writer", "found in the output files")
    return {
        "stage": EXAMPLE_GEN,
        "rows_in": data_rows,
        "rows_in_counted_by": "quote-aware scan of the CSV bytes" if "input/blank_lines" in counts
        else "Parquet footers" if "input/row_groups" in counts else "TFRecord framing",
        "input": {k: int(v) for k, v in sorted(_by_prefix(counts, "input/").items()) if k != "data_rows"},
        "rows_parsed": parsed,
        "malformed": malformed,
        "dropped": dropped,
        "rows_out": dict(sorted(written_files.items())),
        "examples": {k[len("examples/"):]: v for k, v in sorted(counts.items()) if k.startswith("examples/")},
        "cells": {
            "missing": _by_prefix(counts, "cells/missing/"),
            "not_numeric": _by_prefix(counts, "cells/not_numeric/"),
            "null_values": _by_prefix(counts, "cells/null_values/"),  # inside Parquet lists: removed
        },
        "balanced": not problems,
        "problems": problems,
    }


def preprocess_stage(
    read: Dict[str, int],
    dropped: Dict[str, Dict[str, int]],
    written_files: Dict[str, int],
    upstream: Optional[Dict[str, int]],
    upstream_name: str = EXAMPLE_GEN,
) -> Dict[str, Any]:
    """Builds the preprocessing stage entry and checks that its sums add up, per split.

    Args:
      read: the rows read, per split.
      dropped: the rows dropped, per split and reason.
      written_files: the rows found in the transformed files, per split.
      upstream: the rows the stage before wrote, per split; None when unknown (not checked).
      upstream_name: the stage before's name, used in the problems.

    Returns:
      The stage entry: rows in, expected in, dropped, rows out, `balanced` and `problems`.
    """
    problems: List[str] = []
    for split in sorted(read):
        if upstream is not None:
            _equal(problems, f"{split} rows in", upstream.get(split, 0), read[split], f"{upstream_name} wrote", "preprocessing read")
        out = read[split] - sum(dropped.get(split, {}).values())
        _equal(problems, f"{split} rows out", out, written_files.get(split, 0), "read - dropped", "found in the transformed files")
    return {
        "stage": PREPROCESS,
        "rows_in": dict(sorted(read.items())),
        "expected_in": dict(sorted(upstream.items())) if upstream is not None else None,
        "dropped": {s: dict(sorted(d.items())) for s, d in sorted(dropped.items())},
        "rows_out": dict(sorted(written_files.items())),
        "balanced": not problems,
        "problems": problems,
    }


def check_stage(stage: Dict[str, Any]) -> None:
    """Refuses a stage entry whose sums fail.

    Args:
      stage: a stage entry (`example_gen_stage`, `preprocess_stage`, `csv_input_stage`).

    Raises:
      LedgerError: the stage is not balanced; names the stage and every sum that fails.
    """
    if not stage["balanced"]:
        raise LedgerError(f"row ledger of {stage['stage']} does not add up: " + "; ".join(stage["problems"]))


def ledger(stages: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Assembles stage entries into a ledger.

    Args:
      stages: the stage entries, in order.

    Returns:
      The ledger: `version`, `stages`, and `balanced` (every stage balanced).
    """
    return {"version": LEDGER_VERSION, "stages": stages, "balanced": all(s["balanced"] for s in stages)}


def check_ledger(led: Optional[Dict[str, Any]], who: str) -> None:
    """Refuses an input whose ledger is missing or not balanced; consumers (trainer, exporter) call it.

    Args:
      led: the input's ledger, or None.
      who: the consumer's name, used in the message.

    Raises:
      LedgerError: the ledger is missing or empty, or a stage is not balanced.
    """
    if not led:
        raise LedgerError(f"{who}: the input carries no row ledger; it was not produced by this pipeline's preprocessing")
    for stage in led["stages"]:
        if not stage["balanced"]:
            raise LedgerError(f"{who} refuses its input: " + f"row ledger of {stage['stage']} does not add up: " + "; ".join(stage["problems"]))


def to_json(led: Dict[str, Any]) -> str:
    """Serializes a ledger as `ledger.json` holds it (indented, sorted keys, final newline).

    Args:
      led: the ledger.

    Returns:
      The JSON text.
    """
    return json.dumps(led, indent=2, sort_keys=True) + "\n"


CSV_INPUT = "CSV input"


def csv_input_stage(data_rows: Dict[str, int], read: Dict[str, int], malformed: int) -> Dict[str, Any]:
    """Builds the stage entry of the preprocessing CLI's own CSV reading.

    Checks data rows counted on the bytes = rows read + malformed rows.

    Args:
      data_rows: the data rows counted on the bytes, per split.
      read: the rows read, per split.
      malformed: the rows with a wrong field count.

    Returns:
      The stage entry: rows in, malformed, rows out, `balanced` and `problems`.
    """
    problems: List[str] = []
    _equal(problems, "input rows", sum(data_rows.values()), sum(read.values()) + malformed,
           "counted in the files", "read + malformed")
    return {
        "stage": CSV_INPUT,
        "rows_in": dict(sorted(data_rows.items())),
        "malformed": {"wrong_field_count": int(malformed)},
        "rows_out": dict(sorted(read.items())),
        "balanced": not problems,
        "problems": problems,
    }
