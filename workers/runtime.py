"""The worker process's composition root: builds every part once (server client, request pool,
leases, health gate, reconciler, prefetch, listeners, monitor) and runs each delivered chunk."""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import Celery

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.jobs_cache import JobCache, UnknownJob
from dflash_tasks.coord.routing import server_queues
from dflash_tasks.core.errors import (
    DflashError,
    PermanentError,
    RetryableError,
    ServerUnavailable,
    WrongModel,
)
from dflash_tasks.core.repair import RepairUnit
from dflash_tasks.core.settings import WorkerSettings
from dflash_tasks.core.states import Cause, Delivery
from dflash_tasks.monitoring.metrics import PrometheusListener
from workers.chunk_runner import ChunkContext, run_chunk
from workers.flow.consumer_switch import ConsumerSwitch
from workers.flow.health import HealthGate
from workers.flow.inflight_tuner import InflightTuner, TunerConfig
from workers.flow.prefetch import PrefetchController
from workers.flow.request_pool import RequestPool
from workers.flow.tuner_loop import TunerLoop
from workers.generate.identity import ServerModel
from workers.generation import RetryPolicy, WorkerIdentity
from workers.monitor.listener import Listeners, WorkerListener
from workers.monitor.live_stats import FLUSH_SECONDS, StatsListener, WorkerStats
from workers.monitor.worker_monitor import WorkerMonitor
from workers.recovery.leases import LeaseKeeper, Reconciler
from workers.recovery.requeue import Requeuer
from workers.repair_runner import run_repair
from workers.sglang_client import ServerIdentity, SGLangClient

log = logging.getLogger(__name__)

#: A chunk failing this many times with a permanent error is parked until ``resume``.
MAX_CHUNK_FAILURES = 5


