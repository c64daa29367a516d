"""The cost of counting loss tokens: rows shaped like the simulator's, counted under a chat template.

In-process, no services: ``rows`` records (default 2,000; ``--quick`` 400) whose turns are the
simulator's own output plans and filler text (lognormal lengths, mean 2,300 tokens, a tenth of
them three-turn conversations) are counted by :class:`~dflash_tasks.core.trainable.TrainableTally`
(batches tokenized on every core) with the tiny Qwen3-style tokenizer the tests build
(``dflash_tasks/sim/tokenizer.py``: one token per word the simulator writes, as the simulator counts
them; the figures in docs/performance.md were taken with its earlier 400-token BPE, whose rows had
about 2.3 times the tokens). Figures: milliseconds per sample (wall and CPU), with one row at a time
(:meth:`LossTokenCounter.count`) for comparison, and the tokens per row.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Benchmark, Figures, Goal, Options, say
from dflash_tasks.core.loss_tokens import LossTokenCounter, load_tokenizer, row_messages
from dflash_tasks.core.record import Record
from dflash_tasks.core.trainable import TrainableTally
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.sim.textgen import plan_output, render_raw, split_reasoning, truncate
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir


def sim_record(i: int, model_path: str) -> Record:
    rng = random.Random(i)
    turns = []
    for t in range(3 if i % 10 == 0 else 1):
        plan = truncate(plan_output(rng, True, 2300, 0.6, 0.9), 4096, "length")
        reasoning, content = split_reasoning(render_raw(rng, plan), False)
        turns.append(
            {
                "input": [{"role": "user", "content": f"prompt {i} turn {t}"}],
                "reasoning": reasoning or "",
                "content": content or "answer",
                "finish_reason": "stop",
                "status": "ok",
            }
        )
    return Record.from_dict(
        {"id": f"s{i}", "turns": turns, "status": "ok", "server": {"model_path": model_path}, "checks": []}
    )


def run(opts: Options) -> tuple[Figures, dict[str, Any]]:
    rows = int(opts.get("rows", 400 if opts.quick else 2000))
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_model_dir(Path(tmp), QWEN3_TEMPLATE))
        records = [sim_record(i, model) for i in range(rows)]
        loaded = time.perf_counter()
        load_tokenizer(model)
        load_s = time.perf_counter() - loaded
        tally = TrainableTally(TrainerView(), True, 64)
        tally.add(records[0])  # picks and loads the tokenizer: not part of the per-sample cost
        wall, cpu = time.perf_counter(), time.process_time()
        for record in records[1:]:
            tally.add(record)
        summary = tally.summary
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert summary is not None and summary.samples == rows
        counter = LossTokenCounter(load_tokenizer(model), TrainerView(), True, model)
        sample = [row_messages(r) for r in records[: max(1, rows // 4)]]
        one = time.perf_counter()
        tokens = [counter.count(messages).tokens for messages in sample]
        one = time.perf_counter() - one
    figures: Figures = {
        "rows": float(rows),
        "ms_per_sample": 1000 * wall / (rows - 1),
        "cpu_ms_per_sample": 1000 * cpu / (rows - 1),
        "ms_per_sample_one_at_a_time": 1000 * one / len(sample),
        "tokens_per_row": sum(tokens) / len(tokens),
        "loss_tokens_per_row": summary.total / summary.samples,
        "tokenizer_load_s": load_s,
    }
    say(
        f"{figures['ms_per_sample']:.2f} ms per sample batched, "
        f"{figures['ms_per_sample_one_at_a_time']:.2f} ms one at a time, "
        f"{figures['tokens_per_row']:,.0f} tokens per row"
    )
    return figures, {"summary": summary.to_dict()}


def goals(opts: Options) -> list[Goal]:
    return [Goal("ms_per_sample", "<=", 20, "milliseconds to count one sample's loss tokens")]


BENCHMARK = Benchmark("loss_tokens", __doc__.splitlines()[0], run, goals)
