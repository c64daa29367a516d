"""``python -m dflash_tasks.status --output PATH``: where a job stands, its rates, ETA and cost.

Computed from the store (done chunks: the truth) and Redis (running chunks, rates, workers) with
the same code that writes ``progress.json``, so both always agree. Works from any machine that
reaches the store and Redis, after any restart; without Redis it shows what the store knows.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.live import Live

from dflash_tasks.cli.commands import prog
from dflash_tasks.cli.flags import job_flags, json_flag, load_settings
from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.core.errors import DflashError
from dflash_tasks.core.exit_codes import ExitCode
from dflash_tasks.core.setting_values import redact_url
from dflash_tasks.core.settings import CommonSettings, MonitorSettings
from dflash_tasks.core.states import JobState
from dflash_tasks.monitoring.progress import compute_document
from dflash_tasks.monitoring.progress_document import ProgressDocument
from dflash_tasks.monitoring.status_view import render, render_table
from dflash_tasks.store import open_store
from dflash_tasks.store.jobfiles import load_job


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog("dflash_tasks.status"),
        description=__doc__.splitlines()[0],
        parents=[*job_flags(), json_flag("print the progress document (progress.json's format)")],
    )
    p.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=5.0,
        metavar="SECONDS",
        help="refresh every SECONDS (default 5) until the job is done",
    )
    return p


# --- the watch loop ---------------------------------------------------------------------------


def watch(
    snapshot: Callable[[], ProgressDocument],
    every: float | None,
    out: TextIO,
    *,
    as_json: bool = False,
    live: Console | None = None,
) -> int:
    """Show ``snapshot()`` once, or every ``every`` seconds until the job is done.

    With ``live`` (a terminal, not ``--json``), one rich table is redrawn in place on it;
    otherwise each snapshot is printed to ``out`` as plain text (separated by a blank line) or as
    one JSON line, so piped output and logs hold no escape codes. Ctrl-C raises
    :class:`KeyboardInterrupt` (the live table keeps its last frame).
    """
    doc = snapshot()
    if live is not None and every and not as_json:
        with Live(render_table(doc), console=live, auto_refresh=False) as view:
            while doc.header.state != JobState.DONE:
                time.sleep(every)
                doc = snapshot()
                view.update(render_table(doc), refresh=True)
        return ExitCode.OK
    while True:
        print(doc.to_json() if as_json else render(doc), file=out, flush=True)
        if not every or doc.header.state == JobState.DONE:
            return ExitCode.OK
        if not as_json:
            print(file=out, flush=True)
        time.sleep(every)
        doc = snapshot()


# --- the command ------------------------------------------------------------------------------


def connect_bookkeeping(settings: CommonSettings) -> Bookkeeping | None:
    """Redis's bookkeeping, or None (with a warning) when it does not answer: the store only."""
    bk = Bookkeeping.from_url(
        settings.broker_url, settings.redis_prefix, timeout=5, connect_timeout=3, health_check_interval=0
    )
    try:
        bk.ping()
    except DflashError as exc:
        print(f"warning: {exc} ({redact_url(settings.broker_url)}); showing the store only", file=sys.stderr)
        return None
    return bk


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(MonitorSettings, args)
        store = open_store(args.output, settings)
        definition = load_job(store)
        if definition is None:
            raise DflashError(f"{args.output} holds no job (no job.json): run enqueue first")
        bk, job_id = connect_bookkeeping(settings), definition.job_id

        def snapshot() -> ProgressDocument:
            return compute_document(
                store,
                bk,
                job_id,
                queue=settings.queue,
                gpu_hour_usd=args.gpu_hour_usd,
                default_gpu_hour_usd=settings.gpu_hour_usd,
                writer=f"status@{os.uname().nodename}",
            )

        live = Console() if args.watch and not args.json and sys.stdout.isatty() else None
        return watch(snapshot, args.watch, sys.stdout, as_json=args.json, live=live)
    except DflashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
