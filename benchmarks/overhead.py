"""Per-chunk overhead: how many chunks and samples one worker process moves through an instant server.

One simulator with ``--time-scale 0`` (answers at once, with realistic bodies: the lognormal output
length, mean 2,300 tokens, about one word per token) and one ``python -m workers`` with its defaults
(48 in flight, up to 8 chunks). The job is staged and queued first (``enqueue --no-preflight``),
then the worker runs it. Rates are over the simulator's busy window (first request received to
last answered, from ``/sim/stats``); CPU is the worker's and the simulator's utime + stime
(``/proc/<pid>/stat``) over the whole job, divided by its samples.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import (
    Benchmark,
    Figures,
    Goal,
    Options,
    count_outputs,
    cpu_seconds,
    enqueue_args,
    last_json,
    last_output_time,
    reset_sim_stats,
    run_module,
    say,
    sim_stats,
    stack,
    start_simulator,
    start_worker,
    workspace,
)
from benchmarks.prompts import write_prompts
from tests.helpers import wait_until


def run(opts: Options) -> tuple[Figures, dict[str, Any]]:
    chunk_size = int(opts.get("chunk_size", 64))
    chunks = int(opts.get("chunks", 40 if opts.quick else 150))
    total = chunk_size * chunks
    with workspace("overhead", opts) as work, stack(work) as (_, procs):
        inp = write_prompts(work / "prompts.jsonl", total)
        out = work / "out"
        sim, sim_pid = start_simulator(procs, "sim", "--time-scale", "0")
        worker = start_worker(procs, sim, "gpu0")
        time.sleep(1.0)  # let the worker settle (first health probe, monitor threads)
        reset_sim_stats([sim])
        worker_cpu, sim_cpu = cpu_seconds(worker.pid), cpu_seconds(sim_pid)
        started = time.time()
        _, stdout, _ = run_module(
            procs,
            "dflash_tasks.producer.enqueue",
            *enqueue_args(inp, out, "--json", "--chunk-size", str(chunk_size)),
        )
        queued = time.time()
        summary = last_json(stdout)
        wait_until(lambda: count_outputs(out) >= summary["chunks"], 1800, "every chunk stored", 0.05)
        finished = last_output_time(out)
        time.sleep(0.5)  # the last chunk's bookkeeping
        worker_cpu = cpu_seconds(worker.pid) - worker_cpu
        sim_cpu = cpu_seconds(sim_pid) - sim_cpu
        stats = sim_stats(sim)
    window = float(stats["window_seconds"])
    figures: Figures = {
        "samples": float(total),
        "chunks": float(chunks),
        "samples_per_s": total / window,
        "chunks_per_s": chunks / window,
        "worker_cpu_ms_per_sample": 1000 * worker_cpu / total,
        "sim_cpu_ms_per_sample": 1000 * sim_cpu / total,
        "worker_cpu_share": worker_cpu / window,
        "end_to_end_samples_per_s": total / (finished - started),
        "enqueue_seconds": queued - started,
        "mean_running": float(stats["mean_running"]),
    }
    rate, cpu = figures["samples_per_s"], figures["worker_cpu_ms_per_sample"]
    say(f"{rate:.0f} samples/s, {cpu:.2f} ms of worker CPU per sample")
    return figures, {"chunk_size": chunk_size, "sim_stats": stats}


def goals(opts: Options) -> list[Goal]:
    return [Goal("samples_per_s", ">=", 200, "samples per second through one worker process")]


BENCHMARK = Benchmark("overhead", __doc__.splitlines()[0], run, goals)
