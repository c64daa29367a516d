"""Speculative-decoding numbers of output records, and how they add up.

Each record stores the server's per-request ``meta_info`` (``docs/sglang.md``). A sample's accept
length is its completion tokens per verify pass (SGLang's ``spec_accept_length``, the bonus token
included). Over many samples the accept length is **Σ completion tokens / Σ verify passes**, over
the samples that report verify passes: the token-weighted mean, the figure the GPU time follows.
"""

from __future__ import annotations

from collections.abc import Mapping
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
