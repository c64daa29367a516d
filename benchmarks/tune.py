"""Tune: the in-flight tuner against fixed targets, on simulated throughput curves.

For each curve (``opt48``, ``opt128``, ``opt200``, ``kvbound``: :data:`dflash_tasks.sim.batch.CURVES`)
one simulator runs with ``--max-running-requests 256`` (the ceiling) and the curve, then:

1. a **sweep** with a direct client (a thread per slot, no queue, no worker) at fixed concurrencies
   from 16 to 256 reads the server's own ``sglang:gen_throughput`` in steady state, and picks the
   best fixed target;
2. three **jobs** through the whole pipeline (a private Redis, one ``python -m workers``,
   ``enqueue --no-preflight --wait``), the same prompts each time: ``--max-inflight 48`` (the
   seed's), ``--max-inflight <best>`` and ``--max-inflight auto``. A job's tokens/s is the
   server's generated tokens over the job's time from launching enqueue to the last chunk stored.
   The real CPU engine (``--set curves=sglang``) is started afresh before each job (it slows as it
   ages), and runs the best fixed target's and the tuner's jobs three times, alternating, their
   means compared: identical jobs there differ by up to 8% (16% on a slower machine).

The tuner's decisions are read from the worker's log (``in-flight tuner: A -> B (phase: reason)``).
Per curve it prints fixed 48 vs the tuner vs the best fixed target. Goals, per curve: the tuner
reaches 0.95 of the best fixed target's tokens/s, beats fixed 48 where the best is not 48, never
goes past the ceiling, retracts under 1% of its requests, and stays within ±10% of the target it
settled on. ``--set curves=opt48,kvbound``, ``--set prompts=N``, ``--set time_scale=X``;
``--set best=N`` compares with a fixed N instead of the sweep's pick (a short sweep can miss the
pipeline's best), ``--set repeats=N`` runs N alternating pairs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

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
    say,
    stack,
    start_simulator,
    start_worker,
    workspace,
)
from benchmarks.prompts import prompt_line, write_prompts
from tests.helpers import REPO, Processes, free_port, read_records, wait_until
from workers.node.launch import sglang_command
from workers.sglang_client import parse_metrics

CURVE_NAMES = ("opt48", "opt128", "opt200", "kvbound")
CEILING = 256
#: The CPU engine on the tests' tiny checkpoint (35-token answers): its ceiling, sweep and job size.
CPU_CEILING = 128
#: The real CPU engine: measured mode against mode (fixed 48, fixed 16, auto), not by a sweep.
CPU_SERVER = "sglang-cpu"
CPU_SWEEP = (1, 4, 8, 16, 32, 64, 128)
#: About 100 prompt tokens of the tiny tokenizer (one sentence).
CPU_PROMPT_BYTES = 96
SWEEP = (16, 32, 48, 64, 96, 128, 160, 200, 256)
#: One request alone: 2,300 tokens / (40 tok/s / 0.01) = 0.6 s; 2 to 4 s in a full batch.
TIME_SCALE = 0.01
#: A simulated job lasts about this long at the best fixed target (s); the tuner's climb is a part
#: of it (elsewhere scaled with the tuner's window: :func:`job_seconds`).
JOB_SECONDS = 150.0
QUICK_JOB_SECONDS = 60.0
#: The tuner's windows in the benchmark: short, because its requests last seconds, not a minute.
WINDOW_SECONDS, SAMPLE_SECONDS = 2.0, 0.25
#: The CPU engine's windows: SGLang refreshes ``sglang:gen_throughput`` once per 40 decode steps
#: (``--decode-log-interval``), every second or two there; a 2 s window saw one or two values, the
#: first often still the previous target's, and the climb stopped on that noise (0.86 of the best).
CPU_WINDOW_SECONDS = 6.0
#: And its samples: every read of ``/metrics`` costs the CPU-bound server (its tokenizer process
#: gathers the scheduler's metric files). Measured on one 12,000-prompt job each: sampling every
#: 0.25 s, 3,025 tok/s; every 1 s, 3,416; a fixed 128 (where both settled), 3,422.
CPU_SAMPLE_SECONDS = 1.0

_TUNER_LINE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*in-flight tuner: (?P<old>\d+) -> (?P<new>\d+) "
    r"\((?P<phase>[^:]+): (?P<reason>[^)]+)\)"
)


def sweep(
    url: str,
    targets: Sequence[int],
    seconds: float,
    max_tokens: int,
    prompt_bytes: int,
    read_every: float = 0.2,
) -> tuple[dict[int, float], float]:
    """Steady-state tokens/s at each fixed concurrency (the server's gauge, read every
    ``read_every`` s over the last two thirds), and the mean completion tokens of a request (each
    asks for at most ``max_tokens``, with a prompt of about ``prompt_bytes``, as the jobs' prompts:
    prefill is part of the curve)."""
    filler = json.loads(prompt_line(0, prompt_bytes))["messages"][0]["content"]
    curve: dict[int, float] = {}
    answered = [0, 0]  # requests, completion tokens
    for target in targets:
        stop = threading.Event()
        tag = uuid.uuid4().hex[:6]

        def load(i: int, tag: str = tag, stop: threading.Event = stop) -> None:
            session = requests.Session()
            j = 0
            while not stop.is_set():
                j += 1
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": f"sweep {tag} {i} {j} {filler}"}],
                    "max_completion_tokens": max_tokens,
                }
                try:
                    resp = session.post(f"{url}/v1/chat/completions", json=body, timeout=120)
                    tokens = int(resp.json()["usage"]["completion_tokens"])
                except (requests.RequestException, ValueError, KeyError, TypeError):
                    return
                answered[0] += 1
                answered[1] += tokens

        threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(target)]
        for t in threads:
            t.start()
        time.sleep(seconds / 3)
        samples = []
        until = time.monotonic() + seconds * 2 / 3
        while time.monotonic() < until:
            samples.append(parse_metrics(requests.get(f"{url}/metrics", timeout=10).text).gen_throughput)
            time.sleep(read_every)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        curve[target] = sum(samples) / len(samples)
        say(f"  sweep {target:3d} in flight: {curve[target]:,.0f} tok/s")
        wait_idle(url)
    return curve, answered[1] / max(1, answered[0])


def wait_idle(url: str, timeout: float = 60) -> None:
    """Until the server runs and queues nothing (its own gauges: the simulator and SGLang alike)."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        load = parse_metrics(requests.get(f"{url}/metrics", timeout=10).text)
        if load.running + load.queued == 0:
            return
        time.sleep(0.2)


