"""plan_repairs on a local store: which chunks a repair round regenerates, and with which round number."""

from __future__ import annotations

import json
from pathlib import Path

from dflash_tasks.core.job import Manifest, output_key, repair_key
from dflash_tasks.core.repair import RepairUnit
from dflash_tasks.producer.repair import plan_repairs
from dflash_tasks.store import LocalStore

MANIFEST = Manifest("j", 6, 6, 0, 2, 3)  # chunks of two samples: 0, 1, 2


def line(sample_id: str, status: str, **more: object) -> bytes:
    return json.dumps({"id": sample_id, "status": status, **more}).encode() + b"\n"


def test_a_round_is_planned_only_once_every_chunk_is_stored_and_only_where_it_has_work(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path / "out")
    store.write(output_key(0), line("a", "ok") + line("b", "failed", failure="transient"))
    store.write(output_key(1), line("c", "failed", failure="permanent") + line("d", "ok"))
    assert not plan_repairs(store, MANIFEST, None, "q", "j").stored  # chunk 2 still runs: no round yet
    store.write(output_key(2), line("e", "failed", failure="transient") + line("f", "failed"))
    store.write(repair_key(2, 1), line("e", "failed", failure="transient", repair=1))  # failed again

    plan = plan_repairs(store, MANIFEST, None, "q", "j")
    assert plan.stored and plan.pending == {0: 1, 2: 2} and plan.samples == 3 and plan.failed_permanent == 1
    assert plan.to_queue == (RepairUnit(0, 1), RepairUnit(2, 2))  # chunk 2's next round is its second

    retry = plan_repairs(store, MANIFEST, None, "q", "j", permanent=True)  # --retry-failed
    assert retry.pending == {0: 1, 1: 1, 2: 2} and retry.failed_permanent == 0
    assert RepairUnit(1, 1, permanent=True) in retry.to_queue

    store.write(repair_key(0, 1), line("b", "ok", repair=1))
    assert plan_repairs(store, MANIFEST, None, "q", "j", only=[0]).pending == {}  # repaired: nothing left
