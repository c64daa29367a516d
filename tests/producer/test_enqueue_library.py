"""``enqueue()`` as a library function: a typed options object in, a result out, notes through
the caller's ``say``, nothing printed; the command is a thin layer over it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.settings import ProducerSettings
from dflash_tasks.producer.enqueue import enqueue
from dflash_tasks.producer.enqueue import main as enqueue_main
from dflash_tasks.producer.enqueue_args import build_parser, options_from_args
from dflash_tasks.producer.enqueue_options import EnqueueOptions


def prompts(path: Path, n: int) -> Path:
    lines = [
        json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) for i in range(n)
    ]
    path.write_text("\n".join([*lines, "not json"]) + "\n")
    return path


def test_enqueue_takes_options_and_says_its_notes_without_printing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = prompts(tmp_path / "p.jsonl", 10)
    options = EnqueueOptions(
        inputs=(str(source),),
        output=str(tmp_path / "out"),
        spec=GenerationSpec(model="Qwen3-8B", chunk_size=4),
        dry_run=True,
    )
    notes: list[str] = []
    result = enqueue(options, ProducerSettings(), say=notes.append)
    assert (result.manifest.samples, result.manifest.chunks, result.manifest.invalid) == (10, 3, 1)
    assert result.enqueued == 0 and result.plan.pending == 3
    assert result.job.spec == options.spec
    assert any("invalid" in note for note in notes)  # the bad line, told to the caller
    assert capsys.readouterr() == ("", "")
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_the_flags_make_the_options_a_program_would_write(tmp_path: Path) -> None:
    argv = ["--input", "a.jsonl", "--input", "b.jsonl,weight=2", "--output", str(tmp_path), "--model", "M"]
    argv += ["--max-tokens", "512", "--no-preflight", "--wait", "--train-max-length", "1024"]
    options = options_from_args(build_parser().parse_args(argv))
    assert options.inputs == ("a.jsonl", "b.jsonl,weight=2")
    assert options.spec == GenerationSpec(model="M", max_tokens=512)
    assert (options.preflight, options.wait, options.dry_run) == (0, True, False)
    assert options.trainer.on().max_length == 1024


def test_the_command_and_the_function_plan_the_same_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = prompts(tmp_path / "p.jsonl", 7)
    out = str(tmp_path / "out")
    argv = ["--input", str(source), "--output", out, "--model", "Qwen3-8B", "--chunk-size", "2"]
    code = enqueue_main([*argv, "--dry-run", "--json"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    options = EnqueueOptions(
        (str(source),), out, GenerationSpec(model="Qwen3-8B", chunk_size=2), dry_run=True
    )
    result = enqueue(options, ProducerSettings(), say=lambda note: None)
    assert code == 0 and summary == result.summary()
