"""Streaming: the worker's streamed requests (loop detection on) against plain ones, same client,
same servers, same prompts.

A direct client (one thread per slot, ``slots`` per server, every thread taking the next prompt
from one shared list) sends the prompts plain, then streamed (``SGLangClient`` with the job's
default repetition settings: ``stream: true``, continuous usage, each delta fed to the detector),
then plain and streamed again; each phase is timed from its first request to its last answer.
The servers: S simulators started here (default 1, ``--max-running-requests`` = slots, the
simulator's output lengths capped by ``max_tokens`` 4096, ``--stream-interval 16`` as the node
launches SGLang, ``--time-scale 0.025``), or a running server (``--set endpoint=URL``, e.g. real
SGLang: ``benchmarks/gpu_check.sh stream``). The figure: streamed completions per second over
plain (the better of two phases each), the client's CPU milliseconds per completion (this
process) and, with simulators started here, theirs (``server_cpu_ms_per_completion``: a streamed
answer costs the server too, and here both share the machine's cores).
``--set slots=N``, ``--set servers=S``, ``--set prompts_per_server=N``, ``--set time_scale=X``,
``--set loop_share=X``, ``--set model=NAME`` (the model the requests name; a real server's served
name); ``--quick``: fewer prompts.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    MODEL,
    Benchmark,
    Figures,
    Goal,
    Options,
    check,
    say,
    stack,
    start_simulator,
    workspace,
)
from benchmarks.prompts import write_prompts
from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.repetition import RepetitionSettings
from dflash_tasks.core.sample import Sample
from dflash_tasks.producer.mix import read_input
from workers.node.launch import STREAM_INTERVAL
from workers.sglang_client import ChatRequest, SGLangClient

SLOTS = 48
TIME_SCALE = 0.025
#: Prompts per server: about 8 request lifetimes per slot at 256 slots, 40 at 48.
PROMPTS_PER_SERVER = 2000


def process_cpu(pids: list[int]) -> float:
    """CPU seconds the processes ``pids`` used so far (Linux ``/proc``; 0 without it)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def phase(
    urls: list[str],
    samples: list[Sample],
    slots: int,
    watch: RepetitionSettings | None,
    tag: str,
    servers: list[int],
    model: str = MODEL,
) -> Figures:
    """Send every sample once, ``slots`` at a time per server; completions/s and client CPU."""
    spec = GenerationSpec(model=model)
    todo = collections.deque(samples)
    failures, tokens = [0], [0]
    lock = threading.Lock()

    def serve(url: str) -> None:
        client = SGLangClient(url, timeout=600)
        while True:
            try:
                sample = todo.popleft()
            except IndexError:
                return
            try:
                done = client.chat(ChatRequest(spec, sample.messages, f"{tag}-L{sample.line}", watch=watch))
            except Exception:
                with lock:
                    failures[0] += 1
                continue
            with lock:
                tokens[0] += done.completion_tokens

    threads = [threading.Thread(target=serve, args=(url,), daemon=True) for url in urls for _ in range(slots)]
    cpu, server_cpu, start = os.times(), process_cpu(servers), time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds, after, server_used = time.monotonic() - start, os.times(), process_cpu(servers) - server_cpu
    used = (after.user - cpu.user) + (after.system - cpu.system)
    check(failures[0] == 0, f"{tag}: {failures[0]} requests failed")
    return {
        "completions_per_s": len(samples) / seconds,
        "tokens_per_s": tokens[0] / seconds,
        "client_cpu_ms_per_completion": 1000 * used / len(samples),
        "server_cpu_ms_per_completion": 1000 * server_used / len(samples),
    }


def run(opts: Options) -> tuple[Figures, dict[str, Any]]:
    slots = int(opts.get("slots", SLOTS))
    servers = int(opts.get("servers", 1))
    per_server = int(opts.get("prompts_per_server", 600 if opts.quick else PROMPTS_PER_SERVER))
    scale = opts.get("time_scale", TIME_SCALE)
    endpoint = opts.params.get("endpoint", "")
    model = opts.params.get("model", MODEL)
    total = servers * per_server
    details: dict[str, Any] = {"slots": slots, "servers": servers, "prompts": total, "time_scale": scale}
    with workspace("stream", opts) as work, stack(work) as (_, procs):
        pids: list[int] = []
        if endpoint:
            urls = [endpoint.rstrip("/")] * servers
        else:
            flags: tuple[str, ...] = (
                "--time-scale",
                str(scale),
                "--max-running-requests",
                str(slots),
                "--stream-interval",
                str(int(opts.get("stream_interval", STREAM_INTERVAL))),
            )
            flags += ("--loop-share", str(opts.get("loop_share", 0.0)))
            started = [start_simulator(procs, f"sim{i}", *flags) for i in range(servers)]
            urls, pids = [url for url, _ in started], [pid for _, pid in started]
        samples = [
            s for s in read_input(write_prompts(Path(work) / "prompts.jsonl", total)) if isinstance(s, Sample)
        ]
        runs: dict[str, list[Figures]] = {"plain": [], "stream": []}
        for round_ in range(2):
            for name, watch in (("plain", None), ("stream", RepetitionSettings())):
                say(f"{name} #{round_ + 1}: {total:,} prompts, {servers} x {slots} in flight ...")
                fig = phase(urls, samples, slots, watch, f"{name}{round_}", pids, model)
                say(f"{name} #{round_ + 1}: {fig['completions_per_s']:.1f} completions/s")
                runs[name].append(fig)
    figures: Figures = {}
    for name, figs in runs.items():
        best = max(figs, key=lambda f: f["completions_per_s"])
        figures.update({f"{name}.{k}": v for k, v in best.items()})
    figures["ratio"] = figures["stream.completions_per_s"] / figures["plain.completions_per_s"]
    details["phases"] = runs
    return figures, details


def goals(opts: Options) -> list[Goal]:
    return [Goal("ratio", ">=", 0.95, "streamed completions/s over plain (the same direct client)")]


BENCHMARK = Benchmark("stream", __doc__.splitlines()[0], run, goals)
