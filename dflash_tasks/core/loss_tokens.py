"""The loss tokens of one exported row, counted the way a SpecForge-style trainer marks them.

The trainer renders a row's conversation with the tokenizer's own chat template
(``apply_chat_template``, assistant messages carrying ``reasoning_content``, ``enable_thinking``
as generated), tokenizes the text without special tokens added and cuts it at ``max_length``. Its
loss tokens are the spans from each assistant header to the end-of-turn marker, both included
after the header (only the last span with ``train_only_last_turn``), minus the template's ignore
strings. This module does the same, with the markers taken from the template itself:

* the assistant header is what the generation prompt adds after a user message, with thinking on
  (for Qwen3 ``<|im_start|>assistant\\n``);
* the end of turn is what the template writes after an assistant message (``<|im_end|>\\n``);
* with thinking off, the empty think block the generation prompt inserts
  (``<think>\\n\\n</think>\\n\\n``) is ignored, as SpecForge's ``qwen3-instruct`` template does.

Tokens are mapped to spans by their character offsets from one tokenization (SpecForge
re-tokenizes each span's prefix; both agree wherever a span starts and ends on token
boundaries, which chat-template markers do). The count also says whether each assistant turn's
reasoning survives the template: Qwen3's drops the reasoning of turns before the last user
message, so a multi-turn sample's earlier thoughts are generated but never trained on.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.record import Record
from dflash_tasks.core.trainer_templates import registered
from dflash_tasks.core.trainer_view import TrainerView

_PROBE_USER = "dflash-probe-user"
_PROBE_ANSWER = "dflash-probe-answer"


def row_messages(record: Record) -> list[dict[str, Any]]:
    """The record's exported conversation: each turn's input, then the model's answer when it has one
    (a looped turn's cut where its loop starts: no row carries a loop)."""
    messages: list[dict[str, Any]] = []
    for turn in record.turns:
        messages += [
            {"role": m["role"], "content": m["content"], "reasoning_content": None} for m in turn.input
        ]
        if turn.ok:
            reasoning, content = turn.before_loop()
            messages.append({"role": "assistant", "content": content, "reasoning_content": reasoning})
    return messages


@functools.lru_cache(maxsize=4)  # a command checks an explicit --tokenizer early, then counts with it
def load_tokenizer(path: str) -> Any:
    """The tokenizer in model directory ``path``, read offline; :class:`ConfigError` naming the cause."""
    where = Path(path)
    if not (where / "tokenizer_config.json").is_file():
        raise ConfigError(f"--tokenizer {path}: no tokenizer_config.json there (a model directory is needed)")
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(where), local_files_only=True)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise ConfigError(f"--tokenizer {path}: cannot load the tokenizer: {exc}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"--tokenizer {path}: a fast tokenizer (tokenizer.json) is needed")
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"--tokenizer {path}: tokenizer_config.json has no chat_template")
    return tokenizer


@dataclass(frozen=True, slots=True)
class TemplateMarkers:
    """Where a rendered conversation's loss spans start and end, and what they leave out."""

    assistant_header: str
    end_of_turn: str
    ignore: tuple[str, ...] = ()

    def pattern(self) -> re.Pattern[str]:
        """Header, then the span up to and including the end of turn (or the end of the text)."""
        eot = re.escape(self.end_of_turn)
        return re.compile(re.escape(self.assistant_header) + r"([\s\S]*?(?:" + eot + "|$))")


def markers_of(tokenizer: Any, thinking: bool, where: str) -> TemplateMarkers:
    """The markers of ``tokenizer``'s chat template (see the module's docstring)."""
    user = [{"role": "user", "content": _PROBE_USER}]
    bare = _render(tokenizer, user, thinking=True, generation=False)
    header = _render(tokenizer, user, thinking=True, generation=True)
    if not header.startswith(bare) or header == bare:
        raise ConfigError(f"{where}: the chat template's generation prompt does not extend the conversation")
    header = header[len(bare) :]
    answered = _render(
        tokenizer,
        [*user, {"role": "assistant", "content": _PROBE_ANSWER, "reasoning_content": None}],
        thinking=thinking,
        generation=False,
    )
    end = answered[answered.rfind(_PROBE_ANSWER) + len(_PROBE_ANSWER) :]
    if _PROBE_ANSWER not in answered or not end:
        raise ConfigError(f"{where}: the chat template writes nothing after an assistant message")
    ignore: tuple[str, ...] = ()
    if not thinking:
        off = _render(tokenizer, user, thinking=False, generation=True)[len(bare) :]
        if off.startswith(header) and off != header:
            ignore = (off[len(header) :],)
    return TemplateMarkers(header, end, ignore)


