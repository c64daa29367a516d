"""The output record (one JSON line per sample in ``outputs/chunk-NNNNNN.jsonl``) and its one encoding.

A :class:`Record` holds every :class:`Turn` of a sample's conversation, totals and provenance::

    {"id", "line", "source", "user_turns", "turns": [TURN, ...], "outcome", "status", "error", "failure",
     "failed_turn", "finish_reason", "usage", "model", "server", "sampling", "endpoint", "worker",
     "latency_s", "attempts", "repair", "checks"}
    TURN = {"input", "reasoning", "content", "finish_reason", "usage", "meta_info", "status", "error",
            "failure", "latency_s", "attempts", "parts", "loop", "checks"}
    PART = {"reasoning_chars", "content_chars", "finish_reason", "usage", "meta_info", "latency_s",
            "attempts"}

:meth:`Record.to_json` writes exactly these keys in this order (``source`` only in a job of several
input sources, ``failure`` only on a failed turn and record, ``repair`` only on a record a repair
round wrote, ``parts`` only on a turn a repair round continued, ``loop`` only on a turn stopped
because its text looped, ``checks`` only once the quality checks ran), as ``json.dumps(...,
ensure_ascii=False)`` does; :func:`encode_records` is the chunk file. :meth:`Record.from_json`
reads a stored line back and validates it, raising :class:`~dflash_tasks.core.errors.BadRecord`
that names the wrong field.

Reading is lenient where older writers were different, strict where a value is wrong:

* Only ``id`` is required. A key an older writer did not write reads as the default named on the
  field (``status`` as ``failed``: a record that does not say it is ok is not); ``outcome``,
  ``failed_turn`` and ``user_turns`` are then worked out from the turns as the worker does. A
  failed record without ``failure`` reads as None, which :attr:`Record.transient` counts as
  transient (a repair round finds out).
* A record without ``turns`` was written before multi-turn support: its one turn is spread over
  the record itself (``messages``, ``reasoning``, ``content``, ``meta_info`` and the fields both
  have) and reads as one :class:`Turn`. Re-encoding such a record writes today's shape.
* Keys no version of this code writes (a newer writer's additions) to a record or a turn are kept,
  in order, in ``extra`` and written back after the known keys: reading and re-writing loses
  nothing. Inside ``usage`` only the three counts are kept (:class:`Usage`).

A turn whose thought was cut at ``max_tokens`` and then continued (``continue_final_message``,
:mod:`dflash_tasks.core.continuation`) is one turn: its ``reasoning``, ``content``, ``finish_reason``
and ``usage`` are the whole turn's, as the trainer reads it, and ``parts`` keeps each request's
share: the characters of ``reasoning`` and ``content`` it wrote, in order, and its own numbers.

A turn whose stream was stopped because its text looped has ``finish_reason`` ``repetition`` and
``loop`` (:class:`~dflash_tasks.core.repetition.Loop`: which text looped, where the loop starts,
its period and where it was seen); its texts are as streamed up to the stop, loop included, and
:meth:`Turn.before_loop` gives them cut where the loop starts.

``meta_info`` (the server's per-request numbers, whose keys change with the SGLang release),
``server`` (what the server said it serves) and ``sampling`` (the job's sampling parameters) stay
plain mappings: they are recorded as received and passed through, so a new key needs no change
here; only :mod:`dflash_tasks.core.spec_stats` reads one of them (``spec_verify_ct``, checking
its type). The input messages stay the sample's own dicts (no copy per sample).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from dflash_tasks.core.errors import BadRecord
from dflash_tasks.core.loss_counts import LossCounts
from dflash_tasks.core.record_fields import (
    InvalidField,
    extra_of,
    read_checks,
    read_failure,
    read_float,
    read_int,
    read_loop,
    read_mapping,
    read_messages,
    read_status,
    read_str,
    read_text,
    wrong,
)
from dflash_tasks.core.record_parts import Part, Usage, read_parts, read_usage
from dflash_tasks.core.repetition import Loop
from dflash_tasks.core.states import FailureKind, Outcome, RecordStatus

__all__ = ["Part", "Record", "Turn", "Usage", "decode_records", "encode_records", "outcome_of"]

_ENCODER = json.JSONEncoder(ensure_ascii=False)

#: Keys of a record from before multi-turn support that belong to its one turn.
_LEGACY_TURN_KEYS = frozenset(("messages", "reasoning", "content", "meta_info"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Turn:
    """One request of a sample's conversation: the messages it added and the model's answer."""

    input: tuple[dict[str, str], ...] = ()  # the messages new in this turn
    reasoning: str = ""
    content: str = ""
    finish_reason: str | None = None  # None when the turn failed
    usage: Usage = field(default_factory=Usage)
    meta_info: Mapping[str, Any] | None = None  # the server's per-request numbers, as received
    status: RecordStatus
    error: str | None = None
    failure: FailureKind | None = None  # whether a failed turn may pass; None when ok
    latency_s: float = 0.0
    attempts: int = 0
    parts: tuple[Part, ...] = ()  # each request's share of a continued turn; () for one request
    checks: tuple[str, ...] | None = None  # the quality checks it fails; None before they ran
    loop: Loop | None = None  # where its text fell into a loop (finish_reason "repetition")
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this code does not know, as read

    @property
    def ok(self) -> bool:
        return self.status is RecordStatus.OK

    @property
    def looped(self) -> bool:
        """Whether its request was stopped because its text looped."""
        return self.loop is not None

    @property
    def cut_short(self) -> bool:
        """Whether its text stops before the model ended it: at ``max_tokens`` (``finish_reason``
        ``length``), or where it was stopped in a loop (``repetition``)."""
        return self.finish_reason == "length" or self.looped

    def before_loop(self) -> tuple[str, str]:
        """``(reasoning, content)`` as written before the loop began (the whole texts without one)."""
        loop = self.loop
        if loop is None:
            return self.reasoning, self.content
        if loop.text == "content":
            return self.reasoning, self.content[: loop.start_char]
        return self.reasoning[: loop.start_char], ""

    def part_texts(self) -> list[tuple[str, str]]:
        """``(reasoning, content)`` written by each request, in order (one pair for a plain turn)."""
        if not self.parts:
            return [(self.reasoning, self.content)]
        texts, r, c = [], 0, 0
        for part in self.parts:
            texts.append(
                (self.reasoning[r : r + part.reasoning_chars], self.content[c : c + part.content_chars])
            )
            r, c = r + part.reasoning_chars, c + part.content_chars
        return texts

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "input": list(self.input),
            "reasoning": self.reasoning,
            "content": self.content,
            "finish_reason": self.finish_reason,
            "usage": self.usage.to_dict(),
            "meta_info": self.meta_info,
            "status": self.status.value,
            "error": self.error,
        }
        if self.failure is not None:
            doc["failure"] = self.failure.value
        doc["latency_s"] = self.latency_s
        doc["attempts"] = self.attempts
        if self.parts:
            doc["parts"] = [p.to_dict() for p in self.parts]
        if self.loop is not None:
            doc["loop"] = self.loop.to_dict()
        return _with_checks_and_extra(doc, self.checks, self.extra)


def _with_checks_and_extra(
    doc: dict[str, Any], checks: tuple[str, ...] | None, extra: Mapping[str, Any]
) -> dict[str, Any]:
    """The tail both a turn and a record write: ``checks`` once they ran, then the unknown keys."""
    if checks is not None:
        doc["checks"] = list(checks)
    if extra:
        doc.update(extra)
    return doc


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One sample's output line: every turn of its conversation, totals and provenance.

    ``outcome`` is ``complete`` (every turn answered), ``truncated`` (the last turn hit
    ``max_tokens`` or has no answer, so the conversation stopped there) or ``failed`` (the last
    turn failed: ``failed_turn`` names it); see :func:`outcome_of`. The turns before the last
    one are always complete. Equal records encode to the same line; a record is not hashable
    (its pass-through mappings are not).
    """

    id: str
    line: int | None = None  # the sample's place in the job's input (its line in one JSONL file)
    source: str | None = None  # the input source it came from, in a job of several sources
    user_turns: int  # the turns its conversation has (requests it needs when none ends early)
    turns: tuple[Turn, ...]
    outcome: Outcome
    status: RecordStatus  # of the last turn
    error: str | None = None
    failure: FailureKind | None = None  # of the failed turn; None when ok
    failed_turn: int | None = None  # 1-based
    finish_reason: str | None = None  # of the last turn
    usage: Usage = field(default_factory=Usage)  # summed over the turns
    model: str | None = None
    server: Mapping[str, Any] | None = None  # what the server said it serves, as received
    sampling: Mapping[str, Any] | None = None  # the job's sampling parameters
    endpoint: str | None = None
    worker: str | None = None
    latency_s: float = 0.0
    attempts: int = 0  # summed over the turns
    repair: int | None = None  # the repair round that wrote it; None: the chunk's first pass
    checks: tuple[str, ...] | None = None  # the union of the turns' checks; None before they ran
    #: The trainer's view of its rows, counted by the worker (:mod:`dflash_tasks.core.loss_counts`).
    loss_counts: LossCounts | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this code does not know, as read

    @property
    def ok(self) -> bool:
        return self.status is RecordStatus.OK

    @property
    def generated_tokens(self) -> int:
        """The completion tokens its turns generated: what it cost (the stored ``usage`` total may
        be missing)."""
        return sum(t.usage.completion_tokens for t in self.turns)

    @property
    def transient(self) -> bool:
        """Failed by a cause that may pass (or by one an older writer did not name): repairable."""
        return not self.ok and self.failure is not FailureKind.PERMANENT

    def to_dict(self) -> dict[str, Any]:
        """The record as a plain dict: today's keys, in today's order (see the module docstring)."""
        doc: dict[str, Any] = {
            "id": self.id,
            "line": self.line,
        }
        if self.source is not None:
            doc["source"] = self.source
        doc |= {
            "user_turns": self.user_turns,
            "turns": [t.to_dict() for t in self.turns],
            "outcome": self.outcome.value,
            "status": self.status.value,
            "error": self.error,
        }
        if self.failure is not None:
            doc["failure"] = self.failure.value
        doc |= {
            "failed_turn": self.failed_turn,
            "finish_reason": self.finish_reason,
            "usage": self.usage.to_dict(),
            "model": self.model,
            "server": self.server,
            "sampling": self.sampling,
            "endpoint": self.endpoint,
            "worker": self.worker,
            "latency_s": self.latency_s,
            "attempts": self.attempts,
        }
        if self.repair is not None:
            doc["repair"] = self.repair
        if self.checks is not None:
            doc["checks"] = list(self.checks)
        if self.loss_counts is not None:
            doc["loss_counts"] = self.loss_counts.to_dict()
        return _with_checks_and_extra(doc, None, self.extra)

    def to_json(self) -> str:
        """The record's line (without the newline): the one encoding of an output record."""
        return _ENCODER.encode(self.to_dict())

    @classmethod
    def from_json(cls, line: str | bytes, where: str = "") -> Record:
        """Parse and validate one stored line; ``where`` (``key:line``) prefixes the error."""
        try:
            doc = json.loads(line)
        except ValueError:
            raise BadRecord(where, "not JSON") from None
        return cls.from_dict(doc, where)

    @classmethod
    def from_dict(cls, doc: Any, where: str = "") -> Record:
        """Validate a decoded line (see the module docstring for what older writers may omit)."""
        try:
            return _record(doc)
        except InvalidField as exc:
            raise BadRecord(where, exc.cause, exc.field) from None


