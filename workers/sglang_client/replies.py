"""What a chat request gets back: :class:`Completion` (with its :class:`MetaInfo`), parsed from the
reply, or the error the reply means (``docs/sglang.md``, "The answer")."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import requests

from dflash_tasks.core.errors import RetryableError
from dflash_tasks.core.repetition import Loop
from dflash_tasks.core.states import ErrorKind
from workers.sglang_client.http_errors import chat_status_error


@dataclass(frozen=True, slots=True)
class MetaInfo:
    """Per-request numbers from ``choices[0].meta_info`` (sent with ``return_meta_info``).

    Field names are SGLang's. Every field is None where the server did not report it: releases
    before 0.5.15 send no ``meta_info``, and the ``spec_*`` keys appear only when speculative
    decoding ran at least one verify pass for the request.
    """

    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None
    spec_accept_rate: float | None = None
    spec_num_correct_drafts: int | None = None
    spec_num_proposed_drafts: int | None = None
    cached_tokens: int | None = None
    num_retractions: int | None = None

    def as_record(self) -> dict[str, int | float | None]:
        """The fields as stored on an output record (each turn's ``meta_info``), in field order."""
        return {name: getattr(self, name) for name in self.__slots__}  # flat: no deep copy as asdict


@dataclass(frozen=True, slots=True)
class Completion:
    """One successful chat completion, with both text fields stripped.

    ``loop``: where a streamed text fell into a loop; the request was then stopped there
    (``finish_reason`` ``repetition``, the texts and tokens as streamed until the stop).
    """

    reasoning: str
    content: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    meta: MetaInfo | None = None
    loop: Loop | None = None


def read_chat_reply(resp: requests.Response, joins: bool = False) -> Completion:
    """The completion a chat reply carries, or the error its status means
    (:func:`~workers.sglang_client.http_errors.chat_status_error`)."""
    if resp.status_code != 200:
        raise chat_status_error(resp)
    return parse_completion(resp.content, joins)


#: What a malformed body (or stream event) raises while it is read.
MALFORMED = (ValueError, KeyError, IndexError, TypeError, AttributeError, OverflowError)


def aborted() -> RetryableError:
    """The error of an answer whose ``finish_reason`` is ``abort`` (plain or streamed)."""
    return RetryableError("the server aborted the request (finish_reason 'abort')", ErrorKind.ABORT)


def usage_counts(usage: Any) -> tuple[int, int, int]:
    """``(prompt, completion, reasoning)`` tokens of an answer's ``usage`` (SGLang sends
    ``reasoning_tokens`` at its top or in ``completion_tokens_details``); raises one of
    :data:`MALFORMED` when it is not a usage object."""
    usage = _object(usage)
    details = _object(usage.get("completion_tokens_details"))
    return (
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
        int(usage.get("reasoning_tokens") or details.get("reasoning_tokens") or 0),
    )


def kept_texts(reasoning: str, content: str, joins: bool) -> tuple[str, str]:
    """The texts as a record keeps them: stripped, except the leading whitespace of a thought
    that ``joins`` a prefix (it continues the thought where the prefix stopped)."""
    return (reasoning.rstrip() if joins else reasoning.strip()), content.strip()


def parse_completion(body: bytes, joins: bool = False) -> Completion:
    """Parse a chat completion body; malformed or aborted answers are retryable. ``joins``: the
    answer continues a prefix, so its reasoning keeps its leading whitespace."""
    try:
        doc = json.loads(body)
        choice = doc["choices"][0]
        finish = str(choice.get("finish_reason") or "")
    except MALFORMED as exc:
        raise _malformed(body, exc) from None
    if finish == "abort":
        raise aborted()
    try:
        message = _object(choice.get("message"))
        prompt, completion, thought = usage_counts(doc.get("usage"))
        reasoning, content = kept_texts(
            text_of(message.get("reasoning_content")), text_of(message.get("content")), joins
        )
        meta = choice.get("meta_info")
        return Completion(
            reasoning=reasoning,
            content=content,
            finish_reason=finish,
            prompt_tokens=prompt,
            completion_tokens=completion,
            reasoning_tokens=thought,
            meta=parse_meta_info(meta) if isinstance(meta, dict) else None,
        )
    except MALFORMED as exc:
        raise _malformed(body, exc) from None


def parse_meta_info(meta: Mapping[str, Any]) -> MetaInfo:
    """The fields of :class:`MetaInfo` from a ``meta_info`` dict; absent or malformed values are None."""
    return MetaInfo(
        spec_verify_ct=_count(meta.get("spec_verify_ct")),
        spec_accept_length=_real(meta.get("spec_accept_length")),
        spec_accept_rate=_real(meta.get("spec_accept_rate")),
        spec_num_correct_drafts=_count(meta.get("spec_num_correct_drafts")),
        spec_num_proposed_drafts=_count(meta.get("spec_num_proposed_drafts")),
        cached_tokens=_count(meta.get("cached_tokens")),
        num_retractions=_count(meta.get("num_retractions")),
    )


def _malformed(body: bytes, exc: Exception) -> RetryableError:
    return RetryableError(
        f"invalid response body ({len(body)} bytes): {type(exc).__name__}", ErrorKind.BAD_RESPONSE
    )


def _object(value: Any) -> Mapping[str, Any]:
    """A JSON object, ``{}`` for null (or another empty value); anything else is malformed."""
    if not value:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


def text_of(value: Any) -> str:
    """A JSON string, ``""`` for null (or another empty value); anything else is malformed."""
    if not value:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return int(value) if value >= 0 and float(value).is_integer() else None


def _real(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value) if value >= 0 else None