def tuner_timeline(log: Path, start: float) -> list[dict[str, Any]]:
    """The tuner's moves from a worker log: seconds since ``start``, old, new, phase, reason."""
    moves = []
    for text in log.read_text(errors="replace").splitlines():
        m = _TUNER_LINE.match(text)
        if m:
            at = datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            moves.append(
                {
                    "t": round(at - start, 1),
                    "old": int(m["old"]),
                    "new": int(m["new"]),
                    "phase": m["phase"],
                    "reason": m["reason"],
                }
            )
    return moves


class Probe:
    """The server's own counters during a job: generated tokens, and its peak of running requests."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def load(self) -> Any:
        return parse_metrics(requests.get(f"{self.url}/metrics", timeout=10).text)

    def __enter__(self) -> Probe:
        self.tokens0 = self.load().generation_tokens
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.tokens = self.load().generation_tokens - self.tokens0

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self.load().running)


def run_job(
    procs: Processes, server: Server, inp: Path, work: Path, name: str, inflight: str, *extra: str
) -> dict[str, Any]:
    """One job through a fresh worker at ``--max-inflight inflight``; tokens/s and the tuner's moves."""
    url = server.url
    worker = start_worker(
        procs, url, name, "--max-inflight", inflight, "--inflight-ceiling", str(server.ceiling)
    )
    out = work / f"out-{name}"
    start = time.time()
    with Probe(url) as probe:
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "dflash_tasks.enqueue",
                *enqueue_args(inp, out, "--wait", "--json", *extra, model=server.model),
            ],
            cwd=REPO,
            env=procs.env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
    if res.returncode != 0:
        raise RuntimeError(f"enqueue failed ({res.returncode}): {res.stderr[-2000:]}")
    summary = last_json(res.stdout)
    check(count_outputs(out) == summary["chunks"], f"{count_outputs(out)} of {summary['chunks']} stored")
    end = last_output_time(out)
    worker.terminate()
    worker.wait(timeout=60)
    records = read_records(out)
    retractions = sum(
        (turn.get("meta_info") or {}).get("num_retractions") or 0
        for r in records
        for turn in r.get("turns", [])
    )
    return {
        "seconds": end - start,
        "tokens_per_s": probe.tokens / (end - start),
        "completed": len(records),
        "peak_running": probe.peak,
        "retractions": retractions,
        "moves": tuner_timeline(procs.tmp / f"{name}.log", start),
    }