def outcome_of(turns: Sequence[Turn], user_turns: int) -> Outcome:
    """How a conversation with these ``turns`` (of ``user_turns``) ended (see :class:`Record`)."""
    last = turns[-1]
    if not last.ok:
        return Outcome.FAILED
    if len(turns) < user_turns or last.cut_short or not last.content:
        return Outcome.TRUNCATED
    return Outcome.COMPLETE


def encode_records(records: Iterable[Record]) -> bytes:
    """A chunk file of output records: one :meth:`Record.to_json` line each."""
    return "".join([r.to_json() + "\n" for r in records]).encode()


def decode_records(data: bytes, where: str) -> Iterator[Record]:
    """The records of a chunk file, skipping blank lines; a damaged line raises
    :class:`~dflash_tasks.core.errors.BadRecord` naming ``where:LINE`` and the field."""
    for number, raw in enumerate(data.splitlines(), 1):
        if raw.strip():
            yield Record.from_json(raw, f"{where}:{number}")


# --- reading and validating ----------------------------------------------------------------------

_TURN_KEYS = frozenset(f.name for f in fields(Turn)) - {"extra"}
_RECORD_KEYS = frozenset(f.name for f in fields(Record)) - {"extra"}


def _turn(doc: Any, path: str, inputs_key: str, known: frozenset[str]) -> Turn:
    if not isinstance(doc, dict):
        raise wrong(path.rstrip("."), "a turn object", doc)
    reasoning, content = read_text(doc, "reasoning", path), read_text(doc, "content", path)
    return Turn(
        input=read_messages(doc.get(inputs_key), path + inputs_key),
        reasoning=reasoning,
        content=content,
        finish_reason=read_str(doc, "finish_reason", path),
        usage=read_usage(doc, path),
        meta_info=read_mapping(doc, "meta_info", path),
        status=read_status(doc, path),
        error=read_str(doc, "error", path),
        failure=read_failure(doc, path),
        latency_s=read_float(doc, "latency_s", path),
        attempts=read_int(doc, "attempts", path) or 0,
        parts=read_parts(doc, path, reasoning, content) if path else (),
        checks=read_checks(doc, path),
        loop=read_loop(doc, path),
        extra=extra_of(doc, known) if path else {},
    )


