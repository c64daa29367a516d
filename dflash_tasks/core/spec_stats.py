"""Speculative-decoding numbers of output records, and how they add up.

Each record stores the server's per-request ``meta_info`` (``docs/sglang.md``). A sample's accept
length is its completion tokens per verify pass (SGLang's ``spec_accept_length``, the bonus token
included). Over many samples the accept length is **Σ completion tokens / Σ verify passes**, over
the samples that report verify passes: the token-weighted mean, the figure the GPU time follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Where an accept length shown to users comes from.
SOURCE_PER_REQUEST = "per_request"  # Σ tokens / Σ verify passes of the samples' meta_info
SOURCE_SERVER = "server_lifetime"  # the server's own internal_states average (fallback)


def spec_counts(record: Mapping[str, Any]) -> tuple[int, int]:
    """``(completion tokens, verify passes)`` over the answered turns of a record that report
    speculative stats (``(0, 0)`` when none does). Each turn keeps its own ``meta_info``; a record
    without ``turns`` (written before conversations were regenerated turn by turn) is one turn."""
    turns = record.get("turns")
    parts = turns if isinstance(turns, list) else [record]
    tokens = verify = 0
    for part in parts:
        t, v = _turn_counts(part)
        tokens, verify = tokens + t, verify + v
    return tokens, verify


def _turn_counts(turn: Mapping[str, Any]) -> tuple[int, int]:
    meta = turn.get("meta_info")
    if turn.get("status") != "ok" or not isinstance(meta, Mapping):
        return 0, 0
    verify = meta.get("spec_verify_ct")
    if isinstance(verify, bool) or not isinstance(verify, int) or verify <= 0:
        return 0, 0
    usage = turn.get("usage") or {}
    return int(usage.get("completion_tokens") or 0), verify


def accept_length(tokens: float, verify: float) -> float | None:
    """``tokens / verify``, or None without verify passes."""
    return tokens / verify if verify > 0 else None


def sample_accept_length(record: Mapping[str, Any]) -> float | None:
    """One sample's accept length, or None when its record has no speculative stats."""
    return accept_length(*spec_counts(record))


@dataclass(frozen=True, slots=True)
class SampleCounts:
    """What one finished sample adds to the counters, read from its record once."""

    ok: bool
    completion_tokens: int
    prompt_tokens: int
    spec_tokens: int  # completion tokens of its turns that report verify passes
    verify: int  # their verify passes
    turns: int  # its user turns (generations settled)
    generations: int  # turns recorded (requests that returned)


def sample_counts(record: Mapping[str, Any]) -> SampleCounts:
    """The :class:`SampleCounts` of an output record."""
    usage = record.get("usage") or {}
    spec_tokens, verify = spec_counts(record)
    turns = record.get("turns")
    return SampleCounts(
        ok=record.get("status") == "ok",
        completion_tokens=int(usage.get("completion_tokens") or 0),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        spec_tokens=spec_tokens,
        verify=verify,
        turns=int(record.get("user_turns") or 1),
        generations=len(turns) if isinstance(turns, list) else 1,
    )
