"""The servers ``benchmarks tune`` measures: a simulated curve, a real SGLang on a GPU, or the
pinned release's CPU engine, each as a :class:`Server` (where it answers, its cap, what to compare)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from benchmarks.common import MODEL, Options, check, start_simulator
from tests.helpers import Processes, free_port, wait_until
from workers.node.launch import sglang_command

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
    with gpu_sglang(opts, procs, model) if model else cpu_sglang(procs) as server:
        yield server


@contextlib.contextmanager
def gpu_sglang(opts: Options, procs: Processes, model: str) -> Iterator[Server]:
    """SGLang on a GPU with the node launcher's flags, the tuner's ceiling as its caps."""
    port = free_port()
    log = procs.tmp / "sglang.log"
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


@contextlib.contextmanager
def cpu_sglang(procs: Processes) -> Iterator[Server]:
    """The pinned release's CPU engine on the tests' tiny checkpoint, restarted before each job."""
    port = free_port()
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
