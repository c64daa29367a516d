"""Tune: the in-flight tuner against fixed targets, on simulated throughput curves.

For each curve (``opt48``, ``opt128``, ``opt200``, ``kvbound``: :data:`dflash_tasks.sim.batch.CURVES`)
one simulator runs with ``--max-running-requests 256`` (the ceiling) and the curve, then:

1. a **sweep** with a direct client (a thread per slot, no queue, no worker) at fixed concurrencies
   from 16 to 256 reads the server's own ``sglang:gen_throughput`` in steady state, and picks the
   best fixed target;
2. three **jobs** through the whole pipeline (a private Redis, one ``python -m workers``,
   ``enqueue --no-preflight --wait``), the same prompts each time: ``--max-inflight 48`` (the
   seed's), ``--max-inflight <best>`` and ``--max-inflight auto``. A job's tokens/s is the
   simulator's generated tokens over the job's time from launching enqueue to the last chunk stored.

The tuner's decisions are read from the worker's log (``in-flight tuner: A -> B (phase: reason)``).
Per curve it prints fixed 48 vs the tuner vs the best fixed target. Goals, per curve: the tuner
reaches 0.95 of the best fixed target's tokens/s, beats fixed 48 where the best is not 48, never
goes past the ceiling, retracts under 1% of its requests, and stays within ±10% of the target it
settled on. ``--set curves=opt48,kvbound``, ``--set prompts=N``, ``--set time_scale=X``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

from benchmarks.common import (
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
    start_simulator,
    start_worker,
    workspace,
)
from benchmarks.prompts import write_prompts
from tests.helpers import REPO, Processes
from workers.sglang_client import parse_metrics

CURVE_NAMES = ("opt48", "opt128", "opt200", "kvbound")
CEILING = 256
SWEEP = (16, 32, 48, 64, 96, 128, 160, 200, 256)
#: One request alone: 2,300 tokens / (40 tok/s / 0.01) = 0.6 s; 2 to 4 s in a full batch.
TIME_SCALE = 0.01
PROMPTS = 12_000
QUICK_PROMPTS = 6_000
#: The tuner's windows in the benchmark: short, because its requests last seconds, not a minute.
TUNER_ENV = {"DFLASH_TUNE_WINDOW_SECONDS": "2", "DFLASH_TUNE_SAMPLE_SECONDS": "0.25"}

_TUNER_LINE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*in-flight tuner: (?P<old>\d+) -> (?P<new>\d+) "
    r"\((?P<phase>[^:]+): (?P<reason>[^)]+)\)"
)


def sweep(url: str, targets: Sequence[int], seconds: float) -> dict[int, float]:
    """Steady-state tokens/s at each fixed concurrency (the server's gauge, last two thirds)."""
    curve: dict[int, float] = {}
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
                    "messages": [{"role": "user", "content": f"sweep {tag} {i} {j}"}],
                    "max_completion_tokens": 4096,
                }
                try:
                    session.post(f"{url}/v1/chat/completions", json=body, timeout=120)
                except requests.RequestException:
                    return

        threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(target)]
        for t in threads:
            t.start()
        time.sleep(seconds / 3)
        samples = []
        until = time.monotonic() + seconds * 2 / 3
        while time.monotonic() < until:
            samples.append(parse_metrics(requests.get(f"{url}/metrics", timeout=10).text).gen_throughput)
            time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        curve[target] = sum(samples) / len(samples)
        say(f"  sweep {target:3d} in flight: {curve[target]:,.0f} tok/s")
        wait_idle(url)
    return curve


def wait_idle(url: str, timeout: float = 60) -> None:
    until = time.monotonic() + timeout
    while time.monotonic() < until and sim_stats(url)["running"] + sim_stats(url)["waiting"] > 0:
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


