"""What every benchmark shares: goals, options, the process set-up and a few probes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import requests

from tests.helpers import REPO, Processes, RedisServer, wait_until

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
CACHE_DIR = BENCH_DIR / ".cache"
MODEL = "Qwen/Qwen3-8B"

Figures = dict[str, float]


@dataclass(frozen=True, slots=True)
class Goal:
    """``figures[key] op target``, e.g. ``Goal("ratio", ">=", 0.97, "pipeline / direct client")``."""

    key: str
    op: str  # ">=" or "<="
    target: float
    what: str

    def met(self, figures: Figures) -> bool:
        value = figures.get(self.key)
        if value is None:
            return False
        return value >= self.target if self.op == ">=" else value <= self.target

    def render(self, figures: Figures) -> str:
        value = figures.get(self.key)
        shown = "missing" if value is None else f"{value:.4g}"
        verdict = "met" if self.met(figures) else "MISSED"
        return f"{verdict:6s} {self.what}: {self.key} = {shown} (goal {self.op} {self.target:g})"


@dataclass(slots=True)
class Options:
    quick: bool = False
    keep: bool = False  # keep the work directory (logs, outputs) for inspection
    params: dict[str, str] = field(default_factory=dict)  # --set KEY=VALUE

    def get(self, key: str, default: float) -> float:
        return float(self.params.get(key, default))


@dataclass(frozen=True, slots=True)
class Benchmark:
    name: str
    description: str
    run: Callable[[Options], tuple[Figures, dict[str, Any]]]  # (figures, details)
    goals: Callable[[Options], list[Goal]]


def median_figures(runs: list[Figures]) -> Figures:
    """Per key, the median over the runs that have it."""
    keys = {k for run in runs for k in run}
    return {k: statistics.median([run[k] for run in runs if k in run]) for k in sorted(keys)}


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- processes -------------------------------------------------------------------------------


class BenchRedis(RedisServer):
    """A private redis-server configured like production (AOF on, fsync once a second)."""

    def start(self) -> None:
        super().start()
        self.client().config_set("appendfsync", "everysec")


def bench_env(broker_url: str, queue: str) -> dict[str, str]:
    """Production settings (no test short-cuts), a private Redis and queue, no metrics ports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_")}
    env.update(
        DFLASH_BROKER_URL=broker_url,
        DFLASH_QUEUE=queue,
        DFLASH_REDIS_PREFIX=f"b-{queue}",
        DFLASH_METRICS_PORT="0",
        PYTHONUNBUFFERED="1",
    )
    return env


@contextlib.contextmanager
def workspace(name: str, opts: Options) -> Iterator[Path]:
    """A fresh work directory next to the cache (same disk as a real output), removed afterwards."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=CACHE_DIR))
    try:
        yield path
    finally:
        if opts.keep:
            say(f"kept {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def stack(work: Path) -> Iterator[tuple[BenchRedis, Processes]]:
    """A private Redis and a process manager whose children get :func:`bench_env`."""
    server = BenchRedis(work / "redis")
    queue = f"bench{uuid.uuid4().hex[:6]}"
    procs = Processes(work, server.url, queue)
    procs.env = bench_env(server.url, queue)
    try:
        yield server, procs
    finally:
        procs.kill_all()
        server.stop()


def start_simulator(procs: Processes, name: str, *flags: str) -> tuple[str, int]:
    """``python -m dflash_tasks.sim --port 0 FLAGS``; returns (URL, pid) once it is ready."""
    log = procs.tmp / f"{name}.log"
    proc = procs.spawn(["-m", "dflash_tasks.sim", "--port", "0", *flags], log.name)

    def ready() -> str | None:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("SIM READY "):
                return line.split(" ", 2)[2].strip()
        return None

    return str(wait_until(ready, 30, f"simulator {name}")), proc.pid


def start_simulators(procs: Processes, count: int, *flags: str) -> list[str]:
    return [start_simulator(procs, f"sim{i}", *flags)[0] for i in range(count)]


def check(ok: bool, what: str) -> None:
    """Stop the benchmark when a run did not do what it should (a wrong figure is worse than none)."""
    if not ok:
        raise RuntimeError(what)


def start_worker(procs: Processes, endpoint: str, name: str, *flags: str) -> subprocess.Popen[bytes]:
    """``python -m workers``; returns once it logged that it is ready."""
    log = procs.tmp / f"{name}.log"
    proc = procs.spawn(["-m", "workers", "--endpoint", endpoint, "--name", name, *flags], log.name)
    wait_until(lambda: b" ready" in log.read_bytes() or proc.poll() is not None, 60, f"worker {name}")
    if proc.poll() is not None:
        raise RuntimeError(f"worker {name} exited: {log.read_text(errors='replace')[-2000:]}")
    return proc


def run_module(procs: Processes, module: str, *args: str, timeout: float = 900) -> tuple[float, str, str]:
    """Run ``python -m module args``; returns (wall seconds, stdout, stderr); raises on failure."""
    started = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=procs.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    seconds = time.monotonic() - started
    if res.returncode != 0:
        raise RuntimeError(f"{module} exited {res.returncode}:\n{res.stderr[-3000:]}")
    return seconds, res.stdout, res.stderr


def last_json(stdout: str) -> dict[str, Any]:
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def enqueue_args(inp: Path, out: Path, *extra: str, model: str = MODEL) -> list[str]:
    """A job without preflight; ``model``: the name a real server serves (the simulator's: any)."""
    return ["--input", str(inp), "--output", str(out), "--model", model, "--no-preflight", *extra]


# --- probes ----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # fields 14 and 15 of proc(5)


def sim_stats(url: str) -> dict[str, Any]:
    return dict(requests.get(f"{url}/sim/stats", timeout=10).json())


def reset_sim_stats(urls: list[str]) -> None:
    for url in urls:
        requests.post(f"{url}/sim/stats/reset", timeout=10).raise_for_status()


def redis_used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def last_output_time(out: Path) -> float:
    """The wall-clock time the newest chunk file of ``out/outputs`` was written."""
    return max(
        (e.stat().st_mtime for e in os.scandir(out / "outputs") if e.name.endswith(".jsonl")), default=0
    )


def count_outputs(out: Path) -> int:
    folder = out / "outputs"
    if not folder.exists():
        return 0
    return sum(1 for e in os.scandir(folder) if e.name.endswith(".jsonl") and not e.name.startswith("."))
