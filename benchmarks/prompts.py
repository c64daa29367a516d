"""Synthetic prompt files: about 1 KB per line, the shapes real inputs use, generated once and cached."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from benchmarks.common import CACHE_DIR, say

_TEXT = (
    "prove that the sum of integers function graph matrix vector compute derive explain why "
    "consider a sequence where each term equals twice previous minus one find closed form "
    "probability random variable expected value distribution triangle circle radius angle "
    "python code algorithm complexity sort array string parse tree recursion dynamic program"
)
_WORDS = _TEXT.split()


def _sentences(rng: random.Random, count: int) -> list[str]:
    return [" ".join(rng.choices(_WORDS, k=rng.randint(8, 20))).capitalize() + "." for _ in range(count)]


def _prompt_text(i: int, sentences: list[str], size: int) -> str:
    parts = [f"Problem {i}:"]
    n = len(sentences)
    j = i
    length = 12
    while length < size - 80:
        sentence = sentences[(j * 7919 + length) % n]
        parts.append(sentence)
        length += len(sentence) + 1
        j += 1
    return " ".join(parts)


def line(i: int, sentences: list[str], size: int) -> str:
    """Prompt ``i`` as one JSONL line of about ``size`` bytes, in one of four input shapes."""
    text = _prompt_text(i, sentences, size)
    shape = i % 4
    doc: dict[str, object]
    if shape == 0:
        doc = {"id": f"s{i}", "messages": [{"role": "user", "content": text}]}
    elif shape == 1:
        doc = {"id": i, "conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "x"}]}
    elif shape == 2:
        doc = {
            "messages": [
                {"role": "system", "content": "Think step by step."},
                {"role": "user", "content": text},
            ]
        }
    else:
        doc = {"prompt": text}
    return json.dumps(doc)


def prompt_line(i: int, size: int = 1024, seed: int = 0) -> str:
    """Line ``i`` of :func:`write_prompts`'s file, alone."""
    return line(i, _sentences(random.Random(seed), 2000), size)


def write_prompts(path: Path, count: int, size: int = 1024, seed: int = 0) -> Path:
    """Write ``count`` prompts to ``path`` (atomically); returns ``path``."""
    sentences = _sentences(random.Random(seed), 2000)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", buffering=1 << 20) as fh:
        for i in range(count):
            fh.write(line(i, sentences, size) + "\n")
    os.replace(tmp, path)
    return path


def cached_prompts(count: int, size: int = 1024) -> Path:
    """``benchmarks/.cache/prompts-<count>-<size>.jsonl``, generated on first use."""
    path = CACHE_DIR / f"prompts-{count}-{size}.jsonl"
    if not path.exists():
        say(f"generating {count:,} synthetic prompts of ~{size} bytes into {path} (once) ...")
        write_prompts(path, count, size)
    return path


def cached_chat_inputs(count: int, size: int = 1024, shard_rows: int = 250_000) -> tuple[Path, Path]:
    """The same ``count`` chat prompts (``{"id", "messages"}``, the Hub's usual shape) as one JSONL
    file and as a folder of Parquet shards, in ``benchmarks/.cache/``, generated on first use."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = CACHE_DIR / f"chat-{count}-{size}.jsonl"
    shards = CACHE_DIR / f"chat-{count}-{size}-parquet"
    if jsonl.exists() and shards.exists():
        return jsonl, shards
    say(f"generating {count:,} chat prompts as JSONL and Parquet shards into {CACHE_DIR} (once) ...")
    sentences = _sentences(random.Random(0), 2000)
    tmp = shards.with_name(f".{shards.name}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True)
    with open(jsonl.with_name(f".{jsonl.name}.tmp"), "w", buffering=1 << 20) as fh:
        for first in range(0, count, shard_rows):
            rows = [
                {"id": f"s{i}", "messages": [{"role": "user", "content": _prompt_text(i, sentences, size)}]}
                for i in range(first, min(count, first + shard_rows))
            ]
            fh.writelines(json.dumps(r) + "\n" for r in rows)
            pq.write_table(pa.Table.from_pylist(rows), tmp / f"train-{first // shard_rows:05d}.parquet")
    os.replace(jsonl.with_name(f".{jsonl.name}.tmp"), jsonl)
    os.replace(tmp, shards)
    return jsonl, shards