def _record(doc: Any) -> Record:
    if not isinstance(doc, dict) or "id" not in doc:
        raise InvalidField("id", "no id")
    sample_id = doc["id"]
    if not isinstance(sample_id, str):
        raise wrong("id", "a string", sample_id)
    stored_turns = doc.get("turns")
    known = _RECORD_KEYS
    if stored_turns is None:  # written before multi-turn support: one turn spread over the record
        turns: tuple[Turn, ...] = (_turn(doc, "", "messages", _TURN_KEYS),)
        known = _RECORD_KEYS | _LEGACY_TURN_KEYS
    elif isinstance(stored_turns, list) and stored_turns:
        turns = tuple(_turn(t, f"turns[{i}].", "input", _TURN_KEYS) for i, t in enumerate(stored_turns))
    else:
        raise wrong("turns", "a non-empty list of turns", stored_turns)
    user_turns = read_int(doc, "user_turns", "") or len(turns)
    outcome_text = doc.get("outcome")
    if outcome_text is None:
        outcome = outcome_of(turns, user_turns)
    else:
        try:
            outcome = Outcome(outcome_text)
        except ValueError:
            raise wrong("outcome", "'complete', 'truncated' or 'failed'", outcome_text) from None
    failed_turn = read_int(doc, "failed_turn", "")
    if "failed_turn" not in doc and outcome is Outcome.FAILED:
        failed_turn = len(turns)
    return Record(
        id=sample_id,
        line=read_int(doc, "line", ""),
        source=read_str(doc, "source", ""),
        user_turns=user_turns,
        turns=turns,
        outcome=outcome,
        status=read_status(doc, ""),
        error=read_str(doc, "error", ""),
        failure=read_failure(doc, ""),
        failed_turn=failed_turn,
        finish_reason=read_str(doc, "finish_reason", ""),
        usage=read_usage(doc, ""),
        model=read_str(doc, "model", ""),
        server=read_mapping(doc, "server", ""),
        sampling=read_mapping(doc, "sampling", ""),
        endpoint=read_str(doc, "endpoint", ""),
        worker=read_str(doc, "worker", ""),
        latency_s=read_float(doc, "latency_s", ""),
        attempts=read_int(doc, "attempts", "") or 0,
        repair=read_int(doc, "repair", ""),
        checks=read_checks(doc, ""),
        loss_counts=_loss_counts(doc),
        extra=extra_of(doc, known),
    )


def _loss_counts(doc: Mapping[str, Any]) -> LossCounts | None:
    value = doc.get("loss_counts")
    if value is None:
        return None
    try:
        return LossCounts.from_dict(value)
    except ValueError as exc:
        raise InvalidField("loss_counts", f"loss_counts: expected {exc}") from None
