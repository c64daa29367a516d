"""A streamed chat completion's wire format, as SGLang 0.5.23 sends it (``stream: true``).

Server-sent events, each ``data: <json>\\n\\n``, compact JSON (SGLang encodes them with msgspec and
pydantic): a first chunk with ``delta.role``; then per decode step (``--stream-interval`` tokens,
or the tokens of one speculative verify pass) a ``delta.reasoning_content`` chunk and/or a
``delta.content`` chunk, split by the ``qwen3`` reasoning parser's streaming mode; a chunk with
``finish_reason`` (and ``matched_stop``) and an empty delta; with
``stream_options.include_usage`` a last chunk with ``choices: []`` and ``usage``; and
``data: [DONE]``. A delta always has ``reasoning_content`` (null when absent); ``role`` and
``content`` only when set. A request the scheduler rejects once it was accepted (a full queue)
streams one ``data: {"error": {...}}`` event and ``[DONE]``, with HTTP status 200.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
DONE = b"data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``payload`` (compact JSON, as SGLang's encoders write it)."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


@dataclass(frozen=True, slots=True)
class ChunkHead:
    """What every chunk of one response repeats."""

    id: str
    created: int
    model: str
    #: the bytes of a text chunk up to its delta (a chunk per decode step: built once)
    _start: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        start = self.chunk({"reasoning_content": None}).split(b'"delta":', 1)[0] + b'"delta":'
        object.__setattr__(self, "_start", start)

    def chunk(
        self,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        matched_stop: int | None = None,
        usage: dict[str, Any] | None = None,
    ) -> bytes:
        """A ``chat.completion.chunk`` with one choice."""
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish_reason,
            "matched_stop": matched_stop,
        }
        doc: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if usage is not None:
            doc["usage"] = usage
        return event(doc)

    def role(self) -> bytes:
        return self.chunk({"reasoning_content": None, "role": "assistant", "content": ""})

    def reasoning(self, text: str, usage: bytes = b"") -> bytes:
        """A thought's delta; ``usage``: the running usage's JSON (:func:`usage_json`), if any."""
        return self._text(b'{"reasoning_content":', text, usage)

    def content(self, text: str, usage: bytes = b"") -> bytes:
        """An answer's delta, as :meth:`reasoning`."""
        return self._text(b'{"reasoning_content":null,"content":', text, usage)

    def _text(self, delta: bytes, text: str, usage: bytes) -> bytes:
        """What :meth:`chunk` writes for a text delta, built from bytes (the same bytes)."""
        tail = _TEXT_TAIL + b',"usage":' + usage + b"}\n\n" if usage else _TEXT_TAIL + b"}\n\n"
        return b"".join((self._start, delta, encode_basestring_ascii(text).encode(), tail))

    def finish(self, reason: str, matched_stop: int | None) -> bytes:
        return self.chunk({"reasoning_content": None}, reason, matched_stop)

    def tail(self, **fields: Any) -> bytes:
        """A chunk without choices: the usage chunk (``usage=``) or the ``sglext`` one."""
        return event(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                **fields,
            }
        )


_TEXT_TAIL = b'},"logprobs":null,"finish_reason":null,"matched_stop":null}]'


def usage_json(prompt: int, completion: int, reasoning: int) -> bytes:
    """:func:`usage` as compact JSON (a running usage goes with every chunk)."""
    details = b'{"reasoning_tokens":%d}' % reasoning if reasoning else b"null"
    return (
        b'{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":null,'
        b'"reasoning_tokens":%d,"completion_tokens_details":%s}'
        % (prompt, prompt + completion, completion, reasoning, details)
    )


def usage(prompt: int, completion: int, reasoning: int) -> dict[str, Any]:
    """``UsageInfo`` as SGLang serialises it."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "reasoning_tokens": reasoning,
        "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
    }


def error_event(message: str, type_: str, code: int) -> bytes:
    """``create_streaming_error_response``: ``{"error": {...}}`` (json.dumps, with its spaces)."""
    body = {"object": "error", "message": message, "type": type_, "param": None, "code": code}
    return b"data: " + json.dumps({"error": body}).encode() + b"\n\n"


class ReasoningStream:
    """The ``qwen3`` reasoning parser's streaming mode (``stream_reasoning``): text deltas in,
    ``(reasoning, content)`` out. ``<think>`` is stripped once, ``</think>`` ends the thought; a
    delta ending in the start of a tag is held back until the tag is whole or is not one."""

    def __init__(self, force_reasoning: bool, previous: str = "") -> None:
        self._buffer = ""
        self._stripped_open = False
        self._in_reasoning = force_reasoning
        if THINK_OPEN in previous:
            self._in_reasoning = True
        if THINK_CLOSE in previous:
            self._in_reasoning = False

    def feed(self, delta: str) -> tuple[str, str]:
        if not self._buffer and "<" not in delta:  # no tag in sight: the usual delta
            return (delta, "") if self._in_reasoning else ("", delta)
        text = self._buffer + delta
        self._buffer = text
        if any(tag.startswith(text) and tag != text for tag in (THINK_OPEN, THINK_CLOSE)):
            return "", ""
        if not self._stripped_open and THINK_OPEN in text:
            text = text.replace(THINK_OPEN, "", 1)
            self._buffer = text
            self._stripped_open = True
            self._in_reasoning = True
        if self._in_reasoning and THINK_CLOSE in text:
            reasoning, _, content = text.partition(THINK_CLOSE)
            self._buffer = ""
            self._in_reasoning = False
            return reasoning, content
        if self._in_reasoning:
            held = max(_partial_tail(text, tag) for tag in self._held_tags())
            self._buffer = text[len(text) - held :]
            return text[: len(text) - held], ""
        self._buffer = ""
        return "", text

    def finish(self) -> tuple[str, str]:
        """What is still held when generation ends (not on an abort)."""
        held, self._buffer = self._buffer, ""
        return (held, "") if self._in_reasoning else ("", held)

    def _held_tags(self) -> tuple[str, ...]:
        return (THINK_CLOSE,) if self._stripped_open else (THINK_CLOSE, THINK_OPEN)


def _partial_tail(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that starts ``tag`` (and is shorter than it)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
