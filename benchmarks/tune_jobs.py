"""What ``benchmarks tune`` measures on a server: the sweep of fixed targets with a direct client,
one job through the whole pipeline, and the tuner's moves read from the worker's log."""

from __future__ import annotations

import json
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
    check,
    count_outputs,
    enqueue_args,
    last_json,
    last_output_time,
    say,
    start_worker,
)
from benchmarks.prompts import prompt_line
from benchmarks.tune_servers import Server
from tests.helpers import REPO, Processes, read_records
from workers.sglang_client import parse_metrics

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
    # The simulated curves run at about forty times a GPU's pace, where a worker's streamed
    # requests need more CPU than this machine has (docs/performance.md, Streaming): their jobs
    # measure the tuner, so they go plain. The real engine's jobs stream, as a node's do.
    plain = ("--repetition", "off") if server.restart is None else ()
    start = time.time()
    with Probe(url) as probe:
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "dflash_tasks.enqueue",
                *enqueue_args(inp, out, "--wait", "--json", *plain, *extra, model=server.model),
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