def settled_figures(moves: list[dict[str, Any]], start: int) -> dict[str, float]:
    """The target it first settled on, the widest move after that (as a share), and its highest."""
    targets = [start] + [m["new"] for m in moves]
    first = next((i for i, m in enumerate(moves) if m["phase"] == "settled"), None)
    fig = {"max_target": float(max(targets))}
    if first is None:
        return {**fig, "settled": 0.0}
    settled = moves[first]["new"]
    later = [m["new"] for m in moves[first:]]
    fig.update(
        settled=1.0,
        settled_target=float(settled),
        settled_at_s=float(moves[first]["t"]),
        drift_after_settled=max(abs(t - settled) / settled for t in later),
        final_target=float(later[-1]),
    )
    return fig


@dataclass(frozen=True)
class Server:
    """A server under test: where it answers, its running-request cap, and what to compare with."""

    name: str
    url: str
    ceiling: int
    baseline: int  # the fixed target the tuner must beat (48: the seed's; 16 on the CPU engine)
    sweep: tuple[int, ...]
    #: Each request's budget in the sweep and the jobs (the CPU engine's context is 2,048 tokens);
    #: None: 4,096 in the sweep and the job's default (the simulated curves, as first measured).
    max_tokens: int | None = None
    sweep_seconds: float = 6.0
    #: With ``--quick``: None, two thirds of ``sweep_seconds``.
    quick_sweep_seconds: float | None = None
    #: The tuner's ``DFLASH_TUNE_WINDOW_SECONDS`` in the jobs.
    window_seconds: float = WINDOW_SECONDS
    sample_seconds: float = SAMPLE_SECONDS
    #: Each prompt's size (JSONL bytes), in the jobs' input and the sweep. On the CPU engine prefill
    #: is slow: 1 KB prompts (~820 tokens of the tiny tokenizer) before a 35-token answer would
    #: measure prefill, not the decode batch that a distillation job's long answers are bound by.
    prompt_bytes: int = 1024
    #: What jobs name as their model: a real server's served name ends in it (the simulator: any).
    model: str = MODEL
    #: Starts the server afresh (same address) before each job, where it slows as it ages. The CPU
    #: engine does: five jobs of 3,000 requests at 48 in flight on one server gave 4,414, 4,141,
    #: 3,998, 3,799 and 3,716 tok/s while its scheduler grew from 1.6 to 2.8 GB, so the tuner's job,
    #: the last of three, was measured on a slower server than the fixed targets' jobs.
    restart: Callable[[], None] | None = None
    #: Jobs at the best fixed target and with the tuner, alternating (best, tuned, best, ...): their
    #: means are compared. Three on the CPU engine, where identical jobs differ by 8 to 16%.
    repeats: int = 1


