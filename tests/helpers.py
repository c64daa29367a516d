"""Process helpers for tests: private Redis servers, simulators and workers as real processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import requests

from dflash_tasks.coord.routing import model_queue

REPO = Path(__file__).resolve().parent.parent

# Short leases and backoffs so fault tests finish in seconds.
FAST_ENV = {
    "DFLASH_LEASE_SECONDS": "3",
    "DFLASH_HEARTBEAT_SECONDS": "0.5",
    "DFLASH_RECONCILE_SECONDS": "1",
    "DFLASH_REPLAN_SECONDS": "5",
    "DFLASH_RETRY_BACKOFF": "0.1",
    "DFLASH_RETRY_BACKOFF_MAX": "1",
    "DFLASH_HEALTH_POLL_SECONDS": "0.5",
    "DFLASH_REQUEST_TIMEOUT": "30",
    "DFLASH_REQUEST_ATTEMPTS": "8",
    "DFLASH_REPAIR_SPACING_SECONDS": "0.2",
    "DFLASH_METRICS_PORT": "0",  # many workers per machine: a test that wants metrics gives a port
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_url(client: redis.Redis) -> str:
    """The URL of the server ``client`` talks to."""
    kw = client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/0"


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class RedisServer:
    """A private redis-server on a free port (AOF on), so tests may flush, kill and restart it."""

    def __init__(self, workdir: Path, appendonly: bool = True) -> None:
        self.port = free_port()
        self.dir = workdir
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes" if self.appendonly else "no",
                "--appendfsync",
                "always",
                "--dir",
                str(self.dir),
                "--maxmemory-policy",
                "noeviction",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._ping, 10, "redis-server to answer")

    def _ping(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)


class Processes:
    """Starts simulators and workers; kills whatever is left at the end of the test."""

    def __init__(self, tmp: Path, broker_url: str, queue: str) -> None:
        self.tmp = tmp
        self.broker_url = broker_url
        self.queue = queue
        self._procs: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            **FAST_ENV,
            "DFLASH_BROKER_URL": broker_url,
            "DFLASH_QUEUE": queue,
            "DFLASH_REDIS_PREFIX": f"t-{queue}",
            "PYTHONUNBUFFERED": "1",
        }

    def model_queue(self, model: str = "Qwen/Qwen3-8B") -> str:
        """The queue of ``model``'s chunks (default: the simulator's model, every test job's)."""
        return model_queue(self.queue, model)

    def spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / log_name, "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._procs.append(proc)
        return proc

    def simulator(self, *flags: str, name: str = "sim") -> str:
        """Start a simulator; returns its URL once it printed its READY line."""
        log_name = f"{name}.log"
        self.spawn(["-m", "dflash_tasks.sim", "--port", "0", *flags], log_name)

        def ready() -> str | None:
            text = (self.tmp / log_name).read_text(errors="replace")
            for line in text.splitlines():
                if line.startswith("SIM READY "):
                    return line.split(" ", 2)[2].strip()
            return None

        return str(wait_until(ready, 20, f"simulator {name}"))

    def worker(self, endpoint: str, name: str, *flags: str) -> subprocess.Popen[bytes]:
        proc = self.spawn(["-m", "workers", "--endpoint", endpoint, "--name", name, *flags], f"{name}.log")
        wait_until(lambda: b" ready." in (self.tmp / f"{name}.log").read_bytes(), 30, f"worker {name} ready")
        return proc

    def run(self, module: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", module, *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def kill_all(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def write_prompts(path: Path, count: int, bad_every: int = 0, long_at: int | None = None) -> int:
    """Write ``count`` lines of mixed formats; every ``bad_every``-th line is malformed. Returns bad lines."""
    bad = 0
    with open(path, "w") as fh:
        for i in range(count):
            if bad_every and i % bad_every == bad_every - 1:
                fh.write(['{"messages": [', '{"prompt": ""}', "[1, 2]", '{"text": "x"}'][bad % 4] + "\n")
                bad += 1
                continue
            text = "x " * 20_000 if i == long_at else f"Question {i}: what is {i} * 7?"
            shape = i % 4
            if shape == 0:
                doc: dict[str, Any] = {"id": f"q{i}", "messages": [{"role": "user", "content": text}]}
            elif shape == 1:
                doc = {
                    "id": i,
                    "conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "old"}],
                }
            elif shape == 2:
                doc = {
                    "conversations": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": text},
                    ]
                }
            else:
                doc = {"prompt": text}
            fh.write(json.dumps(doc) + "\n")
    return bad


