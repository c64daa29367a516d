"""The worker process's composition root: builds every part once (server client, request pool,
leases, health gate, reconciler, prefetch, listeners, monitor, delivery handler) and starts and
stops their background threads."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import Celery

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.jobs_cache import JobCache
from dflash_tasks.coord.live_progress import LiveProgress
from dflash_tasks.coord.routing import server_queues
from dflash_tasks.core.settings import WorkerSettings
from dflash_tasks.monitoring.metrics import PrometheusListener
from workers.delivery import DeliveryHandler, HeldChunks
from workers.flow.consumer_switch import ConsumerSwitch
from workers.flow.health import HealthGate
from workers.flow.inflight_tuner import InflightTuner
from workers.flow.prefetch import PrefetchController
from workers.flow.request_pool import RequestPool
from workers.flow.tuner_inputs import TunerConfig
from workers.flow.tuner_loop import TunerLoop
from workers.generate.identity import ServerModel
from workers.generation import RetryPolicy, WorkerIdentity
from workers.leased_work import ChunkContext
from workers.monitor.listener import Listeners, WorkerListener
from workers.monitor.live_stats import FLUSH_SECONDS, StatsListener, WorkerStats
from workers.monitor.worker_monitor import WorkerMonitor
from workers.recovery.delivery_failures import DeliveryFailures
from workers.recovery.leases import LeaseKeeper, Reconciler
from workers.recovery.requeue import Requeuer
from workers.sglang_client import ServerIdentity, SGLangClient


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
    delivery: DeliveryHandler  # runs each delivered message; the Celery task calls it
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
        requeuer = Requeuer(settings, bk, jobs, app)
        prefetch = PrefetchController(
            held=held.count,
            backlog=lambda: ctx.pool.waiting,
            low_water=lambda: settings.low_water(pool.max_inflight),
            max_chunks=settings.max_chunks,
        )
        reconciler = reconciler_for(settings, ctx, requeuer, hostname)
        monitor = monitor_for(
            settings, ctx, hostname, held.count, lambda: health.healthy, stats, prometheus, tuner
        )
        failures = DeliveryFailures(bk, requeuer, health, settings.requeue_backoff)
        delivery = DeliveryHandler(ctx, hostname, health, prefetch, held, failures)
        return cls(
            settings, app, hostname, ctx, health, reconciler, prefetch, switch, delivery, monitor, tuner
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

    @property
    def listener(self) -> WorkerListener:
        """Where the worker's events go: Prometheus, the live-progress counters and the tuner."""
        return self.ctx.listener


def monitor_for(
    settings: WorkerSettings,
    ctx: ChunkContext,
    hostname: str,
    held: Callable[[], int],
    healthy: Callable[[], bool],
    stats: WorkerStats,
    prometheus: PrometheusListener,
    tuner: TunerLoop | None = None,
) -> WorkerMonitor:
    """The worker's monitor, wired to its pool, server, chunk count, health and in-flight tuner:
    what its heartbeat says (``state``) and the gauges Prometheus reads at scrape time."""

    def queues() -> list[str]:
        served = ctx.server.current
        if served is None:
            return [settings.queue]
        return server_queues(settings.queue, served.served_model_name, served.model_path)

    def state() -> dict[str, Any]:
        served = ctx.server.current
        return {
            "endpoint": ctx.identity.endpoint,
            "model": served.served_model_name if served else "",
            "model_path": served.model_path if served else "",
            "sglang_version": served.version if served else "",
            "queues": ",".join(queues()),
            "inflight": ctx.pool.running,
            "waiting": ctx.pool.waiting,
            "max_inflight": ctx.pool.max_inflight,
            "held_chunks": held(),
            "healthy": healthy(),
            "server_accept_length": monitor.accept,
            # the tuner's target, phase, reason and measured curve, as one JSON field
            "tuner": tuner.state().to_json() if tuner else "",
        }

    monitor = WorkerMonitor(
        settings, ctx.bookkeeping, ctx.jobs, ctx.client, hostname, state, stats, prometheus
    )
    prometheus.watch_worker(
        lambda: ctx.pool.running,
        lambda: ctx.pool.waiting,
        held,
        healthy,
        lambda: ctx.pool.max_inflight,
    )
    if tuner is not None:
        prometheus.watch_tuner(tuner.state)
    prometheus.watch_queue(LiveProgress.of(ctx.bookkeeping), queues)
    return monitor


def reconciler_for(
    settings: WorkerSettings, ctx: ChunkContext, requeuer: Requeuer, hostname: str
) -> Reconciler:
    """The reconciler: re-queues the chunks of dead workers' expired leases and re-plans jobs."""
    return Reconciler(
        ctx.bookkeeping,
        lambda job_id: ctx.jobs.get(job_id).store,
        requeuer.requeue,
        owner=hostname,
        interval=settings.reconcile_seconds,
        lease_seconds=settings.lease_seconds,
        visibility_timeout=settings.visibility_timeout,
        replan=requeuer.replan_job,
        replan_seconds=settings.replan_seconds,
        listener=ctx.listener,
    )


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
