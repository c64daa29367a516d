"""The node launcher (python -m workers.node --simulate) with real processes: simulated GPUs,
workers, a private Redis; GPUs joining and leaving a running job, a server and a worker killed."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import redis

from tests.helpers import Processes, free_port, read_records, wait_until, write_prompts
from workers.node.launch import GpuPlan
from workers.node.main import port_in_use
from workers.node.procs import Backoff, Child, LogEcho
from workers.node.supervisor import Node, SupervisorConfig

MODEL = "Qwen/Qwen3-8B"
PROMPTS, CHUNK = 1600, 8  # a job that outlasts the joins, leaves and kills on a loaded machine
# Requests of ~0.2 s (400 tokens at 40 tok/s, time scale 0.02), 8 in flight per simulated GPU.
SIM = "--time-scale 0.02 --mean-output-tokens 400"


def port_base(span: int) -> int:
    """A base port with ``span`` free ports above it."""
    for _ in range(50):
        base = free_port()
        if base + span < 65535 and not any(port_in_use(base + i) for i in range(span)):
            return base
    raise AssertionError("no free port range")


def start_node(procs: Processes, log: str, gpus: str, base: int, *extra: str) -> subprocess.Popen[bytes]:
    args = ["-m", "workers.node", "--gpus", gpus, "--simulate", "--port-base", str(base)]
    args += ["--max-inflight", "8", "--sim-arg", SIM, "--log-dir", str(procs.tmp / "logs")]
    return procs.spawn([*args, "--health-interval-seconds", "0.5", *extra], log)


def node_text(procs: Processes, log: str) -> str:
    return (procs.tmp / log).read_text(errors="replace")


def wait_for_line(procs: Processes, log: str, pattern: str, timeout: float, count: int = 1) -> re.Match[str]:
    def found() -> re.Match[str] | None:
        matches = list(re.finditer(pattern, node_text(procs, log)))
        return matches[count - 1] if len(matches) >= count else None

    return wait_until(found, timeout, f"{pattern!r} in {log}")  # type: ignore[no-any-return]


def owners(r: redis.Redis, procs: Processes, job_id: str) -> list[str]:
    values = r.hgetall(f"t-{procs.queue}:job:{job_id}:owners").values()
    return [o.decode() if isinstance(o, bytes) else str(o) for o in values]


def workers_done(out: Path) -> Counter[str]:
    """Done chunks per worker name (without @host)."""
    counts: Counter[str] = Counter()
    for path in (out / "outputs").glob("chunk-*.jsonl"):
        first = path.read_text().split("\n", 1)[0]
        counts[json.loads(first)["worker"].split("@")[0]] += 1
    return counts


def test_node_runs_a_job_while_gpus_join_leave_and_die(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, PROMPTS)
    base = port_base(3)
    t0 = time.monotonic()
    node_a = start_node(procs, "node-a.log", "0-1", base, "--restart-delay-seconds", "2")
    wait_for_line(procs, "node-a.log", r"node ready: 2 GPU\(s\) serving", 60)
    start_s = time.monotonic() - t0

    res = procs.run(
        "dflash_tasks.producer.enqueue",
        *("--input", str(inp), "--output", str(out), "--model", MODEL, "--chunk-size", str(CHUNK), "--json"),
    )
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout.strip().splitlines()[-1])["job_id"]
    wait_until(lambda: sum(workers_done(out).values()) >= 4, 60, "first chunks on node A")

    # A third simulated GPU joins with the same command and takes chunks at once.
    r = redis.Redis.from_url(procs.broker_url)
    t_join = time.monotonic()
    node_b = start_node(procs, "node-b.log", "2", base)
    wait_for_line(procs, "node-b.log", r"node ready: 1 GPU\(s\)", 60)
    ready_s = time.monotonic() - t_join
    wait_until(lambda: any(o.startswith("gpu2@") for o in owners(r, procs, job_id)), 30, "gpu2 lease")
    first_lease_s = time.monotonic() - t_join
    wait_until(lambda: workers_done(out)["gpu2"] >= 2, 60, "gpu2 chunks done")
    first_chunks_s = time.monotonic() - t_join

    # It leaves mid-run: SIGTERM, running chunks finish, nothing lost.
    assert any(o.startswith("gpu2@") for o in owners(r, procs, job_id)), "gpu2 idle at SIGTERM"
    node_b.send_signal(signal.SIGTERM)
    assert node_b.wait(60) == 0
    text_b = node_text(procs, "node-b.log")
    assert "stopping 1 worker(s)" in text_b and "[node]" in text_b and text_b.rstrip().endswith("stopped")
    assert "Warm shutdown" in (tmp_path / "logs" / "gpu2-worker.log").read_text()
    assert not port_in_use(base + 2)  # its server is gone too

    # GPU 0's server dies (its worker pauses, then resumes); GPU 1's worker dies (restarted).
    server_pid = int(wait_for_line(procs, "node-a.log", r"gpu0: server started \(pid (\d+)", 5).group(1))
    worker_pid = int(wait_for_line(procs, "node-a.log", r"gpu1: worker started \(pid (\d+)", 5).group(1))
    # The server dies with requests in flight: the worker sees it down (an idle worker whose server
    # is back within the restart delay would never notice, and has nothing to pause).
    wait_until(lambda: any(o.startswith("gpu0@") for o in owners(r, procs, job_id)), 30, "gpu0 lease")
    done_at_kill = sum(workers_done(out).values())
    assert done_at_kill < PROMPTS // CHUNK, "the job finished before the kill: nothing left to pause"
    os.kill(server_pid, signal.SIGKILL)
    os.kill(worker_pid, signal.SIGKILL)
    wait_for_line(procs, "node-a.log", r"gpu0: server exited with signal SIGKILL", 10)
    wait_for_line(procs, "node-a.log", r"gpu1: worker exited with signal SIGKILL", 10)
    wait_for_line(procs, "node-a.log", r"gpu0: server healthy", 30, count=2)
    wait_for_line(procs, "node-a.log", r"gpu1: worker ready", 30, count=2)

    # The same producer command, with --wait, sees the job through.
    res = procs.run(
        "dflash_tasks.producer.enqueue",
        *("--input", str(inp), "--output", str(out), "--model", MODEL, "--chunk-size", str(CHUNK)),
        "--wait",
        "--json",
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    report = procs.run("dflash_tasks.output.verify", "--input", str(inp), "--output", str(out), "--json")
    summary = json.loads(report.stdout.strip().splitlines()[-1])
    assert report.returncode == 0, summary
    assert summary["ok"] == PROMPTS and summary["duplicated"] == 0 and summary["failed"] == 0
    records = read_records(out)
    assert len(records) == len({r["id"] for r in records}) == PROMPTS
    done = workers_done(out)
    assert {"gpu0", "gpu1", "gpu2"} <= set(done), done

    gpu0_log = (tmp_path / "logs" / "gpu0-worker.log").read_text()
    assert "pausing this worker's consumption" in gpu0_log and "resuming consumption" in gpu0_log
    assert (tmp_path / "logs" / "gpu0-server.log").read_text().count("node: start #") == 2
    assert (tmp_path / "logs" / "gpu1-worker.log").read_text().count("node: start #") == 2
    assert "[gpu0/worker]" in node_text(procs, "node-a.log")  # prefixed echo on the node's stdout

    node_a.send_signal(signal.SIGTERM)
    assert node_a.wait(60) == 0
    assert not port_in_use(base) and not port_in_use(base + 1)
    print(
        f"\nnode start (2 sim GPUs ready): {start_s:.1f}s; joining GPU ready {ready_s:.1f}s, "
        f"first lease {first_lease_s:.1f}s, 2 chunks done {first_chunks_s:.1f}s after its start; "
        f"{done_at_kill} of {PROMPTS // CHUNK} chunks done at the kills; chunks per worker {dict(done)}"
    )


def test_node_gives_up_a_gpu_whose_server_keeps_dying(procs: Processes) -> None:
    base = port_base(1)
    flags = ["--restart-delay-seconds", "0.1", "--max-failures", "2", "--sim-arg=--no-such-flag"]
    node = start_node(procs, "node.log", "0", base, *flags)
    assert node.wait(30) == 1
    text = node_text(procs, "node.log")
    assert "gpu0: server exited with status 2" in text
    assert "gpu0: giving up (server exited 2 times in a row)" in text
    assert "every GPU slot failed" in text


def test_node_refuses_a_busy_port(procs: Processes) -> None:
    base = port_base(1)
    node = start_node(procs, "first.log", "0", base)
    wait_for_line(procs, "first.log", r"gpu0: server healthy", 30)
    second = procs.run("workers.node.main", "--gpus", "0", "--simulate", "--port-base", str(base), timeout=30)
    assert second.returncode == 2 and f"port(s) {base} already in use" in second.stderr
    node.send_signal(signal.SIGTERM)
    assert node.wait(60) == 0


def test_a_second_stop_request_cuts_the_waits_short(tmp_path: Path) -> None:
    """Children that ignore SIGTERM: the first stop waits for the worker, the second kills it."""

    def stubborn(marker: Path) -> tuple[str, ...]:
        # Touches ``marker`` once SIGTERM is ignored, so the test never stops it before that.
        code = "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        code += "pathlib.Path(sys.argv[1]).touch(); time.sleep(60)"
        return (sys.executable, "-c", code, str(marker))

    ready = [tmp_path / "server.ready", tmp_path / "worker.ready"]
    plan = GpuPlan(
        0,
        "gpu0",
        1,
        "http://127.0.0.1:1",
        stubborn(ready[0]),
        stubborn(ready[1]),
        {"PATH": os.environ["PATH"]},
    )
    out = io.StringIO()
    config = SupervisorConfig(health_interval=0.1, worker_stop_timeout=60, server_stop_timeout=2)
    node = Node([plan], tmp_path, config, out=out, probe=lambda url: True)
    thread = threading.Thread(target=node.run)
    thread.start()
    wait_until(lambda: all(p.exists() for p in ready), 20, "both children to ignore SIGTERM")
    started = time.monotonic()
    node.request_stop()
    time.sleep(1.0)
    assert thread.is_alive(), out.getvalue()  # still waiting for the worker's chunks
    node.request_stop()
    thread.join(20)
    assert not thread.is_alive() and time.monotonic() - started < 10
    text = out.getvalue()
    assert "gpu0/worker still running; killing it" in text
    assert "gpu0/server still running after SIGTERM; killing it" in text
    assert not node.slots[0].server.running() and not node.slots[0].worker.running()


def test_backoff_doubles_caps_and_resets_after_a_stable_run() -> None:
    b = Backoff(base=1.0, cap=8.0, stable_after=60.0)
    assert [b.failed(uptime=1.0) for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert b.failures == 5
    assert b.failed(uptime=120.0) == 1.0 and b.failures == 1


def test_log_echo_prefixes_lines_and_keeps_partial_ones(tmp_path: Path) -> None:
    log = tmp_path / "gpu0-worker.log"
    log.write_bytes(b"old line from an earlier run\n")
    lines: list[str] = []
    seen: list[tuple[str, str]] = []
    echo = LogEcho(lines.append, on_line=lambda name, line: seen.append((name, line)))
    echo.follow("gpu0/worker", log, echo=True)
    echo.follow("gpu0/server", tmp_path / "quiet.log", echo=False)
    with open(log, "ab") as fh:
        fh.write(b"first\nloading 10%\rloading 100%\nhalf")
    (tmp_path / "quiet.log").write_bytes(b"server line\n")
    echo.poll()
    assert lines == ["[gpu0/worker] first", "[gpu0/worker] loading 100%"]
    assert ("gpu0/server", "server line") in seen
    with open(log, "ab") as fh:
        fh.write(b" done\n")
    echo.poll()
    assert lines[-1] == "[gpu0/worker] half done"
    log.write_bytes(b"after truncation\n")  # logrotate copytruncate
    echo.poll()
    assert lines[-1] == "[gpu0/worker] after truncation"


def test_a_childs_api_key_never_reaches_its_log_file(tmp_path: Path) -> None:
    """SGLang prints its server_args, ``api_key`` included: the node masks the key in the log."""
    script = "import sys; print('server_args=', sys.argv[1:], flush=True); print('second line')"
    argv = (sys.executable, "-c", script, "--api-key", "s3cret-key", "--admin-api-key=adm1n")
    child = Child("gpu0-server", argv, dict(os.environ), tmp_path / "gpu0-server.log")
    child.spawn()
    assert child.proc is not None
    child.proc.wait(30)
    wait_until(lambda: "second line" in child.log_path.read_text(), 10, "the child's output in its log")
    text = child.log_path.read_text()
    assert "s3cret-key" not in text and "adm1n" not in text, text
    assert "server_args= ['--api-key', '***', '--admin-api-key=***']" in text
