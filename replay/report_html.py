"""report.html: the reconciliation's numbers with inline SVG plots; no scripts, no network."""

from __future__ import annotations

import html
import json
from typing import Any

_W, _H, _PAD = 640, 220, 36
_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:72em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.25em .6em;
text-align:right}th{background:#f3f3f3}td.l,th.l{text-align:left}.bad{color:#b00020;font-weight:bold}
.ok{color:#0a7d28;font-weight:bold}svg{background:#fafafa;border:1px solid #ddd;margin:.3em 0}
code{font-size:.9em}"""


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    if not rows:
        return "<p>none</p>"
    columns = columns or list(rows[0])
    head = "".join(f"<th class=l>{_esc(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td class=l>{_esc(r.get(c))}</td>" for c in columns) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _axes(x_label: str, y_label: str, y_max: float, x_max: float) -> str:
    return (
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - 8}" y2="{_H - _PAD}" stroke="#444"/>'
        f'<line x1="{_PAD}" y1="8" x2="{_PAD}" y2="{_H - _PAD}" stroke="#444"/>'
        f'<text x="{_W // 2}" y="{_H - 6}" font-size="11" text-anchor="middle">'
        f"{_esc(x_label)} (0 … {x_max:.4g})</text>"
        f'<text x="4" y="14" font-size="11">{_esc(y_label)} (max {y_max:.4g})</text>'
    )


def line_plot(series: dict[str, list[float]], step: float, x_label: str, y_label: str) -> str:
    """Lines sharing an x axis (one point per ``step``); colours: blue, orange, …"""
    colours = ("#1f77b4", "#ff7f0e", "#2ca02c")
    longest = max((len(s) for s in series.values()), default=0)
    y_max = max((max(s) for s in series.values() if s), default=0.0) or 1.0
    x_scale = (_W - _PAD - 10) / max(1, longest - 1)
    y_scale = (_H - 2 * _PAD) / y_max
    parts = [_axes(x_label, y_label, y_max, longest * step)]
    for index, (name, values) in enumerate(series.items()):
        colour = colours[index % len(colours)]
        points = " ".join(
            f"{_PAD + i * x_scale:.1f},{_H - _PAD - v * y_scale:.1f}" for i, v in enumerate(values)
        )
        if points:
            parts.append(f'<polyline fill="none" stroke="{colour}" points="{points}"/>')
        parts.append(
            f'<text x="{_W - 150}" y="{20 + 14 * index}" font-size="11" fill="{colour}">'
            f"{_esc(name)}</text>"
        )
    return f'<svg width="{_W}" height="{_H}" role="img">{"".join(parts)}</svg>'


def histogram(dist: dict[str, Any] | None, x_label: str) -> str:
    if not dist:
        return "<p>no data</p>"
    hist = dist["histogram"]
    counts: list[int] = hist["counts"]
    top = max(counts) or 1
    bar = (_W - _PAD - 10) / len(counts)
    parts = [_axes(x_label, "messages", top, hist["start"] + hist["width"] * len(counts))]
    for i, n in enumerate(counts):
        height = (_H - 2 * _PAD) * n / top
        parts.append(
            f'<rect x="{_PAD + i * bar:.1f}" y="{_H - _PAD - height:.1f}" width="{bar - 1:.1f}" '
            f'height="{height:.1f}" fill="#1f77b4"><title>{hist["start"] + i * hist["width"]:.4g}'
            f": {n}</title></rect>"
        )
    stats = ", ".join(f"{k} {dist[k]}" for k in ("p50", "p90", "p99", "max"))
    return f'<svg width="{_W}" height="{_H}" role="img">{"".join(parts)}</svg><p>{stats}</p>'


def render_html(report: dict[str, Any]) -> str:
    totals = report["totals"]
    verdict = (
        "<p class=ok>OK: nothing missing, misrouted or out of order.</p>"
        if report["ok"]
        else "<p class=bad>NOT OK: messages are missing, misrouted or out of order.</p>"
    )
    queue_rows = [{"queue": q, **v} for q, v in report["queues"].items()]
    rates = report["rates"]
    sections = [
        f"<h1>Replay reconciliation</h1>{verdict}",
        f"<p>Capture <code>{_esc(report['capture']['path'])}</code> "
        f"({_esc(report['capture']['format'])}, {report['capture']['messages']} messages, "
        f"{report['capture']['malformed']} malformed lines); target store "
        f"<code>{_esc(report['target']['store'])}</code>.</p>",
        "<h2>Totals</h2>" + _table([totals]),
        "<h2>Per queue</h2>" + _table(queue_rows),
        "<h2>Order</h2>" + _table([report["order"]]),
        "<h2>Sends</h2>" + _table([report["sends"] or {"results": "none found"}]),
        "<h2>Rate over time</h2>"
        + line_plot(
            {"captured (÷ speed)": rates["captured"], "replayed": rates["replayed"]},
            rates["bucket_s"],
            "seconds",
            "msgs/s",
        ),
        "<h2>End-to-end latency (schedule → store)</h2>" + histogram(report["latency_ms"], "ms"),
        "<h2>Pacing error (send - schedule)</h2>" + histogram(report["pacing_error_ms"], "ms"),
        "<h2>Discrepancies (first 20 of each kind)</h2>",
    ]
    for kind, rows in report["discrepancies"].items():
        sections.append(f"<h3>{_esc(kind)}</h3>" + _table(rows))
    sections.append(
        "<details><summary>report.json</summary><pre>"
        + _esc(
            json.dumps(
                {k: v for k, v in report.items() if k != "discrepancies"}, indent=1, default=str
            )
        )
        + "</pre></details>"
    )
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>mqgw replay reconciliation"
        f"</title><style>{_STYLE}</style></head><body>{''.join(sections)}</body></html>\n"
    )
