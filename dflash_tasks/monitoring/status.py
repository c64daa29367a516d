"""``python -m dflash_tasks.status --output PATH``: where a job stands, its rates, ETA and cost.

Computed from the store (done chunks: the truth) and Redis (running chunks, rates, workers) with
the same code that writes ``progress.json``, so both always agree. Works from any machine that
reaches the store and Redis, after any restart; without Redis it shows what the store knows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import redis

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.core.errors import DflashError
from dflash_tasks.core.settings import CommonSettings, MonitorSettings, redact_url
from dflash_tasks.core.spec_stats import SOURCE_PER_REQUEST, SOURCE_SERVER
from dflash_tasks.monitoring.progress import compute_progress
from dflash_tasks.monitoring.progress_bar import format_duration
from dflash_tasks.store import open_store
from dflash_tasks.store.jobfiles import load_job


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dflash_tasks.status", description=__doc__.splitlines()[0])
    p.add_argument("--output", required=True, help="the job's output root (as given to enqueue)")
    p.add_argument("--json", action="store_true", help="print the progress document (progress.json's format)")
    p.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=5.0,
        metavar="SECONDS",
        help="refresh every SECONDS (default 5) until the job is done",
    )
    p.add_argument(
        "--gpu-hour-usd", type=float, help="price of one GPU-hour (overrides the job's) [DFLASH_GPU_HOUR_USD]"
    )
    p.add_argument("--broker-url", help="Redis URL [DFLASH_BROKER_URL]")
    p.add_argument("--queue", help="base queue name, for the depth of the job's model queue [DFLASH_QUEUE]")
    return p


# --- rendering --------------------------------------------------------------------------------


def _n(x: float | int | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.2f}"


def _bar(frac: float, width: int = 32) -> str:
    filled = min(width, int(frac * width))
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [line(header).rstrip(), *(line(r).rstrip() for r in rows)]


def render(doc: dict[str, Any]) -> str:
    """A human summary of a progress document."""
    s, c, t, r, cost = doc["samples"], doc["chunks"], doc["tokens"], doc["rates"], doc["cost"]
    total = s["total"]
    frac = s["done"] / total if total else 1.0
    state = doc["state"] + (f" ({doc['pause_reason']})" if doc.get("pause_reason") else "")
    updated = datetime.fromtimestamp(doc["updated_at"]).strftime("%H:%M:%S")
    out = [
        f"job {doc['job_id']}  {state}  {doc['model']}  ->  {doc['output']}   (at {updated})",
        f"{_bar(frac)} {frac:6.1%}  {s['done']:,} / {total:,} samples",
        "",
        f"  samples   {s['done']:,} done ({s['failed']:,} failed) | {s['remaining']:,} left"
        f" | {s['invalid_lines']:,} invalid input lines",
    ]
    turns = doc.get("turns") or {}
    if doc.get("eta_unit") == "turns":
        generated = f" | {turns['generated']:,} generated" if turns.get("generated") else ""
        out.append(
            f"  turns     {turns['done']:,} / {turns['total']:,} done{generated}"
            f" | {turns['remaining']:,} left (a conversation costs one generation per turn)"
        )
    out += [
        f"  chunks    {c['done']:,} done | {c['running']:,} running | {c['pending']:,} pending"
        + (
            f" | queue depth {doc['queue_depth']:,} ({doc.get('queue') or '?'})"
            if doc.get("queue_depth") is not None
            else ""
        ),
        f"  rate      last {r['window_s']}s: {r['samples_per_s']:,.2f} samples/s"
        + (f"  {r['turns_per_s']:,.2f} turns/s" if doc.get("eta_unit") == "turns" else "")
        + f"  {r['tokens_per_s']:,.0f} tok/s"
        f"  | since start: {r['since_start']['samples_per_s']:,.2f} samples/s"
        f"  {r['since_start']['tokens_per_s']:,.0f} tok/s",
    ]
    if doc["state"] == "done":
        out.append(f"  finished  in {format_duration(doc['elapsed_s'])}")
    else:
        basis = {"last_minute": "last-minute", "since_start": "since-start"}.get(
            doc.get("eta_basis") or "", ""
        )
        eta = f"  ETA       {format_duration(doc['eta_s'])}"
        if doc.get("eta_at_iso"):
            unit = "turn" if doc.get("eta_unit") == "turns" else "sample"
            eta += f" (at {doc['eta_at_iso']}, from the {basis} {unit} rate)"
        if doc.get("eta_by_tokens_s") is not None:
            eta += f" | by tokens {format_duration(doc['eta_by_tokens_s'])}"
        out.append(eta)
        out.append(f"  elapsed   {format_duration(doc['elapsed_s'])}")
    out.append(f"  tokens    {t['generated']:,} generated | {_n(t['avg_per_sample'])} per sample")
    spec_line = render_spec(doc.get("spec") or {})
    if spec_line:
        out.append(f"  spec      {spec_line}")
    gpus = f"{cost['gpus']} GPU{'s' if cost['gpus'] != 1 else ''}"
    if cost["gpu_hour_usd"]:
        projected = (
            "" if doc["state"] == "done" else f" | projected total {_usd(cost['projected_total_usd'])}"
        )
        out.append(
            f"  cost      {gpus} x ${cost['gpu_hour_usd']:,.2f}/GPU-h | {cost['gpu_hours']:,.2f} GPU-h"
            f" | {_usd(cost['usd'])} so far{projected}"
        )
    else:
        out.append(f"  cost      {gpus} | {cost['gpu_hours']:,.2f} GPU-h (price unknown: --gpu-hour-usd)")
    workers = doc["workers"]
    if workers:
        rows = [
            [
                w["name"],
                w["endpoint"],
                ("up" if w["healthy"] is not False else "DOWN") if w["alive"] else "gone",
                f"{w['samples_per_s']:,.2f}",
                f"{w['tokens_per_s']:,.0f}",
                f"{w['samples']:,}",
                f"{w['failed']:,}",
                f"{w['inflight']}/{w['max_inflight']}",
                str(w["held_chunks"]),
                _accept_cell(w),
                _n(w.get("spec_accept_length_window"), 2),
                format_duration(w["last_seen_s"]) + " ago" if w["last_seen_s"] is not None else "-",
            ]
            for w in workers
        ]
        header = ["WORKER", "ENDPOINT", "STATE", "SAMPLES/S", "TOK/S", "SAMPLES", "FAILED"]
        header += ["IN FLIGHT", "HELD", "ACCEPT", "ACCEPT 1M", "SEEN"]
        out += ["", *("  " + line for line in _table(header, rows, right={3, 4, 5, 6, 7, 8, 9, 10}))]
        if any(w.get("spec_accept_source") == SOURCE_SERVER for w in workers):
            out.append("  * the server's lifetime average: its samples report no per-request stats")
    for warning in doc.get("warnings", []):
        out.append(f"  ! {warning}")
    return "\n".join(out)


def _accept_cell(worker: dict[str, Any]) -> str:
    mark = "*" if worker.get("spec_accept_source") == SOURCE_SERVER else ""
    return _n(worker["spec_accept_length"], 2) + mark


def render_spec(spec: dict[str, Any]) -> str:
    """The accept-length line of the summary, naming its source; "" when there is none."""
    if spec.get("accept_length") is None:
        return ""
    if spec.get("source") == SOURCE_PER_REQUEST:
        window = f" | last minute {spec['window']:.2f}" if spec.get("window") is not None else ""
        return (
            f"accept length {spec['accept_length']:.2f} per request (Σ tokens / Σ verify passes, "
            f"{spec['verify_passes']:,} passes){window}"
        )
    return f"accept length {spec['accept_length']:.2f} (the servers' lifetime average: no per-request stats)"


# --- the command ------------------------------------------------------------------------------


def _bookkeeping(settings: CommonSettings) -> Bookkeeping | None:
    client = redis.Redis.from_url(settings.broker_url, socket_timeout=5, socket_connect_timeout=3)
    bk = Bookkeeping(client, settings.redis_prefix)
    try:
        bk.ping()
    except DflashError as exc:
        print(f"warning: {exc} ({redact_url(settings.broker_url)}); showing the store only", file=sys.stderr)
        return None
    return bk


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = MonitorSettings.load(broker_url=args.broker_url, queue=args.queue)
        if args.gpu_hour_usd is not None and args.gpu_hour_usd < 0:
            raise DflashError(f"--gpu-hour-usd must be >= 0, got {args.gpu_hour_usd}")
        store = open_store(args.output, settings)
        definition = load_job(store)
        if definition is None:
            raise DflashError(f"{args.output} holds no job (no job.json): run enqueue first")
        bk = _bookkeeping(settings)
        tty = sys.stdout.isatty()
        while True:
            doc = compute_progress(
                store,
                bk,
                definition.job_id,
                queue=settings.queue,
                gpu_hour_usd=args.gpu_hour_usd,
                default_gpu_hour_usd=settings.gpu_hour_usd,
                writer=f"status@{os.uname().nodename}",
            )
            if args.json:
                print(json.dumps(doc), flush=True)
            else:
                if args.watch and tty:
                    sys.stdout.write("\x1b[H\x1b[2J")  # home + clear: redraw in place
                print(render(doc), flush=True)
            if not args.watch or doc["state"] == "done":
                return 0
            if not tty and not args.json:
                print(flush=True)
            time.sleep(args.watch)
    except DflashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
