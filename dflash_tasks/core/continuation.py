"""Continuing a thought cut at ``max_tokens`` instead of generating the turn again.

A turn whose thought hit ``max_tokens`` before the trainer's horizon is continued by a repair round
with SGLang's ``continue_final_message``: the request repeats the turn's messages and ends with an
assistant message holding the thought so far (after the opener the model wrote, ``<think>\\n``, when
the chat template's generation prompt does not open the thought itself). The server renders the
messages before it, appends that text's tokens to the prompt and goes on from there, so it
generates, and bills, only the new tokens; its reasoning parser reads the prefix, so the answer's
``reasoning_content`` is the rest of the thought and ``content`` the answer.

The horizon is the trainer's ``max_length``: a turn's row is its prompt plus its completion, so a
continuation may add up to ``max_length - prompt_tokens - completion_tokens`` tokens; a thought
cut past it trains as it is (the trainer cuts the row there anyway). With ``--repair-truncated
--max-tokens N`` the turn's completion is continued up to ``N`` tokens instead. A job generated
with ``--max-tokens horizon`` has nothing to continue: every request already ran to the horizon.

The continued turn is one :class:`~dflash_tasks.core.record.Turn` holding the whole text, with one
:class:`~dflash_tasks.core.record.Part` per request (see :mod:`dflash_tasks.core.record`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dflash_tasks.core.budget import HORIZON
from dflash_tasks.core.record import Part, Record, Turn, Usage
from dflash_tasks.core.repetition import Loop

#: What the model writes before its thought when the template does not (Qwen3's output).
THOUGHT_OPENER = "<think>\n"


def is_cut_thought(turn: Turn) -> bool:
    """Whether the turn stopped at ``max_tokens`` inside its thought: reasoning, no answer yet."""
    return (
        turn.ok
        and turn.finish_reason == "length"
        and bool(turn.reasoning.strip())
        and not turn.content.strip()
    )


def continuation_budget(turn: Turn, horizon: int, max_tokens: int | None = None) -> int:
    """The new tokens a continuation of ``turn`` may generate (0: nothing to continue).

    Up to the trainer's ``horizon`` (its ``max_length``: the turn's prompt plus its completion), or
    with ``max_tokens`` (``--repair-truncated``) up to that many completion tokens.
    """
    if not is_cut_thought(turn):
        return 0
    done = turn.usage.completion_tokens
    limit = max_tokens if max_tokens is not None else horizon - turn.usage.prompt_tokens
    return max(0, limit - done)


def record_budget(record: Record, horizon: int, max_tokens: int | None = None) -> int:
    """:func:`continuation_budget` of an ok record's last turn (only a last turn can be cut).

    0 for a record generated under ``--max-tokens horizon``: each of its requests was given the
    trainer's horizon, counted on the row as the trainer renders it (:mod:`dflash_tasks.core.budget`),
    so a cut thought is cut there already (the server's prompt tokens, which this function counts
    otherwise, can be fewer than the trainer's, e.g. without its template's system prompt).
    """
    if not record.ok or generated_at_horizon(record):
        return 0
    return continuation_budget(record.turns[-1], horizon, max_tokens)


def generated_at_horizon(record: Record) -> bool:
    """Whether ``record`` was generated under ``--max-tokens horizon`` (its ``sampling``)."""
    return (record.sampling or {}).get("budget_policy") == HORIZON


def opener_for(generation_prompt: str) -> str:
    """The text to put before the thought in the prefix: none when the template's generation prompt
    (thinking on) already opens the thought (Qwen3.5/3.6), else :data:`THOUGHT_OPENER` (Qwen3)."""
    return "" if generation_prompt.rstrip().endswith("<think>") else THOUGHT_OPENER


def prefix_message(turn: Turn, opener: str) -> dict[str, str]:
    """The final assistant message a continuation sends: the opener and the thought so far."""
    return {"role": "assistant", "content": opener + turn.reasoning}


def joined(
    cut: Turn,
    reasoning: str,
    content: str,
    finish_reason: str,
    usage: Usage,
    meta_info: Mapping[str, Any] | None,
    latency: float,
    attempts: int,
    loop: Loop | None = None,
) -> Turn:
    """``cut`` with a continuation's answer appended: one turn, its parts kept (checks to run again).

    ``reasoning`` keeps the whitespace it starts with (it joins the thought where it stopped);
    ``usage`` is the continuation's own (its completion tokens are only the new ones); ``loop``,
    where the continuation's answer looped (positions in its own texts, a thought's from before
    the join negative), is placed in the joined turn's texts.
    """
    first = parts_of(cut)
    part = Part(
        reasoning_chars=len(reasoning),
        content_chars=len(content),
        finish_reason=finish_reason,
        usage=usage,
        meta_info=meta_info,
        latency_s=round(latency, 3),
        attempts=attempts,
    )
    return dataclasses.replace(
        cut,
        reasoning=cut.reasoning + reasoning,
        content=cut.content + content,
        finish_reason=finish_reason,
        usage=Usage(
            cut.usage.prompt_tokens,
            cut.usage.completion_tokens + usage.completion_tokens,
            cut.usage.reasoning_tokens + usage.reasoning_tokens,
        ),
        latency_s=round(cut.latency_s + latency, 3),
        attempts=cut.attempts + attempts,
        parts=(*first, part),
        checks=None,
        loop=None if loop is None else _joined_loop(cut, loop),
    )


def _joined_loop(cut: Turn, loop: Loop) -> Loop:
    """``loop`` placed in the joined turn: after the cut answer, or after the cut thought (whose
    tokens are all the cut turn's: it stopped in its thought)."""
    if loop.text == "content":
        return loop.shifted(len(cut.content))
    return loop.shifted(len(cut.reasoning), cut.usage.completion_tokens)


def parts_of(turn: Turn) -> tuple[Part, ...]:
    """The requests ``turn`` was made of: its parts, or one part for a turn of one request."""
    return turn.parts or (
        Part(
            reasoning_chars=len(turn.reasoning),
            content_chars=len(turn.content),
            finish_reason=turn.finish_reason,
            usage=turn.usage,
            meta_info=turn.meta_info,
            latency_s=turn.latency_s,
            attempts=turn.attempts,
        ),
    )


def carries(later: Turn, turn: Turn) -> bool:
    """Whether ``later`` (the same place in a newer record) holds ``turn``'s generated tokens: it is
    ``turn`` as it was (kept, or a continuation that failed), or ``turn`` continued."""
    if dataclasses.replace(later, checks=None) == dataclasses.replace(turn, checks=None):
        return True
    earlier = parts_of(turn)
    return len(later.parts) > len(earlier) and later.parts[: len(earlier)] == earlier


def new_parts(old: Turn, new: Turn) -> tuple[Part, ...]:
    """The parts ``new`` (``old`` continued) added; () when it was not continued."""
    if not new.parts:
        return ()
    return new.parts[max(1, len(old.parts)) :]
