"""Speculative-decoding numbers of output records, and how they add up.

Each record stores the server's per-request ``meta_info`` (``docs/sglang.md``). A sample's accept
length is its completion tokens per verify pass (SGLang's ``spec_accept_length``, the bonus token
included). Over many samples the accept length is **Σ completion tokens / Σ verify passes**, over
the samples that report verify passes: the token-weighted mean, the figure the GPU time follows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dflash_tasks.core.record import Record, Turn

#: Where an accept length shown to users comes from.
SOURCE_PER_REQUEST = "per_request"  # Σ tokens / Σ verify passes of the samples' meta_info
SOURCE_SERVER = "server_lifetime"  # the server's own internal_states average (fallback)


def spec_counts(record: Record) -> tuple[int, int]:
    """``(completion tokens, verify passes)`` over the answered turns of a record that report
    speculative stats (``(0, 0)`` when none does). Each turn keeps its own ``meta_info``."""
    tokens = verify = 0
    for turn in record.turns:
        t, v = _turn_counts(turn)
        tokens, verify = tokens + t, verify + v
    return tokens, verify


def _turn_counts(turn: Turn) -> tuple[int, int]:
    if not turn.ok:
        return 0, 0
    if turn.parts:  # a continued turn: each request reported its own
        counts = [_request_counts(p.meta_info, p.usage.completion_tokens) for p in turn.parts]
        return sum(t for t, _ in counts), sum(v for _, v in counts)
    return _request_counts(turn.meta_info, turn.usage.completion_tokens)


def _request_counts(meta: Mapping[str, Any] | None, tokens: int) -> tuple[int, int]:
    if meta is None:
        return 0, 0
    verify = meta.get("spec_verify_ct")
    if isinstance(verify, bool) or not isinstance(verify, int) or verify <= 0:
        return 0, 0
    return tokens, verify


def pooled_accept_length(tokens: float, verify: float) -> float | None:
    """The accept length of pooled counts: ``tokens / verify``, or None without verify passes."""
    return tokens / verify if verify > 0 else None


def sample_accept_length(record: Record) -> float | None:
    """One sample's accept length, or None when its record has no speculative stats."""
    return pooled_accept_length(*spec_counts(record))


@dataclass(frozen=True, slots=True)
class SampleCounts:
    """What one finished sample adds to the counters, read from its record once."""

    ok: bool
    completion_tokens: int
    prompt_tokens: int
    spec_tokens: int  # completion tokens of its turns that report verify passes
    verify: int  # their verify passes
    turns: int  # its user turns (generations settled; none for a repair round's sample)
    generations: int  # turns recorded (requests that returned)
    retractions: int = 0  # times the server retracted its requests (meta_info num_retractions)


def sample_counts(record: Record) -> SampleCounts:
    """The :class:`SampleCounts` of an output record."""
    spec_tokens, verify = spec_counts(record)
    return SampleCounts(
        ok=record.ok,
        completion_tokens=record.usage.completion_tokens,
        prompt_tokens=record.usage.prompt_tokens,
        spec_tokens=spec_tokens,
        verify=verify,
        turns=record.user_turns,
        generations=len(record.turns),
        retractions=retractions(record.turns),
    )


def retractions(turns: Sequence[Turn]) -> int:
    """How often the server retracted the requests of ``turns`` (``meta_info`` ``num_retractions``)."""
    return sum((t.meta_info or {}).get("num_retractions") or 0 for t in turns)
