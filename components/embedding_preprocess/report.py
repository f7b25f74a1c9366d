"""A self-contained HTML report of the embedding-ID statistics, for a person with a browser.

Plots are small inline SVGs written here by hand: the pinned stack has no plotting library, and
three chart shapes (line, bars, paired bars) do not justify adding one to the lock.
"""
from __future__ import annotations

import json

import html
import math
from typing import Optional, Any, Dict, List, Sequence, Tuple

from components.embedding_preprocess.health import describe_reasons

W, H, PAD = 360, 160, 30


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return html.escape(str(v))


def _svg(body: str, title: str) -> str:
    return (
        f'<figure><svg width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img">'
        f'<rect x="{PAD}" y="5" width="{W - PAD - 5}" height="{H - PAD - 5}" fill="#fafafa" stroke="#ccc"/>'
        f"{body}</svg><figcaption>{html.escape(title)}</figcaption></figure>"
    )


def _x(i: float, n: float) -> float:
    return PAD + (W - PAD - 10) * (i / max(n, 1e-9))


def _y(v: float, vmax: float) -> float:
    return H - PAD - (H - PAD - 10) * (v / vmax if vmax else 0)


def line_chart(points: Sequence[Tuple[float, float]], title: str, xlabel: str, ymax: float = 1.0) -> str:
    if not points:
        return ""
    xmax = max(x for x, _ in points) or 1
    path = " ".join(f"{_x(x, xmax):.1f},{_y(y, ymax):.1f}" for x, y in points)
    labels = (
        f'<text x="{PAD}" y="{H - 12}" font-size="10">0</text>'
        f'<text x="{W - 60}" y="{H - 12}" font-size="10">{html.escape(xlabel)} {xmax:g}</text>'
        f'<text x="2" y="14" font-size="10">{ymax:g}</text>'
    )
    return _svg(f'<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{path}"/>{labels}', title)


def bar_chart(series: List[Tuple[str, Sequence[float], str]], title: str, xlabel: str) -> str:
    """Bars of one or more series side by side: [(name, values, colour)]."""
    n = max((len(v) for _, v, _ in series), default=0)
    if not n:
        return ""
    vmax = max((max(v) for _, v, _ in series if len(v)), default=1) or 1
    width = (W - PAD - 10) / n / len(series)
    bars = []
    for k, (name, values, colour) in enumerate(series):
        for i, v in enumerate(values):
            x = PAD + (i * len(series) + k) * width
            bars.append(
                f'<rect x="{x:.1f}" y="{_y(v, vmax):.1f}" width="{max(width - 0.5, 0.5):.1f}" '
                f'height="{(H - PAD) - _y(v, vmax):.1f}" fill="{colour}"><title>{html.escape(name)} {i}: {v:g}</title></rect>'
            )
    legend = " ".join(
        f'<tspan fill="{c}">■ {html.escape(name)}</tspan>' for name, _, c in series
    )
    labels = (
        f'<text x="{PAD}" y="{H - 12}" font-size="10">{html.escape(xlabel)} 0..{n - 1}</text>'
        f'<text x="2" y="14" font-size="10">{vmax:g}</text>'
        f'<text x="{W - 150}" y="18" font-size="10">{legend}</text>'
    )
    return _svg("".join(bars) + labels, title)


