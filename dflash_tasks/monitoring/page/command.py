"""``python -m dflash_tasks.page --output PATH``: the job's own page, in a browser.

Reads what ``status`` reads (the store; Redis while it is there) and serves the run, every GPU
and the samples on http://127.0.0.1:8765/ behind HTTP basic auth: ``DFLASH_PAGE_BASIC_AUTH``
(``user:password``), else user ``admin`` and a password generated and printed once. Built on
Tornado, which Flower already brings: no new dependency, no asset fetched at run time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import tornado.httpserver
import tornado.ioloop

from dflash_tasks.cli.commands import prog
from dflash_tasks.cli.flags import add_setting, job_flags, load_settings
from dflash_tasks.cli.trainer_flags import add_trainer_flags, view_from_args
from dflash_tasks.core.errors import ConfigError, DflashError
from dflash_tasks.core.exit_codes import ExitCode
from dflash_tasks.core.settings import MonitorSettings
from dflash_tasks.monitoring.flower import is_loopback
from dflash_tasks.monitoring.page.auth import Credentials
from dflash_tasks.monitoring.page.server import make_app
from dflash_tasks.monitoring.page.source import JobSource
from dflash_tasks.monitoring.page.trainer_marks import TrainerLens
from dflash_tasks.monitoring.status import connect_bookkeeping
from dflash_tasks.store import open_store
from dflash_tasks.store.jobfiles import load_job

DEFAULT_PORT = 8765


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog("dflash_tasks.page"), description=__doc__.splitlines()[0], parents=job_flags()
    )
    p.add_argument("--address", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    add_setting(
        p,
        "--refresh-seconds",
        MonitorSettings,
        "page_refresh_seconds",
        "compute progress this often for the throughput plot (default 10)",
        aliases=["--refresh"],
        metavar="SECONDS",
    )
    add_trainer_flags(p)
    return p


def build_source(args: argparse.Namespace, settings: MonitorSettings) -> JobSource:
    """The job at ``--output``, its Redis and trainer view; :class:`DflashError` naming what is wrong."""
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be a TCP port, got {args.port}")
    store = open_store(args.output, settings)
    definition = load_job(store)
    if definition is None:
        raise DflashError(f"{args.output} holds no job (no job.json): run enqueue first")
    view = view_from_args(args, definition.trainer)
    return JobSource(
        store,
        connect_bookkeeping(settings),
        definition,
        TrainerLens(view, definition),
        queue=settings.queue,
        gpu_hour_usd=args.gpu_hour_usd,
        default_gpu_hour_usd=settings.gpu_hour_usd,
    )


async def serve(
    args: argparse.Namespace, source: JobSource, credentials: Credentials, refresh_seconds: float
) -> None:
    server = tornado.httpserver.HTTPServer(make_app(source, credentials), xheaders=False)
    server.listen(args.port, address=args.address)
    tick = tornado.ioloop.PeriodicCallback(lambda: _refresh(source), refresh_seconds * 1000)
    tick.start()
    _refresh(source)
    await asyncio.Event().wait()


def _refresh(source: JobSource) -> None:
    try:
        source.progress()
    except DflashError as exc:
        logging.getLogger("dflash_tasks.page").warning("progress not computed: %s", exc)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(MonitorSettings, args)
        source = build_source(args, settings)
    except DflashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    credentials = Credentials.from_setting(settings.page_basic_auth)
    print(f"job page at http://{args.address}:{args.port}/  user {credentials.user}", file=sys.stderr)
    if credentials.generated:
        print(
            f"generated password (shown once; set DFLASH_PAGE_BASIC_AUTH=user:password to choose one): "
            f"{credentials.password}",
            file=sys.stderr,
        )
    if not is_loopback(args.address):
        print(
            f"warning: binding {args.address}: reachable beyond this machine (basic auth only, no TLS)",
            file=sys.stderr,
        )
    sys.stderr.flush()
    try:
        asyncio.run(serve(args, source, credentials, settings.page_refresh_seconds))
    except OSError as exc:
        print(f"error: cannot serve on {args.address}:{args.port}: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    return ExitCode.OK