def job_seconds(server: Server, quick: bool) -> float:
    """How long a job lasts at the best fixed target: as many of the server's tuner windows as a
    simulated job (2 s windows), so the climb is the same share of every server's job. The CPU
    engine's windows are 6 s: its jobs last 450 s (a ``--quick`` one 180 s). At 150 s its climb
    (48 s, six windows) was a third of the job, three times its share of a simulated one, and the
    job ran at 0.944 of the best fixed target; a one-minute job there was half climb (0.890). A
    real job lasts hours: its climb is a rounding error."""
    base = QUICK_JOB_SECONDS if quick else JOB_SECONDS
    return base * max(1.0, server.window_seconds / WINDOW_SECONDS)


#: The real engine's modes, each job on a fresh server: the seed's 48, the CPU engine's best 16,
#: the tuner. Each run rotates their order (so none is always first on a cold machine).
MODES = (("fixed48", "48"), ("fixed16", "16"), ("auto", "auto"))
#: Prompts per real-engine job (``--set prompts=N``): about 45 s at a fixed 48 there.
MODE_PROMPTS = 2000


def measure_modes(opts: Options, server: Server, work: Path, procs: Processes) -> tuple[Figures, Any]:
    """Runs of each mode on a fresh server, their order rotated per run: per-run figures, the
    spread, and the tuner over the better fixed target in each run (and in its worst run)."""
    name, count = server.name, int(opts.get("prompts", MODE_PROMPTS))
    inp = write_prompts(work / f"prompts-{name}.jsonl", count, size=server.prompt_bytes)
    budget = () if server.max_tokens is None else ("--max-tokens", str(server.max_tokens))
    procs.env["DFLASH_TUNE_WINDOW_SECONDS"] = str(server.window_seconds)
    procs.env["DFLASH_TUNE_SAMPLE_SECONDS"] = str(server.sample_seconds)
    procs.env["DFLASH_LOG_LEVEL"] = "DEBUG"  # the tuner's window lines
    runs: list[dict[str, dict[str, Any]]] = []
    for i in range(int(opts.get("repeats", server.repeats))):
        run: dict[str, dict[str, Any]] = {}
        for label, inflight in MODES[i % 3 :] + MODES[: i % 3]:
            assert server.restart is not None
            server.restart()
            say(f"{name}: run {i + 1}: job with --max-inflight {inflight} ...")
            job = run_job(procs, server, inp, work, f"{name}-{label}-{i + 1}", inflight, *budget)
            job["windows"] = tuner_lines(procs.tmp / f"{name}-{label}-{i + 1}.log")
            run[label] = job
            say(f"{name}: run {i + 1}: {label}: {job['tokens_per_s']:,.0f} tok/s in {job['seconds']:.1f}s")
            wait_idle(server.url)
        say(f"{name}: run {i + 1}: auto / max(fixed 48, fixed 16) = {auto_over_fixed(run):.3f}")
        runs.append(run)
    fig: Figures = {f"{name}.prompts": float(count)}
    ratios = []
    for i, run in enumerate(runs, 1):
        for label, job in run.items():
            fig[f"{name}.run{i}.{label}_tok_s"] = job["tokens_per_s"]
        ratios.append(auto_over_fixed(run))
        fig[f"{name}.run{i}.auto_over_better_fixed"] = ratios[-1]
    for label, _ in MODES:
        rates = [run[label]["tokens_per_s"] for run in runs]
        fig[f"{name}.{label}_spread"] = (max(rates) - min(rates)) / (sum(rates) / len(rates))
    fig[f"{name}.worst_auto_over_better_fixed"] = min(ratios)
    return fig, {"prompts": count, "runs": runs}


def auto_over_fixed(run: dict[str, dict[str, Any]]) -> float:
    """The tuner's tokens/s over the better of the fixed targets' in one run."""
    best = max(run["fixed48"]["tokens_per_s"], run["fixed16"]["tokens_per_s"])
    return float(run["auto"]["tokens_per_s"]) / float(best)


def tuner_lines(log: Path) -> list[str]:
    """The tuner's window and decision lines from a worker's log."""
    if not log.exists():
        return []
    return [line for line in log.read_text(errors="replace").splitlines() if "in-flight tuner" in line]


