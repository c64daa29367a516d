"""A job whose server loops on a fifth of its samples: the workers stream, stop each looping
sample early and record it as ``repetition``, flag nothing else, and the export writes no loop;
with ``--on-loop regenerate`` (the default) repair rounds send the looped samples again.

Real simulator (``--loop-share 0.2``), a real worker process, ``enqueue --wait``, ``export``.
Which samples the simulator makes loop is its own plan (``SimEngine.plan``, asked here with the
simulator's own flags for a first round's request, which has no seed), so the records are checked
against the truth, not against the detector.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import requests

from dflash_tasks.core.repetition import FINISH_REASON
from dflash_tasks.sim.__main__ import config_from_args
from dflash_tasks.sim.engine import SimEngine
from dflash_tasks.sim.protocol import parse_chat_request
from tests.e2e.test_pipeline_e2e import enqueue_args, last_json
from tests.helpers import Processes, read_records

SAMPLES = 300
SHARE = 0.2
MAX_TOKENS = 4096
SIM_FLAGS = ("--loop-share", str(SHARE), "--time-scale", "0.002", "--mean-output-tokens", "600")


def planned_loops(prompts: dict[str, str]) -> set[str]:
    """The ids whose prompt the simulator (run with :data:`SIM_FLAGS`) plans to loop on a request
    without a seed, as a first round sends it."""
    engine = SimEngine(config_from_args(SIM_FLAGS))
    try:
        return {key for key, prompt in prompts.items() if loops(engine, prompt)}
    finally:
        engine.stop()


def loops(engine: SimEngine, prompt: str) -> bool:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS}
    request = parse_chat_request("application/json", json.dumps(body).encode(), engine.config)
    full, _, _, _ = engine.plan(request, None)
    return full.loop is not None


def write_job(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    prompts = {f"s{i}": f"Question {i}: what is {i} * 7? Think it through." for i in range(SAMPLES)}
    inp.write_text("".join(json.dumps({"id": k, "prompt": p}) + "\n" for k, p in prompts.items()))
    return inp, out, prompts


def run_job(procs: Processes, inp: Path, out: Path, *flags: str) -> str:
    """Run the job on a looping simulator with one worker; the simulator's URL."""
    sim = procs.simulator(*SIM_FLAGS, "--stream-interval", "8")
    procs.worker(sim, "gpu0", "--max-inflight", "64")
    common = ("--max-tokens", str(MAX_TOKENS), "--chunk-size", "50", "--no-preflight", "--wait", "--json")
    # the looping share is the test's own: the gate would (rightly) stop the job at 10%
    shares = ("--max-share", "truncated=1.0", "--max-share", "looping=1.0")
    res = procs.run(
        "dflash_tasks.producer.enqueue", *enqueue_args(inp, out, *common, *shares, *flags), timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert last_json(res.stdout)["job_id"]
    return sim


def loops_in(text: str, looped: list[dict[str, Any]]) -> list[str]:
    """The ids of looped turns whose loop (two copies of its span, as JSON writes it) is in ``text``."""
    found = []
    for key, turn in ((r["id"], t) for r in looped for t in r["turns"] if "loop" in t):
        loop = turn["loop"]
        span = turn[loop["text"]][loop["start_char"] : loop["start_char"] + loop["period_chars"]]
        assert len(span) == loop["period_chars"] > 0
        if json.dumps(span * 2, ensure_ascii=False)[1:-1] in text:
            found.append(key)
    return found


def exported_loops(procs: Processes, out: Path, to: Path, looped: list[dict[str, Any]]) -> list[str]:
    """Export the job; the ids of looped turns whose loop is in the exported file."""
    res = procs.run("dflash_tasks.export", "--output", str(out), "--to", str(to))
    assert res.returncode == 0, res.stderr[-3000:]
    text = to.read_text()
    assert text.count("\n") > 0.5 * SAMPLES
    return loops_in(text, looped)


def test_looping_samples_are_stopped_and_recorded_and_no_other_is(procs: Processes, tmp_path: Path) -> None:
    inp, out, prompts = write_job(tmp_path)
    looping = planned_loops(prompts)
    assert 0.12 * SAMPLES < len(looping) < 0.28 * SAMPLES
    sim = run_job(procs, inp, out, "--on-loop", "drop")
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
    looped = [records[k] for k in looping]
    assert exported_loops(procs, out, tmp_path / "train.jsonl", looped) == []
    # the same check finds every loop in the stored records, which keep them
    stored = "".join(path.read_text() for path in (out / "outputs").glob("chunk-*.jsonl"))
    assert sorted(loops_in(stored, looped)) == sorted(looping)


def test_repair_rounds_regenerate_the_looped_samples_with_another_seed(
    procs: Processes, tmp_path: Path
) -> None:
    inp, out, prompts = write_job(tmp_path)
    first = planned_loops(prompts)
    run_job(procs, inp, out)  # --on-loop regenerate, the default
    current = {str(r["id"]): r for r in read_records(out)}
    assert len(current) == SAMPLES
    left = {k for k, r in current.items() if r["finish_reason"] == FINISH_REASON}
    regenerated = {k for k in first if current[k].get("repair")}
    assert regenerated == first  # each looped sample was sent again, and no other
    assert len(left) < 0.5 * len(first)  # another seed mostly escapes the loop
    assert all(current[k]["sampling"].get("seed") is not None for k in regenerated)
    stored = [r for path in sorted((out / "outputs").glob("*.jsonl")) for r in map(json.loads, path.open())]
    looped = [r for r in stored if r["finish_reason"] == FINISH_REASON]
    assert len(looped) >= len(first)
    assert exported_loops(procs, out, tmp_path / "train.jsonl", looped) == []
