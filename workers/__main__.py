"""``python -m workers --endpoint URL --name NAME``: one Celery worker bound to one SGLang server.

The worker asks its server which model it serves and consumes that model's queue (shared by
every worker of that model: a faster GPU simply takes more chunks; docs/routing.md). It keeps
``--max-inflight`` requests in flight against its server, across chunk boundaries.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from celery import bootsteps, signals

from dflash_tasks.coord.celery_app import app, configure
from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.setting_values import inflight_overrides, parse_inflight, redact_url
from dflash_tasks.core.settings import DEFAULT_INFLIGHT_CEILING, DEFAULT_MAX_INFLIGHT, WorkerSettings
from workers.runtime import WorkerRuntime


def inflight_type(text: str) -> int | str:
    try:
        return parse_inflight(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workers", description=__doc__.splitlines()[0])
    p.add_argument("--endpoint", help="SGLang server URL, e.g. http://127.0.0.1:30000 [DFLASH_ENDPOINT]")
    p.add_argument("--name", help="worker name shown in Flower, e.g. gpu0 [DFLASH_WORKER_NAME]")
    p.add_argument(
        "--max-inflight",
        type=inflight_type,
        metavar="N|auto",
        help=f"requests kept in flight (default {DEFAULT_MAX_INFLIGHT}) [DFLASH_MAX_INFLIGHT]; auto: "
        "tuned from the server's numbers between --inflight-floor and --inflight-ceiling "
        "[DFLASH_TUNE_INFLIGHT=1]",
    )
    p.add_argument(
        "--inflight-ceiling",
        type=int,
        help=f"the tuner's highest target: the server's --max-running-requests "
        f"(default {DEFAULT_INFLIGHT_CEILING}) [DFLASH_INFLIGHT_CEILING]",
    )
    p.add_argument(
        "--inflight-floor", type=int, help="the tuner's lowest target (default 8) [DFLASH_INFLIGHT_FLOOR]"
    )
    p.add_argument("--max-chunks", type=int, help="most chunks held at once (default 8) [DFLASH_MAX_CHUNKS]")
    p.add_argument("--broker-url", help="Redis URL (default redis://127.0.0.1:6379/0) [DFLASH_BROKER_URL]")
    p.add_argument("--queue", help="base queue name (default dflash) [DFLASH_QUEUE]")
    p.add_argument(
        "--s3-endpoint-url", help="S3-compatible endpoint for s3:// outputs [DFLASH_S3_ENDPOINT_URL]"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        help="Prometheus port on 127.0.0.1, 0 = off (default 9808) [DFLASH_METRICS_PORT]",
    )
    p.add_argument("--log-level", help="INFO, WARNING, DEBUG [DFLASH_LOG_LEVEL]")
    return p.parse_args(argv)


def prefetch_step(runtime: WorkerRuntime) -> type[bootsteps.StartStopStep]:
    """A consumer bootstep handing the consumer (prefetch, on/off switch) to the runtime."""

    class BacklogPrefetch(bootsteps.StartStopStep):  # type: ignore[misc]
        requires = ("celery.worker.consumer.tasks:Tasks",)

        def start(self, consumer: Any) -> None:
            runtime.attach_consumer(consumer)

    return BacklogPrefetch


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = WorkerSettings.load(
            endpoint=args.endpoint,
            worker_name=args.name,
            **inflight_overrides(args.max_inflight),
            inflight_ceiling=args.inflight_ceiling,
            inflight_floor=args.inflight_floor,
            max_chunks=args.max_chunks,
            broker_url=args.broker_url,
            queue=args.queue,
            log_level=args.log_level,
            metrics_port=args.metrics_port,
            s3_endpoint_url=args.s3_endpoint_url,
        )
        if not settings.endpoint.startswith(("http://", "https://")):
            raise ConfigError(
                "--endpoint is required and must be an http(s) URL, e.g. http://127.0.0.1:30000"
            )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from workers import runtime as worker_runtime
    from workers.task import register_chunk_task

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s [%(name)s] %(message)s"
    )
    configure(app, settings)
    runtime = worker_runtime.WorkerRuntime.build(settings, app)
    runtime.ctx.server.try_refresh()  # its model decides the queues; else learnt once the server answers
    register_chunk_task(app, runtime)
    signals.worker_ready.connect(lambda **_: runtime.start_background(), weak=False)
    app.steps["consumer"].add(prefetch_step(runtime))
    concurrency = settings.max_chunks
    queues = runtime.switch.starting()
    logging.getLogger("workers").info(
        "worker %s: endpoint %s, broker %s, queues %s, %s in flight, up to %d chunks",
        runtime.hostname,
        settings.endpoint,
        redact_url(settings.broker_url),
        ",".join(queues),
        (
            f"tuned {settings.inflight_floor}-{runtime.ctx.pool.ceiling} (from {settings.max_inflight})"
            if settings.tune_inflight
            else str(settings.max_inflight)
        ),
        concurrency,
    )
    app.worker_main(
        [
            "worker",
            "--pool=threads",
            f"--concurrency={concurrency}",
            f"--hostname={runtime.hostname}",
            f"--queues={','.join(queues)}",
            f"--loglevel={settings.log_level.upper()}",
            "--events",
            "--without-gossip",
            "--without-mingle",
        ]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