def modes_table(fig: Figures, name: str, runs: int) -> str:
    rows = [
        "| run | fixed 48 | fixed 16 | auto | auto / max(fixed) |",
        "|---|---|---|---|---|",
    ]
    for i in range(1, runs + 1):
        run = f"{name}.run{i}"
        rows.append(
            f"| {i} | {fig[f'{run}.fixed48_tok_s']:,.0f} | {fig[f'{run}.fixed16_tok_s']:,.0f} | "
            f"{fig[f'{run}.auto_tok_s']:,.0f} | {fig[f'{run}.auto_over_better_fixed']:.3f} |"
        )
    rows.append(
        f"| spread | {fig[f'{name}.fixed48_spread']:.1%} | {fig[f'{name}.fixed16_spread']:.1%} | "
        f"{fig[f'{name}.auto_spread']:.1%} | worst {fig[f'{name}.worst_auto_over_better_fixed']:.3f} |"
    )
    return "\n".join(rows)


def measure(opts: Options, server: Server, work: Path, procs: Processes) -> tuple[Figures, Any]:
    """Sweep, then fixed baseline, best fixed and tuned jobs on one server; its figures."""
    name = server.name
    say(f"{name}: sweep of fixed concurrencies ...")
    seconds = server.sweep_seconds
    if opts.quick:
        seconds = server.quick_sweep_seconds or seconds * 2 / 3
    curve, mean_tokens = sweep(
        server.url,
        server.sweep,
        seconds,
        server.max_tokens or 4096,
        server.prompt_bytes,
        server.sample_seconds,  # its reads cost a CPU-bound server, as the tuner's do
    )
    budget = () if server.max_tokens is None else ("--max-tokens", str(server.max_tokens))
    swept_best = max(curve, key=lambda t: curve[t])
    best = int(opts.get("best", swept_best))  # --set best=N: compare with a target you name
    # as many prompts as the best target serves in a job
    default = curve.get(best, curve[swept_best]) * job_seconds(server, opts.quick) / max(1.0, mean_tokens)
    count = int(opts.get("prompts", round(default, -2)))
    inp = write_prompts(work / f"prompts-{name}.jsonl", count, size=server.prompt_bytes)
    say(f"{name}: best fixed target {best}; {count:,} prompts of {mean_tokens:,.0f} tokens on average")
    jobs: dict[str, list[dict[str, Any]]] = {"fixed": [], "best": [], "tuned": []}
    procs.env["DFLASH_TUNE_WINDOW_SECONDS"] = str(server.window_seconds)
    procs.env["DFLASH_TUNE_SAMPLE_SECONDS"] = str(server.sample_seconds)
    repeats = int(opts.get("repeats", server.repeats))
    order = [("fixed", str(server.baseline))] + [("best", str(best)), ("tuned", "auto")] * repeats
    for label, inflight in order:
        if server.restart is not None:
            say(f"{name}: restarting the server (each job on a fresh one) ...")
            server.restart()
        say(f"{name}: job with --max-inflight {inflight} ...")
        job = run_job(procs, server, inp, work, f"{name}-{label}-{len(jobs[label]) + 1}", inflight, *budget)
        jobs[label].append(job)
        say(f"{name}: {label}: {job['tokens_per_s']:,.0f} tok/s in {job['seconds']:.1f}s")
        wait_idle(server.url)
    rate = {label: sum(j["tokens_per_s"] for j in runs) / len(runs) for label, runs in jobs.items()}
    tuned = jobs["tuned"]
    fig: Figures = {
        f"{name}.best_fixed_target": float(best),
        f"{name}.baseline_target": float(server.baseline),
        f"{name}.fixed_tok_s": rate["fixed"],
        f"{name}.best_tok_s": rate["best"],
        f"{name}.tuned_tok_s": rate["tuned"],
        f"{name}.tuned_over_best": rate["tuned"] / rate["best"],
        f"{name}.tuned_over_fixed": rate["tuned"] / rate["fixed"],
        f"{name}.tuned_peak_running": max(float(j["peak_running"]) for j in tuned),
        f"{name}.ceiling": float(server.ceiling),
        f"{name}.tuned_retraction_share": sum(j["retractions"] for j in tuned)
        / max(1, sum(j["completed"] for j in tuned)),
    }
    for key, value in tuned_figures([j["moves"] for j in tuned]).items():
        fig[f"{name}.tuned_{key}"] = value
    return fig, {"sweep": curve, "prompts": count, "mean_tokens": mean_tokens, "jobs": jobs}


