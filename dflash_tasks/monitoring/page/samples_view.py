"""The samples views: a filtered list (one page of :mod:`.pager`) and one sample with the trainer's view.

Every piece of sample text goes through :func:`~.layout.esc`: prompts and answers are shown,
never interpreted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from dflash_tasks.core.loss_tokens import TokenMarks
from dflash_tasks.core.record import Record
from dflash_tasks.core.spec_stats import sample_accept_length
from dflash_tasks.monitoring.page.layout import esc, figure, frame, key_values, table
from dflash_tasks.monitoring.page.pager import OUTCOMES, Found, Page, SampleFilter
from dflash_tasks.monitoring.page.trainer_marks import TrainerSight

PREVIEW_CHARS = 120


def sample_href(found: Found) -> str:
    return f"/samples/{quote(found.record.id, safe='')}?chunk={found.chunk}"


def _preview(record: Record) -> str:
    first = next((m["content"] for t in record.turns for m in t.input if m.get("role") == "user"), "")
    return first if len(first) <= PREVIEW_CHARS else first[:PREVIEW_CHARS] + "…"


def list_page(page: Page, wanted: SampleFilter, query: Mapping[str, str]) -> str:
    rows = [
        [
            f"<a class='sample' href='{esc(sample_href(f))}'>{esc(f.record.id)}</a>",
            esc(f.record.outcome.value),
            esc(f.record.finish_reason or "-"),
            f"<td class='n'>{f.record.usage.completion_tokens:,}</td>",
            esc(", ".join(f.record.checks or ())),
            esc(_preview(f.record)),
        ]
        for f in page.rows
    ]
    more = ""
    if page.next is not None:
        href = "/samples?" + urlencode({**query, "from": str(page.next)})
        more = f"<p><a id='next' href='{esc(href)}'>next page</a></p>"
    body = (
        "<h1>samples</h1>"
        + _filters(wanted)
        + f"<p class='muted'><span id='shown'>{len(page.rows)}</span> shown · {page.chunks_read} of "
        f"{page.chunks_stored} stored chunk files read for this page</p>"
        + table(["id", "outcome", "finish", "tokens", "checks failed", "prompt"], rows, "samples")
        + more
    )
    return frame("samples", body)


def _filters(wanted: SampleFilter) -> str:
    options = "".join(
        f"<option value='{o}'{' selected' if o == wanted.outcome else ''}>{o or 'any outcome'}</option>"
        for o in ("", *OUTCOMES)
    )

    def box(name: str, value: object, hint: str) -> str:
        shown = "" if value is None else value
        return f"<input name='{name}' value='{esc(shown)}' placeholder='{esc(hint)}' size='12'>"

    return (
        "<form class='filters' method='get' action='/samples'>"
        f"<select name='outcome'>{options}</select>"
        + box("check", wanted.check, "failed check")
        + box("min_tokens", wanted.min_tokens, "min tokens")
        + box("max_tokens", wanted.max_tokens, "max tokens")
        + box("id", wanted.id_contains, "id contains")
        + box("source", wanted.source, "input source")
        + "<button type='submit'>filter</button> <a href='/samples/random'>a random one</a></form>"
    )


def sample_page(found: Found, sight: TrainerSight) -> str:
    r = found.record
    body = (
        f"<h1>sample {esc(r.id)}</h1>"
        + key_values(_metadata(found))
        + "".join(_turn(i, t) for i, t in enumerate(r.turns, 1))
        + "<h2>as the trainer will see it</h2>"
        + _trainer(sight)
    )
    return frame(f"sample {r.id}", body)


def _metadata(found: Found) -> list[tuple[str, str]]:
    r = found.record
    accept = sample_accept_length(r)
    return [
        ("outcome", figure("outcome", r.outcome.value)),
        ("finish reason", figure("finish_reason", r.finish_reason)),
        (
            "tokens",
            f"{figure('completion_tokens', r.usage.completion_tokens)} completion, "
            f"{r.usage.prompt_tokens:,} prompt, {r.usage.reasoning_tokens:,} reasoning",
        ),
        ("latency", f"{r.latency_s:.2f} s"),
        ("attempts", esc(r.attempts)),
        ("error", esc(r.error or "-") + (f" ({esc(r.failure.value)})" if r.failure else "")),
        ("checks failed", esc(", ".join(r.checks or ()) or "none")),
        ("server", esc(_server(r))),
        ("worker", esc(r.worker or "-")),
        ("accept length", "-" if accept is None else f"{accept:.2f}"),
        ("repair round", esc(r.repair if r.repair is not None else "-")),
        ("where", f"chunk {found.chunk}, sample {found.index}, input line {esc(r.line)}"),
    ]


def _server(r: Record) -> str:
    server: Mapping[str, Any] = r.server or {}
    name = server.get("model_path") or server.get("model") or r.model or "?"
    return f"{name} at {r.endpoint or '?'}"


def _turn(i: int, turn: Any) -> str:
    messages = "".join(
        f"<h3>{esc(m.get('role', '?'))}</h3><pre class='input'>{esc(m.get('content', ''))}</pre>"
        for m in turn.input
    )
    return (
        f"<h2>turn {i} <span class='muted'>({esc(turn.status.value)}, "
        f"finish {esc(turn.finish_reason or '-')})</span></h2>"
        + messages
        + f"<h3>reasoning</h3><pre class='reasoning'>{esc(turn.reasoning)}</pre>"
        + f"<h3>answer</h3><pre class='answer'>{esc(turn.content)}</pre>"
    )


def _trainer(sight: TrainerSight) -> str:
    note = f"<p class='muted'>{esc(sight.note)}</p>"
    if sight.marks is None:
        return note
    return note + _marked(sight.marks)


def _marked(marks: TokenMarks) -> str:
    total = len(marks.offsets)
    summary = (
        f"<p>{figure('trained_tokens', marks.trained_count)} of {total:,} tokens trained "
        "<span class='tok t legend'>(highlighted)</span>"
        + (
            f"; max_length {marks.max_length:,} cuts the last {total - marks.max_length:,}"
            if total > marks.max_length
            else ""
        )
        + "</p>"
    )
    spans = []
    at = 0
    for i, ((a, b), trained) in enumerate(zip(marks.offsets, marks.trained, strict=True)):
        if a > at:  # characters no token covers
            spans.append(esc(marks.text[at:a]))
        at = max(at, b)
        if i == marks.max_length:
            spans.append(f"<span class='maxlen' title='max_length'>✂ max_length {marks.max_length:,}</span>")
        cls = "tok t" if trained else ("tok cut" if i >= marks.max_length else "tok")
        spans.append(f"<span class='{cls}'>{esc(marks.text[a:b])}</span>")
    spans.append(esc(marks.text[at:]))
    return summary + "<pre class='trainer'>" + "".join(spans) + "</pre>"
