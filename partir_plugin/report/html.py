"""One self-contained HTML report: the per-tactic table, and the costliest collectives with
their source lines and the decision behind each.

Everything is inline (styles, the few lines of source copied when the file is written, as
nsys-jax copies sources into its archives), so the file opens anywhere, offline, and can be
attached to a review. A small inline script only marks, on the page itself, how many table
rows were laid out (what a headless browser test reads back).
"""

from __future__ import annotations

import html
import linecache
from collections.abc import Sequence
from pathlib import Path

from .records import CollectiveRecord
from .tactic_report import TacticReport
from .text import fmt_bytes, fmt_time, tactic_table

TOP = 25  # collectives shown with their source
CONTEXT = 2  # source lines shown before and after a collective's line

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; white-space: nowrap; }
th { background: #f0f0f0; }
td.text, th.text { text-align: left; }
pre { background: #f7f7f7; padding: 6px; margin: 4px 0; font-size: 12px; }
pre .hit { background: #ffe08a; font-weight: bold; }
.record { border-left: 4px solid #4a7bd0; padding-left: 10px; margin: 1.2em 0; }
.muted { color: #777; }
"""

_MARK_RENDERED = """
window.addEventListener('load', () => {
  const rows = [...document.querySelectorAll('table tr')]
    .filter(r => r.getBoundingClientRect().height > 0).length;
  document.body.setAttribute('data-rendered-rows', String(rows));
});
"""


def render(tactics: Sequence[TacticReport], *, mesh: dict[str, int] | None,
           hardware: str | None, top: int = TOP) -> str:
    """The report as one HTML document."""
    head, rows = tactic_table(tactics)
    final = tactics[-1].records if tactics else []
    costly = sorted(final, key=lambda r: (-(r.total_time_s or 0.0), r.id))[:top]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        "<title>partir_plugin report</title>",
        f"<style>{_STYLE}</style><script>{_MARK_RENDERED}</script></head><body>",
        "<h1>partir_plugin report</h1>",
        f"<p>mesh {html.escape(str(mesh))}, hardware {html.escape(str(hardware))}"
        " (estimates are simulated)</p>",
        "<h2>Per tactic</h2>",
        "<p class='muted'>Collectives of the whole program after each tactic, with the "
        "simulated runtime and peak memory (PartIR paper, Table 2).</p>",
        _table(head, rows, text_columns={0}),
        f"<h2>Costliest collectives of the final program ({len(costly)} of {len(final)})</h2>",
        _table(["est. time / step", "count", "collective", "bytes", "phase", "tactic",
                "reason", "op", "where", "layer", "param"],
               [[fmt_time(r.total_time_s), f"x{r.count}", f"{r.kind}[{','.join(r.axes)}]",
                 fmt_bytes(r.bytes), str(r.phase), r.tactic, str(r.reason),
                 r.op.removeprefix("stablehlo."), r.source.short if r.source else "-",
                 r.layer, r.param or ""] for r in costly],
               text_columns={2, 4, 5, 6, 7, 8, 9, 10}),
        *(_record_section(r) for r in costly),
        "</body></html>",
    ]
    return "\n".join(parts)


def write_html(tactics: Sequence[TacticReport], path, **facts) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(tactics, **facts))
    return path


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], text_columns: set[int]) -> str:
    def cells(tag: str, values: Sequence[str]) -> str:
        return "".join(f"<{tag}{' class=text' if i in text_columns else ''}>"
                       f"{html.escape(str(v))}</{tag}>" for i, v in enumerate(values))

    body = "".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
    return f"<table><tr>{cells('th', head)}</tr>{body}</table>"


def _record_section(r: CollectiveRecord) -> str:
    """One collective: what it is, the decision behind it, and its source lines."""
    decision = (f"tactic {r.tactic}: {r.reason} for {r.op}"
                + (f" (parameter {r.param})" if r.param else ""))
    lines = [f"<div class='record' id='{r.id}'>",
             f"<b>{html.escape(f'{r.kind}[{chr(44).join(r.axes)}]')}</b> "
             f"<span class='muted'>{r.id}, {r.phase}</span><br>",
             f"decision: {html.escape(decision)}<br>"]
    if r.source is None:
        lines.append("<span class='muted'>no source location</span>")
    for frame in r.stack[:2] or ([r.source] if r.source else []):
        lines.append(f"<div class='muted'>{html.escape(str(frame))}</div>{_source(frame)}")
    lines.append("</div>")
    return "\n".join(lines)


def _source(frame) -> str:
    """The frame's line with `CONTEXT` lines around it, copied from the file now."""
    first = max(1, frame.line - CONTEXT)
    rows = []
    for n in range(first, frame.line + CONTEXT + 1):
        text = linecache.getline(frame.file, n).rstrip("\n")
        if not text and n > frame.line:
            break
        row = f"{n:5d}  {html.escape(text)}"
        rows.append(f"<span class='hit'>{row}</span>" if n == frame.line else row)
    return "<pre>" + "\n".join(rows) + "</pre>" if any(rows) else ""
