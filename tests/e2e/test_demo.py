"""``make demo``'s command on a small job: a simulated node, Flower, enqueue, verify, clean stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.helpers import REPO, RedisServer


def test_demo_runs_a_small_job_end_to_end_and_leaves_nothing_running(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    env = {
        **os.environ,
        "DFLASH_BROKER_URL": redis_server.url,
        "DFLASH_QUEUE": f"demo-{uuid.uuid4().hex[:8]}",
        "PYTHONPATH": str(REPO),
    }
    argv = [sys.executable, "-m", "dflash_tasks.demo", "--prompts", "150", "--gpus", "2"]
    argv += ["--output", str(tmp_path / "demo"), "--time-scale", "0.02"]
    run = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "PASS: 159 lines = 150 ok + 0 failed + 9 invalid" in run.stdout + run.stderr
    logs = tmp_path / "demo" / "logs"
    assert "the job's page: http://127.0.0.1:" in run.stderr  # started once the job was staged
    # the workers counted loss tokens with the tokenizer the demo built: the yield and its cost
    progress = json.loads((tmp_path / "demo" / "completions" / "progress.json").read_text())
    live = progress["yield"]
    assert live["counted_chunks"] == progress["chunks"]["total"] and 0.5 < live["yield"] <= 1, live
    summary = f"demo: yield {live['yield']:.3f}: {live['trainable_tokens']:,} trainable of "
    assert summary + f"{live['generated_tokens']:,} generated tokens | $" in run.stderr
    assert "per million trainable" in run.stderr and "model" in {
        p.name for p in (tmp_path / "demo").iterdir()
    }
    wanted = {"node.log", "gpu0-server.log", "gpu1-worker.log", "flower.log", "page.log"}
    assert wanted <= {p.name for p in logs.iterdir()}
    assert not processes_mentioning(str(tmp_path))


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (read from /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args)
    return found
