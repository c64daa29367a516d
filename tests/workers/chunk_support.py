"""A staged job in a local store, registered in a private Redis, and a worker's chunk context
bound to an in-process simulator: what run_chunk and the delivery handler need, without Celery."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from celery import Celery

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.celery_app import configure
from dflash_tasks.coord.jobs_cache import JobCache
from dflash_tasks.core.job import JOB_KEY, GenerationSpec, JobDefinition
from dflash_tasks.core.quality import QualitySettings
from dflash_tasks.core.settings import WorkerSettings
from dflash_tasks.producer.staging import stage_input
from dflash_tasks.sim import RunningSimulator, SimConfig, start_simulator
from dflash_tasks.store import LocalStore
from tests.helpers import RedisServer
from workers.flow.request_pool import RequestPool
from workers.generate.identity import ServerModel
from workers.generation import RetryPolicy, WorkerIdentity
from workers.leased_work import ChunkContext
from workers.recovery.leases import LeaseKeeper
from workers.sglang_client import SGLangClient

SAMPLES, CHUNK_SIZE = 12, 4  # three chunks


@dataclass
class Staged:
    job_id: str
    root: Path
    store: LocalStore
    bk: Bookkeeping
    sim: RunningSimulator
    ctx: ChunkContext
    settings: WorkerSettings
    inp: Path

    def sim_log(self) -> dict[str, Any]:
        doc: dict[str, Any] = requests.get(f"{self.sim.url}/sim/requests", timeout=5).json()
        return doc

    def sim_stats(self) -> dict[str, Any]:
        doc: dict[str, Any] = requests.get(f"{self.sim.url}/sim/stats", timeout=5).json()
        return doc

    def fault(self, kind: str, **how: Any) -> None:
        requests.post(f"{self.sim.url}/sim/faults", json={"kind": kind, **how}, timeout=5).raise_for_status()

    def app(self) -> Celery:
        app = Celery(f"ut-{uuid.uuid4().hex[:6]}", set_as_current=False)
        return configure(app, self.settings)


def stage_job(
    tmp_path: Path, bk: Bookkeeping, samples: int = SAMPLES, quality: QualitySettings | None = None
) -> tuple[str, LocalStore, Path]:
    inp = tmp_path / f"prompts-{uuid.uuid4().hex[:6]}.jsonl"
    inp.write_text(
        "".join(
            json.dumps({"id": f"s{i}", "prompt": f"question {i}: what is {i} * 7? (café)"}) + "\n"
            for i in range(samples)
        )
    )
    root = tmp_path / f"out-{inp.stem}"
    store = LocalStore(root)
    spec = GenerationSpec(model="Qwen/Qwen3-8B", max_tokens=3000, chunk_size=CHUNK_SIZE)
    job = JobDefinition.create(f"sha256:{uuid.uuid4().hex}", inp.name, spec, quality)
    store.write(JOB_KEY, job.to_json())
    stage_input(inp, store, job.job_id, CHUNK_SIZE)
    bk.register_job(job.job_id, str(root))
    return job.job_id, store, inp


@pytest.fixture
def staged(tmp_path: Path, redis_server: RedisServer) -> Iterator[Staged]:
    with staged_with(tmp_path, redis_server, SimConfig(port=0, time_scale=0.0, mean_output_tokens=200)) as s:
        yield s


@contextmanager
def staged_with(tmp_path: Path, redis_server: RedisServer, sim_config: SimConfig) -> Iterator[Staged]:
    """A staged job and a chunk context bound to a simulator started with ``sim_config``."""
    prefix, queue = f"cr-{uuid.uuid4().hex[:8]}", f"cq-{uuid.uuid4().hex[:8]}"
    settings = WorkerSettings.load(
        {},
        broker_url=redis_server.url,
        redis_prefix=prefix,
        queue=queue,
        lease_seconds=60,
        heartbeat_seconds=10,
        metrics_port=0,
    )
    bk = Bookkeeping.from_url(redis_server.url, prefix)
    job_id, store, inp = stage_job(tmp_path, bk)
    with start_simulator(sim_config) as sim:
        pool = RequestPool(1)  # one request at a time: the rest of a chunk waits in the pool
        ctx = ChunkContext(
            client=SGLangClient(sim.url, 10),
            pool=pool,
            bookkeeping=bk,
            jobs=JobCache(bk, settings),
            leases=LeaseKeeper(bk, 60, 10),
            policy=RetryPolicy(attempts=2, backoff=0.001, backoff_max=0.001),
            identity=WorkerIdentity(worker="ut@host", endpoint=sim.url),
            lease_seconds=60,
            store_retry_seconds=settings.store_retry_seconds,
            server=ServerModel(SGLangClient(sim.url, 10).identity),  # the simulator serves the job's model
        )
        ctx.server.refresh()
        yield Staged(job_id, Path(store.root), store, bk, sim, ctx, settings, inp)
        pool.shutdown()
    keys = [*bk.client.scan_iter(match=f"{prefix}*", count=1000), queue]
    bk.client.delete(*keys)