def _table(headers: List[str], rows: List[List[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<div style='overflow-x:auto'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


_STYLE = (
    "<style>body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;"
    "margin:1em 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f0f0f0}"
    "figure{display:inline-block;margin:0.5em}figcaption{font-size:12px;text-align:center}"
    "section{border-top:1px solid #ccc;margin-top:1.5em}</style></head><body>"
)


def _coverage_points(curve: List[Dict[str, Any]]) -> List[Tuple[float, float]]:
    """A coverage curve's (1 + log2 N, share covered by the top N values) points, from (0, 0)."""
    return [(0.0, 0.0)] + [(math.log2(c["top"]) + 1, c["share"]) for c in curve]


def _hottest(values: Dict[str, Any]) -> str:
    """The hottest values with their shares of occurrences, as escaped text."""
    return ", ".join(f"{html.escape(h['value'])} ({h['share']:.1%})" for h in values.get("hottest_values", []))


def _reasons(invalid: Dict[str, int]) -> str:
    return ", ".join(f"{k}: {c}" for k, c in invalid.items()) or "none"


def _head_and_splits_html(stats: Dict[str, Any], title: str) -> List[str]:
    """The page's head, its summary line and the table of splits."""
    return [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        _STYLE,
        f"<h1>{html.escape(title)}</h1>",
        f"<p>Statistics version {stats.get('version')}, global batch size {stats.get('global_batch_size')}, "
        f"shard counts {stats.get('shard_counts')}. Exact counts over all rows; per-batch figures use full "
        f"batches of the train split ({stats.get('train_partial_batches', 0)} partial batches not counted).</p>",
        "<h2>Splits</h2>",
        _table(
            ["split", "examples read", "dropped (no label)", "dropped (invalid label)", "written", "positive rate"],
            [
                [s, v["examples_read"], v["examples_dropped"].get("missing_label", 0),
                 v["examples_dropped"].get("invalid_label", 0), v["examples_written"], v["positive_rate"]]
                for s, v in stats["splits"].items()
            ],
        ),
    ]


def _table_row(name: str, t: Dict[str, Any], largest: Optional[str]) -> List[Any]:
    """One table's summary row; the shard columns are for `largest` shards (None: no shard counts)."""
    limits = t["shards"][largest]["suggested_sparsecore_limits"] if largest else {}
    voc = t.get("vocabulary") or {}
    return [
        name, t.get("kind", "counted"), ", ".join(t["features"]), t["distinct_values"], t["vocabulary_size"],
        t["rows"], t["dim"],
        voc.get("covered_by_vocabulary"), (voc.get("skew") or {}).get("gini"),
        t["batches"]["ids_per_batch_mean"], t["batches"]["ids_per_batch_max"],
        t["batches"]["unique_ids_per_batch_mean"], t["batches"]["unique_ids_per_batch_max"],
        t["shards"][largest]["div"]["max_over_mean_load"] if largest else None,
        t["shards"][largest]["mod"]["max_over_mean_load"] if largest else None,
        limits.get("max_ids_per_table"), limits.get("max_unique_ids_per_table"),
        t["memory"]["total_bytes"] / 2**20,
    ]


def _table_section(name: str, t: Dict[str, Any], shard_counts: Sequence[int]) -> List[str]:
    """One table's section: its coverage curve, its load per shard for each shard count, its hottest values."""
    voc = t.get("vocabulary") or {}
    curve = voc.get("coverage_curve") or []
    charts = [line_chart(_coverage_points(curve), "coverage of occurrences by the top N values", "1+log2 N")]
    for n in shard_counts:
        per = t["shards"][str(n)]
        charts.append(
            bar_chart(
                [("div", per["div"]["load_per_shard"], "#d62728"), ("mod", per["mod"]["load_per_shard"], "#2ca02c")],
                f"IDs per shard over the train split, {n} shards",
                "shard",
            )
        )
    return [f"<section><h3>table {html.escape(name)}</h3><p>hottest values: {_hottest(voc) or '–'}</p>", *charts, "</section>"]


def tables_html(stats: Dict[str, Any]) -> List[str]:
    """The tables: one summary row each (sizes, coverage, IDs per batch and per shard, memory), then a section each.

    Args:
      stats: the statistics as a dict (`EmbeddingStatistics.to_dict()`).

    Returns:
      HTML fragments, in page order.
    """
    shard_counts = stats.get("shard_counts") or []
    largest = str(max(shard_counts)) if shard_counts else None
    parts = [
        "<h2>Tables</h2>",
        f"<p>Shard columns are for {largest} shards; suggested SparseCore limits carry the configured "
        "headroom. Memory is rows × dim × 4 bytes × (1 + optimizer slots).</p>",
        _table(
            ["table", "kind", "features", "distinct", "vocab", "rows", "dim", "coverage", "gini", "IDs/batch",
             "max IDs/batch", "unique/batch", "max unique/batch", "div max/mean", "mod max/mean",
             "max_ids_per_table", "max_unique_ids_per_table", "MiB"],
            [_table_row(name, t, largest) for name, t in stats["tables"].items()],
        ),
    ]
    for name, t in stats["tables"].items():
        parts += _table_section(name, t, shard_counts)
    return parts


def _feature_section(stats: Dict[str, Any], name: str, f: Dict[str, Any]) -> List[str]:
    """One categorical feature: its splits' presence, IDs per example, OOV and invalid values, and its charts."""
    rows = []
    for split, v in f["splits"].items():
        pe = v["ids_per_example"]
        rows.append(
            [split, v["present_rate"], pe["mean"], pe["p50"], pe["p90"], pe["p99"], pe["max"], v["truncated_ids"],
             v["oov_rate"], _reasons(v["invalid_values"])]
        )
    charts = []
    train = f["splits"].get("train")
    if train:
        charts.append(bar_chart([("examples", train["ids_per_example"]["histogram"], "#1f77b4")],
                                "IDs per example (train)", "IDs"))
    values = f.get("values") or {}
    shared = len(stats["tables"].get(f["table"], {}).get("features", [])) > 1
    if shared and values.get("coverage_curve"):  # a table of its own: the table's chart above is the feature's
        charts.append(line_chart(_coverage_points(values["coverage_curve"]),
                                 "coverage of this feature's occurrences by its top N values", "1+log2 N"))
    return [
        f"<section><h3>{html.escape(name)} → table {html.escape(f['table'])}</h3>",
        f"<p>{values.get('distinct_values', '–')} distinct values, gini "
        f"{_fmt((values.get('skew') or {}).get('gini'))}; hottest: {_hottest(values) or '–'}</p>",
        _table(["split", "present", "IDs/example", "p50", "p90", "p99", "max", "truncated", "OOV rate", "invalid"], rows),
        *charts,
        "</section>",
    ]


def dense_html(dense_features: Optional[Dict[str, Any]]) -> List[str]:
    """The dense features: values missing (filled) and invalid, per split; nothing when there is none."""
    if not dense_features:
        return []
    rows = [[name, split, v["missing"], _reasons(v["invalid_values"])]
            for name, per in dense_features.items() for split, v in per.items()]
    return ["<h2>Dense features</h2>", _table(["feature", "split", "missing (filled)", "invalid"], rows)]


def render_html(stats: Dict[str, Any], title: str = "Embedding-ID statistics") -> str:
    """The statistics as one self-contained HTML page.

    Args:
      stats: the statistics as a dict (`EmbeddingStatistics.to_dict()`).
      title: the page's title and heading.

    Returns:
      The page: splits, row ledger, feature health, tables, categorical and dense features.
    """
    parts = _head_and_splits_html(stats, title)
    parts += ledger_html(stats.get("ledger"))
    parts += health_html(stats.get("feature_health"))
    parts += tables_html(stats)
    parts.append("<h2>Categorical features</h2>")
    for name, f in stats["features"].items():
        parts += _feature_section(stats, name, f)
    parts += dense_html(stats.get("dense_features"))
    parts.append("</body></html>")
    return "\n".join(parts)


def ledger_html(led: Optional[Dict[str, Any]]) -> List[str]:
    """The row ledger: one row per stage, rows in, malformed, dropped and out by reason."""
    if not led:
        return []
    rows = []
    for st in led["stages"]:
        rows.append([
            st["stage"],
            json.dumps(st.get("rows_in")),
            json.dumps(st.get("malformed", {})),
            json.dumps(st.get("dropped", {})),
            json.dumps(st.get("rows_out")),
            "yes" if st["balanced"] else "NO: " + "; ".join(st["problems"]),
        ])
    verdict = "every stage adds up" if led["balanced"] else "<b>the ledger does not add up</b>"
    return ["<h2>Row ledger</h2>", f"<p>Rows in and out of every stage, by reason: {verdict}.</p>",
            _table(["stage", "rows in", "malformed", "dropped", "rows out", "adds up"], rows)]


def health_html(health: Optional[Dict[str, Any]]) -> List[str]:
    """Features whose share of unusable train rows is above the warning level."""
    if not health:
        return []
    flagged = [(n, e) for n, e in health["features"].items() if e["status"] != "ok"]
    head = (f"<h2>Feature health</h2><p>Share of {health['rows']:,} train rows without a usable value; "
            f"flagged above {health['warn_invalid_share']:.0%}, the run stops above {health['max_invalid_share']:.0%} "
            "unless the feature is in input.allow_invalid.</p>")
    if not flagged:
        return [head, "<p>No feature above the warning level.</p>"]
    rows = [[n, e["kind"], f"{e['share']:.1%}", e["status"].upper(),
             describe_reasons(e["reasons"], health["rows"]) + (f"; {e['column']}" if e.get("column") else "")]
            for n, e in flagged]
    return [head, _table(["feature", "kind", "unusable share", "status", "reasons"], rows)]
