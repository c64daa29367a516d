"""A record's token counts (:class:`Usage`) and the requests of a continued turn (:class:`Part`),
with their readers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dflash_tasks.core.record_fields import InvalidField, read_float, read_int, read_mapping, read_str, wrong


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one turn, or summed over a record's turns (0 when a writer left one out)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0

    def to_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }

    @staticmethod
    def total(parts: Iterable[Usage]) -> Usage:
        prompt = completion = reasoning = 0
        for u in parts:
            prompt += u.prompt_tokens
            completion += u.completion_tokens
            reasoning += u.reasoning_tokens
        return Usage(prompt, completion, reasoning)


@dataclass(frozen=True, slots=True, kw_only=True)
class Part:
    """One request of a continued turn: the characters of the turn's text it wrote, and its numbers.

    The turn's ``reasoning`` is its parts' reasoning in order (each ``reasoning_chars`` long),
    likewise its ``content``; ``usage.completion_tokens`` is what that request generated.
    """

    reasoning_chars: int
    content_chars: int
    finish_reason: str | None
    usage: Usage = Usage()
    meta_info: Mapping[str, Any] | None = None
    latency_s: float = 0.0
    attempts: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "reasoning_chars": self.reasoning_chars,
            "content_chars": self.content_chars,
            "finish_reason": self.finish_reason,
            "usage": self.usage.to_dict(),
            "meta_info": self.meta_info,
            "latency_s": self.latency_s,
            "attempts": self.attempts,
        }


def read_usage(doc: Mapping[str, Any], path: str) -> Usage:
    value = read_mapping(doc, "usage", path)
    if not value:
        return Usage()
    where = path + "usage."
    return Usage(
        read_int(value, "prompt_tokens", where) or 0,
        read_int(value, "completion_tokens", where) or 0,
        read_int(value, "reasoning_tokens", where) or 0,
    )


def read_parts(doc: Mapping[str, Any], path: str, reasoning: str, content: str) -> tuple[Part, ...]:
    value = doc.get("parts")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
        raise wrong(path + "parts", "a list of part objects", value)
    parts = tuple(
        Part(
            reasoning_chars=read_int(p, "reasoning_chars", f"{path}parts[{i}].") or 0,
            content_chars=read_int(p, "content_chars", f"{path}parts[{i}].") or 0,
            finish_reason=read_str(p, "finish_reason", f"{path}parts[{i}]."),
            usage=read_usage(p, f"{path}parts[{i}]."),
            meta_info=read_mapping(p, "meta_info", f"{path}parts[{i}]."),
            latency_s=read_float(p, "latency_s", f"{path}parts[{i}]."),
            attempts=read_int(p, "attempts", f"{path}parts[{i}].") or 0,
        )
        for i, p in enumerate(value)
    )
    if sum(p.reasoning_chars for p in parts) != len(reasoning) or sum(p.content_chars for p in parts) != len(
        content
    ):
        raise InvalidField(path + "parts", f"{path}parts: their lengths do not add up to the turn's text")
    return parts
