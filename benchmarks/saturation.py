"""Saturation: the full pipeline against a direct client, side by side on the same simulated servers.

S simulators (default 4, ``--max-running-requests 48``, the simulator's lognormal output lengths with
mean 2,300 tokens capped by ``max_tokens`` 4096, all with the same seed so a prompt costs the same on
every server, ``--time-scale 0.025``) serve the same prompts (default 2,000 per server) twice:

(a) a direct client: reads the prompts, then one thread per slot, 48 per server, all taking the next
    prompt from one shared list, so every server holds exactly 48 requests for as long as prompts
    remain (the upper bound);
(b) the pipeline: a private redis-server, one ``python -m workers`` per server (defaults: 48 in
    flight, up to 8 chunks of 64), and ``python -m dflash_tasks.enqueue --no-preflight --wait``.

Both phases are timed from their start (for (b): launching enqueue, which stages the input) to the
last completion stored. The simulators' own time-weighted occupancy (``/sim/stats``, reset between
phases) is read twice: when the last prompt has reached a server (the cut: from then on the run can
only drain), and at the end (the whole run, drain included). ``--set time_scale=X``,
``--set prompts_per_server=N``, ``--set servers=S`` change the set-up; ``--quick``: 500 per server.
"""

from __future__ import annotations

import collections
import subprocess
import sys
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
    count_outputs,
    enqueue_args,
    last_json,
    last_output_time,
    reset_sim_stats,
    say,
    sim_stats,
    stack,
    start_simulators,
    start_worker,
    workspace,
)
from benchmarks.prompts import write_prompts
from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.sample import Sample
from dflash_tasks.producer.mix import read_input
from tests.helpers import REPO
from workers.generation import WorkerIdentity, make_record, make_turn
from workers.sglang_client import ChatRequest, SGLangClient

SLOTS = 48
#: A request lasts 2,300 / 40 * 0.025 = 1.4 s on average (57 s unscaled), 2.6 s at most (4,096 tokens).
TIME_SCALE = 0.025
#: 2,000 prompts per server: about 42 request lifetimes per slot, each phase about a minute, so the
#: start (about 0.5 s for enqueue) and the final drain (about 2.5 s, the same for both) stay small.
PROMPTS_PER_SERVER = 2000


class Sampler:
    """Polls every simulator's ``/sim/stats`` (and an optional extra probe) in the background."""

    def __init__(self, urls: list[str], interval: float = 0.25, extra: Any = None) -> None:
        self.urls = urls
        self.interval = interval
        self.extra = extra
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            stats = [sim_stats(url) for url in self.urls]
            sample: dict[str, Any] = {"t": time.time(), "stats": stats}
            if self.extra is not None:
                sample["extra"] = self.extra()
            self.samples.append(sample)

    def cut(self, total: int) -> dict[str, Any] | None:
        """The first sample at which every one of ``total`` requests had reached a server."""
        for sample in self.samples:
            if sum(s["requests_total"] for s in sample["stats"]) >= total:
                return sample
        return None