def chunk_files(output: Path) -> list[Path]:
    """The chunk files of a local output root (not the repair rounds' files), in chunk order."""
    folder = output / "outputs"
    return sorted(p for p in folder.glob("chunk-*.jsonl") if ".repair-" not in p.name)


def read_records(output: Path) -> list[dict[str, Any]]:
    """The current record of every sample, read as plain JSON: a chunk file's records, each replaced
    by the one of the latest repair round that holds its id (``chunk-N.repair-R.jsonl``)."""
    records: list[dict[str, Any]] = []
    for path in chunk_files(output):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        where = {str(row["id"]): i for i, row in enumerate(rows)}
        stem = path.name[: -len(".jsonl")]
        repairs = sorted(
            path.parent.glob(f"{stem}.repair-*.jsonl"), key=lambda p: int(p.stem.rsplit("-", 1)[1])
        )
        for repair in repairs:
            for line in repair.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    rows[where[str(row["id"])]] = row
        records += rows
    return records


def done_chunk_count(output: Path) -> int:
    return len(chunk_files(output)) if (output / "outputs").exists() else 0


@contextlib.contextmanager
def processes(tmp: Path, broker_url: str, queue: str) -> Iterator[Processes]:
    procs = Processes(tmp, broker_url, queue)
    try:
        yield procs
    finally:
        procs.kill_all()


# --- generation, as the simulators saw it ------------------------------------------------------


def sim_requests(sim: str) -> dict[str, Any]:
    """``GET /sim/requests`` of the simulator at ``sim`` (take it before killing a simulator)."""
    doc: dict[str, Any] = requests.get(f"{sim}/sim/requests", timeout=10).json()
    return doc


@dataclass(frozen=True)
class Generation:
    """Requests the simulators generated for a job's input samples."""

    generated: int  # generations of the input's prompts, in all
    wasted: int  # beyond one per input sample
    ungenerated: int  # input samples never generated (a rejected prompt, or lost work)
    other: int  # generations of prompts not in the input (another job on the same simulator)


def generation(inp: Path, logs: Iterable[dict[str, Any] | str]) -> Generation:
    """Count generation per input sample from simulators' request logs (URLs or taken snapshots).

    A prompt that two samples share may be generated twice without waste.
    """
    from dflash_tasks.core.sample import Sample
    from dflash_tasks.producer.mix import read_input
    from dflash_tasks.sim.requestlog import sample_key

    want = Counter(sample_key(item.messages) for item in read_input(inp) if isinstance(item, Sample))
    got: Counter[str] = Counter()
    for log in logs:
        doc = sim_requests(log) if isinstance(log, str) else log
        assert not doc["truncated"], "the simulator's request log overflowed"
        got.update({key: counts["generated"] for key, counts in doc["per_sample"].items()})
    return Generation(
        generated=sum(n for key, n in got.items() if key in want),
        wasted=sum(max(0, got[key] - n) for key, n in want.items()),
        ungenerated=sum(max(0, n - got[key]) for key, n in want.items()),
        other=sum(n for key, n in got.items() if key not in want),
    )


def sent_bodies(sim: str) -> list[dict[str, Any]]:
    """The newest chat request bodies the simulator received (without their messages)."""
    return list(sim_requests(sim)["recent"])


def recovery_events(folder: Path) -> list[Any]:
    """Every worker recovery event logged in ``folder``'s ``*.log`` files (see workers.recovery.events)."""
    from workers.recovery.events import parse_events

    found: list[Any] = []
    for log in sorted(folder.glob("*.log")):
        found += parse_events(log.read_text(errors="replace"))
    return found


def recovered_by(folder: Path, job_id: str) -> dict[int, set[str]]:
    """chunk -> the mechanisms that re-queued it, from the workers' logs in ``folder``."""
    found: dict[int, set[str]] = {}
    for event in recovery_events(folder):
        if event.job == job_id:
            found.setdefault(event.chunk, set()).add(event.mechanism)
    return found
