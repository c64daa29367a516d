"""The page's frame: one inline stylesheet, a navigation bar, and the escaping helpers every view uses."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2430;background:#f6f7f9}
nav{background:#1d2430;padding:8px 16px}nav a{color:#fff;margin-right:18px;text-decoration:none}
main{padding:12px 20px;max-width:1400px}h1{font-size:20px}h2{font-size:16px;margin-top:22px}
table{border-collapse:collapse;background:#fff}td,th{border:1px solid #dde;padding:3px 8px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}.warn{color:#9a5b00}.muted{color:#667}
.bar{background:#dde;width:420px;height:14px}.bar div{background:#2ea043;height:14px}
pre{white-space:pre-wrap;word-break:break-word;background:#fff;border:1px solid #dde;padding:8px}
.tok{white-space:pre-wrap}.tok.t{background:#c8f7c5}.tok.cut{background:#f7c5c5;text-decoration:line-through}
.maxlen{border-left:3px solid #d00;padding-left:2px;color:#d00;font-weight:bold}
form.filters input,form.filters select{margin-right:8px}
"""


def esc(value: object) -> str:
    """Any value as HTML-escaped text (quotes too)."""
    return escape(str(value), quote=True)


def frame(title: str, body: str) -> str:
    """A whole page around ``body``."""
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
        "<nav><a href='/'>run</a><a href='/#gpus'>GPUs</a><a href='/samples'>samples</a>"
        "<a href='/samples/random'>random sample</a><a href='/api/progress'>JSON</a></nav>"
        f"<main>{body}</main></body></html>"
    )


def table(header: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """A table of cells that are already HTML (escape them with :func:`esc`)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(rows_cells(r)) + "</tr>" for r in rows)
    return f"<table class='{cls}'><tr>{head}</tr>{body}</table>"


def rows_cells(row: Sequence[str]) -> list[str]:
    return [c if c.startswith("<td") else f"<td>{c}</td>" for c in row]


def figure(path: str, value: object, shown: str | None = None) -> str:
    """A figure, its raw value in ``data-figure`` (the tests read the page by it)."""
    raw = "" if value is None else value
    text = (
        shown
        if shown is not None
        else ("-" if value is None else f"{value:,}" if isinstance(value, int) else str(value))
    )
    return f"<span data-figure='{esc(path)}' data-value='{esc(raw)}'>{esc(text)}</span>"


def key_values(pairs: Iterable[tuple[str, str]]) -> str:
    """A two-column table of (label, HTML) rows."""
    return "<table>" + "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in pairs) + "</table>"
