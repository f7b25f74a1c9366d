"""The label column held to `input.max_invalid_share`, as every feature is (docs/ingestion.md).

ExampleGen drops a row whose label is missing (`missing_label`) or not exactly 0 or 1
(`invalid_label`: the rulebook's L1) and counts it in its ledger. Without a limit, a label column
gone wrong (95% of labels `yes`) trains on the few rows left and pushes; with it, a run whose share
of such rows among the rows parsed is above the limit stops at ExampleGen, before any training, in
one line naming the column, the counts by reason and what to change. A run with no
row left stops there too, whatever the limit: nothing could be trained or evaluated. The label
column listed in `input.allow_invalid` is held to no share (only to having a row).
"""
from __future__ import annotations

from typing import Any, Dict

from components.config.schema import PipelineConfig
from components.reporting.errors import InputError
from components.rules.rulebook import DROP_INVALID_LABEL, DROP_MISSING_LABEL

REASONS = (DROP_MISSING_LABEL, DROP_INVALID_LABEL)


def check_labels(cfg: PipelineConfig, stage: Dict[str, Any], who: str = "EmbeddingExampleGen") -> None:
    """Refuses ExampleGen's output when too many rows had no usable label, or none is left.

    Args:
      cfg: the config (`input.max_invalid_share`, `input.allow_invalid`, the label).
      stage: ExampleGen's ledger stage (`rows_parsed`, `dropped` by reason, `rows_out`).
      who: the stage named in the message.

    Raises:
      InputError: one line, as the module docstring says.
    """
    parsed = int(stage.get("rows_parsed") or 0)
    dropped = {r: int(stage.get("dropped", {}).get(r, 0)) for r in REASONS}
    bad = sum(dropped.values())
    if not parsed or not bad:
        return
    column, limit = cfg.label_source(), cfg.input.max_invalid_share
    share = bad / parsed
    kept = sum(int(v) for v in (stage.get("rows_out") or {}).values())
    exempt = column in cfg.input.allow_invalid
    if kept and (exempt or share <= limit):
        return
    counts = ", ".join(f"{r} {n:,}" for r, n in dropped.items() if n)
    rule = (f"label_rule on column {column!r}" if cfg.label_rule else f"label column {column!r}")
    if not kept:
        raise InputError(f"{who}: no row of the {parsed:,} parsed has a usable label ({counts}): the "
                         f"{rule} must hold 0 or 1 (or a number the label_rule maps); fix the column or point "
                         "`label`/`label_rule` at the right one")
    raise InputError(f"{who}: {share:.1%} of the {parsed:,} rows parsed have no usable label in the {rule} "
                     f"({counts}), above input.max_invalid_share {limit:g}: fix the label column or its "
                     f"label_rule, or raise input.max_invalid_share (or list {column!r} in input.allow_invalid) to "
                     f"train on the {kept:,} rows left")
