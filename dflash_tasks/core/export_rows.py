"""The rows a record becomes in the export, in one of two layouts, and which of them the trainer gets.

* ``conversation``: one row per sample, every generated assistant turn with its reasoning.
* ``per-turn``: one row per generated assistant turn, as SpecForge's
  ``scripts/expand_reasoning_conversations.py`` writes them (``id#turnN``, N from 0, with
  ``source_id`` and ``assistant_turn_index``): the conversation up to that turn, earlier answers
  without their reasoning; trained with ``train_only_last_turn``. Every generated turn is then
  trained, also where the template renders earlier turns without reasoning or without the header
  the trainer marks (SpecForge's ``qwen3.5``), and a sample cut at its second turn keeps its first.
  Under ``auto`` a sample with one generated turn keeps its plain id (its row is the same).

Two modes: ``trainer`` (the default) applies the horizon rule: a row whose last turn hit
``max_tokens`` is written when the trainer's ``max_length`` cuts it inside that turn's generated
text, so every token the trainer sees is one the model wrote (the answer may then be blank, which
SpecForge's validator script refuses and its trainer does not read). Truncated rows short of the
horizon are left out as ``truncated`` ("to continue or drop": a continuation round can finish
them). ``validator`` leaves out every truncated row, so SpecForge's validator accepts the file.

No row carries a loop: a turn stopped in a loop is written cut where its loop starts, as a turn cut
at ``max_tokens`` is (``truncated``, the horizon rule), when the job's ``--on-loop prefix`` keeps it
(:mod:`dflash_tasks.core.on_loop`); otherwise its row is left out by the ``looping`` check, one of
the default drops (``--keep looping`` writes the cut row, still under the truncated rule).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dflash_tasks.core.loss_tokens import LossTokenCounter, RowTokens, row_messages
from dflash_tasks.core.on_loop import OnLoop, loop_tokens, tokens_before_loop
from dflash_tasks.core.quality import QualitySettings, check_record, check_turn
from dflash_tasks.core.record import Record, Turn
from dflash_tasks.core.trainer_rules import row_problem

LAYOUTS = ("auto", "conversation", "per-turn")
MODES = ("trainer", "validator")

#: Quality checks whose rows the trainer rejects (or should never see): left out by default, the
#: first a row fails naming why. ``looping`` spares a turn whose text before its loop the job's
#: ``--on-loop prefix`` keeps: its row is that text, cut short (``truncated``).
DEFAULT_DROPS = (
    "looping",
    "think_marker",
    "truncated",
    "empty_answer",
    "no_reasoning",
    "unexpected_reasoning",
)
#: Where a turn that hit ``max_tokens`` was cut (:func:`cut_where`).
AT_MAX_TOKENS = "at max_tokens"
#: Reasons the horizon rule can lift from a row whose last turn was cut short.
_HORIZON_LIFTS = frozenset(("truncated", "empty_answer", "empty_message"))


@dataclass(slots=True)
class Candidate:
    """One row a record may become, with what it costs and why it may be left out."""

    sample_id: str
    row: dict[str, Any]
    generated: int  # completion tokens of the turns this row trains (its own)
    reasons: list[tuple[str, str]] = field(default_factory=list)  # (reason, detail), most telling first
    cut: str = ""  # where its last turn was cut short (cut_where), "" when it was not
    tokens: RowTokens | None = None  # the trainer's view, once counted
    source: str | None = None  # the record's input source (a job of several)
    turn: int | None = None  # the per-turn layout: the index of the turn it trains; None: every one
    looping: int = 0  # completion tokens of its looped turn from the loop on (never in the row)

    @property
    def cut_short(self) -> bool:
        """Whether its last turn was cut short (:attr:`Turn.cut_short`)."""
        return bool(self.cut)


def record_checks(record: Record, thinking: bool) -> set[str]:
    return set(record.checks or check_record(record, thinking, QualitySettings()))


def conversation_candidate(
    record: Record,
    thinking: bool,
    drop_checks: frozenset[str],
    keep_sources: bool,
    on_loop: OnLoop | None = None,
) -> Candidate:
    """The one row of an ok record in the ``conversation`` layout (``on_loop``: the job's policy)."""
    turns = row_messages(record)
    row: dict[str, Any] = {"id": record.id, "status": "success", "conversations": turns}
    copied = _copied_answers(record)
    last = record.turns[-1]
    looping = loop_tokens(last)
    generated = sum(t.usage.completion_tokens for t in record.turns) - looping
    c = Candidate(record.id, row, generated, cut=cut_where(last), looping=looping)
    c.reasons += drop_reasons(record_checks(record, thinking), last, drop_checks, on_loop or OnLoop())
    if thinking and copied:
        c.reasons.append(("source_answers", f"{len(copied)} assistant turns copied from the input"))
    exempt = copied if keep_sources else frozenset()
    problem = row_problem(row, expect_reasoning=thinking, exempt=exempt)
    if problem is not None:
        c.reasons.append((problem.reason, problem.detail))
    return c


def per_turn_candidates(
    record: Record,
    thinking: bool,
    drop_checks: frozenset[str],
    plain_id: bool = False,
    on_loop: OnLoop | None = None,
) -> list[Candidate]:
    """One row per generated (ok) turn of ``record`` in the ``per-turn`` layout (``plain_id``: a
    sample of one turn keeps its id, without ``source_id`` and ``assistant_turn_index``;
    ``on_loop``: the job's policy)."""
    out: list[Candidate] = []
    history: list[dict[str, Any]] = []
    for index, turn in enumerate(t for t in record.turns if t.ok):
        history += [
            {"role": m["role"], "content": m["content"], "reasoning_content": None} for m in turn.input
        ]
        reasoning, content = turn.before_loop()
        answer = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        messages = [*history, answer]
        row: dict[str, Any] = {"id": record.id, "status": "success", "conversations": messages}
        if not plain_id:
            row |= {"id": f"{record.id}#turn{index}", "source_id": record.id, "assistant_turn_index": index}
        looping = loop_tokens(turn)
        c = Candidate(
            record.id,
            row,
            turn.usage.completion_tokens - looping,
            cut=cut_where(turn),
            turn=index,
            looping=looping,
        )
        c.reasons += drop_reasons(turn_checks(turn, thinking), turn, drop_checks, on_loop or OnLoop())
        earlier = frozenset(i for i, m in enumerate(messages[:-1]) if m["role"] == "assistant")
        problem = row_problem(row, expect_reasoning=thinking, exempt=earlier)
        if problem is not None:
            c.reasons.append((problem.reason, problem.detail))
        out.append(c)
        history.append({"role": "assistant", "content": content, "reasoning_content": None})
    return out


def prefix_messages(
    inputs: Sequence[Sequence[Mapping[str, Any]]], answered: Sequence[Turn], per_turn: bool
) -> list[dict[str, Any]]:
    """The messages of the row that will train the next turn, before its answer: each answered
    turn's input and answer (its reasoning too in the ``conversation`` layout; the ``per-turn``
    layout drops earlier reasoning; a looped turn's texts up to its loop), then the next turn's input
    (``inputs[len(answered)]``)."""
    messages: list[dict[str, Any]] = []
    for added, turn in zip(inputs, answered, strict=False):
        messages += [{"role": m["role"], "content": m["content"], "reasoning_content": None} for m in added]
        reasoning, content = turn.before_loop()
        messages.append(
            {"role": "assistant", "content": content, "reasoning_content": None if per_turn else reasoning}
        )
    next_input = inputs[len(answered)]
    return messages + [
        {"role": m["role"], "content": m["content"], "reasoning_content": None} for m in next_input
    ]


def turn_checks(turn: Turn, thinking: bool) -> set[str]:
    """The checks a turn fails: as stored, else as the quality checks find them."""
    return set(turn.checks if turn.checks is not None else check_turn(turn, thinking, QualitySettings()))


def drop_reasons(
    checks: Collection[str], turn: Turn, drop_checks: frozenset[str], on_loop: OnLoop
) -> list[tuple[str, str]]:
    """Why a row ending in ``turn`` is left out: the checks it fails (``checks``: the turn's, or the
    record's for a whole conversation) among the default drops, then ``drop_checks``, each once.
    A turn cut short fails ``truncated`` (a looped one is cut where its loop starts); ``looping``
    spares a turn whose text before its loop the job keeps (``on_loop``)."""
    failed = {*checks, *(("truncated",) if turn.cut_short else ())}
    spared = {"looping"} if on_loop.keeps_prefix(turn) else set()
    return [
        (check, _detail(check, turn, on_loop))
        for check in dict.fromkeys((*DEFAULT_DROPS, *sorted(drop_checks)))
        if check in failed - spared
    ]


def cut_where(turn: Turn) -> str:
    """Where a turn cut short stops ("" when it is not): at ``max_tokens``, or where its loop starts
    (its row ends there)."""
    loop = turn.loop
    if loop is not None:
        kept = tokens_before_loop(turn)
        return f"where its loop starts, token {loop.start_token:,} of its {loop.text} ({kept:,} tokens kept)"
    return AT_MAX_TOKENS if turn.cut_short else ""


def _detail(check: str, turn: Turn, on_loop: OnLoop) -> str:
    """What a ``looping`` or ``truncated`` reason says (nothing for other checks)."""
    loop = turn.loop
    if check == "looping" and loop is not None:
        where = f"its {loop.text} at token {loop.start_token:,}"
        return f"stopped in a loop of {where} (--on-loop {on_loop.policy})"
    if check == "truncated" and turn.cut_short:
        return f"cut {cut_where(turn)}"
    return ""


def _copied_answers(record: Record) -> frozenset[int]:
    """Indexes (in the exported conversation) of assistant messages copied from the input."""
    copied: set[int] = set()
    index = 0
    for turn in record.turns:
        for message in turn.input:
            if message["role"] == "assistant":
                copied.add(index)
            index += 1
        index += turn.ok
    return frozenset(copied)


def within_horizon(
    candidate: Candidate, thinking: bool, max_length: int, per_turn: bool, kept: frozenset[str] = frozenset()
) -> tuple[bool, str]:
    """Whether a row cut short (at max_tokens, or where its loop starts) may be written by the horizon
    rule, and why not.

    The row's only problems must be its cut (``truncated``, a blank answer) and reasons the export
    keeps (``kept``: ``--keep``), and the trainer's ``max_length`` must fall inside the last turn's
    generated text (``candidate.tokens`` counted).
    """
    if not candidate.cut_short or candidate.tokens is None:
        return False, "no tokenizer to place the trainer's cut" if candidate.tokens is None else ""
    if any(reason not in _HORIZON_LIFTS | kept for reason, _ in candidate.reasons):
        return False, ""
    filled = _with_answer(candidate.row)  # whatever else the row breaks, apart from its blank answer
    earlier = frozenset(
        i for i, m in enumerate(filled["conversations"][:-1]) if per_turn and m["role"] == "assistant"
    )
    problem = row_problem(filled, expect_reasoning=thinking, exempt=earlier)
    if problem is not None:
        return False, ""
    if candidate.tokens.generated_end < max_length:
        then = "to continue or drop" if candidate.cut == AT_MAX_TOKENS else "a loop's prefix is not continued"
        return False, (
            f"cut {candidate.cut}, {candidate.tokens.generated_end:,} tokens into the row, short of the "
            f"trainer's max_length {max_length:,}: {then}"
        )
    return True, ""


def _with_answer(row: dict[str, Any]) -> dict[str, Any]:
    messages: Sequence[dict[str, Any]] = row["conversations"]
    last = dict(messages[-1])
    if not str(last.get("content") or "").strip():
        last["content"] = "-"
    return {**row, "conversations": [*messages[:-1], last]}


def count(counter: LossTokenCounter | None, candidates: Sequence[Candidate]) -> None:
    """Fill each candidate's :attr:`Candidate.tokens` (one batch), when a counter is at hand."""
    if counter is None or not candidates:
        return
    for c, tokens in zip(
        candidates, counter.count_many([c.row["conversations"] for c in candidates]), strict=True
    ):
        c.tokens = tokens