@dataclass(slots=True)
class WorkerRuntime:
    settings: WorkerSettings
    app: Celery
    hostname: str
    ctx: ChunkContext
    health: HealthGate
    reconciler: Reconciler
    prefetch: PrefetchController
    switch: ConsumerSwitch
    requeuer: Requeuer
    held: HeldChunks
    monitor: WorkerMonitor  # live stats, progress.json, Prometheus
    tuner: TunerLoop | None = None  # the in-flight tuner (--max-inflight auto)

    @classmethod
    def build(cls, settings: WorkerSettings, app: Celery) -> WorkerRuntime:
        name = settings.worker_name or socket.gethostname()
        hostname = name if "@" in name else f"{name}@{socket.gethostname()}"
        bk = Bookkeeping.from_url(settings.broker_url, settings.redis_prefix)
        client = SGLangClient(settings.endpoint, settings.request_timeout, settings.sglang_api_key)
        jobs = JobCache(bk, settings)
        # Until the server says which model it serves, only the base queue (strays are forwarded).
        switch = ConsumerSwitch([settings.queue])

        def on_model(old: ServerIdentity | None, new: ServerIdentity) -> None:
            switch.set_queues(server_queues(settings.queue, new.served_model_name, new.model_path))

        server = ServerModel(client.identity, on_change=on_model, quick=client.model_identity)
        stats = WorkerStats(bk, hostname, min(FLUSH_SECONDS, settings.progress_seconds))
        # a job's figures stay exported a few progress periods after this worker last wrote them
        prometheus = PrometheusListener(hostname, settings.endpoint, 3 * settings.progress_seconds)
        pool = RequestPool(settings.max_inflight, settings.pool_ceiling())
        tuner = tuner_for(settings, pool, client)
        listener = Listeners([prometheus, StatsListener(stats), *([tuner] if tuner else [])])
        ctx = ChunkContext(
            client=client,
            pool=pool,
            bookkeeping=bk,
            jobs=jobs,
            leases=LeaseKeeper(bk, settings.lease_seconds, settings.heartbeat_seconds),
            policy=RetryPolicy(settings.request_attempts, settings.retry_backoff, settings.retry_backoff_max),
            identity=WorkerIdentity(worker=hostname, endpoint=settings.endpoint),
            lease_seconds=settings.lease_seconds,
            store_retry_seconds=settings.store_retry_seconds,
            server=server,
            listener=listener,
        )

        def probe() -> bool:  # healthy, and its model known (read again: it may have restarted)
            return client.healthy() and server.try_refresh() is not None

        health = HealthGate(probe, settings.health_poll_seconds, on_down=switch.pause, on_up=switch.resume)
        held = HeldChunks()
        requeuer = Requeuer(settings, ctx, app)
        prefetch = PrefetchController(
            held=held.count,
            backlog=lambda: ctx.pool.waiting,
            low_water=lambda: settings.low_water(pool.max_inflight),
            max_chunks=settings.max_chunks,
        )
        reconciler = Reconciler(
            bk,
            lambda job_id: jobs.get(job_id).store,
            requeuer.requeue,
            owner=hostname,
            interval=settings.reconcile_seconds,
            lease_seconds=settings.lease_seconds,
            visibility_timeout=settings.visibility_timeout,
            replan=requeuer.replan_job,
            replan_seconds=settings.replan_seconds,
            listener=listener,
        )
        monitor = WorkerMonitor.for_worker(
            settings, ctx, hostname, held.count, lambda: health.healthy, stats, prometheus, tuner
        )
        return cls(
            settings, app, hostname, ctx, health, reconciler, prefetch, switch, requeuer, held, monitor, tuner
        )

    def attach_consumer(self, consumer: Any) -> None:
        """Take over the consumer's prefetch and on/off switch (from the consumer bootstep)."""
        self.prefetch.attach(consumer.qos)
        self.switch.attach(consumer)

    def _loops(self) -> list[tuple[Callable[[], object], Callable[[], None]]]:
        """The background threads, as (start, stop), in starting order."""
        server = self.ctx.server
        return [
            (self.ctx.leases.start, self.ctx.leases.stop),
            (self.reconciler.start, self.reconciler.stop),
            (self.prefetch.start, self.prefetch.stop),
            (self.health.check_now, self.health.stop),
            (lambda: server.start(self.settings.identity_seconds, lambda: self.health.healthy), server.stop),
            (self.monitor.start, self.monitor.stop),
            *([(self.tuner.start, self.tuner.stop)] if self.tuner else []),
        ]

    def start_background(self) -> None:
        """Heartbeats, reconciler, prefetch, health, identity and monitoring (once the worker is ready)."""
        for start, _ in self._loops():
            start()

    def stop_background(self) -> None:
        for _, stop in reversed(self._loops()):
            stop()

    def requeue(
        self,
        job_id: str,
        chunk: int,
        countdown: float | None = None,
        fallback: str = "",
        repair: RepairUnit | None = None,
    ) -> str:
        """See :meth:`Requeuer.requeue`."""
        return self.requeuer.requeue(job_id, chunk, countdown, fallback, repair)

    def replan_job(self, job_id: str) -> list[int]:
        """See :meth:`Requeuer.replan_job`."""
        return self.requeuer.replan_job(job_id)

    @property
    def listener(self) -> WorkerListener:
        """Where the worker's events go: Prometheus and the live-progress counters."""
        return self.ctx.listener

    @property
    def held_chunks(self) -> int:
        """Chunks this worker is running now."""
        return self.held.count()

    def _after_failure(
        self, job_id: str, chunk: int, exc: Exception, queue: str = "", repair: RepairUnit | None = None
    ) -> dict[str, Any]:
        """Re-queue a chunk that failed on store or Redis trouble (or a bug), with a growing delay.

        A chunk failing with a permanent error ``max_chunk_failures`` times is parked instead:
        not queued again until ``resume`` (or a re-run of enqueue), and shown by ``status``.
        """
        try:
            failures = self.ctx.bookkeeping.count_chunk_failure(job_id, chunk)
        except DflashError:
            failures = 1
        reason = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, PermanentError) and failures >= MAX_CHUNK_FAILURES:
            try:
                self.ctx.bookkeeping.park_chunk(job_id, chunk, reason)
                log.error("chunk %d of job %s parked after %d failures: %s", chunk, job_id, failures, reason)
                return delivery_result(Delivery.PARKED, reason, Cause.ERROR)
            except DflashError:
                pass  # cannot park without Redis: keep retrying
        delay = float(min(600.0, self.settings.requeue_backoff * 2 ** (failures - 1)))
        self.requeue(job_id, chunk, countdown=delay, fallback=queue, repair=repair)
        log.log(
            logging.WARNING if isinstance(exc, RetryableError) else logging.ERROR,
            "chunk %d of job %s re-queued in %.0fs: %s",
            chunk,
            job_id,
            delay,
            reason,
            exc_info=not isinstance(exc, DflashError),
        )
        return delivery_result(Delivery.REQUEUED, reason, Cause.ERROR)

    def handle_delivery(
        self, job_id: str, chunk: int, task_id: str, queue: str = "", repair: RepairUnit | None = None
    ) -> dict[str, Any]:
        """Run one delivered chunk message, or a chunk's ``repair`` round (taken from ``queue``);
        never raises for expected failures."""
        if not self.health.healthy:  # not consuming any more; don't bounce it straight back here
            self.requeue(
                job_id, chunk, countdown=self.settings.health_poll_seconds, fallback=queue, repair=repair
            )
            return delivery_result(Delivery.REQUEUED, "server unhealthy", Cause.SERVER_UNHEALTHY)
        owner = f"{self.hostname}/{task_id}/{uuid.uuid4().hex[:6]}"
        self.held.add(1)
        try:
            if repair is None:
                outcome = run_chunk(self.ctx, job_id, chunk, owner)
            else:
                outcome = run_repair(self.ctx, job_id, repair, owner)
        except WrongModel as exc:  # never generate another model's chunk: back to its model's queue
            target = self.requeue(job_id, chunk, fallback=queue, repair=repair)
            log.warning(
                "chunk %d of job %s (from queue %s) put on queue %s: %s", chunk, job_id, queue, target, exc
            )
            return delivery_result(Delivery.REROUTED, str(exc), Cause.WRONG_MODEL)
        except ServerUnavailable as exc:
            self.requeue(
                job_id, chunk, fallback=queue, repair=repair
            )  # first: the chunk must not depend on the pause
            self.health.mark_down(str(exc))
            log.warning("chunk %d of job %s re-queued: %s", chunk, job_id, exc)
            return delivery_result(Delivery.REQUEUED, str(exc), Cause.SERVER_UNHEALTHY)
        except UnknownJob as exc:
            log.error("dropping chunk %d: %s", chunk, exc)
            return delivery_result(Delivery.DROPPED, str(exc), Cause.BAD_MESSAGE)
        except Exception as exc:  # store or Redis trouble, or a bug: never drop the chunk
            return self._after_failure(job_id, chunk, exc, queue, repair)
        finally:
            self.held.add(-1)
            self.prefetch.nudge()  # before the ack: it must not pull in a chunk nobody wants yet
        log.info(
            "chunk %d of job %s: %s %s (%d ok, %d failed, %d tokens, %.1fs)",
            chunk,
            job_id,
            outcome.status,
            outcome.reason,
            outcome.samples_ok,
            outcome.samples_failed,
            outcome.completion_tokens,
            outcome.seconds,
        )
        return outcome.as_dict()


def tuner_for(settings: WorkerSettings, pool: RequestPool, client: SGLangClient) -> TunerLoop | None:
    """The in-flight tuner's loop when ``tune_inflight`` is on, else None (a fixed target)."""
    if not settings.tune_inflight:
        return None
    config = TunerConfig(
        floor=settings.inflight_floor,
        ceiling=pool.ceiling,
        start=settings.max_inflight,
    )
    return TunerLoop(
        InflightTuner(config),
        pool,
        client.load,
        window_seconds=settings.tune_window_seconds,
        sample_seconds=settings.tune_sample_seconds,
        graph_ceiling=client.decode_graph_ceiling,
        running_cap=client.max_running_requests,
    )


class HeldChunks:
    """How many chunks this worker is running now (its prefetch follows it)."""

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def add(self, delta: int) -> None:
        with self._lock:
            self._n += delta

    def count(self) -> int:
        return self._n


def delivery_result(status: Delivery, reason: str, cause: Cause = Cause.NONE) -> dict[str, Any]:
    """The task's result for a delivery that did not run to a stored chunk."""
    return {"status": status.value, "reason": reason, "cause": cause.value}
