"""What the page reads: the job's store and, while it is there, Redis; the same sources as ``status``."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.core.job import JobDefinition
from dflash_tasks.monitoring.page.history import ThroughputHistory
from dflash_tasks.monitoring.page.trainer_marks import TrainerLens
from dflash_tasks.monitoring.progress import compute_document
from dflash_tasks.store import Store
from dflash_tasks.store.records import list_outputs


@dataclass
class JobSource:
    """One job's sources and what the page keeps between requests (the throughput seen, the tokenizer)."""

    store: Store
    bookkeeping: Bookkeeping | None
    definition: JobDefinition
    lens: TrainerLens
    queue: str = ""
    gpu_hour_usd: float | None = None
    default_gpu_hour_usd: float = 0.0
    history: ThroughputHistory = field(default_factory=ThroughputHistory)

    def progress(self) -> dict[str, Any]:
        """The progress document, as ``status --json`` computes it; its rates join the history."""
        doc = compute_document(
            self.store,
            self.bookkeeping,
            self.definition.job_id,
            queue=self.queue,
            gpu_hour_usd=self.gpu_hour_usd,
            default_gpu_hour_usd=self.default_gpu_hour_usd,
            writer=f"page@{os.uname().nodename}",
        ).to_dict()
        self.history.add(doc)
        return doc

    def repair_rounds(self) -> dict[int, int]:
        """Repair round -> chunks it rewrote samples of (one listing of ``outputs/``)."""
        listing = list_outputs(self.store)
        return dict(Counter(r for rounds in listing.rounds.values() for r in rounds))
