"""The history of a run: every fault, and what the store, the counters and the simulators said.

:class:`History` is an append-only list of events (also written, line by line, to
``history.jsonl``, so a crashed run leaves its history behind). :class:`Recorder` samples, about
twice a second:

* the store: each chunk output as it appears, hashed; a later version with other bytes is a
  ``chunk_rewritten`` event;
* the counters, then the store, in that order: Redis's done set and sample counters and
  ``progress.json`` (a count read before a listing must not exceed what the listing shows);
* the simulators' ``GET /sim/stats`` (every 2 s, and just before one is killed), so requests
  served by a simulator that later died still count;
* ``verify --json`` now and then, during the run;
* the recovery of each fault (see :class:`Watch`).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import redis
import requests

from dflash_tasks.coord.keys import Keys
from dflash_tasks.coord.publish import queued_chunks
from dflash_tasks.core.job import Manifest
from tests.chaos.cluster import Node
from tests.chaos.rounds import is_repair_file
from tests.chaos.services import Blob, Output, blob
from tests.helpers import REPO


class RedisHandle(Protocol):
    """Where the recorder gets a Redis client (the run's :class:`~tests.chaos.services.RedisProc`)."""

    def client(self) -> redis.Redis: ...


class History:
    """Timestamped events (seconds since the start of the fault window)."""

    def __init__(self, path: Path) -> None:
        self.t0 = time.monotonic()
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._fh = open(path, "a", buffering=1)  # noqa: SIM115 - closed in close()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def record(self, event_type: str, /, **data: Any) -> dict[str, Any]:
        event = {"t": round(self.now(), 3), "type": event_type, **data}
        with self._lock:
            self.events.append(event)
            self._fh.write(json.dumps(event, default=str) + "\n")
        return event

    def of(self, *kinds: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["type"] in kinds]

    def close(self) -> None:
        self._fh.close()


@dataclass
class Watch:
    """One fault's recovery: its victims' chunks back in circulation, and the job moving again.

    ``victims`` (chunk -> the owner that held it when the fault struck) are back in circulation
    when each is stored, leased by another owner, or waiting in the queue. The job moves again
    when a chunk is first stored after the fault healed (or the job is done).
    """

    index: int
    kind: str
    started: float
    victims: dict[int, str]
    healed: float | None = None
    takeover_at: float | None = None
    resumed_at: float | None = None

    def done(self) -> bool:
        return self.takeover_at is not None and self.resumed_at is not None


@dataclass
class _SimCounter:
    last: dict[str, int] = field(default_factory=dict)
    banked: dict[str, int] = field(default_factory=dict)

    def update(self, stats: dict[str, Any]) -> None:
        for name in ("requests_total", "completed", "faults_injected", "aborted", "bad_requests"):
            value = int(stats.get(name, 0))
            if value < self.last.get(name, 0):  # a new process: bank what the old one served
                self.banked[name] = self.banked.get(name, 0) + self.last[name]
            self.last[name] = value

    def total(self, name: str) -> int:
        return self.banked.get(name, 0) + self.last.get(name, 0)


class Recorder(threading.Thread):
    """Samples the run into the :class:`History` until :meth:`finish`."""

    def __init__(
        self,
        history: History,
        output: Output,
        redis_proc: RedisHandle,
        nodes: dict[str, Node],
        prefix: str,
        queue: str,
        verify_argv: list[str],
        env: dict[str, str],
        verify_every: float,
    ) -> None:
        super().__init__(name="chaos-recorder", daemon=True)
        self.h = history
        self.output = output
        self.redis = redis_proc
        self.nodes = nodes
        self.keys = Keys(prefix)
        self.queue = queue
        self.verify_argv = verify_argv
        self.env = env
        self.verify_every = verify_every
        self.job_id = ""
        self.manifest: Manifest | None = None
        self.first: dict[str, Blob] = {}
        self.tokens: dict[str, str] = {}
        self.latest_store: tuple[int, int, int] = (0, 0, 0)  # chunks, samples, failed records
        self.last_stored_at = 0.0
        self.sims: dict[str, _SimCounter] = {}
        self.watches: list[Watch] = []
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._verify: subprocess.Popen[str] | None = None
        self._next_verify = verify_every
        self._next_sims = 0.0
        self.errors = 0

    # --- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        while not self._halt.wait(0.5):
            try:
                self.sample()
            except Exception as exc:  # a sampling hiccup (Redis restarting) must not end the history
                self.errors += 1
                if self.errors <= 20:
                    self.h.record("recorder_error", error=f"{type(exc).__name__}: {exc}")

    def finish(self) -> None:
        self._halt.set()
        self.join(30)
        with contextlib.suppress(Exception):
            self.sample(final=True)
        if self._verify is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._collect_verify(self._verify.wait(120))

    def sample(self, final: bool = False) -> None:
        if not self._know_job():
            return
        self.sample_counters_then_store()
        self.check_watches()
        now = self.h.now()
        if now >= self._next_sims or final:
            self._next_sims = now + 2.0
            for node in list(self.nodes.values()):
                for gpu in node.spec.gpus:
                    self.poll_sim(node, gpu)
        self._poll_verify(now)

    def _know_job(self) -> bool:
        if self.manifest is not None:
            return True
        job, manifest = self.output.read("job.json"), self.output.read("manifest.json")
        if job is None or manifest is None:
            return False
        self.job_id = str(json.loads(job)["job_id"])
        self.manifest = Manifest.from_json(manifest, "manifest.json")
        self.h.record("job", job_id=self.job_id, chunks=self.manifest.chunks, samples=self.manifest.samples)
        return True

    # --- store and counters ---------------------------------------------------------------------
    def sample_counters_then_store(self) -> None:
        counters = self._counters()
        progress = self._progress()
        stored = self._scan_store()
        if counters is not None:
            self.h.record("counters", **counters, store=stored)
        if progress is not None:
            self.h.record("progress", **progress, store=stored)

    def _counters(self) -> dict[str, Any] | None:
        try:
            r = self.redis.client()
            pipe = r.pipeline()
            pipe.scard(self.keys.job(self.job_id, "done"))
            pipe.hmget(self.keys.stats(self.job_id), ["samples_ok", "samples_failed"])
            done, (ok, failed) = pipe.execute()
        except redis.RedisError:
            return None
        ok_n, failed_n = float(ok or 0), float(failed or 0)
        return {"done_chunks": int(done), "samples": int(ok_n + failed_n), "failed": int(failed_n)}

    def _progress(self) -> dict[str, Any] | None:
        raw = self.output.read("progress.json")
        if not raw:
            return None
        try:
            doc = json.loads(raw)
            return {
                "samples": int(doc["samples"]["done"]),
                "failed": int(doc["samples"]["failed"]),
                "chunks": int(doc["chunks"]["done"]),
                "counted": int(doc["tokens"]["counted_samples"]),
                "state": doc.get("state"),
            }
        except (ValueError, KeyError, TypeError):
            self.h.record("progress_unreadable", size=len(raw))
            return None

    def _scan_store(self) -> list[int]:
        versions = self.output.chunk_versions()
        for name, token in versions.items():
            if self.tokens.get(name) == token:
                continue
            data = self.output.read(f"outputs/{name}")
            if data is None:
                continue
            self.tokens[name] = token
            try:
                seen = blob(data)
            except ValueError:
                self.h.record("chunk_corrupt", chunk=name, size=len(data))
                continue
            first = self.first.get(name)
            if first is None:
                self.first[name] = seen
                if is_repair_file(name):  # a repair round's write-once file: checked like a chunk's
                    self.h.record("repair_stored", chunk=name, digest=seen.digest, records=seen.records)
                    continue
                self.last_stored_at = self.h.now()
                self.h.record("chunk_stored", chunk=name, digest=seen.digest, records=seen.records)
            elif seen.digest != first.digest:
                self.h.record(
                    "chunk_rewritten",
                    chunk=name,
                    first=first.digest,
                    now=seen.digest,
                    records=seen.records,
                    failed_before=first.failed,
                    failed_now=seen.failed,
                )
                self.first[name] = seen  # report each further change once
        gone = set(self.first) - set(versions)
        for name in sorted(gone):
            self.h.record("chunk_vanished", chunk=name)
            del self.first[name]
            self.tokens.pop(name, None)
        # Chunk files only: a repair file holds samples of a chunk already counted (and only
        # lowers the failed count, which the counters must then not exceed either way).
        firsts = [b for name, b in self.first.items() if not is_repair_file(name)]
        chunks = len(firsts)
        samples = sum(b.records for b in firsts)
        failed = sum(b.failed for b in firsts)
        self.latest_store = (chunks, samples, failed)
        return [chunks, samples, failed]

    def stored_chunks(self) -> set[int]:
        return {int(name.split("-")[1].split(".")[0]) for name in self.first if not is_repair_file(name)}

    # --- simulators --------------------------------------------------------------------------------
    def poll_sim(self, node: Node, gpu: int) -> None:
        if not node.alive():
            return
        try:
            stats = requests.get(f"{node.sim_url(gpu)}/sim/stats", timeout=1.5).json()
        except (requests.RequestException, ValueError):
            return
        with self._lock:
            self.sims.setdefault(f"{node.name}/gpu{gpu}", _SimCounter()).update(stats)

    def served(self, name: str = "requests_total") -> int:
        with self._lock:
            return sum(c.total(name) for c in self.sims.values())

    # --- verify during the run ----------------------------------------------------------------
    def _poll_verify(self, now: float) -> None:
        if self._verify is not None and self._verify.poll() is not None:
            self._collect_verify(self._verify.returncode)
        if self._verify is None and now >= self._next_verify:
            self._next_verify = now + self.verify_every
            self._verify_chunks = self.stored_chunks()
            self._verify = subprocess.Popen(
                self.verify_argv,
                cwd=REPO,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )

    def _collect_verify(self, rc: int) -> None:
        assert self._verify is not None
        out = self._verify.stdout.read() if self._verify.stdout else ""
        self._verify = None
        try:
            doc = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            self.h.record("verify", rc=rc, error="no JSON")
            return
        keep = ("chunks_done", "ok", "failed", "missing", "duplicated", "unexpected", "corrupted")
        self.h.record("verify", rc=rc, **{k: doc.get(k) for k in keep}, counted=sorted(self._verify_chunks))

    # --- recoveries ---------------------------------------------------------------------------------
    def owners(self) -> dict[int, str]:
        if not self.job_id:
            return {}
        try:
            raw = cast(dict[bytes, bytes], self.redis.client().hgetall(self.keys.job(self.job_id, "owners")))
        except redis.RedisError:
            return {}
        return {int(k): v.decode() for k, v in raw.items()}

    def watch(self, index: int, kind: str, workers: list[str]) -> Watch:
        """Start watching a fault's recovery; ``workers`` (gpuN) lose the chunks they hold now."""
        owners = self.owners()
        victims = {c: o for c, o in owners.items() if any(o.startswith(w + "@") for w in workers)}
        w = Watch(index, kind, self.h.now(), victims)
        with self._lock:
            self.watches.append(w)
        return w

    def healed(self, index: int) -> None:
        with self._lock:
            for w in self.watches:
                if w.index == index and w.healed is None:
                    w.healed = self.h.now()

    def check_watches(self) -> None:
        with self._lock:
            open_ = [w for w in self.watches if not w.done()]
        if not open_:
            return
        now = self.h.now()
        stored = self.stored_chunks()
        complete = self.manifest is not None and len(stored) >= self.manifest.chunks
        owners = self.owners()
        try:
            queued = queued_chunks(self.redis.client(), self.queue, self.job_id) if self.job_id else set()
        except Exception:
            queued = set()
        for w in open_:
            if w.takeover_at is None and all(
                c in stored or c in queued or owners.get(c, dead) != dead for c, dead in w.victims.items()
            ):
                w.takeover_at = now
            if w.resumed_at is None and w.healed is not None:
                if self.last_stored_at > w.healed:
                    w.resumed_at = self.last_stored_at
                elif complete:
                    w.resumed_at = w.healed
            if w.done():
                self.h.record("recovered", **self.watch_result(w))

    @staticmethod
    def watch_result(w: Watch) -> dict[str, Any]:
        takeover = None if w.takeover_at is None else round(w.takeover_at - w.started, 2)
        resume = None if (w.resumed_at is None or w.healed is None) else round(w.resumed_at - w.healed, 2)
        return {
            "index": w.index,
            "kind": w.kind,
            "victim_chunks": len(w.victims),
            "takeover_s": takeover if w.victims else None,
            "resume_s": resume,
        }


def verify_argv(inp: Path, output: str) -> list[str]:
    return [sys.executable, "-m", "dflash_tasks.verify", "--input", str(inp), "--output", output, "--json"]
