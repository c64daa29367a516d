"""The repetition detector: sees a streamed text fall into a loop, as text deltas arrive.

A loop is the recent text made of one span repeated in a row: the text's tail is periodic with a
period ``P`` (in characters, at most ``max_period``) over at least ``max(min_chars,
min_repeats * P)`` characters. A short phrase must repeat many times (``min_chars / P``), a
paragraph at least ``min_repeats`` times. The rule is vLLM's n-gram repetition stop (the tail is
``min_count`` exact copies of a pattern), read on characters, since a streamed answer carries
text, not token ids, and with a floor on the repeated length: short periods repeated a few times
(separator rows, ``0, 0, 0``, a table of equal rows) are legitimate, a run of ``min_chars``
periodic characters is not (docs/quality.md, "Loops").

Cost: :meth:`RepetitionDetector.feed` appends the delta to a list; every :data:`CHECK_CHARS`
characters the pending deltas are joined onto a bounded buffer and the tail is checked with C
string operations (``rfind`` of the last :data:`PROBE_CHARS` characters within ``max_period``
gives the candidate periods, one slice comparison verifies each): a few hundred nanoseconds a
token (``python -m benchmarks repetition``). Memory per stream: one window of
``max(min_chars, min_repeats * max_period)`` characters, and the deltas since the last check.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

#: Characters fed between two checks of the tail (about 15 tokens of English).
CHECK_CHARS = 64
#: Characters of the tail whose earlier occurrences give the candidate periods.
PROBE_CHARS = 32
#: Candidate periods verified per check, nearest first.
MAX_CANDIDATES = 32
#: Characters per token of English text, where a text's token count is not known.
CHARS_PER_TOKEN = 4

#: ``--repetition`` / ``DFLASH_REPETITION``: ``off``, ``on``, or ``key=value`` pairs (comma-separated).
SPEC_HELP = (
    "loop detection on streamed text: 'off', 'on' (the defaults), or comma-separated key=value of "
    "min_chars (repeated run length, chars), min_repeats (copies in a row), max_period (longest "
    "repeated span, chars), e.g. 'min_chars=2000,max_period=6000'. On, the workers stream "
    "each request and stop it where its text loops (finish_reason 'repetition'); off, requests "
    "are sent plain (docs/quality.md, Loops)"
)


@dataclass(frozen=True, slots=True)
class RepetitionSettings:
    """When a streamed text counts as looping (a job quality setting, recorded in ``job.json``)."""

    #: Off: no text is ever judged a loop.
    enabled: bool = True
    #: The repeated run must span at least this many characters (about 350 tokens of English).
    min_chars: int = 1600
    #: ... and hold at least this many copies of its span.
    min_repeats: int = 2
    #: The longest span considered (characters); longer loops are not seen. Bounds the memory.
    max_period: int = 4000

    def __post_init__(self) -> None:
        if self.min_repeats < 2:
            raise ValueError(f"min_repeats must be >= 2, got {self.min_repeats}")
        if self.min_chars < 2:
            raise ValueError(f"min_chars must be >= 2, got {self.min_chars}")
        if self.max_period < 1:
            raise ValueError(f"max_period must be >= 1, got {self.max_period}")

    @property
    def window(self) -> int:
        """Characters a check needs to see: the longest run that proves a loop."""
        return max(self.min_chars, self.min_repeats * self.max_period)

    def needed(self, period: int) -> int:
        """Periodic characters that make a loop of ``period``."""
        return max(self.min_chars, self.min_repeats * period)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> RepetitionSettings:
        if not doc:
            return cls()
        base = cls()
        return cls(
            enabled=bool(doc.get("enabled", base.enabled)),
            min_chars=int(doc.get("min_chars", base.min_chars)),
            min_repeats=int(doc.get("min_repeats", base.min_repeats)),
            max_period=int(doc.get("max_period", base.max_period)),
        )

    @classmethod
    def parse(cls, text: str) -> RepetitionSettings:
        """A ``--repetition`` / ``DFLASH_REPETITION`` value; raises ``ValueError`` naming the problem."""
        values: dict[str, Any] = {}
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            if item.lower() in ("on", "off"):
                values["enabled"] = item.lower() == "on"
                continue
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or key not in _INT_KEYS:
                raise ValueError(f"repetition: {item!r} is not on, off or one of {', '.join(_INT_KEYS)}=N")
            try:
                values[key] = int(raw)
            except ValueError:
                raise ValueError(f"repetition: {key}={raw!r} is not an integer") from None
        return cls(**values)


_INT_KEYS = ("min_chars", "min_repeats", "max_period")

#: A turn's ``finish_reason`` when its request was stopped because its text looped.
FINISH_REASON = "repetition"
#: The texts a loop is watched in: ``Loop.text`` names one.
TEXTS = ("reasoning", "content")


@dataclass(frozen=True, slots=True)
class Loop:
    """Where a stream fell into a loop, and how far it had gone when it was seen."""

    #: Characters before the repeated run: ``text[:start_char]`` is the prefix before the loop.
    start_char: int
    #: Tokens before the run, estimated from the token counts fed (exact at check points).
    start_token: int
    #: Length of the repeated span: ``text[start_char:start_char + period_chars]`` is one copy.
    period_chars: int
    #: Copies of the span seen when the loop was detected.
    copies: float
    #: Characters and tokens fed when the loop was detected.
    detected_char: int
    detected_token: int
    #: The text that looped: ``reasoning`` (the thought) or ``content`` (the answer).
    text: str = "reasoning"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def shifted(self, chars: int, tokens: int = 0) -> Loop:
        """This loop with its character positions moved by ``chars`` and its token counts by
        ``tokens`` (not below 0): where it lies in a text that holds more (or less) before it."""
        return replace(
            self,
            start_char=max(0, self.start_char + chars),
            detected_char=max(0, self.detected_char + chars),
            start_token=max(0, self.start_token + tokens),
            detected_token=max(0, self.detected_token + tokens),
        )


class RepetitionDetector:
    """Watches one stream (a thought or an answer): :meth:`feed` its deltas, in order."""

    __slots__ = (
        "_base",
        "_buf",
        "_chars",
        "_keep",
        "_marks",
        "_pending",
        "_pending_chars",
        "_probe",
        "_tokens",
        "_watching",
        "loop",
        "settings",
        "text",
    )

    def __init__(self, settings: RepetitionSettings | None = None, text: str = "reasoning") -> None:
        self.settings = settings or RepetitionSettings()
        self.text = text
        self.loop: Loop | None = None
        self._watching = self.settings.enabled  # until a loop is seen
        self._buf = ""  # the text from offset _base on
        self._base = 0
        self._pending: list[str] = []
        self._pending_chars = 0
        self._chars = 0  # characters fed
        self._tokens = 0  # tokens fed
        # (characters fed, tokens fed) at each check, for the token estimate of a position
        self._marks: list[tuple[int, int]] = [(0, 0)]
        self._keep = self.settings.window + 2 * CHECK_CHARS
        self._probe = max(1, min(PROBE_CHARS, self.settings.min_chars // 2))

    @property
    def chars(self) -> int:
        """Characters fed so far."""
        return self._chars + self._pending_chars

    @property
    def buffered_chars(self) -> int:
        """Characters held (the bounded buffer and the deltas since the last check)."""
        return len(self._buf) + self._pending_chars

    def feed(self, delta: str, tokens: int = 1) -> Loop | None:
        """Add the next ``delta`` (``tokens`` tokens of text); the :class:`Loop` once it is seen
        (then kept in :attr:`loop`; later deltas are ignored), else None."""
        if not self._watching:
            return None
        self._pending.append(delta)
        self._pending_chars += len(delta)
        self._tokens += tokens
        if self._pending_chars < CHECK_CHARS:
            return None
        return self._check()

    def prime(self, text: str, tokens: int | None = None) -> None:
        """Hold the tail of ``text`` (up to :attr:`RepetitionSettings.window` characters), the text
        this stream continues, as if it had been fed before position 0, without counting it as fed:
        a loop that began in it is placed where it began, at a negative position. ``tokens``:
        ``text``'s token count (its tail's is taken pro rata), else estimated at
        :data:`CHARS_PER_TOKEN` characters a token. Call it before the first feed."""
        if not self._watching or not text or self._chars or self._pending:
            return
        tail = text[-self.settings.window :]
        tail_tokens = (
            round(len(tail) / CHARS_PER_TOKEN) if tokens is None else tokens * len(tail) // len(text)
        )
        self._buf = tail
        self._base = -len(tail)
        self._marks = [(-len(tail), -tail_tokens), (0, 0)]

    def flush(self) -> Loop | None:
        """Check what was fed since the last check (at the end of a stream)."""
        if not self._watching or not self._pending:
            return None
        return self._check()

    def _check(self) -> Loop | None:
        buf = self._buf + "".join(self._pending)
        self._chars += self._pending_chars
        self._pending.clear()
        self._pending_chars = 0
        if len(buf) > self._keep:
            cut = len(buf) - self._keep
            buf = buf[cut:]
            self._base += cut
            self._trim_marks()
        self._buf = buf
        self._marks.append((self._chars, self._tokens))
        found = self._tail_period(buf)
        if found is None:
            return None
        period, needed = found
        start = self._run_start(buf, period, len(buf) - needed)
        run = len(buf) - start
        self._watching = False
        self.loop = Loop(
            start_char=self._base + start,
            start_token=self._token_at(self._base + start),
            period_chars=period,
            copies=round(run / period, 2),
            detected_char=self._chars,
            detected_token=self._tokens,
            text=self.text,
        )
        return self.loop

    def _tail_period(self, buf: str) -> tuple[int, int] | None:
        """(period, periodic characters needed) when the tail is a loop, else None."""
        settings = self.settings
        size = len(buf)
        if size < settings.min_chars:
            return None
        probe = buf[size - self._probe :]
        end = size - 1  # an occurrence ending before the last character: a distance >= 1
        first = max(0, size - self._probe - settings.max_period)  # the farthest candidate
        for _ in range(MAX_CANDIDATES):
            at = buf.rfind(probe, first, end)
            if at < 0:
                return None
            period = size - self._probe - at
            needed = settings.needed(period)
            if needed > size:
                return None  # farther candidates need more
            if buf[size - needed : size - period] == buf[size - needed + period :]:
                return period, needed
            end = at + self._probe - 1
        return None

    @staticmethod
    def _run_start(buf: str, period: int, start: int) -> int:
        """Where the run that is periodic with ``period`` and reaches ``start`` begins."""
        while start >= period and buf[start - period : start] == buf[start : start + period]:
            start -= period
        while start > 0 and buf[start - 1] == buf[start - 1 + period]:
            start -= 1
        return start

    def _trim_marks(self) -> None:
        keep = bisect.bisect_left(self._marks, (self._base, -1)) - 1
        if keep > 0:
            del self._marks[:keep]

    def _token_at(self, char: int) -> int:
        """Tokens fed before character ``char``, interpolated between the checks around it."""
        marks = self._marks
        i = bisect.bisect_right(marks, (char, math.inf)) - 1
        if i < 0:
            return 0
        c0, t0 = marks[i]
        if i + 1 >= len(marks) or char <= c0:
            return t0
        c1, t1 = marks[i + 1]
        return t0 + int((t1 - t0) * (char - c0) / (c1 - c0))


def first_loop(text: str, settings: RepetitionSettings | None = None) -> Loop | None:
    """The loop a stream of ``text`` would show first: fed :data:`CHECK_CHARS` characters at a
    time, counted as one token per :data:`CHARS_PER_TOKEN` characters (token figures are estimates)."""
    detector = RepetitionDetector(settings)
    for at in range(0, len(text), CHECK_CHARS):
        piece = text[at : at + CHECK_CHARS]
        found = detector.feed(piece, max(1, round(len(piece) / CHARS_PER_TOKEN)))
        if found is not None:
            return found
    return detector.flush()
