"""``--max-tokens horizon``: each request stops where the trainer's ``max_length`` cuts its row.

Real simulator (recording every request), real worker process, real enqueue with its repair
rounds, real export. The served model's tokenizer counts the simulator's output exactly as the
simulator does (one token per simulator token, ``tests/exact_tokenizer.py``),
so a row's tokens are its prompt's plus the completion tokens the simulator reported, and the
budgets are checked to the token against the trainer's rendering, computed here independently of
the worker's code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from dflash_tasks.core.loss_tokens import load_tokenizer
from dflash_tasks.sim.requestlog import read_requests
from tests.e2e.test_multiturn_e2e import write_conversations
from tests.e2e.test_pipeline_e2e import MODEL, enqueue_args, last_json
from tests.exact_tokenizer import build_exact_model_dir
from tests.helpers import Processes, read_records

MAX_LENGTH = 256
CLOSING = 2  # <|im_end|>, "\n": what the template writes after an answer
FLOOR = 16
_RID = re.compile(r"-L(\d+)-T(\d+)-\d+$")


def _prefix_tokens(tokenizer: Any, messages: list[dict[str, Any]]) -> int:
    """The row's prefix as the trainer renders it: the request's messages and the generation prompt."""
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=True
    )
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_every_request_runs_to_the_trainers_horizon_and_not_past_it(procs: Processes, tmp_path: Path) -> None:
    inp, out, sent = tmp_path / "convos.jsonl", tmp_path / "out", tmp_path / "requests.jsonl"
    write_conversations(inp, 24)
    model_dir = build_exact_model_dir(tmp_path / "models", name="Qwen3-8B")
    sim = procs.simulator(
        "--time-scale", "0.001", "--model-path", str(model_dir), "--served-model-name", MODEL,
        "--mean-output-tokens", "300", "--record-requests", str(sent), "--fault", "http_500:3",
    )  # fmt: skip
    procs.env["DFLASH_REQUEST_ATTEMPTS"] = "1"  # the 500s fail their samples: a repair round regenerates them
    procs.worker(sim, "gpu0")
    args = enqueue_args(inp, out, "--max-tokens", "horizon", "--train-max-length", str(MAX_LENGTH))
    res = procs.run(
        "dflash_tasks.producer.enqueue", *args, "--chunk-size", "8", "--no-preflight", "--wait", "--json"
    )
    assert res.returncode == 0, res.stderr
    assert last_json(res.stdout)["chunks_done"] == 3
    spec = json.loads((out / "job.json").read_text())["spec"]
    assert (spec["budget_policy"], spec["max_tokens"]) == ("horizon", MAX_LENGTH)

    # Every request's budget is max_length less its row's prefix, plus the closing tokens.
    tokenizer = load_tokenizer(str(model_dir))
    budgets: dict[tuple[int, int], int] = {}
    requests = read_requests(sent)
    for body in requests:
        expected = max(FLOOR, MAX_LENGTH - _prefix_tokens(tokenizer, body["messages"]) + CLOSING)
        assert body["max_tokens"] == body["max_completion_tokens"] == expected
        line, turn = _RID.search(body["rid"]).groups()  # type: ignore[union-attr]
        budgets[(int(line), int(turn))] = expected
    assert any("-r1-" in body["rid"] for body in requests)  # repair rounds honour the same horizon

    records = read_records(out)
    assert len(records) == 24 and all(r["status"] == "ok" for r in records)
    assert all(r["sampling"]["budget_policy"] == "horizon" for r in records)
    cut = finished = 0
    for record in records:
        for k, turn in enumerate(record["turns"], 1):
            budget, completion = budgets[(record["line"], k)], turn["usage"]["completion_tokens"]
            assert completion <= budget
            if turn["finish_reason"] == "length":
                assert completion == budget
                cut += 1
            else:
                finished += 1
    assert cut >= 4 and finished >= 4  # both kinds of turns, and multi-turn ones among them
    assert any(len(r["turns"]) > 1 for r in records)

    # The rows: every cut row written by the horizon rule, its window full of generated tokens, and
    # at most the closing tokens generated past max_length in any row.
    res = procs.run("dflash_tasks.export", "--output", str(out), "--to", str(tmp_path / "rows.jsonl"))
    assert res.returncode == 0, res.stderr
    manifest = json.loads((tmp_path / "rows.jsonl.manifest.json").read_text())
    assert manifest["layout"] == "per-turn" and "truncated" not in manifest["dropped"]
    assert manifest["yield"]["rows_written_by_horizon_rule"] == cut
    rows = [r for rec in records for r in rec["loss_counts"]["per_turn"]]
    turns = [t for rec in records for t in rec["turns"]]
    assert len(rows) == len(turns) == cut + finished
    for (tokens, loss, untruncated, _, _, generated_end), turn in zip(rows, turns, strict=True):
        assert generated_end <= MAX_LENGTH + CLOSING
        if turn["finish_reason"] == "length":
            assert generated_end >= MAX_LENGTH  # the trainer's cut lies inside generated text ...
            assert loss == untruncated - (tokens - MAX_LENGTH)  # ... and its loss runs up to the cut
    assert manifest["yield"]["yield"] >= 0.95


def test_the_preflights_projection_of_a_smaller_budget_is_what_that_budget_generates(
    procs: Processes, tmp_path: Path
) -> None:
    """A job at 8,192 projects 4,096 from its preflight sample; the same job run at 4,096 generates
    and trains exactly that (the simulator answers a prompt the same way every time)."""
    inp = tmp_path / "convos.jsonl"
    write_conversations(inp, 24)
    model_dir = build_exact_model_dir(tmp_path / "models", name="Qwen3-8B")
    sim = procs.simulator(
        "--time-scale", "0.0001", "--model-path", str(model_dir), "--served-model-name", MODEL,
        "--mean-output-tokens", "3000",
    )  # fmt: skip
    procs.worker(sim, "gpu0")
    lenient = ("--max-share", "truncated_by_trainer=1", "--max-share", "truncated=1", "--chunk-size", "8")
    wide = procs.run(
        "dflash_tasks.producer.enqueue",
        *enqueue_args(inp, tmp_path / "wide", "--max-tokens", "8192", "--preflight", "24", *lenient),
        "--gpu-hour-usd", "3.6", "--wait",
    )  # fmt: skip
    assert wide.returncode == 0, wide.stderr
    preflight = json.loads((tmp_path / "wide" / "preflight.json").read_text())
    budgets = {b["max_tokens"]: b for b in preflight["budgets"]}
    assert set(budgets) == {"horizon", 4096, 8192, 32768} and budgets[8192]["chosen"]
    assert budgets[8192]["generated_tokens"] == preflight["yield"]["generated_tokens"]
    assert "budget            projected on this sample" in wide.stderr
    assert "8,192 (chosen)" in wide.stderr and "per million trainable" in wide.stderr
    projected = budgets[4096]
    assert not projected["lower_bound"] and projected["generated_tokens"] < budgets[8192]["generated_tokens"]
    assert budgets[32768]["lower_bound"] == any(
        t["finish_reason"] == "length" for r in read_records(tmp_path / "wide") for t in r["turns"]
    )

    narrow = procs.run(
        "dflash_tasks.producer.enqueue",
        *enqueue_args(inp, tmp_path / "narrow", "--max-tokens", "4096", "--no-preflight"),
        "--chunk-size", "8", "--wait",
    )  # fmt: skip
    assert narrow.returncode == 0, narrow.stderr
    report = procs.run("dflash_tasks.report", "--output", str(tmp_path / "narrow"), "--json")
    got = last_json(report.stdout)["yield"]
    assert isinstance(got, dict)
    assert (got["generated_tokens"], got["trainable_tokens"]) == (
        projected["generated_tokens"],
        projected["trainable_tokens"],
    )
    assert got["yield"] == projected["yield"]