def direct_client(urls: list[str], inp: Path, out: Path) -> tuple[float, float, int]:
    """Phase (a): read the prompts, then 48 threads per server share them. Returns (start, end, failures)."""
    start = time.time()
    spec = GenerationSpec(model=MODEL)
    todo = collections.deque(s for s in read_input(inp) if isinstance(s, Sample))
    failures = [0]
    out.mkdir(parents=True, exist_ok=True)

    def serve(url: str, index: int, fh: Any, lock: threading.Lock) -> None:
        client = SGLangClient(url, timeout=600)
        who = WorkerIdentity(worker=f"direct{index}", endpoint=url)
        while True:
            try:
                sample = todo.popleft()
            except IndexError:
                return
            started = time.monotonic()
            try:
                completion = client.chat(ChatRequest(spec, sample.messages, f"direct-L{sample.line}"))
            except Exception as exc:
                failures[0] += 1
                turn = make_turn(sample.messages, None, str(exc), time.monotonic() - started, 1)
            else:
                turn = make_turn(sample.messages, completion, None, time.monotonic() - started, 1)
            record = make_record(spec, sample, who, [turn], 1, time.monotonic() - started)
            line = (record.to_json() + "\n").encode()
            with lock:
                fh.write(line)

    files = [open(out / f"server{i}.jsonl", "wb") for i in range(len(urls))]  # noqa: SIM115
    locks = [threading.Lock() for _ in urls]
    threads = [
        threading.Thread(target=serve, args=(url, i, files[i], locks[i]), daemon=True)
        for i, url in enumerate(urls)
        for _ in range(SLOTS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    end = time.time()
    for fh in files:
        fh.close()
    return start, end, failures[0]


def phase_figures(
    prefix: str, urls: list[str], sampler: Sampler, total: int, start: float, end: float
) -> tuple[Figures, dict[str, Any]]:
    final = [sim_stats(url) for url in urls]
    cut = sampler.cut(total)
    fig: Figures = {
        f"{prefix}.seconds": end - start,
        f"{prefix}.completions_per_s": total / (end - start),
        f"{prefix}.completed": float(sum(s["completed"] for s in final)),
    }
    pre = []
    for i, stats in enumerate(final):
        fig[f"{prefix}.server{i}.occupancy"] = stats["occupancy"]
        if cut is not None:
            occupancy = cut["stats"][i]["occupancy"]
            fig[f"{prefix}.server{i}.occupancy_pre_drain"] = occupancy
            pre.append(occupancy)
    whole = [s["occupancy"] for s in final]
    fig[f"{prefix}.occupancy_min"] = min(whole)
    fig[f"{prefix}.occupancy_mean"] = sum(whole) / len(whole)
    if cut is not None:
        fig[f"{prefix}.occupancy_pre_drain_min"] = min(pre)
        fig[f"{prefix}.occupancy_pre_drain_mean"] = sum(pre) / len(pre)
        fig[f"{prefix}.drain_seconds"] = end - cut["t"]
    first = next((s["t"] for s in sampler.samples if any(x["requests_total"] for x in s["stats"])), None)
    if first is not None:
        fig[f"{prefix}.first_request_after_s"] = first - start
    timeline = [
        {
            "t": round(s["t"] - start, 2),
            "running": [x["running"] for x in s["stats"]],
            **({"queued": s["extra"]} if "extra" in s else {}),
        }
        for s in sampler.samples[:: max(1, int(1 / sampler.interval))]
    ]
    return fig, {"timeline": timeline, "final_stats": final}


def run(opts: Options) -> tuple[Figures, dict[str, Any]]:
    servers = int(opts.get("servers", 4))
    scale = opts.get("time_scale", TIME_SCALE)
    per_server = int(opts.get("prompts_per_server", 500 if opts.quick else PROMPTS_PER_SERVER))
    total = servers * per_server
    details: dict[str, Any] = {
        "servers": servers,
        "time_scale": scale,
        "prompts": total,
        "max_running_requests": SLOTS,
        "mean_output_tokens": 2300,
        "max_tokens": 4096,
    }
    with workspace("saturation", opts) as work, stack(work) as (redis_server, procs):
        inp = write_prompts(work / "prompts.jsonl", total)
        flags = ("--time-scale", str(scale), "--max-running-requests", str(SLOTS))
        urls = start_simulators(procs, servers, *flags)

        say(f"(a) direct client: {total:,} prompts, {servers} servers x {SLOTS} in flight ...")
        reset_sim_stats(urls)
        sampler = Sampler(urls).start()
        start, end, failures = direct_client(urls, inp, work / "direct")
        sampler.stop()
        fig_a, det_a = phase_figures("a", urls, sampler, total, start, end)
        fig_a["a.failures"] = failures
        say(f"(a) {fig_a['a.completions_per_s']:.2f} completions/s in {fig_a['a.seconds']:.1f}s")

        say(f"(b) pipeline: {servers} workers, enqueue --wait ...")
        for i, url in enumerate(urls):
            start_worker(procs, url, f"gpu{i}")
        out = work / "out"
        broker = redis_server.client()
        reset_sim_stats(urls)
        sampler = Sampler(urls, extra=lambda: int(broker.llen(procs.model_queue()))).start()
        start = time.time()
        res = subprocess.run(
            [sys.executable, "-m", "dflash_tasks.enqueue", *enqueue_args(inp, out, "--wait", "--json")],
            cwd=REPO,
            env=procs.env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        exited = time.time()
        sampler.stop()
        if res.returncode != 0:
            raise RuntimeError(f"enqueue failed ({res.returncode}): {res.stderr[-2000:]}")
        summary = last_json(res.stdout)
        check(count_outputs(out) == summary["chunks"], f"{count_outputs(out)} of {summary['chunks']} stored")
        end = last_output_time(out)
        fig_b, det_b = phase_figures("b", urls, sampler, total, start, end)
        fig_b["b.enqueue_exit_seconds"] = exited - start
        say(f"(b) {fig_b['b.completions_per_s']:.2f} completions/s in {fig_b['b.seconds']:.1f}s")

    figures = {**fig_a, **fig_b}
    figures["ratio"] = figures["b.completions_per_s"] / figures["a.completions_per_s"]
    details.update(direct=det_a, pipeline=det_b, chunks=summary["chunks"])
    return figures, details


def goals(opts: Options) -> list[Goal]:
    # --quick phases last 15 s: the pipeline's fixed start (enqueue, about 0.5 s) and its tail of
    # at most one chunk per worker weigh four times more there, so the ratio goal is a smoke test.
    ratio = 0.93 if opts.quick else 0.97
    return [
        Goal("ratio", ">=", ratio, "pipeline completions/s over the direct client's"),
        Goal("b.occupancy_pre_drain_min", ">=", 0.95, "every server's occupancy before the final drain"),
    ]


BENCHMARK = Benchmark("saturation", __doc__.splitlines()[0], run, goals)
