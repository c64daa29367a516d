"""The trainable yield of what a worker stores, added to the job's counters as it is stored.

A stored chunk's records, and a repair round's, are planned as the default export plans them
(:class:`~dflash_tasks.core.row_planner.RowPlanner` with default
:class:`~dflash_tasks.core.row_planner.ExportOptions`) from the loss counts the worker stored with
them, without tokenizing a row again: the ``yield_*`` counters then move once per chunk and round
beside the others, and ``status``, ``progress.json`` and Prometheus show the yield ``report`` states
at the end (:mod:`dflash_tasks.core.yields`). Only chunks whose records this worker counted enter
it (``yield_counted_chunks`` of them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from dflash_tasks.core.job import JobDefinition
from dflash_tasks.core.log_text import exception_text
from dflash_tasks.core.record import Record
from dflash_tasks.core.repair import superseded
from dflash_tasks.core.row_planner import ExportOptions, RowPlanner
from dflash_tasks.core.stored_counts import RecordCounter
from dflash_tasks.core.yields import COUNTED_CHUNKS, YieldTally
from workers.checks.loss_counting import LossCountCache

log = logging.getLogger(__name__)


def yield_counters(
    counts: LossCountCache,
    job_id: str,
    job: JobDefinition,
    model_path: str | None,
    records: Sequence[Record],
    replaced: Sequence[Record] | None = None,
    *,
    where: str,
) -> dict[str, float]:
    """The ``yield_*`` counters of a stored chunk's ``records``; of a repair round with ``replaced``
    (the records its ``records`` replace, in the same order): the change, the tokens it sent (the
    turns it generated again are paid for even though their records are superseded).

    Empty when a record was not counted by ``counts`` (no tokenizer here, another view), and when
    planning fails: the yield is an optional figure and never costs the chunk its other counters.
    That failure is logged with ``where`` (the chunk or round) and its message, quoted text masked.
    """
    try:
        return _counters(counts, job_id, job, model_path, records, replaced)
    except Exception as exc:
        log.warning("live yield not counted for %s: %s", where, exception_text(exc))
        return {}


def _counters(
    counts: LossCountCache,
    job_id: str,
    job: JobDefinition,
    model_path: str | None,
    records: Sequence[Record],
    replaced: Sequence[Record] | None,
) -> dict[str, float]:
    counter = counts.counter(job_id, job, model_path)
    if counter is None:
        return {}
    new = _planned(job, counter, records)
    if new is None:
        return {}
    if replaced is None:
        return {**new.counters(), COUNTED_CHUNKS: 1.0}
    old = _planned(job, counter, replaced)
    if old is None:
        return {}
    for before, after in zip(replaced, records, strict=True):
        new.add_superseded(*superseded(before, after))
    return new.counters(minus=old)


def _planned(job: JobDefinition, counter: RecordCounter, records: Sequence[Record]) -> YieldTally | None:
    """The default export's yield of ``records`` from their stored counts; None unless all are counted."""
    planner = RowPlanner(job, job.trainer, ExportOptions())
    planner.use_stored(counter.key, counter.earlier_trained)
    for _ in planner.rows(records):
        pass
    return planner.yields if planner.counted else None