def _render(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    thinking: bool | None,
    generation: bool,
    preserve_thinking: bool = False,
) -> str:
    """The template's text; ``thinking`` None renders without ``enable_thinking`` (its default)."""
    extra: dict[str, Any] = {"preserve_thinking": True} if preserve_thinking else {}
    if thinking is not None:
        extra["enable_thinking"] = thinking
    text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=generation, **extra
    )
    return str(text)


@dataclass(frozen=True, slots=True)
class RowTokens:
    """One row as the trainer sees it."""

    tokens: int  # rendered, before max_length
    loss_tokens: int  # the loss tokens the trainer keeps (within max_length)
    loss_tokens_untruncated: int  # the loss tokens without max_length
    reasoning_turns: int  # assistant messages carrying reasoning
    reasoning_dropped: int  # of those, the ones whose reasoning the template does not render
    #: Tokens wholly before the end of the last assistant message's text: those after it are the
    #: template's (``</think>``, end of turn). A row cut at ``max_length`` <= this trains on
    #: generated tokens only, however its last turn ended (the horizon rule).
    generated_end: int = 0

    @property
    def lost_to_max_length(self) -> int:
        return self.loss_tokens_untruncated - self.loss_tokens

    @property
    def truncated(self) -> bool:
        """Whether ``max_length`` cuts loss tokens off this row."""
        return self.lost_to_max_length > 0


@dataclass(frozen=True, slots=True)
class TokenMarks:
    """A rendered row token by token: each token's characters and whether the trainer learns it."""

    text: str
    offsets: tuple[tuple[int, int], ...]  # each token's [start, end) in ``text``
    trained: tuple[bool, ...]  # per token, within max_length
    max_length: int

    @property
    def trained_count(self) -> int:
        return sum(self.trained)


