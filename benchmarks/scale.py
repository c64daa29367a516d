"""Scale: staging, queueing and re-planning a 913,786-prompt job (``--quick``: 100,000 prompts).

The input is synthetic, about 1 KB per prompt in the four accepted shapes, generated once into
``benchmarks/.cache/``. Against a private redis-server (AOF, fsync every second) and no workers:

* ``stage_enqueue_s``: ``python -m dflash_tasks.enqueue --no-preflight`` on a fresh output root,
  wall time of the whole command (fingerprint, validation, chunk files, manifest, one message per
  chunk);
* ``redis_job_mb``: growth of Redis ``used_memory`` from before to after, and ``queue_mb``, the
  ``MEMORY USAGE`` of the queue list;
* re-plan times of the same command when the job is partly or wholly done, with the output files
  fabricated (empty files: enqueue only lists them):
  ``replan_half_done_s`` (the first half stored, the other half's messages still queued),
  ``replan_half_done_redis_lost_s`` (the same after FLUSHALL: the other half is queued again),
  ``replan_all_done_s`` (every chunk stored, the queue empty).

The input formats row (``--set format_rows=N``, default 5,000,000; ``--quick``: 100,000; 0 skips
it): the same chat prompts (``{"id", "messages"}``, ~1 KB) as one JSONL file and as Parquet shards
of 250,000 rows, each staged and queued by the same command on a fresh output root:
``stage_jsonl_chat_s`` / ``stage_parquet_s`` (wall time), ``peak_mb_jsonl`` / ``peak_mb_parquet``
(the command's peak resident memory) and ``parquet_vs_jsonl_per_row`` (time per row, Parquet over
JSONL).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Benchmark,
    Figures,
    Goal,
    Options,
    check,
    enqueue_args,
    last_json,
    redis_used_memory,
    run_module,
    say,
    stack,
    workspace,
)
from benchmarks.prompts import cached_chat_inputs, cached_prompts
from dflash_tasks.core.job import chunk_name
from tests.helpers import REPO

FULL = 913_786
QUICK = 100_000


def fabricate_outputs(out: Path, chunks: range) -> None:
    """Empty completion files for ``chunks`` (enqueue only lists ``outputs/``)."""
    folder = out / "outputs"
    folder.mkdir(parents=True, exist_ok=True)
    for chunk in chunks:
        os.close(os.open(folder / chunk_name(chunk), os.O_WRONLY | os.O_CREAT, 0o644))


def run(opts: Options) -> tuple[Figures, dict[str, Any]]:
    count = int(opts.get("prompts", QUICK if opts.quick else FULL))
    inp = cached_prompts(count)
    figures: Figures = {"prompts": float(count), "input_mb": inp.stat().st_size / 2**20}
    with workspace("scale", opts) as work, stack(work) as (server, procs):
        r = server.client()
        out = work / "out"
        base = redis_used_memory(r)
        say(f"stage + enqueue {count:,} prompts ...")
        seconds, stdout, _ = run_module(
            procs, "dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--json")
        )
        summary = last_json(stdout)
        chunks = int(summary["chunks"])
        queue = procs.model_queue()
        figures.update(
            stage_enqueue_s=seconds,
            chunks=float(chunks),
            redis_job_mb=(redis_used_memory(r) - base) / 2**20,
            queue_mb=int(r.memory_usage(queue, samples=0) or 0) / 2**20,
            queue_bytes_per_chunk=int(r.memory_usage(queue, samples=0) or 0) / chunks,
        )
        check(summary["chunks_enqueued"] == chunks == r.llen(queue), f"not all queued: {summary}")
        say(f"staged and queued {chunks:,} chunks in {seconds:.1f}s")

        half = chunks // 2
        fabricate_outputs(out, range(half))
        # Messages are LPUSHed and consumed from the right: the oldest (lowest chunks) go first.
        r.ltrim(procs.model_queue(), 0, chunks - half - 1)
        seconds, stdout, _ = run_module(
            procs, "dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--json")
        )
        s = last_json(stdout)
        check(
            (s["chunks_done"], s["chunks_queued_before"], s["chunks_enqueued"]) == (half, chunks - half, 0),
            f"half done, half queued: {s}",
        )
        figures["replan_half_done_s"] = seconds

        r.flushall()
        seconds, stdout, _ = run_module(
            procs, "dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--json")
        )
        s = last_json(stdout)
        check((s["chunks_done"], s["chunks_enqueued"]) == (half, chunks - half), f"Redis lost: {s}")
        figures["replan_half_done_redis_lost_s"] = seconds

        fabricate_outputs(out, range(half, chunks))
        r.delete(procs.model_queue())
        seconds, stdout, _ = run_module(
            procs, "dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--json")
        )
        s = last_json(stdout)
        check((s["chunks_done"], s["chunks_enqueued"]) == (chunks, 0), f"all done: {s}")
        figures["replan_all_done_s"] = seconds
        figures["replan_max_s"] = max(
            figures[k] for k in ("replan_half_done_s", "replan_half_done_redis_lost_s", "replan_all_done_s")
        )
        figures.update(format_row(opts, procs, work))
    return figures, {"summary": summary}


def format_row(opts: Options, procs: Any, work: Path) -> Figures:
    """Stage the same chat prompts from JSONL and from Parquet shards: time and peak memory."""
    rows = int(opts.get("format_rows", 100_000 if opts.quick else 5_000_000))
    if rows <= 0:
        return {}
    jsonl, shards = cached_chat_inputs(rows)
    figures: Figures = {"format_rows": float(rows)}
    for label, location in (("jsonl", jsonl), ("parquet", shards)):
        out = work / f"out-{label}"
        say(f"stage + enqueue {rows:,} chat prompts from {label} ...")
        seconds, peak_kb, stdout = _timed(procs, enqueue_args(location, out, "--json"))
        check(int(last_json(stdout)["samples"]) == rows, f"{label}: not every row staged")
        key = "stage_jsonl_chat_s" if label == "jsonl" else "stage_parquet_s"
        figures[key], figures[f"peak_mb_{label}"] = seconds, peak_kb / 1024
        say(f"{label}: {seconds:.1f}s, peak {peak_kb / 1024:.0f} MB")
    figures["parquet_vs_jsonl_per_row"] = figures["stage_parquet_s"] / figures["stage_jsonl_chat_s"]
    return figures


def _timed(procs: Any, args: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak resident KB, stdout) of ``enqueue args`` under GNU time."""
    started = time.monotonic()
    res = subprocess.run(
        ["/usr/bin/time", "-f", "PEAK_KB %M", sys.executable, "-m", "dflash_tasks.producer.enqueue", *args],
        cwd=REPO,
        env=procs.env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    seconds = time.monotonic() - started
    check(res.returncode == 0, f"enqueue exited {res.returncode}: {res.stderr[-2000:]}")
    peak = [line for line in res.stderr.splitlines() if line.startswith("PEAK_KB ")][-1]
    return seconds, float(peak.split()[1]), res.stdout


def goals(opts: Options) -> list[Goal]:
    return [
        Goal("stage_enqueue_s", "<=", 60, "stage + enqueue the input (2-core machine)"),
        Goal("redis_job_mb", "<=", 64, "Redis memory of the queued job"),
        Goal("replan_max_s", "<=", 15, "slowest resume re-plan"),
        Goal("parquet_vs_jsonl_per_row", "<=", 1.0, "Parquet staged at least as fast per row as JSONL"),
    ]


BENCHMARK = Benchmark("scale", __doc__.splitlines()[0], run, goals)
