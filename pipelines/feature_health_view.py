"""Feature health warnings in words: what the summary and the run report print about features
whose share of rows without a usable value is above `input.warn_invalid_share`, grouped by kind
and reason, with the names of numbered runs shortened (`I1..I13`) and a hint per group."""
from __future__ import annotations

import math
import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

from components.embedding_preprocess.health import VALUE_PREFIX, reason_words


def name_ranges(names: Iterable[str]) -> str:
    """Feature names in natural order, runs of three or more numbered alike shortened to `first..last`.

    Args:
      names: feature names.

    Returns:
      E.g. I1..I13 for I1, I2, ..., I13, and "C2, C6, C16..C18" for C18, C2, C16, C6, C17.
    """
    def split(name: str) -> Tuple[str, Optional[int]]:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        return (m.group(1), int(m.group(2))) if m else (name, None)

    ordered = sorted(set(names), key=lambda n: (split(n)[0], split(n)[1] is not None, split(n)[1] or 0, n))
    runs: List[List[str]] = []
    for name in ordered:
        prefix, number = split(name)
        if runs and number is not None:
            last_prefix, last_number = split(runs[-1][-1])
            if last_prefix == prefix and last_number is not None and number == last_number + 1:
                runs[-1].append(name)
                continue
        runs.append([name])
    parts: List[str] = []
    for run in runs:
        parts += [f"{run[0]}..{run[-1]}"] if len(run) >= 3 else run
    return ", ".join(parts)


def _warning_kind(w: Dict[str, Any]) -> str:
    """dense or categorical (a summary written before entries carried their kind: from the reasons)."""
    if w.get("kind"):
        return w["kind"]
    return "categorical" if any(k == "rows_without_a_valid_value" or k.startswith(VALUE_PREFIX)
                                for k in w.get("reasons") or {}) else "dense"


def _share_label(share: float) -> str:
    return f"{share:.0%}" if share >= 0.01 else f"{share:.1%}"


def feature_health_groups(warnings: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Groups flagged features that read the same: kind, status, share to the percent, reasons.

    Args:
      warnings: the summary's `feature_warnings` (feature -> share, status, reasons, kind).

    Returns:
      One dict per group, largest first: kind, status, share (its label: "10%"; one decimal for a
      lone feature), row_reasons (largest first) and value_reasons (keys of `reasons`), names.
    """
    groups: Dict[tuple, Dict[str, Any]] = {}
    for name, w in warnings.items():
        reasons = w.get("reasons") or {}
        row_keys = tuple(sorted((k for k, v in reasons.items() if v and not k.startswith(VALUE_PREFIX)),
                                key=lambda k: -reasons[k]))
        value_keys = tuple(sorted(k for k, v in reasons.items() if v and k.startswith(VALUE_PREFIX)))
        key = (_warning_kind(w), w["status"], _share_label(w["share"]), row_keys, value_keys)
        g = groups.setdefault(key, {"kind": key[0], "status": key[1], "share": key[2], "row_reasons": row_keys,
                                    "value_reasons": value_keys, "names": [], "shares": []})
        g["names"].append(name)
        g["shares"].append(w["share"])
    out = []
    for g in groups.values():
        if len(g["names"]) == 1:
            g["share"] = f"{g['shares'][0]:.1%}"
        out.append(g)
    return sorted(out, key=lambda g: (-len(g["names"]), g["kind"], g["share"], g["names"]))


def feature_health_lines(warnings: Dict[str, Dict[str, Any]]) -> List[Tuple[str, str]]:
    """The flagged features in groups that read the same, one line each.

    Args:
      warnings: the summary's `feature_warnings`.

    Returns:
      (kind, text) per group, e.g. ("dense", "13 features: 10% of rows missing (I1..I13)").
    """
    lines = []
    for g in feature_health_groups(warnings):
        n = len(g["names"])
        what = " or ".join(reason_words(k) for k in g["row_reasons"]) or "unusable"
        line = f"{n} feature{'' if n == 1 else 's'}: {g['share']} of rows {what}"
        if g["value_reasons"]:
            line += "; values dropped as " + ", ".join(reason_words(k) for k in g["value_reasons"])
        line += f" ({name_ranges(g['names'])})"
        if g["status"] == "allowed":
            line += ": above input.max_invalid_share, allowed by input.allow_invalid"
        elif g["status"] == "stop":
            line += ": above input.max_invalid_share, the run stops"
        lines.append((g["kind"], line))
    return lines


def feature_health_hints(warnings: Dict[str, Dict[str, Any]], limits: Optional[Dict[str, Any]] = None) -> List[str]:
    """What a user can do about the flagged features, naming the config fields that decide.

    Args:
      warnings: the summary's `feature_warnings`.
      limits: the summary's `feature_health_limits` (warn_invalid_share, max_invalid_share), or None.

    Returns:
      One sentence per kind of problem: dense values missing (their fill_value), dense values
      invalid, categorical rows without a valid value, then the warning threshold.
    """
    limits = limits or {}
    hints = []
    dense = {n: w for n, w in warnings.items() if _warning_kind(w) == "dense"}
    missing = [n for n, w in dense.items() if (w.get("reasons") or {}).get("missing")]
    if missing:
        by_value: Dict[float, List[str]] = {}
        for n in missing:
            if dense[n].get("fill_value") is not None:
                by_value.setdefault(float(dense[n]["fill_value"]), []).append(n)
        now = "; ".join(f"{v} for {name_ranges(names)}" if len(by_value) > 1 else str(v)
                        for v, names in sorted(by_value.items()))
        hints.append("missing dense values are replaced by dense_features[].fill_value"
                     + (f" (now {now})" if now else "") + ": make sure it is a value the model cannot mistake "
                     "for real data, or fill the gaps at the source")
    found = {k for w in dense.values() for k, v in (w.get("reasons") or {}).items() if v}
    invalid = sorted(found - {"missing", "multi_valued_dense"})
    if invalid:
        hints.append("dense rows " + " or ".join(reason_words(k) for k in invalid)
                     + " get the fill_value too: check the source column's values")
    if "multi_valued_dense" in found:
        hints.append("dense rows with several values keep the first: store one value per row")
    if any(_warning_kind(w) == "categorical" for w in warnings.values()):
        hints.append("a categorical feature's rows without a valid value pool to a zero vector: check the "
                     "source column for empty cells, or for the values statistics.html counts as invalid")
    warn, stop = limits.get("warn_invalid_share"), limits.get("max_invalid_share")
    highest = max((w["share"] for w in warnings.values()), default=0.0)
    enough = math.ceil(highest * 100) / 100  # the whole percent that flags none of these
    quiet = f": {enough:.0%} quiets all of these" if stop is None or enough < stop else ""
    hints.append("if this much is expected, raise input.warn_invalid_share"
                 + (f" (now {warn:.0%})" if warn is not None else "") + quiet + "; above input.max_invalid_share"
                 + (f" ({stop:.0%})" if stop is not None else "")
                 + " the run stops unless the feature is listed in input.allow_invalid")
    return hints
