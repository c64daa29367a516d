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

from dflash_tasks.cli.commands import prog
from dflash_tasks.cli.flags import add_setting, broker_flags, load_settings, store_flags
from dflash_tasks.coord.celery_app import app, configure
from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.exit_codes import ExitCode
from dflash_tasks.core.setting_values import redact_url
from dflash_tasks.core.settings import DEFAULT_INFLIGHT_CEILING, DEFAULT_MAX_INFLIGHT, WorkerSettings
from workers.runtime import WorkerRuntime


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog("workers"),
        description=__doc__.splitlines()[0],
        parents=[broker_flags(), store_flags(output=False)],
    )
    add_setting(p, "--endpoint", WorkerSettings, "endpoint", "SGLang server URL, e.g. http://127.0.0.1:30000")
    add_setting(p, "--name", WorkerSettings, "worker_name", "worker name shown in Flower, e.g. gpu0")
    add_setting(
        p,
        "--max-inflight",
        WorkerSettings,
        "max_inflight",
        f"requests kept in flight (default {DEFAULT_MAX_INFLIGHT}); auto: tuned from the server's "
        "numbers between --inflight-floor and --inflight-ceiling [DFLASH_TUNE_INFLIGHT=1]",
        metavar="N|auto",
    )
    add_setting(
        p,
        "--inflight-ceiling",
        WorkerSettings,
        "inflight_ceiling",
        "the tuner's highest target: the server's --max-running-requests "
        f"(default {DEFAULT_INFLIGHT_CEILING})",
    )
    add_setting(
        p, "--inflight-floor", WorkerSettings, "inflight_floor", "the tuner's lowest target (default 8)"
    )
    add_setting(p, "--max-chunks", WorkerSettings, "max_chunks", "most chunks held at once (default 8)")
    add_setting(
        p,
        "--metrics-port",
        WorkerSettings,
        "metrics_port",
        "Prometheus port on 127.0.0.1, 0 = off (default 9808)",
    )
    add_setting(p, "--log-level", WorkerSettings, "log_level", "INFO, WARNING, DEBUG")
    return p


def load(argv: list[str] | None) -> WorkerSettings:
    """The worker's settings from its flags and ``DFLASH_*``; :class:`ConfigError` when unusable."""
    settings = load_settings(WorkerSettings, build_parser().parse_args(argv))
    if not settings.endpoint.startswith(("http://", "https://")):
        raise ConfigError("--endpoint is required and must be an http(s) URL, e.g. http://127.0.0.1:30000")
    return settings


def prefetch_step(runtime: WorkerRuntime) -> type[bootsteps.StartStopStep]:
    """A consumer bootstep handing the consumer (prefetch, on/off switch) to the runtime."""

    class BacklogPrefetch(bootsteps.StartStopStep):  # type: ignore[misc]
        requires = ("celery.worker.consumer.tasks:Tasks",)

        def start(self, consumer: Any) -> None:
            runtime.attach_consumer(consumer)

    return BacklogPrefetch


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
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
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
