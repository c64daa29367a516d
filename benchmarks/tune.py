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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Benchmark,
    Figures,
    Goal,
    Options,
    say,
    stack,
    workspace,
)
from benchmarks.prompts import write_prompts
from benchmarks.tune_jobs import run_job, settled_figures, sweep, wait_idle
from benchmarks.tune_servers import (
    CEILING,
    CPU_SERVER,
    JOB_SECONDS,
    QUICK_JOB_SECONDS,
    WINDOW_SECONDS,
    Server,
    real_sglang,
    simulated,
)
from tests.helpers import Processes

CURVE_NAMES = ("opt48", "opt128", "opt200", "kvbound")


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
    procs.env["DFLASH_LOG_LEVEL"] = "DEBUG"  # the tuner's window lines
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
