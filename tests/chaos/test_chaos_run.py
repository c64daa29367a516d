"""The short chaos run of ``make test``: 60 s of overlapping faults on three nodes and one joining.

The long one is ``make chaos`` (10 minutes by default). This one runs the same command with a
fixed seed and fails when any invariant broke; its row goes to ``test-artifacts/chaos.{md,json}``.
Its simulated requests take 2 s (3 s in the long run), so its 360 prompts fill the shorter window
as densely: the same 13 kinds of fault (16 faults, 5 at once at most) hit as much running work.
About a fifth of their thoughts are cut at ``max_tokens`` and continued by the producer's repair
rounds, under seven faults of their own (from the first round on), every one of them by the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.chaos import schedule as S
from tests.chaos.config import ARTIFACTS
from tests.chaos.netns import available
from tests.helpers import REPO

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.skipif(bool(available()), reason=f"chaos run: {available()}"),
]

LABEL = "short: 1 min, seed 7, 3 nodes + 1 joining, 2 s requests (make test)"
ARGS = ["--minutes", "1", "--seed", "7", "--nodes", "3", "--request-seconds", "2", "--label", LABEL]


@pytest.mark.timeout(480)
def test_short_chaos_run_breaks_no_invariant() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_")}
    run = subprocess.run(
        [sys.executable, "-m", "tests.chaos", *ARGS],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=450,
    )
    out = run.stdout + run.stderr
    lines = run.stdout.strip().splitlines()
    assert lines[0].startswith("chaos: seed 7, 1 min of faults"), out[-3000:]
    assert any(line.startswith("fault schedule (seed 7") for line in lines[:4]), out[-3000:]
    summary = lines[-1]
    assert summary.startswith("chaos seed=7 minutes=1 store=local:"), out[-5000:]
    assert run.returncode == 0 and summary.endswith("PASS"), out[-8000:]
    row = json.loads((ARTIFACTS / "chaos.json").read_text())["runs"][LABEL]
    assert row["passed"] and row["violations"] == []
    assert row["lost"] == 0 and row["duplicated"] == 0 and row["unexpected"] == 0
    assert row["stored_once"] == row["samples_expected"] > 300
    # thoughts cut short of the trainer's horizon, each continued by a repair round, none left cut
    assert row["samples_expected"] * 0.1 <= row["cut_thoughts"] <= row["samples_expected"] * 0.35, row
    assert row["continued"] == row["cut_thoughts"] and row["left_cut"] == 0, row
    assert row["repair_rounds"] >= 1 and row["continuation_requests"] >= row["continued"], row
    assert row["repair_phase"] and sum(row["faults_during_repairs"].values()) >= 3, row
    assert row["faults_injected"] >= 15 and row["max_overlap"] >= 3
    kinds = set(row["kinds"])
    assert {S.NODE_KILL, S.NODE_JOIN, S.WORKER_PAUSE, S.PARTITION_REDIS, S.REDIS_FLUSHALL} <= kinds, kinds
    # wasted = served - one per sample - one per continuation
    assert row["requests_served"] >= row["samples_expected"] + row["continuation_requests"]
    assert row["done_after_last_fault_s"] is not None and row["done_after_last_fault_s"] <= row["bound_s"]
    assert row["run_dir"] == ""  # a passing run removes its folder
