"""Feature health: the share of (kept) train rows in which a feature has no usable value.

A dense feature's row is unusable when its value is missing or invalid (not numeric, NaN,
infinite, several values); a categorical feature's when no valid token is left (missing, or every
token invalid). Above `input.max_invalid_share` the run stops before training (unless the feature
is in `input.allow_invalid`); above `input.warn_invalid_share` the feature is flagged. Pure Python.

`describe_reasons` says a feature's reasons in words ("30,105 rows missing (10.0%)"): the stop line
here, the pipeline's summary and its run report all show them through it.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from components.config.schema import PipelineConfig
from components.contracts.statistics import EmbeddingStatistics
from components.reporting.errors import FeatureHealthError

OK, WARN, STOP, ALLOWED = "ok", "warn", "stop", "allowed"

# The reasons of a feature's entry (`reasons`) that count rows, in words: "<n> rows <words>". A
# dense feature's invalid reasons are the rulebook's (D1, D3, D5), each row counted once.
ROW_REASONS = {
    "missing": "missing",
    "rows_without_a_valid_value": "without a valid value",
    "not_numeric": "not a number",
    "nan": "NaN",
    "infinite": "infinite or beyond float32",
    "multi_valued_dense": "with several values",
}
# A categorical feature's reasons `invalid_values/<reason>` count values (tokens) dropped, by the
# rulebook's reason (T2-T6, J2-J3, V4, W1), in words: "<n> values <words>".
VALUE_PREFIX = "invalid_values/"
VALUE_REASONS = {
    "not_utf8": "not UTF-8 text",
    "line_break": "holding a line break",
    "float_in_categorical": "floats in a categorical column",
    "negative_int": "negative integers",
    "not_integer": "not integers",
    "out_of_range": "out of the ID range",
    "invalid_weight": "with a missing or invalid weight",
    "not_an_id": "not an ID",
}


def reason_words(reason: str) -> str:
    """One reason of a feature's entry in words, without its count.

    Args:
      reason: a key of the entry's `reasons` (`missing`, `invalid_values/not_utf8`, ...).

    Returns:
      E.g. "missing", "not a number", "not UTF-8 text"; an unknown key with its underscores as spaces.
    """
    if reason.startswith(VALUE_PREFIX):
        key = reason[len(VALUE_PREFIX):]
        return VALUE_REASONS.get(key, key.replace("_", " "))
    return ROW_REASONS.get(reason, reason.replace("_", " "))


def describe_reasons(reasons: Mapping[str, Any], rows: Optional[int] = None) -> str:
    """A feature's unusable rows by reason, in words: the one wording every report uses.

    Args:
      reasons: the entry's `reasons` (reason -> count); zero counts are left out.
      rows: the rows the shares are of (the split's rows); None gives counts without shares.

    Returns:
      E.g. "30,105 rows missing (10.0%)" or "15,152 rows without a valid value (5.1%), 12 values
      not UTF-8 text"; "none" when every count is zero.
    """
    parts = []
    for reason, n in reasons.items():
        if not n:
            continue
        if reason.startswith(VALUE_PREFIX):
            parts.append(f"{n:,} value{'' if n == 1 else 's'} {reason_words(reason)}")
        else:
            share = f" ({n / rows:.1%})" if rows else ""
            parts.append(f"{n:,} row{'' if n == 1 else 's'} {reason_words(reason)}{share}")
    return ", ".join(parts) if parts else "none"


def feature_health(
    cfg: PipelineConfig, stats: EmbeddingStatistics, split: str = "train", notes: Optional[Mapping[str, str]] = None
) -> Dict[str, Any]:
    """Each feature's unusable rows by reason and its status. `notes`: raw column -> why its type
    leaves it unusable (`run.column_notes`), carried into the feature's entry and the stop line."""
    notes = notes or {}
    rows = stats.splits[split]["examples_written"]
    i = cfg.input
    out: Dict[str, Any] = {
        "split": split,
        "rows": rows,
        "max_invalid_share": i.max_invalid_share,
        "warn_invalid_share": i.warn_invalid_share,
        "features": {},
    }
    stages = (stats.ledger or {}).get("stages") or [{}]
    ingestion = stages[0].get("cells", {}).get("not_numeric", {})
    for d in cfg.dense_features:
        s = stats.dense_features[d.name][split]
        unusable = s["missing"]  # rows left to the fill value: missing and invalid alike
        reasons = dict(s["invalid_values"])
        reasons["missing"] = unusable - sum(reasons.values())
        entry = _entry(cfg, d.name, "dense", unusable, rows, reasons)
        if ingestion.get(d.source):  # cells ExampleGen could not read as numbers arrive here as missing
            entry["not_numeric_at_ingestion_all_splits"] = ingestion[d.source]
        if d.source in notes:
            entry["column"] = notes[d.source]
        out["features"][d.name] = entry
    for f in cfg.categorical_features:
        s = stats.features[f.name]["splits"][split]
        unusable = rows - s["examples_present"]
        reasons = {"rows_without_a_valid_value": unusable}
        reasons.update({f"invalid_values/{k}": v for k, v in s["invalid_values"].items()})
        entry = _entry(cfg, f.name, "categorical", unusable, rows, reasons)
        column = next((notes[c] for c in (f.source, f.weight_column) if c in notes), None)
        if column:
            entry["column"] = column
        out["features"][f.name] = entry
    out["stopped"] = sorted(n for n, e in out["features"].items() if e["status"] == STOP)
    out["warned"] = sorted(n for n, e in out["features"].items() if e["status"] == WARN)
    return out


def _entry(cfg: PipelineConfig, name: str, kind: str, unusable: int, rows: int, reasons: Dict[str, int]):
    share = unusable / rows if rows else 0.0
    i = cfg.input
    if share > i.max_invalid_share:
        status = ALLOWED if name in i.allow_invalid else STOP
    elif share > i.warn_invalid_share:
        status = WARN
    else:
        status = OK
    return {"kind": kind, "unusable_rows": int(unusable), "share": share, "reasons": reasons, "status": status}


def check_health(health: Dict[str, Any]) -> None:
    """Raises FeatureHealthError naming every stopped feature, its share and its reasons."""
    if not health["stopped"]:
        return
    parts: List[str] = []
    for name in health["stopped"]:
        e = health["features"][name]
        reasons = describe_reasons(e["reasons"])  # the share of all of them is said before
        if e.get("not_numeric_at_ingestion_all_splits"):
            reasons += f"; {e['not_numeric_at_ingestion_all_splits']:,} cells were not numbers at ingestion (all splits)"
        if e.get("column"):
            reasons += f"; {e['column']}"
        parts.append(f"{name} ({e['kind']}): {e['share']:.1%} of {health['rows']:,} train rows unusable ({reasons})")
    raise FeatureHealthError(
        f"feature health: {'; '.join(parts)}; above input.max_invalid_share "
        f"{health['max_invalid_share']:.0%}. Fix the column, or list the feature under input.allow_invalid"
    )
