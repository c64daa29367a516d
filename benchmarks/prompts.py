"""Synthetic prompt files: about 1 KB per line, the shapes real inputs use, generated once and cached."""

from __future__ import annotations

import json
import os
import random
import shutil
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


#: The input formats :func:`cached_chat_formats` writes, by the name the inputs benchmark gives them.
CHAT_FORMATS = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet", "arrow")


def cached_chat_formats(count: int, size: int = 1024, shard_rows: int = 250_000) -> dict[str, Path]:
    """The same ``count`` chat prompts (``{"id", "messages"}``, the Hub's usual shape) in every
    format of :data:`CHAT_FORMATS`, in ``benchmarks/.cache/``, generated on first use: one JSONL
    file plain, gzipped and zstd-compressed; Parquet shards of ``shard_rows`` rows (one row group
    each, as ``pyarrow`` writes them by default); Arrow IPC stream shards of 1,000-row batches
    (what a ``save_to_disk`` folder holds)."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    base = CACHE_DIR / f"chat-{count}-{size}"
    paths = {
        "jsonl": base.with_name(base.name + ".jsonl"),
        "jsonl.gz": base.with_name(base.name + ".jsonl.gz"),
        "jsonl.zst": base.with_name(base.name + ".jsonl.zst"),
        "parquet": base.with_name(base.name + "-parquet"),
        "arrow": base.with_name(base.name + "-arrow"),
    }
    if all(p.exists() for p in paths.values()):
        return paths
    say(f"generating {count:,} chat prompts in {len(paths)} formats into {CACHE_DIR} (once) ...")
    sentences = _sentences(random.Random(0), 2000)
    tmp = {k: p.with_name(f".{p.name}.tmp-{os.getpid()}") for k, p in paths.items()}
    tmp["parquet"].mkdir(parents=True)
    tmp["arrow"].mkdir(parents=True)
    with (
        open(tmp["jsonl"], "wb", buffering=1 << 20) as plain,
        gzip.open(tmp["jsonl.gz"], "wb", compresslevel=6) as gz,
        pa.output_stream(str(tmp["jsonl.zst"]), compression="zstd") as zst,
    ):
        for first in range(0, count, shard_rows):
            rows = [
                {"id": f"s{i}", "messages": [{"role": "user", "content": _prompt_text(i, sentences, size)}]}
                for i in range(first, min(count, first + shard_rows))
            ]
            text = "".join(json.dumps(r) + "\n" for r in rows).encode()
            for fh in (plain, gz, zst):
                fh.write(text)
            table = pa.Table.from_pylist(rows)
            shard = f"train-{first // shard_rows:05d}"
            pq.write_table(table, tmp["parquet"] / f"{shard}.parquet")
            with pa.ipc.new_stream(str(tmp["arrow"] / f"{shard}.arrow"), table.schema) as writer:
                writer.write_table(table, max_chunksize=1000)
    for key, path in paths.items():
        if path.is_dir():  # an older cache's copy of this format
            shutil.rmtree(path)
        os.replace(tmp[key], path)
    return paths
