"""Which models the live workers serve, from their heartbeats (pure, and against a private Redis)."""

from __future__ import annotations

from dataclasses import replace

import redis

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.keys import Keys
from dflash_tasks.monitoring.fleet import FleetWorker, capacity, check_serving, live_fleet, serving_warning
from dflash_tasks.monitoring.progress import progress_document
from dflash_tasks.monitoring.snapshot import Snapshot
from tests.helpers import redis_url

NOW = 1_764_000_000.0


def beat(model: str, path: str = "", age: float = 1.0) -> dict[str, str]:
    return {"last_seen": str(NOW - age), "beat_s": "2", "model": model, "model_path": path or model}


def test_served_model_no_warning() -> None:
    fleet = [FleetWorker("gpu0@a", "/dev/shm/models/Qwen3.6-27B", "/dev/shm/models/Qwen3.6-27B")]
    assert serving_warning("Qwen3.6-27B", fleet) is None


def test_warning_lists_what_the_live_workers_serve() -> None:
    beats = {
        "gpu0@a": beat("Org/Model-B"),
        "gpu1@a": beat("Org/Model-B"),
        "gpu2@a": beat("alias", "/models/Model-C"),
        "gpu3@a": beat("", ""),  # its server has not answered yet
        "gpu4@a": beat("Model-A", age=3600),  # dead: does not count
    }
    warning = serving_warning("Model-A", live_fleet(beats, NOW))
    assert warning == (
        "no live worker serves model 'Model-A'; the live workers serve: Org/Model-B (2 workers), "
        "alias (/models/Model-C) (1 worker), unknown (server not answering) (1 worker)"
    )


def test_warning_without_any_live_worker() -> None:
    assert serving_warning("Model-A", []) == "no live worker serves model 'Model-A': no worker is live"


def test_heartbeats_from_redis_and_expired_workers_forgotten(rclient: redis.Redis, prefix: str) -> None:
    keys = Keys(prefix)
    rclient.hset(keys.worker("gpu0@a"), mapping=beat("Org/Model-B"))
    rclient.sadd(keys.workers(), "gpu0@a", "gone@b")  # gone@b's heartbeat hash expired
    bk = Bookkeeping.from_url(redis_url(rclient), prefix)
    assert bk.heartbeats() == {"gpu0@a": beat("Org/Model-B")}
    assert rclient.smembers(keys.workers()) == {b"gpu0@a"}
    rclient.hset(keys.worker("gpu0@a"), "last_seen", "9e18")  # alive at any "now"
    assert check_serving(bk, "Org/Model-B", NOW) is None
    assert "the live workers serve: Org/Model-B (1 worker)" in str(check_serving(bk, "Model-A", NOW))


def test_progress_warns_when_no_live_worker_serves_the_job_model() -> None:
    snap = Snapshot(
        job_id="j1",
        output="/out",
        model="Model-A",
        total_samples=10,
        total_chunks=1,
        invalid_lines=0,
        done_chunks=0,
        done_samples=0,
        queue="dflash.model-a",
        fleet={"gpu0@a": beat("Org/Model-B")},
    )
    warnings = progress_document(snap, NOW).to_dict()["warnings"]
    assert any(
        w.startswith("no live worker serves model 'Model-A'; the live workers serve: Org/Model-B")
        and w.endswith("wait in queue dflash.model-a")
        for w in warnings
    ), warnings
    served = progress_document(replace(snap, fleet={"gpu0@a": beat("Model-A")}), NOW).to_dict()
    assert not any("serves model" in w for w in served["warnings"])


def test_capacity_counts_only_the_workers_serving_the_model() -> None:
    fleet = [
        FleetWorker("gpu0", "Model-A", "/m/Model-A", 48, tuned=True),
        FleetWorker("gpu1", "Model-A", "/m/Model-A", 32),
        FleetWorker("gpu2", "Model-B", "/m/Model-B", 48, tuned=True),
    ]
    assert capacity("Model-A", fleet) == (2, 80, 1)
    assert capacity("Model-C", fleet) == (0, 0, 0)


def test_live_fleet_reads_each_workers_in_flight_target() -> None:
    beats = {"gpu0": {**beat("Model-A"), "max_inflight": "24"}, "gpu1": {**beat("Model-A"), "tuner": "{}"}}
    assert [(w.max_inflight, w.tuned) for w in live_fleet(beats, NOW)] == [(24, False), (0, True)]
