"""``python -m benchmarks yield``: how much of what the servers generate the trainer learns from.

In-process, no services. A demo-sized mixed job (``samples``, default 3,000; ``--quick`` 600; a
quarter of them conversations of two or three turns) is generated against the tiny Qwen3-style
tokenizer the tests build (``dflash_tasks/sim/tokenizer.py``): each turn's output is the simulator's
words, a lognormal thought (mean ``mean_tokens`` 2,000 tokens, so about a tenth of the samples
runs past ``max_tokens`` 4,096) and a short answer, cut at the request's budget. The output is exported
three ways and counted under SpecForge's ``qwen3.5`` template at ``max_length`` 4,096:

* ``old``: the previous defaults (``--layout conversation --mode validator``, ``max_tokens`` 4,096);
* ``new``: today's defaults (``--layout auto --mode trainer``: per-turn rows, the horizon rule);
* ``new_horizon_budget``: today's defaults with ``--max-tokens horizon``: each request's budget
  computed as the worker computes it (:class:`workers.generate.request_budget.HorizonBudget`: ``max_length``
  less the row's prefix under the trainer's template, plus its closing tokens);
* ``new_horizon_last_turn``: a variant the worker does not implement, measured for comparison: the
  horizon for each sample's last turn only, ``max_length`` for the turns before it (whose answers
  the later turns need: a turn cut at its horizon ends the conversation there);
* ``new_budget_8192`` and ``new_budget_32768``: today's defaults at those fixed budgets (SpecForge's
  regeneration recipe uses 32,768), the same samples drawn.

Figures per way: generated tokens, trainable tokens (our count), the yield, the cost per million
trainable tokens at ``usd_per_m_generated`` (default $1 per million generated tokens), and, where
SpecForge's environment is at hand (``tests/real_sglang/specforge_env.py``; ``specforge=0`` skips
it), SpecForge's own count of the same rows and our count's deviation from it.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import Benchmark, Figures, Goal, Options, say
from dflash_tasks.core.budget import HORIZON
from dflash_tasks.core.job import JOB_KEY, MANIFEST_KEY, GenerationSpec, JobDefinition, Manifest, output_key
from dflash_tasks.core.loss_tokens import load_tokenizer
from dflash_tasks.core.quality import QualitySettings, with_checks
from dflash_tasks.core.record import Record, Turn, encode_records
from dflash_tasks.core.row_planner import ExportOptions
from dflash_tasks.core.states import RecordStatus
from dflash_tasks.core.trainable import counter_for, earlier_turns_trained
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.output.export import export
from dflash_tasks.sim.textgen import _ANSWER_TEXT, _REASONING_TEXT
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir
from dflash_tasks.store import LocalStore
from workers.generate.request_budget import HorizonBudget

MAX_LENGTH = 4096
TEMPLATE = "qwen3.5"
CHUNK = 500
_REASONING_WORDS = _REASONING_TEXT.split()
_ANSWER_WORDS = _ANSWER_TEXT.split()


class Generator:
    """A stand-in server on the tiny tokenizer: a drawn thought and answer, cut at the budget."""

    def __init__(self, model: str, mean_tokens: float) -> None:
        self.tokenizer = load_tokenizer(model)
        self.mean = mean_tokens
        self._tpw = len(self._ids(" ".join(_REASONING_WORDS * 4))) / (4 * len(_REASONING_WORDS))

    def _ids(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=True
        )
        return len(self._ids(str(text)))  # the row adds "<think>\n": the cut falls 2 tokens in

    def turn(self, rng: random.Random, budget: int) -> tuple[str, str, int, str]:
        """(reasoning, content, completion tokens, finish reason) of one request."""
        sigma = 0.7
        target = max(16, round(rng.lognormvariate(math.log(self.mean) - sigma**2 / 2, sigma)))
        words = rng.choices(_REASONING_WORDS, k=math.ceil(target / self._tpw * 1.2) + 4)
        thought = self._ids(" ".join(words))[:target]
        answer = self._ids("\n</think>\n\n" + " ".join(rng.choices(_ANSWER_WORDS, k=rng.randint(20, 80))))
        full = thought + answer + [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        out = full[:budget]
        text = self.tokenizer.decode(out, skip_special_tokens=False).replace("<|im_end|>", "")
        reasoning, _, content = text.partition("</think>")
        return reasoning.strip(), content.lstrip("\n"), len(out), "length" if len(out) < len(full) else "stop"


def horizon_of(model: str, view: TrainerView) -> HorizonBudget:
    """The worker's per-request budget for this job (the tokenizer, the trainer's template)."""
    counter, _ = counter_for(replace(view, tokenizer=model), True, None)
    assert counter is not None
    return HorizonBudget(counter, not earlier_turns_trained(counter), view.max_length)


def make_records(
    gen: Generator, samples: int, model: str, budget: int | HorizonBudget, last_turn_only: bool = False
) -> list[Record]:
    """The job's records, each request cut at ``budget`` (``last_turn_only``: a horizon for the last
    turn, ``MAX_LENGTH`` before it)."""
    records = []
    for i in range(samples):
        rng = random.Random(i)  # the same samples and lengths for every way
        turns: list[dict[str, Any]] = []
        history: list[dict[str, Any]] = []  # the request's messages
        inputs: list[list[dict[str, Any]]] = []
        answered: list[Turn] = []
        count = rng.choice((2, 3)) if i % 4 == 0 else 1
        for t in range(count):
            user = {"role": "user", "content": f"alpha question {i} turn {t}"}
            history.append(user)
            inputs.append([user])
            if isinstance(budget, int):
                limit = budget
            else:
                limit = MAX_LENGTH if last_turn_only and t < count - 1 else budget(inputs, answered)
            reasoning, content, tokens, finish = gen.turn(rng, limit)
            turns.append(
                {
                    "input": [user],
                    "reasoning": reasoning,
                    "content": content,
                    "finish_reason": finish,
                    "usage": {
                        "prompt_tokens": gen.prompt_tokens(history),
                        "completion_tokens": tokens,
                        "reasoning_tokens": 0,
                    },
                    "status": "ok",
                }
            )
            if finish == "length":
                break
            answered.append(Turn(input=(user,), reasoning=reasoning, content=content, status=RecordStatus.OK))
            history.append({"role": "assistant", "content": content})
        doc = {"id": f"s{i}", "user_turns": len(turns), "turns": turns, "status": "ok"}
        doc["server"] = {"model_path": model}
        records.append(with_checks(Record.from_dict(doc), True, QualitySettings()))
    return records


def write_job(root: Path, records: list[Record]) -> None:
    store = LocalStore(root)
    spec = GenerationSpec("m", chunk_size=CHUNK)
    store.write(JOB_KEY, JobDefinition.create("sha256:bench", "in.jsonl", spec).to_json())
    chunks = math.ceil(len(records) / CHUNK)
    store.write(MANIFEST_KEY, Manifest("j", len(records), len(records), 0, CHUNK, chunks).to_json())
    for c in range(chunks):
        store.write(output_key(c), encode_records(records[c * CHUNK : (c + 1) * CHUNK]))


def specforge_total(rows_path: Path, model: str, last_turn_only: bool, tmp: Path) -> int | None:
    """SpecForge's loss-mask sum over the exported rows, or None without its environment."""
    try:
        from tests.real_sglang.env import EnvUnavailable
        from tests.real_sglang.specforge_env import ensure_specforge

        python, site = ensure_specforge()
    except (ImportError, EnvUnavailable) as exc:
        say(f"SpecForge's count skipped: {exc}")
        return None
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    request = tmp / "specforge-request.json"
    payload = [{"conversations": r["conversations"], "last_turn_only": last_turn_only} for r in rows]
    doc = {"tokenizer": model, "template": TEMPLATE, "max_length": MAX_LENGTH, "rows": payload}
    request.write_text(json.dumps(doc))
    script = Path(__file__).resolve().parents[1] / "tests" / "real_sglang" / "specforge_count.py"
    res = subprocess.run(
        [str(python), str(script), str(request)],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=3600,
        check=True,
    )
    sums: list[int] = json.loads(res.stdout.strip().splitlines()[-1])
    return sum(sums)


