"""Each request's ``max_tokens`` under ``--max-tokens horizon``, from the served model's tokenizer.

The arithmetic is :func:`dflash_tasks.core.budget.horizon_budget`: the trainer's ``max_length``
less the row's prefix, plus the template's closing tokens. The prefix is the row that will train
the turn, up to its answer, as the export writes it (:func:`~dflash_tasks.core.export_rows.
prefix_messages`: the per-turn layout drops earlier reasoning; the layout is the one ``export
--layout auto`` picks), rendered by the trainer's view with the generation prompt after it. The
tokenizer is the one the worker already loaded to count loss tokens
(:class:`~workers.checks.loss_counting.LossCountCache`); where there is none, every request gets the job's
``max_tokens`` (the trainer's ``max_length``) and the worker says so once per job.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from dflash_tasks.core.budget import horizon_budget
from dflash_tasks.core.export_rows import prefix_messages
from dflash_tasks.core.job import JobDefinition
from dflash_tasks.core.loss_tokens import LossTokenCounter
from dflash_tasks.core.record import Turn
from workers.checks.loss_counting import LossCountCache
from workers.sglang_client import ServerIdentity

log = logging.getLogger(__name__)


class HorizonBudget:
    """The budget of each turn of one job's conversations (one per chunk; the counter is shared)."""

    def __init__(self, counter: LossTokenCounter, per_turn: bool, fallback: int, job_id: str = "") -> None:
        self.job_id = job_id
        self.counter = counter
        self.per_turn = per_turn  # the layout export --layout auto writes
        self.max_length = counter.view.max_length
        self.closing = counter.closing_tokens
        self.fallback = fallback  # where a prefix cannot be rendered: the job's max_tokens

    def __call__(self, inputs: Sequence[Sequence[Mapping[str, Any]]], answered: Sequence[Turn]) -> int:
        """The ``max_tokens`` of the turn after ``answered`` (``inputs``: each turn's new messages)."""
        try:
            prefix = self.counter.prompt_tokens(prefix_messages(inputs, answered, self.per_turn))
        except Exception as exc:  # a template that refuses these messages: the sample still runs
            _unrendered_once(self.job_id, type(exc).__name__, self.fallback)
            return self.fallback
        return horizon_budget(self.max_length, prefix, self.closing)


def request_budget(
    counts: LossCountCache, job_id: str, job: JobDefinition, server: ServerIdentity | None
) -> HorizonBudget | None:
    """The per-request budget of a ``--max-tokens horizon`` job, or None: a fixed budget (every
    request gets ``job.spec.max_tokens``: the job's own, or without a tokenizer here the horizon
    job's stated fallback, its ``max_length``)."""
    if not job.spec.at_horizon:
        return None
    model_path = server.model_path if server is not None else None
    counter = counts.counter(job_id, job, model_path)
    if counter is None:
        _fixed_once(job_id, job.spec.max_tokens)
        return None
    return HorizonBudget(counter.whole, not counter.earlier_trained, job.spec.max_tokens, job_id)


@functools.lru_cache(maxsize=256)
def _fixed_once(job_id: str, max_tokens: int) -> None:
    """Say once per job that its requests get the fixed budget."""
    log.warning(
        "job %s asks for --max-tokens horizon, but no tokenizer of the served model is readable "
        "here: each request gets the fixed budget %d (the trainer's max_length)",
        job_id,
        max_tokens,
    )


@functools.lru_cache(maxsize=256)
def _unrendered_once(job_id: str, error: str, max_tokens: int) -> None:
    """Say once per job and error that a prefix could not be rendered (each request would repeat it)."""
    log.warning(
        "job %s: a request's horizon not computed (%s): such requests get max_tokens %d",
        job_id,
        error,
        max_tokens,
    )
