"""SpecForge's own preprocessing is the judge of our loss-token count, row by row.

Our export's rows (conversation and per-turn layouts; single-turn, multi-turn and truncated rows
written by the horizon rule; thinking on under ``qwen3.5``, off under ``qwen3-instruct``) are
counted by :class:`~dflash_tasks.core.loss_tokens.LossTokenCounter` and by SpecForge 0.2.0's
``preprocess_conversations`` (its registered template, ``max_length``, ``train_only_last_turn``
for per-turn rows), run in the SGLang environment (:mod:`tests.real_sglang.specforge_env`). The
loss-mask sums must be equal, row by row, and the manifest's total their sum.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.job import JOB_KEY, MANIFEST_KEY, GenerationSpec, JobDefinition, Manifest, output_key
from dflash_tasks.core.loss_tokens import LossTokenCounter, load_tokenizer
from dflash_tasks.core.quality import QualitySettings, with_checks
from dflash_tasks.core.record import Record
from dflash_tasks.core.row_planner import ExportOptions
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.output.export import export
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir
from dflash_tasks.store import LocalStore
from tests.real_sglang.env import EnvUnavailable
from tests.real_sglang.specforge_env import ensure_specforge

COUNT_SCRIPT = Path(__file__).with_name("specforge_count.py")
MAX_LENGTH = 160


@pytest.fixture(scope="module")
def specforge() -> tuple[Path, Path]:
    problem = ""
    try:
        return ensure_specforge()
    except EnvUnavailable as exc:
        problem = f"SpecForge's judge needs the SGLang environment: {exc}"
    pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_model_dir(tmp_path_factory.mktemp("models"), QWEN3_TEMPLATE))


def words(n: int) -> str:
    return " ".join(["beta gamma"] * n)


def turn(i: int, pairs: int, thinking: bool, cut: bool = False) -> dict[str, Any]:
    answer = words(pairs) if not thinking else "gamma delta alpha"
    return {
        "input": [{"role": "user", "content": f"alpha question {i}"}],
        "reasoning": words(pairs) if thinking else "",
        "content": "" if cut and thinking else answer,
        "finish_reason": "length" if cut else "stop",
        "usage": {"prompt_tokens": 5, "completion_tokens": 2 * pairs, "reasoning_tokens": 0},
        "status": "ok",
    }


def job(root: Path, model: str, thinking: bool) -> Path:
    def rec(sid: str, turns: list[dict[str, Any]], user_turns: int | None = None) -> dict[str, Any]:
        doc = {"id": sid, "user_turns": user_turns or len(turns), "turns": turns, "status": "ok"}
        doc["server"] = {"model_path": model}
        checked = with_checks(Record.from_dict(doc), thinking, QualitySettings())
        for t, read in zip(turns, checked.turns, strict=True):
            t["checks"] = list(read.checks or ())
        return {**doc, "checks": list(checked.checks or ())}

    records = [
        rec("single", [turn(1, 20, thinking)]),
        rec("long", [turn(1, 120, thinking)]),  # cut by max_length
        rec("cut", [turn(1, 200, thinking, cut=True)]),  # cut at max_tokens past the horizon
        rec("two", [turn(1, 15, thinking), turn(2, 25, thinking)]),
        rec("three", [turn(1, 10, thinking), turn(2, 12, thinking), turn(3, 150, thinking, cut=True)]),
    ]
    store = LocalStore(root)
    spec = GenerationSpec("m", thinking=thinking, chunk_size=5)
    store.write(JOB_KEY, JobDefinition.create("sha256:x", "in.jsonl", spec).to_json())
    store.write(MANIFEST_KEY, Manifest("j", 5, 5, 0, 5, 1).to_json())
    store.write(output_key(0), b"".join(json.dumps(r).encode() + b"\n" for r in records))
    return root


def specforge_sums(
    specforge: tuple[Path, Path], model: str, template: str, rows: list[dict[str, Any]], last: bool, tmp: Path
) -> list[int]:
    python, site = specforge
    request = tmp / "request.json"
    payload = [{"conversations": r["conversations"], "last_turn_only": last} for r in rows]
    request.write_text(
        json.dumps({"tokenizer": model, "template": template, "max_length": MAX_LENGTH, "rows": payload})
    )
    res = subprocess.run(
        [str(python), str(COUNT_SCRIPT), str(request)],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    sums: list[int] = json.loads(res.stdout.strip().splitlines()[-1])
    return sums


@pytest.mark.parametrize(("thinking", "template"), [(True, "qwen3.5"), (False, "qwen3-instruct")])
@pytest.mark.parametrize("layout", ["conversation", "per-turn"])
def test_our_count_equals_specforges_row_by_row(
    specforge: tuple[Path, Path], model: str, tmp_path: Path, thinking: bool, template: str, layout: str
) -> None:
    view = TrainerView(max_length=MAX_LENGTH, template=template)
    out = tmp_path / "train.jsonl"
    doc = export(
        str(job(tmp_path / "job", model, thinking)), out, "jsonl", ExportOptions(layout=layout), view
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert doc["layout"] == layout and len(rows) >= 5
    last = layout == "per-turn"
    counter = LossTokenCounter(load_tokenizer(model), replace(view, last_turn_only=last), thinking, model)
    ours = [counter.count(r["conversations"]).loss_tokens for r in rows]
    theirs = specforge_sums(specforge, model, template, rows, last, tmp_path)
    assert ours == theirs, list(zip([r["id"] for r in rows], ours, theirs, strict=True))
    assert doc["trainable_tokens"] == sum(theirs)
    assert min(theirs) > 0
    ids = [r["id"] for r in rows]
    assert (
        {"cut#turn0", "three#turn2"} <= set(ids) if last else {"cut", "three"} <= set(ids)
    )  # the horizon rule's rows