def run_job(procs: Processes, url: str, inp: Path, work: Path, name: str, inflight: str) -> dict[str, Any]:
    """One job through a fresh worker at ``--max-inflight inflight``; tokens/s and the tuner's moves."""
    worker = start_worker(procs, url, name, "--max-inflight", inflight, "--inflight-ceiling", str(CEILING))
    out = work / f"out-{name}"
    reset_sim_stats([url])
    start = time.time()
    res = subprocess.run(
        [sys.executable, "-m", "dflash_tasks.enqueue", *enqueue_args(inp, out, "--wait", "--json")],
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
    stats = sim_stats(url)
    worker.terminate()
    worker.wait(timeout=60)
    wait_idle(url)
    moves = tuner_timeline(procs.tmp / f"{name}.log", start)
    return {
        "seconds": end - start,
        "tokens_per_s": stats["generation_tokens"] / (end - start),
        "completed": stats["completed"],
        "peak_running": stats["peak_running"],
        "retractions": stats["retractions"],
        "moves": moves,
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


def run_curve(opts: Options, name: str, work: Path, procs: Processes, inp: Path) -> tuple[Figures, Any]:
    scale = opts.get("time_scale", TIME_SCALE)
    flags = ("--curve", name, "--max-running-requests", str(CEILING), "--time-scale", str(scale))
    url, _ = start_simulator(procs, f"sim-{name}", *flags)
    say(f"{name}: sweep of fixed concurrencies ...")
    curve = sweep(url, SWEEP, 4.0 if opts.quick else 6.0)
    best = max(curve, key=lambda t: curve[t])
    jobs = {}
    for label, inflight in (("fixed48", "48"), ("best", str(best)), ("tuned", "auto")):
        say(f"{name}: job with --max-inflight {inflight} ...")
        jobs[label] = run_job(procs, url, inp, work, f"{name}-{label}", inflight)
        say(f"{name}: {label}: {jobs[label]['tokens_per_s']:,.0f} tok/s in {jobs[label]['seconds']:.1f}s")
    tuned = jobs["tuned"]
    fig: Figures = {
        f"{name}.best_fixed_target": float(best),
        f"{name}.fixed48_tok_s": jobs["fixed48"]["tokens_per_s"],
        f"{name}.best_tok_s": jobs["best"]["tokens_per_s"],
        f"{name}.tuned_tok_s": tuned["tokens_per_s"],
        f"{name}.tuned_over_best": tuned["tokens_per_s"] / jobs["best"]["tokens_per_s"],
        f"{name}.tuned_over_fixed48": tuned["tokens_per_s"] / jobs["fixed48"]["tokens_per_s"],
        f"{name}.tuned_peak_running": float(tuned["peak_running"]),
        f"{name}.tuned_retraction_share": tuned["retractions"] / max(1, tuned["completed"]),
    }
    for key, value in settled_figures(tuned["moves"], 48).items():
        fig[f"{name}.tuned_{key}"] = value
    return fig, {"sweep": curve, "jobs": jobs}


def curves(opts: Options) -> list[str]:
    names = [n for n in opts.params.get("curves", ",".join(CURVE_NAMES)).split(",") if n]
    return names


def run(opts: Options) -> tuple[Figures, dict[str, Any]]:
    prompts = int(opts.get("prompts", QUICK_PROMPTS if opts.quick else PROMPTS))
    figures: Figures = {}
    details: dict[str, Any] = {"prompts": prompts, "ceiling": CEILING, "curves": {}}
    with workspace("tune", opts) as work, stack(work) as (_, procs):
        procs.env.update(TUNER_ENV)
        inp = write_prompts(work / "prompts.jsonl", prompts)
        for name in curves(opts):
            fig, det = run_curve(opts, name, work, procs, inp)
            figures.update(fig)
            details["curves"][name] = det
    print(table(figures, curves(opts)))
    return figures, details


def table(fig: Figures, names: Sequence[str]) -> str:
    rows = [
        "| curve | fixed 48 | tuner | best fixed (target) | tuner / best | tuner / 48 | settled on |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in names:
        rows.append(
            f"| {n} | {fig[f'{n}.fixed48_tok_s']:,.0f} | {fig[f'{n}.tuned_tok_s']:,.0f} | "
            f"{fig[f'{n}.best_tok_s']:,.0f} ({fig[f'{n}.best_fixed_target']:.0f}) | "
            f"{fig[f'{n}.tuned_over_best']:.3f} | {fig[f'{n}.tuned_over_fixed48']:.2f} | "
            f"{fig.get(f'{n}.tuned_settled_target', 0):.0f} |"
        )
    return "\n".join(rows)


def goals(opts: Options) -> list[Goal]:
    out = []
    for n in curves(opts):
        out += [
            Goal(f"{n}.tuned_over_best", ">=", 0.95, f"{n}: tuner over the best fixed target"),
            Goal(f"{n}.tuned_peak_running", "<=", CEILING, f"{n}: never past the ceiling"),
            Goal(f"{n}.tuned_retraction_share", "<=", 0.01, f"{n}: retractions per request"),
            Goal(f"{n}.tuned_settled", ">=", 1, f"{n}: the tuner settled"),
            Goal(f"{n}.tuned_drift_after_settled", "<=", 0.10, f"{n}: within 10% once settled"),
        ]
        if n != "opt48":
            out.append(Goal(f"{n}.tuned_over_fixed48", ">=", 1.05, f"{n}: tuner beats a fixed 48"))
    return out


BENCHMARK = Benchmark("tune", __doc__.splitlines()[0], run, goals)
