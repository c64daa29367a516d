"""The worker's count of each record's loss tokens, with the served model's tokenizer.

The server's ``/model_info`` names the model directory it loaded; the worker runs beside it and
reads the tokenizer from the same disk. One :class:`~dflash_tasks.core.stored_counts.RecordCounter`
per job and model path, kept for the worker's life. Where the path is not a readable model
directory here, or the job names a tokenizer of its own, nothing is stored and ``export`` and
``report`` count as before.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.job import JobDefinition
from dflash_tasks.core.log_text import exception_text
from dflash_tasks.core.record import Record
from dflash_tasks.core.stored_counts import RecordCounter

log = logging.getLogger(__name__)


class LossCountCache:
    """Record counters by (job, model path); None where this worker cannot count."""

    def __init__(self) -> None:
        self._counters: dict[tuple[str, str], RecordCounter | None] = {}
        self._lock = threading.Lock()  # chunks run in threads; transformers' lazy imports are not safe

    def counted(
        self, job_id: str, job: JobDefinition, model_path: str | None, records: list[Record], where: str
    ) -> list[Record]:
        """``records`` with their loss counts, or unchanged when no tokenizer is at hand or the
        count fails; that failure is logged with ``where`` (the chunk or round) and its message,
        quoted text masked (:mod:`dflash_tasks.core.log_text`)."""
        counter = self.counter(job_id, job, model_path)
        if counter is None:
            return records
        try:
            return counter.counted(records)
        except Exception as exc:  # the count is optional: the chunk is stored without it
            log.warning("loss tokens not counted for %s: %s", where, exception_text(exc))
            return records

    def counter(self, job_id: str, job: JobDefinition, model_path: str | None) -> RecordCounter | None:
        """The job's counter with the tokenizer at ``model_path`` (loaded once), or None where this
        worker cannot count (the request budgets of ``--max-tokens horizon`` use it too)."""
        if not model_path:
            return None
        key = (job_id, model_path)
        with self._lock:
            if key not in self._counters:
                self._counters[key] = _load(job, model_path)
            return self._counters[key]


def _load(job: JobDefinition, model_path: str) -> RecordCounter | None:
    if job.trainer.tokenizer is not None and job.trainer.tokenizer != model_path:
        log.info("loss tokens not counted here: the job names its own tokenizer")
        return None
    if not (Path(model_path) / "tokenizer_config.json").is_file():
        log.info("loss tokens not counted here: the served model path %s is not readable", model_path)
        return None
    try:
        return RecordCounter(job, model_path)
    except (ConfigError, OSError, ValueError) as exc:
        log.warning("loss tokens not counted here: the tokenizer at %s does not load (%s)", model_path, exc)
        return None