LAST_TURN = "horizon for the last turn"
#: Each way: the export's options and the budget (tokens, "horizon", or :data:`LAST_TURN`).
WAYS: dict[str, tuple[ExportOptions, int | str]] = {
    "old": (ExportOptions(layout="conversation", mode="validator"), MAX_LENGTH),
    "new": (ExportOptions(), MAX_LENGTH),
    "new_horizon_budget": (ExportOptions(), HORIZON),
    "new_horizon_last_turn": (ExportOptions(), LAST_TURN),
    "new_budget_8192": (ExportOptions(), 8192),
    "new_budget_32768": (ExportOptions(), 32768),
}


def run(opts: Options) -> tuple[Figures, dict[str, Any]]:
    samples = int(opts.get("samples", 600 if opts.quick else 3000))
    usd = opts.get("usd_per_m_generated", 1.0)
    judge = bool(opts.get("specforge", 1))
    figures: Figures = {"samples": float(samples)}
    details: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model = str(build_model_dir(tmp, QWEN3_TEMPLATE))
        gen = Generator(model, opts.get("mean_tokens", 2000))
        view = TrainerView(max_length=MAX_LENGTH, template=TEMPLATE)
        made: dict[int | str, Path] = {}
        for way, (options, budget) in WAYS.items():
            if budget not in made:
                made[budget] = tmp / f"job-{way}"
                horizon = budget in (HORIZON, LAST_TURN)
                per_request = horizon_of(model, view) if horizon else int(budget)
                write_job(made[budget], make_records(gen, samples, model, per_request, budget == LAST_TURN))
            out = tmp / f"{way}.jsonl"
            doc = export(str(made[budget]), out, "jsonl", options, view)
            y = doc["yield"]
            ratio = y["yield"] or 0.0
            figures[f"{way}_generated_tokens"] = float(y["generated_tokens"])
            figures[f"{way}_trainable_tokens"] = float(y["trainable_tokens"])
            figures[f"{way}_yield"] = ratio
            figures[f"{way}_usd_per_m_trainable"] = usd / ratio if ratio else float("inf")
            details[way] = {"layout": doc["layout"], "mode": doc["mode"], "dropped": doc["dropped"], **y}
            if judge:
                theirs = specforge_total(out, model, doc["layout"] == "per-turn", tmp)
                if theirs is not None:
                    figures[f"{way}_specforge_trainable_tokens"] = float(theirs)
                    figures[f"{way}_specforge_yield"] = theirs / y["generated_tokens"]
                    figures[f"{way}_count_deviation"] = abs(y["trainable_tokens"] - theirs) / max(theirs, 1)
            say(f"{way}: yield {ratio:.3f} ({y['trainable_tokens']:,} of {y['generated_tokens']:,})")
    return figures, details


def goals(opts: Options) -> list[Goal]:
    out = [Goal("new_yield", ">=", 0.95, "trainable share of generated tokens, default settings")]
    if bool(opts.get("specforge", 1)):
        out += [
            Goal("new_specforge_yield", ">=", 0.95, "the same, counted by SpecForge's preprocessing"),
            Goal("new_count_deviation", "<=", 0.01, "our count against SpecForge's"),
        ]
    return out


BENCHMARK = Benchmark("yield", __doc__.splitlines()[0], run, goals)
