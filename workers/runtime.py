"""Everything a GPU worker process holds besides Celery: its server client, the in-flight
request pool, leases, the health gate and the reconciler."""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.exceptions import Reject

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.jobs_cache import JobCache, UnknownJob
from dflash_tasks.coord.planner import plan_job
from dflash_tasks.coord.publish import publish_chunks
from dflash_tasks.coord.routing import model_queue, server_queues
from dflash_tasks.core.errors import (
    DflashError,
    PermanentError,
    RetryableError,
    ServerUnavailable,
    WrongModel,
)
from dflash_tasks.core.settings import Settings
from dflash_tasks.core.states import Cause, Delivery, JobState
from dflash_tasks.monitoring.metrics import PrometheusListener
from workers.chunk_runner import ChunkContext, run_chunk
from workers.flow.consumer_switch import ConsumerSwitch
from workers.flow.health import HealthGate
from workers.flow.prefetch import PrefetchController
from workers.flow.request_pool import RequestPool
from workers.generation import RetryPolicy, WorkerIdentity
from workers.identity import ServerModel
from workers.listener import Listeners, WorkerListener
from workers.recovery.leases import LeaseKeeper, Reconciler
from workers.sglang_client import ServerIdentity, SGLangClient
from workers.stats import FLUSH_SECONDS, StatsListener, WorkerMonitor, WorkerStats

log = logging.getLogger(__name__)

#: A chunk failing this many times with a permanent error is parked until ``resume``.
MAX_CHUNK_FAILURES = 5

_current: WorkerRuntime | None = None


