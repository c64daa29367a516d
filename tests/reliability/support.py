"""Shared helpers of the reliability suite: the results table, accounting, processes and faults.

Every scenario runs real processes (Redis, ``python -m workers``, simulators, moto) and ends
with :func:`settle`, which counts the job's samples from the stored records against the input
and from a ``python -m dflash_tasks.export`` of the job, counts generation from the simulators'
request logs (``GET /sim/requests``: requests generated beyond one per sample are wasted), runs
``verify``, and adds one row to the scenario's :class:`ScenarioRows`. ``tests/reliability/conftest.py``
prints the table at the end of the session and writes ``test-artifacts/reliability.{json,md}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import redis
import requests

from dflash_tasks.coord.publish import queued_chunks
from dflash_tasks.core.sample import Sample
from dflash_tasks.producer.mix import read_input
from tests.helpers import REPO, Processes, RedisServer, free_port, generation, read_records, wait_until

MODEL = "Qwen/Qwen3-8B"
ARTIFACTS = REPO / "test-artifacts"


# --- the results table ---------------------------------------------------------------------------


@dataclass
class Row:
    """One scenario's figures."""

    family: str  # the scenario number of issue 7, e.g. "2"
    fault: str
    runs: int  # faults injected (kills, restarts, fault bursts, jobs)
    expected: int | None  # valid input samples (None: a check without a job of its own)
    stored_once: int | None  # input samples stored exactly once
    lost: int | None  # input samples not stored
    duplicated: int | None  # records beyond the first for a sample (store and export together)
    recover_s: float | None  # measured; None where no recovery applies
    wasted: int | None = None  # generations beyond one per sample (the simulators' count)
    repaired: int | None = None  # samples a repair round regenerated into an ok record
    measured: str = ""  # what recover_s measures
    notes: str = ""
    passed: bool = True
    test: str = ""