def tuned_figures(runs: list[list[dict[str, Any]]]) -> dict[str, float]:
    """:func:`settled_figures` over the tuner's jobs: the first job's targets, the worst of the rest
    (settled only when every job did; the widest drift; the highest target)."""
    each = [settled_figures(moves, 48) for moves in runs]
    fig = dict(each[0])
    fig["settled"] = min(f["settled"] for f in each)
    fig["max_target"] = max(f["max_target"] for f in each)
    if all("drift_after_settled" in f for f in each):
        fig["drift_after_settled"] = max(f["drift_after_settled"] for f in each)
    return fig


@contextlib.contextmanager
def simulated(opts: Options, name: str, procs: Processes) -> Iterator[Server]:
    scale = opts.get("time_scale", TIME_SCALE)
    flags = ("--curve", name, "--max-running-requests", str(CEILING), "--time-scale", str(scale))
    url, pid = start_simulator(procs, f"sim-{name}", *flags)
    try:
        yield Server(name, url, CEILING, 48, SWEEP)
    finally:
        os.kill(pid, signal.SIGTERM)


@contextlib.contextmanager
def real_sglang(opts: Options, procs: Processes) -> Iterator[Server]:
    """A real SGLang server: ``--set model=PATH`` on a GPU (``--set sglang_python=...``,
    ``--set sglang_args='...'``), else the pinned release's CPU engine on the tests' tiny checkpoint."""
    model = opts.params.get("model", "")
    port = free_port()
    log = procs.tmp / "sglang.log"
    if model:  # a GPU: the node launcher's flags, the tuner's ceiling as the caps
        python = opts.params.get("sglang_python", sys.executable)
        cmd = sglang_command(python, model, port, CEILING, shlex.split(opts.params.get("sglang_args", "")))
        proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)  # noqa: SIM115
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _healthy(url) or proc.poll() is not None, 1800, "SGLang to start")
        check(proc.poll() is None, f"SGLang exited: {log.read_text(errors='replace')[-3000:]}")
        try:
            budget = int(opts.params.get("max_tokens", "4096"))
            yield Server("sglang-gpu", url, CEILING, 48, SWEEP, budget, model=Path(model).name)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
        return
    from tests.real_sglang.checkpoint import ensure_checkpoint
    from tests.real_sglang.env import cache_root, ensure_env
    from tests.real_sglang.server import RealServer, start_ready

    env_python = ensure_env()
    checkpoint = ensure_checkpoint(cache_root(), env_python)
    ceiling = CPU_CEILING
    starts = 0

    def start() -> RealServer:
        nonlocal starts
        starts += 1
        log = procs.tmp / f"sglang-{starts}.log"
        cap = ("--max-running-requests", str(ceiling))
        started, _ = start_ready(env_python, checkpoint, port, log, RealServer.wait_ready, extra=cap)
        return started

    server = start()

    def restart() -> None:
        nonlocal server
        server.stop()
        server.check_no_standin_calls()
        server = start()

    try:
        # 35-token answers: the gauge's decode-log windows are few at 1 in flight, so sweep longer
        yield Server(
            CPU_SERVER,
            server.url,
            ceiling,
            16,
            CPU_SWEEP,
            256,
            sweep_seconds=9.0,
            # a shorter sweep saw too few gauge refreshes: one --quick run put the best at 16
            # (3,396 tok/s; 64: 3,090; 128: 2,723), where full sweeps rise to 128
            quick_sweep_seconds=9.0,
            window_seconds=CPU_WINDOW_SECONDS,
            sample_seconds=CPU_SAMPLE_SECONDS,
            prompt_bytes=CPU_PROMPT_BYTES,
            model=checkpoint.name,
            restart=restart,
            repeats=3,  # identical jobs differ by up to 16% there: one pair decides little
        )
    finally:
        server.stop()
        server.check_no_standin_calls()


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health_generate", timeout=30).status_code == 200
    except requests.RequestException:
        return False


