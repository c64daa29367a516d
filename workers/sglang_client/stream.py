"""Reading a streamed chat answer (``stream: true``) and stopping it when its text loops
(``docs/sglang.md``, "Streaming").

:class:`StreamReader` takes the body's raw pieces as they arrive, splits them into server-sent
events on blank lines (bytes operations; a piece that is one whole event, as SGLang sends them,
is not split), decodes each event's JSON with one call into the C decoder, joins the thought's and
the answer's deltas and feeds each text to its own
:class:`~dflash_tasks.core.repetition.RepetitionDetector`, with the tokens each delta brought
(the continuous usage of ``stream_options.continuous_usage_stats``). Once a detector sees a loop
the reader is done: the caller closes the response, which makes SGLang abort the request.

What the stream cannot say is left out: ``meta_info`` (SGLang refuses ``return_meta_info`` with
streaming) holds only the speculative-decoding numbers of the ``sglext`` chunk
(``return_spec_tokens_details``), None when there is none (no speculative decoding, or a stream
stopped before its end). A stream stopped at a loop never gets the final usage: its thought's
tokens are the most of the last usage's and those of the thought's deltas; a stream without any
usage (a server that ignores ``stream_options``) gets its counts estimated from its deltas' texts
(:data:`~dflash_tasks.core.repetition.CHARS_PER_TOKEN`, at least a token a delta), the loop's
positions too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from dflash_tasks.core.errors import DflashError, RetryableError
from dflash_tasks.core.repetition import (
    CHARS_PER_TOKEN,
    FINISH_REASON,
    Loop,
    RepetitionDetector,
    RepetitionSettings,
)
from dflash_tasks.core.states import ErrorKind
from workers.sglang_client.http_errors import stream_error
from workers.sglang_client.replies import (
    MALFORMED,
    Completion,
    MetaInfo,
    aborted,
    kept_texts,
    parse_meta_info,
    text_of,
    usage_counts,
)

_DATA = b"data: "
_DONE = b"[DONE]"
_EVENT_END = b"\n\n"
#: ``(document, end)`` of the JSON text at the start of a string: ``json.loads`` without its
#: per-call layers (encoding detection, whitespace matching), the bulk of an event's cost.
_decode = json.JSONDecoder().raw_decode


class StreamReader:
    """One streamed answer, read piece by piece: :meth:`feed` the body's bytes, then
    :meth:`completion`. Raises the project's errors for an error event or a malformed event."""

    __slots__ = (
        "_content",
        "_content_watch",
        "_events",
        "_fed",
        "_fed_reasoning",
        "_reasoning",
        "_reasoning_watch",
        "_rest",
        "done",
        "finish_reason",
        "loop",
        "meta",
        "tokens",
        "usage",
    )

    def __init__(
        self, settings: RepetitionSettings, primer: str = "", primer_tokens: int | None = None
    ) -> None:
        """``primer``: the thought this answer continues (``primer_tokens`` tokens): a loop that
        began in it is placed where it began, at a negative position
        (:meth:`~dflash_tasks.core.repetition.RepetitionDetector.prime`)."""
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._reasoning_watch = RepetitionDetector(settings, "reasoning")
        self._reasoning_watch.prime(primer, primer_tokens)
        self._content_watch = RepetitionDetector(settings, "content")
        self._rest = b""
        self._events = 0
        self._fed = 0  # tokens fed to the detectors (the steps of the texts read)
        self._fed_reasoning = 0  # ... to the thought's
        self.done = False  # [DONE] seen
        self.finish_reason = ""
        self.loop: Loop | None = None
        self.meta: MetaInfo | None = None
        self.tokens = 0  # completion tokens so far (the latest usage)
        self.usage: dict[str, Any] = {}

    def feed(self, data: bytes) -> bool:
        """Read the next piece of the body; True once a loop was seen (stop reading)."""
        if self._rest:
            data = self._rest + data
        end = data.find(_EVENT_END)
        if end < 0:
            self._rest = data
            return False
        if end == len(data) - 2:  # one whole event: the usual piece
            self._rest = b""
            return data.startswith(_DATA) and self._event(data[len(_DATA) : end])
        events = data.split(_EVENT_END)
        self._rest = events.pop()
        return any(raw.startswith(_DATA) and self._event(raw[len(_DATA) :]) for raw in events)

    def _event(self, payload: bytes) -> bool:
        if payload == _DONE:
            self.done = True
            return False
        self._events += 1
        try:
            text = payload.decode()
            doc, end = _decode(text)
            if end != len(text) and text[end:].strip():
                raise ValueError("extra data after the event's JSON")
            if not isinstance(doc, dict):
                raise RetryableError(
                    f"invalid stream event ({len(payload)} bytes): not a JSON object", ErrorKind.BAD_RESPONSE
                )
            if "error" in doc:
                raise stream_error(doc["error"])
            usage = doc.get("usage")
            step: int | None = 1 if self.usage else None  # None: no usage yet, estimated
            if usage:
                self.usage = usage
                count = int(usage["completion_tokens"])
                step, self.tokens = count - self.tokens, count
            choices = doc["choices"]
            if not choices:
                self._extension(doc.get("sglext"))
                return False
            choice = choices[0]
            delta = choice["delta"]
            loop = self._text(text_of(delta.get("reasoning_content")), text_of(delta.get("content")), step)
            finish = choice.get("finish_reason")
            if finish:
                self.finish_reason = str(finish)
        except DflashError:
            raise
        except MALFORMED as exc:
            raise RetryableError(
                f"invalid stream event ({len(payload)} bytes): {type(exc).__name__}", ErrorKind.BAD_RESPONSE
            ) from None
        if loop is not None:
            self.loop = loop
            return True
        return False

    def _text(self, reasoning: str, content: str, tokens: int | None) -> Loop | None:
        """Join the delta's texts and watch them (a step's tokens go with its first text; without
        a usage, each text's are estimated)."""
        loop = None
        if reasoning:
            self._reasoning.append(reasoning)
            step = _estimate(reasoning) if tokens is None else tokens
            self._fed_reasoning += step
            self._fed += step
            loop = self._reasoning_watch.feed(reasoning, step)
            if tokens is not None:
                tokens = 0
        if content and loop is None:
            self._content.append(content)
            step = _estimate(content) if tokens is None else tokens
            self._fed += step
            loop = self._content_watch.feed(content, step)
        return loop

    def _extension(self, sglext: Any) -> None:
        """The ``sglext`` chunk: the speculative-decoding numbers, as ``meta_info`` holds them."""
        details = sglext.get("spec_tokens_details") if isinstance(sglext, dict) else None
        if isinstance(details, dict) and details:
            self.meta = parse_meta_info(details)

    def completion(self, joins: bool = False) -> Completion:
        """The answer read: the whole one, or the part before the stop once a loop was seen.

        ``joins`` as :func:`~workers.sglang_client.replies.parse_completion`. Retryable: a stream
        that ended before its finish and ``[DONE]``, and an abort (as the plain answer's)."""
        stopped = self.loop is not None
        if not stopped:
            if not (self.done and self.finish_reason):
                raise RetryableError(
                    f"the stream ended before its end ({self._events} events, no "
                    f"{'[DONE]' if self.finish_reason else 'finish_reason'})",
                    ErrorKind.BAD_RESPONSE,
                )
            if self.finish_reason == "abort":
                raise aborted()
            # the text since each detector's last check: a loop it completes counts too
            self.loop = self._reasoning_watch.flush() or self._content_watch.flush()
        raw_reasoning = "".join(self._reasoning)
        raw_content = "".join(self._content)
        reasoning, content = kept_texts(raw_reasoning, raw_content, joins)
        prompt_tokens, reasoning_tokens = self._usage_counts()
        completion_tokens = self.tokens
        if not self.usage:  # a server that ignored stream_options: the estimates fed
            completion_tokens, reasoning_tokens = self._fed, self._fed_reasoning
        elif stopped:  # no final usage: the continuous one may leave the thought's tokens out
            reasoning_tokens = min(completion_tokens, max(reasoning_tokens, self._fed_reasoning))
        loop = self.loop
        if loop is not None:  # positions in the stored (stripped) text
            if loop.text == "content":
                cut = _leading_cut(raw_content, content)
            else:  # a joining thought keeps its leading whitespace (and may loop from before 0)
                cut = 0 if joins else _leading_cut(raw_reasoning, reasoning)
            if cut:
                loop = loop.shifted(-cut)
        return Completion(
            reasoning=reasoning,
            content=content,
            finish_reason=FINISH_REASON if loop is not None else self.finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            reasoning_tokens=reasoning_tokens,
            meta=self.meta,
            loop=loop,
        )

    def _usage_counts(self) -> tuple[int, int]:
        """``(prompt_tokens, reasoning_tokens)`` of the latest usage; a malformed one is retryable."""
        try:
            prompt, _, reasoning = usage_counts(self.usage)
            return prompt, reasoning
        except MALFORMED as exc:
            raise RetryableError(
                f"invalid stream usage: {type(exc).__name__}", ErrorKind.BAD_RESPONSE
            ) from None


def read_stream(pieces: Iterable[bytes], reader: StreamReader, joins: bool = False) -> Completion:
    """The completion of a streamed body given as its pieces, read by ``reader``; stops reading at
    a loop (the caller then closes the connection). ``joins``: the answer continues a thought."""
    for piece in pieces:
        if reader.feed(piece):
            break
    return reader.completion(joins)


def _estimate(text: str) -> int:
    """The tokens of a delta whose count the stream does not give: at least one."""
    return max(1, round(len(text) / CHARS_PER_TOKEN))


def _leading_cut(raw: str, kept: str) -> int:
    """Characters stripping took off the start of ``raw`` to leave ``kept``."""
    return len(raw) - len(raw.lstrip()) if kept else len(raw)
