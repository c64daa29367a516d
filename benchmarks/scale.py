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

The same prompts staged from each input format (time and memory): the ``inputs`` benchmark.
"""

from __future__ import annotations

import os
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
from benchmarks.prompts import cached_prompts
from dflash_tasks.core.job import chunk_name

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
    return figures, {"summary": summary}


def goals(opts: Options) -> list[Goal]:
    return [
        Goal("stage_enqueue_s", "<=", 60, "stage + enqueue the input (2-core machine)"),
        Goal("redis_job_mb", "<=", 64, "Redis memory of the queued job"),
        Goal("replan_max_s", "<=", 15, "slowest resume re-plan"),
    ]


BENCHMARK = Benchmark("scale", __doc__.splitlines()[0], run, goals)
