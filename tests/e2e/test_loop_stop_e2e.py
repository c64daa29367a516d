"""A job whose server loops on a fifth of its samples: the workers stream, stop each looping
sample early and record it as ``repetition``, and flag nothing else.

Real simulator (``--loop-share 0.2``), a real worker process, ``enqueue --wait``. Which samples
the simulator makes loop is its own plan, worked out here with its own functions (a sample loops
by its prompt alone when the request has no seed), so the records are checked against the truth,
not against the detector.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import requests

from dflash_tasks.core.repetition import FINISH_REASON
from dflash_tasks.sim import SimConfig
from dflash_tasks.sim.textgen import plan_loop, plan_output, prompt_rng
from tests.e2e.test_pipeline_e2e import enqueue_args, last_json
from tests.helpers import Processes

SAMPLES = 300
SHARE = 0.2
MAX_TOKENS = 4096


def loops(prompt: str, share: float = SHARE) -> bool:
    """Whether the simulator (default seed) makes this one-message prompt loop."""
    base = plan_output(random.Random(0), True, 300, 0.5, 0.9)
    return plan_loop(prompt_rng(SimConfig().seed + 3, prompt), base, share, MAX_TOKENS).loop is not None


def test_looping_samples_are_stopped_and_recorded_and_no_other_is(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    prompts = {f"s{i}": f"Question {i}: what is {i} * 7? Think it through." for i in range(SAMPLES)}
    inp.write_text("".join(json.dumps({"id": k, "prompt": p}) + "\n" for k, p in prompts.items()))
    looping = {k for k, p in prompts.items() if loops(p)}
    assert 0.12 * SAMPLES < len(looping) < 0.28 * SAMPLES
    sim = procs.simulator(
        "--loop-share",
        str(SHARE),
        "--time-scale",
        "0.002",
        "--mean-output-tokens",
        "600",
        "--stream-interval",
        "8",
    )
    procs.worker(sim, "gpu0", "--max-inflight", "64")
    flags = ("--max-tokens", str(MAX_TOKENS), "--chunk-size", "50", "--no-preflight", "--wait", "--json")
    res = procs.run(
        "dflash_tasks.producer.enqueue",
        *enqueue_args(inp, out, *flags, "--max-share", "truncated=1.0"),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert last_json(res.stdout)["job_id"]
    records = {
        r["id"]: r
        for path in sorted((out / "outputs").glob("chunk-*.jsonl"))
        for r in map(json.loads, path.open())
    }
    assert len(records) == SAMPLES
    stopped = {k for k, r in records.items() if r["finish_reason"] == FINISH_REASON}
    assert stopped == looping  # every looping sample, and nothing else
    for key in looping:
        (turn,) = records[key]["turns"]
        assert turn["status"] == "ok" and turn["loop"]["text"] == "reasoning"
        assert turn["usage"]["completion_tokens"] <= 0.25 * MAX_TOKENS, turn["usage"]
        assert records[key]["outcome"] == "truncated"
    for key in records.keys() - looping:
        (turn,) = records[key]["turns"]
        assert "loop" not in turn and turn["finish_reason"] in ("stop", "length")
    stats = requests.get(f"{sim}/sim/stats", timeout=10).json()  # the simulator's own counts
    assert stats["looping"] == len(looping)
    # closed by the worker (at this pace a few finish generating before the close reaches them)
    assert 0.5 * len(looping) < stats["client_gone"] <= len(looping)