@dataclass(slots=True)
class WorkerRuntime:
    settings: Settings
    app: Celery
    hostname: str
    ctx: ChunkContext
    health: HealthGate
    reconciler: Reconciler
    prefetch: PrefetchController
    switch: ConsumerSwitch
    _held: int = 0
    _held_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    monitor: WorkerMonitor | None = None  # live stats, progress.json, Prometheus

    @classmethod
    def build(cls, settings: Settings, app: Celery) -> WorkerRuntime:
        name = settings.worker_name or socket.gethostname()
        hostname = name if "@" in name else f"{name}@{socket.gethostname()}"
        bk = Bookkeeping.from_url(settings.broker_url, settings.redis_prefix)
        client = SGLangClient(settings.endpoint, settings.request_timeout, settings.sglang_api_key)
        jobs = JobCache(bk, settings)
        # Until the server says which model it serves, only the base queue (strays are forwarded).
        switch = ConsumerSwitch([settings.queue])

        def on_model(old: ServerIdentity | None, new: ServerIdentity) -> None:
            switch.set_queues(server_queues(settings.queue, new.served_model_name, new.model_path))

        server = ServerModel(client.identity, on_change=on_model)
        stats = WorkerStats(bk, hostname, min(FLUSH_SECONDS, settings.progress_seconds))
        prometheus = PrometheusListener(hostname, settings.endpoint)
        listener = Listeners([prometheus, StatsListener(stats)])
        ctx = ChunkContext(
            client=client,
            pool=RequestPool(settings.max_inflight),
            bookkeeping=bk,
            jobs=jobs,
            leases=LeaseKeeper(bk, settings.lease_seconds, settings.heartbeat_seconds),
            policy=RetryPolicy(settings.request_attempts, settings.retry_backoff, settings.retry_backoff_max),
            identity=WorkerIdentity(worker=hostname, endpoint=settings.endpoint),
            lease_seconds=settings.lease_seconds,
            server=server,
            listener=listener,
        )

        def probe() -> bool:  # healthy, and its model known (read again: it may have restarted)
            return client.healthy() and server.try_refresh() is not None

        health = HealthGate(probe, settings.health_poll_seconds, on_down=switch.pause, on_up=switch.resume)
        runtime = cls(settings, app, hostname, ctx, health, None, None, switch)  # type: ignore[arg-type]
        runtime.prefetch = PrefetchController(
            held=lambda: runtime.held_chunks,
            backlog=lambda: ctx.pool.waiting,
            low_water=settings.low_water(),
            max_chunks=settings.max_chunks,
        )
        runtime.reconciler = Reconciler(
            bk,
            lambda job_id: jobs.get(job_id).store,
            runtime.requeue,
            owner=hostname,
            interval=settings.reconcile_seconds,
            lease_seconds=settings.lease_seconds,
            visibility_timeout=settings.visibility_timeout,
            replan=runtime.replan_job,
            replan_seconds=settings.replan_seconds,
            listener=listener,
        )
        runtime.monitor = WorkerMonitor.for_runtime(runtime, stats, prometheus)
        return runtime

    def replan_job(self, job_id: str) -> list[int]:
        """Queue what a job is missing (see :meth:`Reconciler._replan_all`); returns those chunks.

        A finished job leaves the registry; a paused job is left alone (its chunks wait for resume).
        """
        job = self.ctx.jobs.get(job_id)
        if self.ctx.bookkeeping.job_state(job_id)[0] != JobState.RUNNING:  # paused, or in its preflight
            return []
        queue = model_queue(self.settings.queue, job.definition.spec.model)
        plan = plan_job(
            job.store,
            self.ctx.bookkeeping,
            self.ctx.bookkeeping.client,
            queue,
            job_id,
            job.manifest.chunks,
            self.settings.lease_seconds,
        )
        if len(plan.done) >= job.manifest.chunks:
            self.ctx.bookkeeping.finish_job(job_id)
            return []
        parked = self.ctx.bookkeeping.parked(job_id)
        missing = [c for c in plan.to_enqueue if c not in parked]
        if missing:
            publish_chunks(self.app, job_id, missing, queue=queue)
        return missing

    def attach_consumer(self, consumer: Any) -> None:
        """Take over the consumer's prefetch and on/off switch (from the consumer bootstep)."""
        self.prefetch.attach(consumer.qos)
        self.switch.attach(consumer)

    def start_background(self) -> None:
        """Heartbeats, reconciler, and an initial health probe (called once the worker is ready)."""
        self.ctx.leases.start()
        self.reconciler.start()
        self.prefetch.start()
        self.health.check_now()
        self.ctx.server.start(self.settings.identity_seconds, lambda: self.health.healthy)
        if self.monitor is not None:
            self.monitor.start()

    def stop_background(self) -> None:
        self.ctx.leases.stop()
        self.reconciler.stop()
        self.prefetch.stop()
        self.health.stop()
        self.ctx.server.stop()
        if self.monitor is not None:
            self.monitor.stop()

    @property
    def listener(self) -> WorkerListener:
        """Where the worker's events go: Prometheus and the live-progress counters."""
        return self.ctx.listener

    @property
    def held_chunks(self) -> int:
        """Chunks this worker is running now."""
        return self._held

    def job_queue(self, job_id: str, fallback: str = "") -> str:
        """The job's model queue; ``fallback`` (the queue a delivery came from) if the job cannot be read."""
        try:
            return model_queue(self.settings.queue, self.ctx.jobs.get(job_id).definition.spec.model)
        except DflashError:
            if not fallback:
                raise
            return fallback

    def requeue(self, job_id: str, chunk: int, countdown: float | None = None, fallback: str = "") -> str:
        """Queue the chunk again on its model's queue (returned); if even that fails, reject the
        delivery so the broker keeps it."""
        try:
            queue = self.job_queue(job_id, fallback)
            publish_chunks(self.app, job_id, [chunk], queue=queue, countdown=countdown)
            return queue
        except Exception as exc:
            log.error(
                "could not re-queue chunk %d of job %s (%s): returning it to the broker", chunk, job_id, exc
            )
            raise Reject(f"could not re-queue: {exc}", requeue=True) from exc

    def _after_failure(self, job_id: str, chunk: int, exc: Exception, queue: str = "") -> dict[str, Any]:
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
        self.requeue(job_id, chunk, countdown=delay, fallback=queue)
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

    def handle_delivery(self, job_id: str, chunk: int, task_id: str, queue: str = "") -> dict[str, Any]:
        """Run one delivered chunk message (taken from ``queue``); never raises for expected failures."""
        if not self.health.healthy:  # not consuming any more; don't bounce it straight back here
            self.requeue(job_id, chunk, countdown=self.settings.health_poll_seconds, fallback=queue)
            return delivery_result(Delivery.REQUEUED, "server unhealthy", Cause.SERVER_UNHEALTHY)
        owner = f"{self.hostname}/{task_id}/{uuid.uuid4().hex[:6]}"
        with self._held_lock:
            self._held += 1
        try:
            state, reason = self.ctx.bookkeeping.job_state(job_id)
            if state == JobState.PAUSED:  # resume (or a re-run of enqueue) queues the chunk again
                return delivery_result(Delivery.PAUSED, reason)
            outcome = run_chunk(self.ctx, job_id, chunk, owner)
        except WrongModel as exc:  # never generate another model's chunk: back to its model's queue
            target = self.requeue(job_id, chunk, fallback=queue)
            log.warning(
                "chunk %d of job %s (from queue %s) put on queue %s: %s", chunk, job_id, queue, target, exc
            )
            return delivery_result(Delivery.REROUTED, str(exc), Cause.WRONG_MODEL)
        except ServerUnavailable as exc:
            self.requeue(job_id, chunk, fallback=queue)  # first: the chunk must not depend on the pause
            self.health.mark_down(str(exc))
            log.warning("chunk %d of job %s re-queued: %s", chunk, job_id, exc)
            return delivery_result(Delivery.REQUEUED, str(exc), Cause.SERVER_UNHEALTHY)
        except UnknownJob as exc:
            log.error("dropping chunk %d: %s", chunk, exc)
            return delivery_result(Delivery.DROPPED, str(exc), Cause.BAD_MESSAGE)
        except Exception as exc:  # store or Redis trouble, or a bug: never drop the chunk
            return self._after_failure(job_id, chunk, exc, queue)
        finally:
            with self._held_lock:
                self._held -= 1
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


def delivery_result(status: Delivery, reason: str, cause: Cause = Cause.NONE) -> dict[str, Any]:
    """The task's result for a delivery that did not run to a stored chunk."""
    return {"status": status.value, "reason": reason, "cause": cause.value}


def install(runtime: WorkerRuntime) -> None:
    """Make ``runtime`` the one the chunk task uses in this process."""
    global _current
    _current = runtime


def current() -> WorkerRuntime:
    if _current is None:
        raise RuntimeError("no worker runtime: start workers with `python -m workers`")
    return _current
