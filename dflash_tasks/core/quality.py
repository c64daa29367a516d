"""Per-turn quality checks and the gates that stop a useless run early.

The seed's first dataset was generated without thinking mode: 87% of its samples had six loss
tokens, and nobody noticed until after tokenization. Every generated turn now carries the checks
it failed, and its record (one per sample) the union of them; the gates judge the share of samples
failing each check, for the preflight sample and the live run alike.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dflash_tasks.core.on_loop import OnLoop
from dflash_tasks.core.record import Record, Turn
from dflash_tasks.core.repetition import RepetitionSettings

THINK_MARKERS = ("<think>", "</think>")

#: Every check a record can fail, with the likely cause shown when a gate trips.
CHECK_HINTS: dict[str, str] = {
    "failed": "requests fail: see the records' `error` field and the server logs",
    "no_reasoning": (
        "is enable_thinking on and the server started with a reasoning parser (--reasoning-parser qwen3)?"
    ),
    "unexpected_reasoning": (
        "thinking is off for this job, yet the server returns reasoning: check the chat template"
    ),
    "think_marker": "think tags leak into the text: is the server's reasoning parser right for this model?",
    "empty_answer": "no answer after the reasoning: raise --max-tokens, or check the reasoning parser",
    "truncated": "outputs hit max_tokens: raise --max-tokens or accept truncated samples",
    "short": "completions are very short: is thinking really on for this model?",
    "looping": (
        "the model falls into loops: check the sampling settings the server applies (temperature, "
        "top_p, top_k, presence_penalty; a model card's recommended ones) and the model itself"
    ),
}
#: The ``looping`` hint of a job sampling at temperature 0, the likely cause.
GREEDY_LOOPING_HINT = (
    "the job samples at temperature 0, and greedy decoding loops (regenerating with another seed "
    "changes nothing): raise --temperature (e.g. 0.6), or set presence_penalty on the server"
)
CHECKS = tuple(CHECK_HINTS)

#: Gates on the trainer's view of the rows (loss tokens under the model's chat template, see
#: core/trainable.py): judged where a tokenizer is at hand (the preflight, ``report``), not per record.
TRAINER_GATE_HINTS: dict[str, str] = {
    "few_loss_tokens": (
        "the trainer would learn from almost nothing in these rows (the seed's 6-loss-token failure): "
        "is thinking on and the reasoning parser right, and is --tokenizer the served model's?"
    ),
    "truncated_by_trainer": (
        "the trainer's max_length cuts the thoughts: set --train-max-length to the trainer's real "
        "max_length, or lower --max-tokens"
    ),
}
#: Every gate, the per-record checks first.
GATES = (*CHECKS, *TRAINER_GATE_HINTS)


@dataclass(frozen=True, slots=True)
class QualitySettings:
    """Job-level quality settings (written to job.json; not part of the job's identity)."""

    #: A completion shorter than this many tokens is flagged ``short`` (thinking jobs only).
    min_completion_tokens: int = 32
    #: Highest tolerated share of samples failing each check, for the preflight and live gates.
    max_share: dict[str, float] = field(
        default_factory=lambda: {
            "failed": 0.10,
            "no_reasoning": 0.10,
            "unexpected_reasoning": 0.10,
            "think_marker": 0.05,
            "empty_answer": 0.25,
            "truncated": 0.30,
            "short": 0.25,
            "looping": 0.10,
            "few_loss_tokens": 0.10,
            "truncated_by_trainer": 0.30,
        }
    )
    #: A row with fewer loss tokens than this counts toward ``few_loss_tokens``.
    min_loss_tokens: int = 64
    #: The live gate looks at the most recent samples, at least this many.
    window: int = 300
    #: The live gate decides nothing before this many samples are in the window.
    min_samples: int = 100
    #: When a streamed thought or answer counts as looping (core/repetition.py).
    repetition: RepetitionSettings = field(default_factory=RepetitionSettings)
    #: What happens to a sample stopped in a loop (core/on_loop.py).
    on_loop: OnLoop = field(default_factory=OnLoop)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> QualitySettings:
        if not doc:
            return cls()
        base = cls()
        shares = {**base.max_share, **dict(doc.get("max_share") or {})}
        return cls(
            min_completion_tokens=int(doc.get("min_completion_tokens", base.min_completion_tokens)),
            max_share={k: float(v) for k, v in shares.items()},
            window=int(doc.get("window", base.window)),
            min_samples=int(doc.get("min_samples", base.min_samples)),
            min_loss_tokens=int(doc.get("min_loss_tokens", base.min_loss_tokens)),
            repetition=RepetitionSettings.from_dict(doc.get("repetition")),
            on_loop=OnLoop.from_dict(doc.get("on_loop")),
        )


def check_turn(turn: Turn, thinking: bool, settings: QualitySettings) -> list[str]:
    """The checks one generated turn fails (empty when it is good)."""
    if not turn.ok:
        return ["failed"]
    reasoning = turn.reasoning.strip()
    content = turn.content.strip()
    found: list[str] = []
    if thinking and not reasoning:
        found.append("no_reasoning")
    if not thinking and reasoning:
        found.append("unexpected_reasoning")
    text = f"{reasoning}\n{content}".lower()  # once: the texts run to tens of kilobytes
    if any(m in text for m in THINK_MARKERS):
        found.append("think_marker")
    if not content and not turn.looped:  # a loop in the thought: its missing answer is the loop's
        found.append("empty_answer")
    if turn.finish_reason == "length":
        found.append("truncated")
    if turn.looped:
        found.append("looping")
    # A few tokens are the seed's failure in thinking mode; without thinking, a short answer
    # ("42") can be exactly right, so the check applies to thinking jobs only.
    if thinking and turn.usage.completion_tokens < settings.min_completion_tokens:
        found.append("short")
    return found


def check_record(record: Record, thinking: bool, settings: QualitySettings) -> list[str]:
    """The checks a sample fails: those any of its turns fails."""
    found = {check for turn in record.turns for check in check_turn(turn, thinking, settings)}
    return [check for check in CHECKS if check in found]


def with_checks(record: Record, thinking: bool, settings: QualitySettings) -> Record:
    """The record with each turn's checks (``turn.checks``) and their union (``record.checks``)."""
    turns = tuple(replace(t, checks=tuple(check_turn(t, thinking, settings))) for t in record.turns)
    found = {check for turn in turns for check in turn.checks or ()}
    return replace(record, turns=turns, checks=tuple(check for check in CHECKS if check in found))


def judged(records: Iterable[Record]) -> list[Record]:
    """The records the gates judge: all but those failed by a passing cause.

    A transient failure (a burst of 5xx, a timeout) says nothing about the data and is regenerated
    by a repair round; a server that keeps failing is the worker's health gate's business.
    """
    return [r for r in records if not r.transient]


def count_checks(records: Iterable[Record]) -> tuple[int, Counter[str]]:
    """(number of records, how many failed each check) from records carrying ``checks``."""
    total = 0
    counts: Counter[str] = Counter()
    for record in records:
        total += 1
        counts.update(record.checks or ())
    return total, counts


@dataclass(frozen=True, slots=True)
class GateFailure:
    check: str
    share: float
    threshold: float
    #: The job's sampling temperature, when known: names the likely cause of ``looping``.
    temperature: float | None = None

    @property
    def message(self) -> str:
        return f"{self.share:.0%} of samples {_DESCRIBE[self.check]}: {self.hint}"

    @property
    def hint(self) -> str:
        if self.check == "looping" and self.temperature == 0:
            return GREEDY_LOOPING_HINT
        return CHECK_HINTS.get(self.check) or TRAINER_GATE_HINTS[self.check]


_DESCRIBE = {
    "failed": "failed",
    "no_reasoning": "have no reasoning",
    "unexpected_reasoning": "have reasoning although thinking is off",
    "think_marker": "contain <think> markers",
    "empty_answer": "have no answer",
    "truncated": "are truncated",
    "short": "are shorter than the minimum",
    "looping": "fall into a loop",
    "few_loss_tokens": "have fewer than the minimum loss tokens under the chat template",
    "truncated_by_trainer": "lose loss tokens to the trainer's max_length",
}


def evaluate_gates(
    total: int, counts: Mapping[str, int], settings: QualitySettings, temperature: float | None = None
) -> list[GateFailure]:
    """Every check whose share of ``total`` exceeds its threshold, worst first (``temperature``: the
    job's, which names the likely cause of loops)."""
    if total <= 0:
        return []
    failures = [
        GateFailure(check, counts.get(check, 0) / total, limit, temperature)
        for check, limit in settings.max_share.items()
        if counts.get(check, 0) / total > limit
    ]
    return sorted(failures, key=lambda f: f.share - f.threshold, reverse=True)
