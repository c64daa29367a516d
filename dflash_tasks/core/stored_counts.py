"""Counting a record's rows once, where it is made, and reading the stored count back.

:class:`RecordCounter` is what the worker uses beside its server (the served model's tokenizer,
the job's trainer view): it counts each record's candidate rows in both layouts, as the export's
planner would, and returns the record with :class:`~dflash_tasks.core.loss_counts.LossCounts`.
:func:`stored_tokens` gives the planner a candidate's stored count when the view matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from dflash_tasks.core.export_rows import Candidate, conversation_candidate, per_turn_candidates
from dflash_tasks.core.job import JobDefinition
from dflash_tasks.core.loss_counts import LossCounts, view_key
from dflash_tasks.core.loss_tokens import LossTokenCounter, RowTokens
from dflash_tasks.core.record import Record
from dflash_tasks.core.trainable import counter_for, earlier_turns_trained


def _row(tokens: RowTokens) -> tuple[int, ...]:
    return (
        tokens.tokens,
        tokens.loss_tokens,
        tokens.loss_tokens_untruncated,
        tokens.reasoning_turns,
        tokens.reasoning_dropped,
        tokens.generated_end,
    )


def row_tokens(row: Sequence[int]) -> RowTokens:
    tokens, loss, untruncated, reasoning, dropped, end = row
    return RowTokens(tokens, loss, untruncated, reasoning, dropped, generated_end=end)


class RecordCounter:
    """Counts records' rows under one job's trainer view with one tokenizer (one per job and worker)."""

    def __init__(self, job: JobDefinition, tokenizer_path: str) -> None:
        view = replace(job.trainer, tokenizer=tokenizer_path)
        self.thinking = job.spec.thinking
        preserve = job.spec.keeps_history_reasoning
        self.key = view_key(job.trainer, tokenizer_path, self.thinking, preserve)
        whole, _ = counter_for(view, self.thinking, None, preserve)
        last, _ = counter_for(replace(view, last_turn_only=True), self.thinking, None, preserve)
        assert whole is not None and last is not None  # an explicit tokenizer loads or raises
        self._whole: LossTokenCounter = whole
        self._last: LossTokenCounter = last
        # what `auto` picks under this view (the live yield plans the default export's layout)
        self.earlier_trained = earlier_turns_trained(whole)

    @property
    def whole(self) -> LossTokenCounter:
        """The counter of whole conversations under the job's view (every assistant turn)."""
        return self._whole

    def counted(self, records: Sequence[Record]) -> list[Record]:
        """``records`` with their ``loss_counts`` (failed records: their ok turns' per-turn rows)."""
        whole = [
            conversation_candidate(r, self.thinking, frozenset(), False) if r.ok else None for r in records
        ]
        turns = [per_turn_candidates(r, self.thinking, frozenset()) for r in records]
        # A row of one assistant turn is the same text in both layouts (its last turn is its only
        # one): counted once, as the conversation row, not tokenized a second time.
        shared = [_same(cs, w) for cs, w in zip(turns, whole, strict=True)]
        whole_rows = iter(self._count(self._whole, [w for w in whole if w is not None]))
        again = [c for cs, same in zip(turns, shared, strict=True) if not same for c in cs]
        turn_rows = iter(self._count(self._last, again))
        out: list[Record] = []
        for record, candidates, same in zip(records, turns, shared, strict=True):
            conversation: tuple[tuple[int, ...], ...] = (next(whole_rows),) if record.ok else ()
            per_turn = conversation if same else tuple(next(turn_rows) for _ in candidates)
            out.append(replace(record, loss_counts=LossCounts(self.key, conversation, per_turn)))
        return out

    @staticmethod
    def _count(counter: LossTokenCounter, candidates: list[Candidate]) -> list[tuple[int, ...]]:
        if not candidates:
            return []
        return [_row(t) for t in counter.count_many([c.row["conversations"] for c in candidates])]


def _same(candidates: Sequence[Candidate], whole: Candidate | None) -> bool:
    """One per-turn row whose messages are the conversation row's, with one assistant message in
    them: the trainer's last-turn-only view then marks what the whole view marks."""
    if whole is None or len(candidates) != 1:
        return False
    messages = whole.row["conversations"]
    return bool(candidates[0].row["conversations"] == messages) and (
        sum(m["role"] == "assistant" for m in messages) == 1
    )


def stored_tokens(record: Record, key: str | None, per_turn: bool) -> list[RowTokens] | None:
    """The stored counts of ``record``'s rows in one layout, when counted under ``key``."""
    counts = record.loss_counts
    if key is None or counts is None or counts.view != key:
        return None
    return [row_tokens(r) for r in (counts.per_turn if per_turn else counts.conversation)]