def curves(opts: Options) -> list[str]:
    names = [n for n in opts.params.get("curves", ",".join(CURVE_NAMES)).split(",") if n]
    return names


def run(opts: Options) -> tuple[Figures, dict[str, Any]]:
    figures: Figures = {}
    details: dict[str, Any] = {"ceiling": CEILING, "servers": {}}
    with workspace("tune", opts) as work, stack(work) as (_, procs):
        for name in curves(opts):
            server_cm = real_sglang(opts, procs) if name == "sglang" else simulated(opts, name, procs)
            with server_cm as server:
                if server.name == CPU_SERVER:
                    fig, det = measure_modes(opts, server, work, procs)
                    print(modes_table(fig, server.name, len(det["runs"])))
                else:
                    fig, det = measure(opts, server, work, procs)
            figures.update(fig)
            details["servers"][server.name] = det
    names = [n for n in details["servers"] if n != CPU_SERVER]
    if names:
        print(table(figures, names))
    return figures, details


def table(fig: Figures, names: Sequence[str]) -> str:
    rows = [
        "| server | fixed (target) | tuner | best fixed (target) | tuner / best | tuner / fixed | settled |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in names:
        rows.append(
            f"| {n} | {fig[f'{n}.fixed_tok_s']:,.0f} ({fig[f'{n}.baseline_target']:.0f}) | "
            f"{fig[f'{n}.tuned_tok_s']:,.0f} | "
            f"{fig[f'{n}.best_tok_s']:,.0f} ({fig[f'{n}.best_fixed_target']:.0f}) | "
            f"{fig[f'{n}.tuned_over_best']:.3f} | {fig[f'{n}.tuned_over_fixed']:.2f} | "
            f"{fig.get(f'{n}.tuned_settled_target', 0):.0f} |"
        )
    return "\n".join(rows)


def goals(opts: Options) -> list[Goal]:
    out = []
    for c in curves(opts):
        n = c if c != "sglang" else ("sglang-gpu" if opts.params.get("model") else CPU_SERVER)
        if n == CPU_SERVER:  # each run, not only on average: the worst run decides
            worst = f"{n}.worst_auto_over_better_fixed"
            out.append(Goal(worst, ">=", 0.95, f"{n}: auto / the better fixed target, worst run"))
            continue
        # A --quick job lasts a minute (simulated), of which the climb takes a third: the goal is 0.90
        # (a smoke test); the full run's jobs last 150 s at the best target, as the 0.95 asks.
        ratio = 0.90 if opts.quick else 0.95
        out += [
            Goal(f"{n}.tuned_over_best", ">=", ratio, f"{n}: tuner over the best fixed target"),
            Goal(f"{n}.tuned_peak_running", "<=", CEILING, f"{n}: never past the ceiling"),
            Goal(f"{n}.tuned_retraction_share", "<=", 0.01, f"{n}: retractions per request"),
            Goal(f"{n}.tuned_settled", ">=", 1, f"{n}: the tuner settled"),
            Goal(f"{n}.tuned_drift_after_settled", "<=", 0.10, f"{n}: within 10% once settled"),
        ]
        if n != "opt48":  # elsewhere the best target is not the baseline's
            out.append(Goal(f"{n}.tuned_over_fixed", ">=", 1.05, f"{n}: tuner beats the fixed baseline"))
    return out


BENCHMARK = Benchmark("tune", __doc__.splitlines()[0], run, goals)