@dataclass
class Collector:
    """The session's rows, built by ``plugin.py`` from the tests' reports."""

    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0  # the suite's own time, added up by plugin.py

    def add(self, row: Row) -> None:
        self.rows.append(row)

    def ordered(self) -> list[Row]:
        """By scenario number (modules run in alphabetical order), then as recorded."""
        return sorted(self.rows, key=lambda r: int(r.family) if r.family.isdigit() else 99)

    def markdown(self) -> str:
        head = (
            "| # | fault | runs | samples expected | stored once | lost | duplicated | repaired "
            "| wasted requests | time to recover (s) | recovery measured as | notes |"
        )
        lines = [head, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|---|"]

        def n(value: int | None) -> str:
            return "-" if value is None else f"{value:,}"

        for r in self.ordered():
            rec = "-" if r.recover_s is None else f"{r.recover_s:.1f}"
            mark = "" if r.passed else " **FAILED**"
            lines.append(
                f"| {r.family} | {r.fault}{mark} | {r.runs} | {n(r.expected)} | {n(r.stored_once)} "
                f"| {n(r.lost)} | {n(r.duplicated)} | {n(r.repaired)} | {n(r.wasted)} | {rec} "
                f"| {r.measured or '-'} | {r.notes or ''} |"
            )
        return "\n".join(lines)

    def totals(self) -> dict[str, Any]:
        return {
            "scenarios": len(self.rows),
            "failed": sum(not r.passed for r in self.rows),
            "samples_expected": sum(r.expected or 0 for r in self.rows),
            "stored_once": sum(r.stored_once or 0 for r in self.rows),
            "lost": sum(r.lost or 0 for r in self.rows),
            "duplicated": sum(r.duplicated or 0 for r in self.rows),
            "wasted": sum(r.wasted or 0 for r in self.rows),
            "suite_s": round(self.seconds, 1),
        }

    def write(self, folder: Path) -> tuple[Path, Path]:
        folder.mkdir(parents=True, exist_ok=True)
        md, js = folder / "reliability.md", folder / "reliability.json"
        t = self.totals()
        md.write_text(
            self.markdown() + f"\n\n{t['scenarios']} scenarios, {t['samples_expected']:,} samples expected, "
            f"{t['stored_once']:,} stored exactly once, {t['lost']} lost, {t['duplicated']} duplicated, "
            f"{t['wasted']:,} requests wasted (generated beyond one per sample); "
            f"suite time {t['suite_s']:.0f} s.\n"
        )
        js.write_text(json.dumps({"totals": t, "rows": [asdict(r) for r in self.ordered()]}, indent=2) + "\n")
        return md, js


#: The key of a row in a test's ``user_properties``.
ROW_PROPERTY = "reliability_row"


class ScenarioRows(Collector):
    """One scenario's rows (the ``reliability`` fixture): each also goes into the test's
    ``user_properties``, which travel with its report to the process that prints the table (the
    controller under ``pytest -n``, where the scenarios run in worker processes)."""

    def __init__(self, properties: list[tuple[str, object]]) -> None:
        super().__init__()
        self._properties = properties

    def add(self, row: Row) -> None:
        super().add(row)
        self._properties.append((ROW_PROPERTY, asdict(row)))


# --- accounting -------------------------------------------------------------------------------


@dataclass
class Accounting:
    expected: int
    stored_once: int
    lost: int
    duplicated: int
    unexpected: int
    ok: int
    failed: int
    export_rows: int = 0
    export_duplicates: int = 0
    export_missing: int = 0
    generated: int = 0  # generations of the input's samples (the simulators' count)
    wasted: int = 0  # beyond one per sample


def expected_ids(inp: Path) -> set[str]:
    return {item.id for item in read_input(inp) if isinstance(item, Sample)}


def account(inp: Path, records: Iterable[dict[str, Any]]) -> Accounting:
    """Count the stored records against the input's valid samples."""
    return account_ids(expected_ids(inp), records)


def account_ids(wanted: set[str], records: Iterable[dict[str, Any]]) -> Accounting:
    """Count the stored records against the sample ids ``wanted`` (each stored once, none else)."""
    seen: Counter[str] = Counter()
    ok = failed = 0
    for record in records:
        seen[str(record["id"])] += 1
        if record.get("status") == "ok":
            ok += 1
        else:
            failed += 1
    return Accounting(
        expected=len(wanted),
        stored_once=sum(1 for i in wanted if seen[i] == 1),
        lost=sum(1 for i in wanted if seen[i] == 0),
        duplicated=sum(n - 1 for n in seen.values() if n > 1),
        unexpected=sum(n for i, n in seen.items() if i not in wanted),
        ok=ok,
        failed=failed,
    )


def export_check(procs: Processes, out: str, wanted: set[str], acc: Accounting) -> None:
    """``python -m dflash_tasks.export --keep-failed``: every sample once, as a row or left out with a reason.

    Rows the trainer would reject (e.g. truncated) are left out by default and listed, with
    their reason, in ``PATH.dropped.jsonl``: such a sample is accounted for, not missing.
    """
    to = procs.tmp / f"export-{time.monotonic_ns()}.jsonl"
    res = procs.run(
        "dflash_tasks.output.export",
        "--output",
        out,
        "--to",
        str(to),
        "--keep-failed",
        "--layout",
        "conversation",
    )
    assert res.returncode == 0, res.stderr
    ids = Counter(json.loads(line)["id"] for line in to.read_text().splitlines() if line.strip())
    manifest = json.loads(to.with_name(to.name + ".manifest.json").read_text())
    dropped_file = to.with_name(str(manifest["dropped_file"])) if manifest["dropped_file"] else None
    left_out = [json.loads(line) for line in dropped_file.read_text().splitlines()] if dropped_file else []
    ids.update(r["id"] for r in left_out if r["reason"] != "duplicate")
    acc.export_rows = sum(ids.values())
    # export drops a second record of a sample itself; count those as duplicates too
    acc.export_duplicates = sum(n - 1 for n in ids.values() if n > 1) + int(
        manifest["dropped"].get("duplicate", 0)
    )
    acc.export_missing = len(wanted - set(ids))


def verify_json(procs: Processes, inp: Path, out: str | Path) -> tuple[int, dict[str, Any]]:
    res = procs.run("dflash_tasks.output.verify", "--input", str(inp), "--output", str(out), "--json")
    return res.returncode, dict(json.loads(res.stdout.strip().splitlines()[-1]))


def settle(
    collector: Collector,
    procs: Processes,
    *,
    family: str,
    fault: str,
    inp: Path,
    out: str | Path,
    runs: int,
    recover_s: float | None,
    measured: str = "",
    notes: str = "",
    records: list[dict[str, Any]] | None = None,
    test: str = "",
    sims: Sequence[str | dict[str, Any]],
    allowed_waste: int | None = 0,
) -> Accounting:
    """Account for the job, export and verify it, record the row, then assert nothing was lost or doubled.

    ``sims``: the simulators that served the job (URLs, or request logs taken with
    :func:`~tests.helpers.sim_requests` before a simulator was killed); their generations are
    counted per sample. ``allowed_waste``: how many generations beyond one per sample the scenario
    may cost (0: none; None: only reported).
    """
    out = str(out)
    records = read_records(Path(out)) if records is None else records
    acc = account(inp, records)
    export_check(procs, out, expected_ids(inp), acc)
    gen = generation(inp, sims)
    acc.generated, acc.wasted = gen.generated, gen.wasted
    rc, report = verify_json(procs, inp, out)
    passed = (
        rc == 0
        and acc.lost == 0
        and acc.duplicated == 0
        and acc.unexpected == 0
        and acc.export_duplicates == 0
        and acc.export_missing == 0
        and (allowed_waste is None or acc.wasted <= allowed_waste)
    )
    collector.add(
        Row(
            family=family,
            fault=fault,
            runs=runs,
            expected=acc.expected,
            stored_once=acc.stored_once,
            lost=max(acc.lost, acc.export_missing),
            duplicated=acc.duplicated + acc.export_duplicates,
            wasted=acc.wasted,
            repaired=sum(1 for r in records if r.get("status") == "ok" and r.get("repair") is not None),
            recover_s=None if recover_s is None else round(recover_s, 2),
            measured=measured,
            notes=notes,
            passed=passed,
            test=test or os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
        )
    )
    assert rc == 0, report
    assert acc.lost == 0 and acc.duplicated == 0 and acc.unexpected == 0, acc
    assert acc.export_duplicates == 0 and acc.export_missing == 0, acc
    assert acc.stored_once == acc.expected, acc
    if allowed_waste is not None:
        assert acc.wasted <= allowed_waste, f"{acc.wasted} wasted generations > {allowed_waste} allowed"
    return acc


# --- jobs ----------------------------------------------------------------------------------------


def last_json(stdout: str) -> dict[str, Any]:
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def enqueue(
    procs: Processes, inp: Path, out: str | Path, *extra: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``python -m dflash_tasks.enqueue --no-preflight --json`` (add ``--wait`` to wait)."""
    return procs.run(
        "dflash_tasks.producer.enqueue",
        *("--input", str(inp), "--output", str(out), "--model", MODEL, "--no-preflight", "--json", *extra),
        timeout=timeout,
    )


def enqueue_ok(procs: Processes, inp: Path, out: str | Path, *extra: str) -> dict[str, Any]:
    res = enqueue(procs, inp, out, *extra)
    assert res.returncode == 0, res.stderr
    return last_json(res.stdout)


def write_questions(path: Path, count: int, tag: str = "") -> Path:
    """``count`` distinct one-turn prompts (``tag`` makes the file, hence the job, unique)."""
    with open(path, "w") as fh:
        for i in range(count):
            fh.write(
                json.dumps({"id": f"{tag}q{i}", "prompt": f"{tag} question {i}: what is {i} * 7?"}) + "\n"
            )
    return path


def outputs(out: Path) -> set[int]:
    folder = out / "outputs"
    if not folder.exists():
        return set()
    return {int(p.stem.split("-")[1]) for p in folder.glob("chunk-*.jsonl") if ".repair-" not in p.name}


def wait_done(out: Path, chunks: int, timeout: float, what: str = "the job to complete") -> float:
    """Wait until ``chunks`` chunk outputs exist; returns the seconds waited."""
    start = time.monotonic()
    wait_until(lambda: len(outputs(out)) >= chunks, timeout, what, interval=0.1)
    return time.monotonic() - start


def redis_client(procs: Processes) -> redis.Redis:
    return redis.Redis.from_url(procs.broker_url)


def prefix(procs: Processes) -> str:
    return str(procs.env["DFLASH_REDIS_PREFIX"])


def owners(procs: Processes, job_id: str, client: redis.Redis | None = None) -> dict[int, str]:
    """chunk -> lease owner (``worker@host/task id/nonce``) of the job's live and expired leases."""
    r = client or redis_client(procs)
    raw = cast(dict[bytes, bytes], r.hgetall(f"{prefix(procs)}:job:{job_id}:owners"))
    return {int(k): v.decode() for k, v in raw.items()}


def held_by(procs: Processes, job_id: str, worker: str) -> dict[int, str]:
    return {c: o for c, o in owners(procs, job_id).items() if o.startswith(worker + "@")}


def wait_recovered(
    procs: Processes,
    job_id: str,
    out: Path,
    chunks: dict[int, str],
    since: float,
    timeout: float,
    *,
    queued_counts: bool = True,
) -> float:
    """Seconds from ``since`` until each of ``chunks`` (chunk -> dead owner) is stored, leased by
    another owner, or (with ``queued_counts``) waiting in the queue again."""
    r = redis_client(procs)

    def recovered() -> bool:
        done, own = outputs(out), owners(procs, job_id, r)
        queued = queued_chunks(r, procs.model_queue(), job_id) if queued_counts else set()
        return all(c in done or (c in own and own[c] != dead) or c in queued for c, dead in chunks.items())

    wait_until(recovered, timeout, f"chunks {sorted(chunks)} to be back in circulation", interval=0.05)
    return time.monotonic() - since


class RecoveryWatch(threading.Thread):
    """:func:`wait_recovered` in the background, started at a kill, so kills can overlap."""

    def __init__(
        self, procs: Processes, job_id: str, out: Path, chunks: dict[int, str], timeout: float
    ) -> None:
        super().__init__(daemon=True)
        self.args_ = (procs, job_id, out, chunks, time.monotonic(), timeout)
        self.seconds: float | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.seconds = wait_recovered(*self.args_)
        except BaseException as exc:
            self.error = exc

    def result(self) -> float:
        self.join(float(self.args_[-1]) + 10)
        if self.error is not None:
            raise self.error
        assert self.seconds is not None
        return self.seconds


# --- processes ------------------------------------------------------------------------------------


def start_worker(
    procs: Processes,
    endpoint: str,
    name: str,
    *flags: str,
    log: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """``python -m workers`` with extra environment, logging to ``log``; returns once it is ready."""
    log = log or f"{name}.log"
    saved = procs.env
    procs.env = {**saved, **(env or {})}
    try:
        proc = procs.spawn(["-m", "workers", "--endpoint", endpoint, "--name", name, *flags], log)
    finally:
        procs.env = saved
    path = procs.tmp / log
    wait_until(lambda: b" ready." in path.read_bytes() or proc.poll() is not None, 60, f"worker {name}")
    assert proc.poll() is None, path.read_text(errors="replace")[-3000:]
    return proc


def start_simulator(
    procs: Processes, *flags: str, name: str, port: int | None = None
) -> tuple[str, subprocess.Popen[bytes]]:
    """A simulator on ``port`` (a fixed one can be restarted on the same address): (URL, process)."""
    port = port or free_port()
    log = procs.tmp / f"{name}.log"
    log.unlink(missing_ok=True)
    proc = procs.spawn(["-m", "dflash_tasks.sim", "--port", str(port), *flags], f"{name}.log")
    wait_until(lambda: log.exists() and b"SIM READY" in log.read_bytes(), 20, f"simulator {name}")
    return f"http://127.0.0.1:{port}", proc


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    proc.wait(30)


def logs(procs: Processes, *names: str) -> str:
    return "".join((procs.tmp / n).read_text(errors="replace") for n in names if (procs.tmp / n).exists())


def fault(sim: str, kind: str, **how: float) -> None:
    requests.post(f"{sim}/sim/faults", json={"kind": kind, **how}, timeout=5).raise_for_status()


def publish_countdown(procs: Processes, job_id: str, chunk: int, seconds: float) -> None:
    """Queue ``chunk`` to run in ``seconds`` (as a failed chunk is re-queued with a backoff)."""
    from celery import Celery

    from dflash_tasks.coord.celery_app import configure
    from dflash_tasks.coord.publish import publish_chunks
    from dflash_tasks.core.settings import CommonSettings

    app = Celery("reliability-publish", set_as_current=False)
    configure(app, CommonSettings.load({}, broker_url=procs.broker_url, queue=procs.queue))
    try:
        publish_chunks(app, job_id, [chunk], queue=procs.model_queue(), countdown=seconds)
    finally:
        app.close()


def sim_stats(sim: str) -> dict[str, Any]:
    return dict(requests.get(f"{sim}/sim/stats", timeout=5).json())


def reset_sim_stats(sim: str) -> None:
    requests.post(f"{sim}/sim/stats/reset", timeout=5).raise_for_status()


@dataclass
class Node:
    """A simulated GPU node: one simulator and its workers in one process group (one session)."""

    proc: subprocess.Popen[bytes]
    endpoint: str
    workers: list[str]
    logs: list[str]


def start_node(
    procs: Processes, name: str, workers: int, sim_flags: list[str], worker_flags: list[str]
) -> Node:
    """``bash`` starting a simulator and ``workers`` workers bound to it, all in one process group,
    so one ``killpg`` takes the whole node down at once, as a lost machine would."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    py = shlex.quote(sys.executable)
    names = [f"{name}-gpu{i}" for i in range(workers)]
    logs_ = [f"{n}.log" for n in names]
    sim = shlex.join(["--port", str(port), *sim_flags])
    script = [f"{py} -m dflash_tasks.sim {sim} > {shlex.quote(name + '-sim.log')} 2>&1 &"]
    for worker, log in zip(names, logs_, strict=True):
        args = shlex.join(["--endpoint", endpoint, "--name", worker, *worker_flags])
        script.append(f"{py} -m workers {args} > {shlex.quote(log)} 2>&1 &")
    script.append("wait")
    proc = subprocess.Popen(
        ["bash", "-c", "\n".join(script)],
        cwd=procs.tmp,
        env={**procs.env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    procs._procs.append(proc)  # killed with the rest at the end of the test
    for log in logs_:
        path = procs.tmp / log
        wait_until(lambda p=path: p.exists() and b" ready." in p.read_bytes(), 60, f"{log} ready")  # type: ignore[misc]
    return Node(proc, endpoint, names, logs_)


class PasswordRedis(RedisServer):
    """A private redis-server that requires a password (``requirepass``)."""

    def __init__(self, workdir: Path, password: str) -> None:
        self.password = password
        super().__init__(workdir)

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "redis.conf"  # the password stays off the command line (ps)
        conf.write_text(
            f'port {self.port}\nbind 127.0.0.1\nsave ""\nappendonly yes\nappendfsync always\n'
            f"dir {self.dir}\nmaxmemory-policy noeviction\nrequirepass {self.password}\n"
        )
        self.proc = subprocess.Popen(
            ["redis-server", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_until(self._ping, 10, "redis-server to answer")

    def _ping(self) -> bool:
        try:
            return bool(
                redis.Redis(port=self.port, password=self.password, socket_connect_timeout=0.5).ping()
            )
        except redis.RedisError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)


def files_under(*folders: Path) -> Iterator[Path]:
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                yield path


def timed(action: Callable[[], Any]) -> float:
    start = time.monotonic()
    action()
    return time.monotonic() - start
