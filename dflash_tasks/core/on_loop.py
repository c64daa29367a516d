"""What happens to a sample whose turn was stopped in a loop (``enqueue --on-loop``, ``DFLASH_ON_LOOP``).

* ``regenerate`` (the default): repair rounds send the sample again from its looped turn, with
  another sampling seed (the round's number); the looped attempt's tokens count as generated and
  not trained (``looping`` in the yield). At temperature 0 another seed changes nothing: greedy
  decoding loops again.
* ``prefix``: the looped turn is kept cut where its loop starts (:meth:`~dflash_tasks.core.record.
  Turn.before_loop`) when the text kept is at least ``min_prefix_tokens`` long; the export treats
  it as a turn cut at ``max_tokens`` (the horizon rule writes it in trainer mode when the trainer's
  ``max_length`` falls inside the kept text). Shorter prefixes are regenerated.
* ``drop``: the sample is left out of the export and not regenerated.

Whatever the policy, the export never writes a loop: a row carries a looped turn's text only up to
where its loop starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dflash_tasks.core.record import Record, Turn

REGENERATE = "regenerate"
PREFIX = "prefix"
DROP = "drop"
POLICIES = (REGENERATE, PREFIX, DROP)
#: The shortest prefix ``prefix`` keeps (tokens before the loop), when the value does not say.
DEFAULT_MIN_PREFIX_TOKENS = 1024

#: ``--on-loop`` / ``DFLASH_ON_LOOP``.
ON_LOOP_HELP = (
    "what happens to a sample stopped in a loop: regenerate (default: repair rounds send it again "
    "with another seed), prefix[=N] (keep the text before the loop when it holds at least N tokens, "
    f"default {DEFAULT_MIN_PREFIX_TOKENS}; shorter ones are regenerated), drop (left out). The "
    "export never writes a loop (docs/quality.md, Loops)"
)


@dataclass(frozen=True, slots=True)
class OnLoop:
    """The job's policy for looped samples (a quality setting, recorded in ``job.json``)."""

    policy: str = REGENERATE
    #: Under ``prefix``: the tokens a looped turn must hold before its loop to be kept.
    min_prefix_tokens: int = DEFAULT_MIN_PREFIX_TOKENS

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"on_loop: expected one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.min_prefix_tokens < 1:
            raise ValueError(f"on_loop: the prefix minimum must be >= 1, got {self.min_prefix_tokens}")

    def keeps_prefix(self, turn: Turn) -> bool:
        """Whether a looped ``turn`` is kept cut where its loop starts (``prefix``, long enough)."""
        return self.policy == PREFIX and turn.looped and tokens_before_loop(turn) >= self.min_prefix_tokens

    def regenerates(self, record: Record) -> bool:
        """Whether a repair round sends this looped record again."""
        last = record.turns[-1]
        if not record.ok or not last.looped:
            return False
        return self.policy == REGENERATE or (self.policy == PREFIX and not self.keeps_prefix(last))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> OnLoop:
        if not doc:
            return cls()
        return cls(
            policy=str(doc.get("policy", REGENERATE)),
            min_prefix_tokens=int(doc.get("min_prefix_tokens", DEFAULT_MIN_PREFIX_TOKENS)),
        )

    @classmethod
    def parse(cls, text: str) -> OnLoop:
        """An ``--on-loop`` / ``DFLASH_ON_LOOP`` value (empty: the default); ``ValueError`` naming
        the problem."""
        name, sep, raw = text.strip().lower().partition("=")
        if not name:
            return cls()
        if sep and name != PREFIX:
            raise ValueError(f"on_loop: only prefix takes a value (prefix=N), got {text!r}")
        if not sep:
            return cls(policy=name)
        try:
            minimum = int(raw)
        except ValueError:
            raise ValueError(f"on_loop: prefix={raw!r} is not a number of tokens") from None
        return cls(policy=PREFIX, min_prefix_tokens=minimum)


def tokens_before_loop(turn: Turn) -> int:
    """The tokens a looped turn wrote before its loop (its thought's too, when the answer looped)."""
    loop = turn.loop
    if loop is None:
        return turn.usage.completion_tokens
    if loop.text == "content":
        return turn.usage.reasoning_tokens + loop.start_token
    return loop.start_token


def loop_tokens(turn: Turn) -> int:
    """The tokens a looped turn generated from its loop's start on (0 for a turn without a loop)."""
    if turn.loop is None:
        return 0
    return max(0, turn.usage.completion_tokens - tokens_before_loop(turn))


def tokens_saved(record: Record) -> int:
    """The budget a looped record's stop left unspent: the request's ``max_tokens`` (the record's
    ``sampling.max_tokens``; under ``--max-tokens horizon`` the job's, an upper bound) less the tokens
    its looped turn generated (a continued turn's, every request's). 0 without a loop."""
    last = record.turns[-1]
    if not last.looped:
        return 0
    budget = (record.sampling or {}).get("max_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool):
        return 0
    return max(0, budget - last.usage.completion_tokens)  # a continued turn's: all its parts'


#: The job counters of loops: generations stopped in a loop (first passes and repair rounds), and
#: the budget their stops left unspent.
LOOPED_COUNTER = "looped_generations"
SAVED_COUNTER = "loop_tokens_saved"


def loop_figures(counters: Mapping[str, float]) -> dict[str, int] | None:
    """From a job's counters: first-pass samples stopped in a loop (``samples``), generations
    stopped in one, repair rounds' included (``generations``), and the budget their stops left
    unspent (``tokens_saved``); None before any loop."""
    figures = {
        "samples": round(counters.get("check_looping", 0.0)),
        "generations": round(counters.get(LOOPED_COUNTER, 0.0)),
        "tokens_saved": round(counters.get(SAVED_COUNTER, 0.0)),
    }
    return figures if any(figures.values()) else None


def loop_counters(records: Iterable[Record]) -> dict[str, float]:
    """The loop counters of records just generated (each record's last turn, the one it sent last)."""
    looped = [r for r in records if r.turns[-1].looped]
    if not looped:
        return {}
    return {LOOPED_COUNTER: float(len(looped)), SAVED_COUNTER: float(sum(map(tokens_saved, looped)))}