class LossTokenCounter:
    """Counts rows' loss tokens with one tokenizer and trainer view (one per command)."""

    def __init__(
        self, tokenizer: Any, view: TrainerView, thinking: bool, where: str, preserve_thinking: bool = False
    ) -> None:
        self.tokenizer = tokenizer
        self.view = view
        self.thinking = thinking
        #: ``history_reasoning: keep``: the template renders earlier turns' reasoning (Qwen3.6).
        self.preserve_thinking = preserve_thinking
        self.where = where
        self.system_prompt = ""
        self._render_thinking: bool | None = thinking
        if view.template is None:
            self.markers = markers_of(tokenizer, thinking, where)
        else:  # SpecForge's registered template: its markers, system prompt and rendering switch
            t = registered(view.template)
            self.markers = TemplateMarkers(t.assistant_header, t.end_of_turn, t.ignore)
            self.system_prompt = t.system_prompt
            self._render_thinking = True if t.enable_thinking else None
        self._pattern = self.markers.pattern()
        self._backend = _untruncated_copy(tokenizer)

    def render(self, messages: Sequence[Mapping[str, Any]], generation: bool = False) -> str:
        """The row's text as the trainer renders it (``generation``: with the generation prompt)."""
        if self.system_prompt and (not messages or messages[0].get("role") != "system"):
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        return _render(
            self.tokenizer,
            messages,
            thinking=self._render_thinking,
            generation=generation,
            preserve_thinking=self.preserve_thinking,
        )

    def prompt_tokens(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """The tokens of a row's prefix: ``messages`` (up to the turn being generated) as the trainer
        renders them, and the generation prompt after them (the model's answer starts there)."""
        return len(self._backend.encode(self.render(messages, generation=True), add_special_tokens=False))

    @functools.cached_property
    def closing_tokens(self) -> int:
        """The tokens the template writes after an answer (its end of turn, ``<|im_end|>\n``)."""
        return len(self._backend.encode(self.markers.end_of_turn, add_special_tokens=False))

    def count(self, messages: Sequence[Mapping[str, Any]]) -> RowTokens:
        return self.count_many([messages])[0]

    def count_many(self, rows: Sequence[Sequence[Mapping[str, Any]]]) -> list[RowTokens]:
        """:meth:`count` of each row; the texts are tokenized together, on every core."""
        texts = [self.render(messages) for messages in rows]
        # The backend tokenizer directly: the same encoding, without transformers' per-call wrapping.
        encodings = self._backend.encode_batch(texts, add_special_tokens=False)
        return [
            self._row(messages, text, e.offsets)
            for messages, text, e in zip(rows, texts, encodings, strict=True)
        ]

    def marks(self, messages: Sequence[Mapping[str, Any]]) -> TokenMarks:
        """The row's rendered text and tokens, each marked trained or not (what :meth:`count` sums)."""
        text = self.render(messages)
        (encoding,) = self._backend.encode_batch([text], add_special_tokens=False)
        pieces = self._loss_pieces(text, encoding.offsets)
        trained = [False] * len(encoding.offsets)
        for a, b in pieces:
            for i in range(a, min(b, self.view.max_length)):
                trained[i] = True
        return TokenMarks(text, tuple(encoding.offsets), tuple(trained), self.view.max_length)

    def _loss_pieces(self, text: str, offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The token index ranges ``[a, b)`` the trainer's loss covers, before ``max_length``."""
        starts = [a for a, _ in offsets]
        ends = [b for _, b in offsets]
        spans = [m.span(1) for m in self._pattern.finditer(text)]
        if self.view.last_turn_only:
            spans = spans[-1:]
        pieces: list[tuple[int, int]] = []
        for start, end in spans:
            first, last = _tokens_within(starts, ends, start, end)
            cut = [(first, last)]
            for s in self.markers.ignore:  # ignored tokens inside this span leave it
                for at in _occurrences(text, s, start, end):
                    lo, hi = _tokens_within(starts, ends, at, at + len(s))
                    cut = [piece for a, b in cut for piece in ((a, min(b, lo)), (max(a, hi), b))]
            pieces += [(a, b) for a, b in cut if a < b]
        return pieces

    def _row(
        self, messages: Sequence[Mapping[str, Any]], text: str, offsets: list[tuple[int, int]]
    ) -> RowTokens:
        limit = self.view.max_length
        kept = total = 0
        for a, b in self._loss_pieces(text, offsets):
            total += b - a
            kept += max(0, min(b, limit) - a)
        reasoning = [
            str(m["reasoning_content"]).strip()
            for m in messages
            if m.get("role") == "assistant" and str(m.get("reasoning_content") or "").strip()
        ]
        dropped = sum(1 for r in reasoning if r not in text)
        ends = [b for _, b in offsets]
        return RowTokens(
            len(offsets), kept, total, len(reasoning), dropped, _generated_end(messages, text, ends)
        )


def _generated_end(messages: Sequence[Mapping[str, Any]], text: str, ends: list[int]) -> int:
    """The tokens wholly before the end of the last assistant message's own text in ``text``."""
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    if last is None:
        return 0
    for part in (str(last.get("content") or ""), str(last.get("reasoning_content") or "")):
        part = part.strip()
        if part and (at := text.rfind(part)) != -1:
            return bisect.bisect_right(ends, at + len(part))
    return 0


def _untruncated_copy(tokenizer: Any) -> Any:
    """A private copy of a fast tokenizer's backend (the ``tokenizers`` object), never truncating:
    transformers leaves the shared one in the truncation state of its last call."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    return backend


def _tokens_within(starts: list[int], ends: list[int], start: int, end: int) -> tuple[int, int]:
    """The token indexes ``[first, last)`` whose characters lie wholly within ``[start, end)``."""
    first = bisect.bisect_left(starts, start)
    last = bisect.bisect_right(ends, end)
    return first, max(first, last)


def _occurrences(text: str, needle: str, start: int, end: int) -> list[int]:
    """Where ``needle`` occurs wholly within ``text[start:end]``."""
    found = []
    while (i := text.find(needle, start, end)) != -1:
        found.append(i)
        start = i + len(needle)
    return found
