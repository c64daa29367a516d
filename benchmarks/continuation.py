"""Continuation: the tokens repair rounds pay to finish thoughts cut at max_tokens, against regenerating them.

One simulator (defaults: mean output 2,300 tokens) and one worker; a job at ``--max-tokens 2048``
(``--set max_tokens=N``) with the trainer's horizon at its default 4,096. The first pass runs alone
(``DFLASH_REPAIR_ROUNDS=0``), then the same ``enqueue --wait`` runs the repair rounds, which
continue every thought cut short of the horizon. A second simulator with the same seed answers
each cut sample's request uninterrupted, up to the horizon and without a limit: what regenerating
it from scratch costs. Tokens are the simulators' ``generation_tokens``.
"""

from __future__ import annotations

from typing import Any

import requests

from benchmarks.common import (
    Benchmark,
    Figures,
    Goal,
    Options,
    check,
    enqueue_args,
    run_module,
    say,
    sim_stats,
    stack,
    start_simulator,
    start_worker,
    workspace,
)
from benchmarks.prompts import write_prompts
from dflash_tasks.core.trainer_view import DEFAULT_TRAIN_MAX_LENGTH
from tests.helpers import read_records

FLAGS = ("--time-scale", "0.0005")


def run(opts: Options) -> tuple[Figures, dict[str, Any]]:
    samples = int(opts.get("samples", 100 if opts.quick else 400))
    max_tokens = int(opts.get("max_tokens", 2048))
    with workspace("continuation", opts) as work, stack(work) as (_, procs):
        inp, out = write_prompts(work / "prompts.jsonl", samples, size=256), work / "out"
        sim, _ = start_simulator(procs, "sim", *FLAGS)
        reference, _ = start_simulator(procs, "reference", *FLAGS)
        start_worker(procs, sim, "gpu0")
        procs.env["DFLASH_REPAIR_SPACING_SECONDS"] = "0.5"  # tokens are measured here, not time
        args = enqueue_args(inp, out, "--json", "--chunk-size", "32", "--max-tokens", str(max_tokens))
        args += ["--max-share", "truncated=1.0", "--max-share", "empty_answer=1.0"]
        procs.env["DFLASH_REPAIR_ROUNDS"] = "0"
        run_module(procs, "dflash_tasks.producer.enqueue", *args, "--wait")
        first = sim_stats(sim)["generation_tokens"]
        cut = [
            r for r in read_records(out) if r["finish_reason"] == "length" and not r["turns"][0]["content"]
        ]
        check(bool(cut), "no thought was cut: raise the simulator's output or lower --set max_tokens")
        del procs.env["DFLASH_REPAIR_ROUNDS"]
        run_module(procs, "dflash_tasks.producer.enqueue", *args, "--wait")
        continued = sim_stats(sim)["generation_tokens"] - first
        current = {r["id"]: r for r in read_records(out)}
        at_horizon = sum(current[r["id"]]["finish_reason"] == "length" for r in cut)
        horizon = [_tokens(reference, r, DEFAULT_TRAIN_MAX_LENGTH - r["usage"]["prompt_tokens"]) for r in cut]
        unlimited = [_tokens(reference, r, 30_000) for r in cut]
    figures: Figures = {
        "samples": float(samples),
        "cut_thoughts": float(len(cut)),
        "left_at_the_horizon": float(at_horizon),
        "first_pass_tokens": float(first),
        "continuation_tokens": float(continued),
        "regeneration_tokens_to_the_horizon": float(sum(horizon)),
        "regeneration_tokens_unlimited": float(sum(unlimited)),
        "continuation_share_of_regeneration": continued / sum(horizon),
    }
    say(f"{len(cut)} cut thoughts: {continued:,} tokens continued vs {sum(horizon):,} regenerated")
    return figures, {"max_tokens": max_tokens, "horizon": DEFAULT_TRAIN_MAX_LENGTH}


def _tokens(url: str, record: dict[str, Any], max_tokens: int) -> int:
    body = {"model": "m", "messages": record["turns"][0]["input"], "max_tokens": max_tokens}
    resp = requests.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    resp.raise_for_status()
    return int(resp.json()["usage"]["completion_tokens"])


def goals(opts: Options) -> list[Goal]:
    return [
        Goal(
            "continuation_share_of_regeneration",
            "<=",
            0.6,
            "tokens continued / tokens regenerated to the horizon",
        )
    ]


BENCHMARK = Benchmark("continuation", __doc__.splitlines()[0], run, goals)
