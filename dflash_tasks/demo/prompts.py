"""The demo's prompt file: valid prompts in every accepted format, and a few malformed lines
(each run's ids carry a fresh tag, so every run is a new job)."""

from __future__ import annotations

import json
import random
import secrets
import time
from pathlib import Path
from typing import Any

from dflash_tasks.producer.inputs import InvalidLine
from dflash_tasks.producer.mix import read_input

_TOPICS = (
    "binary search",
    "the CAP theorem",
    "photosynthesis",
    "TCP congestion control",
    "Bayes' rule",
    "the Fourier transform",
    "garbage collection",
    "plate tectonics",
    "public-key cryptography",
    "the halting problem",
    "supply and demand",
    "CRISPR",
    "gradient descent",
    "black holes",
    "consistent hashing",
    "the French Revolution",
    "eigenvalues",
    "Raft consensus",
    "enzymes",
)
_ASKS = (
    "Explain {t} to a first-year student, step by step.",
    "What is a common misconception about {t}? Reason it through.",
    "Write three exam questions about {t}, each with a worked answer.",
    "Compare {t} with a related idea and say when each applies.",
    "Summarize {t} in five bullet points, then give one example.",
)
_SYSTEM = "You are a careful assistant. Think before you answer."


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(12, 999), rng.randint(12, 999), rng.randint(2, 99)
    return f"Compute ({a} * {b}) mod {c} and show your reasoning."


def _question(rng: random.Random) -> str:
    if rng.random() < 0.25:
        return _math(rng)
    return rng.choice(_ASKS).format(t=rng.choice(_TOPICS))


def _record(i: int, tag: str, rng: random.Random) -> dict[str, Any]:
    """One well-formed line; the format cycles through every accepted shape."""
    q = _question(rng)
    sid = f"demo-{tag}-{i:06d}"
    kind = i % 6
    if kind == 0:
        return {
            "id": sid,
            "messages": [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": q}],
        }
    if kind == 1:
        parts = [{"type": "text", "text": q}, {"type": "text", "text": "Keep it short."}]
        return {"id": sid, "messages": [{"role": "user", "content": parts}]}
    if kind == 2:
        turns = [
            {"from": "human", "value": _question(rng)},
            {"from": "gpt", "value": "(an earlier answer)"},
            {"from": "human", "value": q},
            {"from": "gpt", "value": "(the answer to regenerate)"},
        ]
        return {"id": sid, "conversations": turns}
    if kind == 3:
        return {"id": sid, "conversations": [{"role": "user", "content": q}]}
    if kind == 4:
        return {"id": i, "prompt": q}  # an integer id
    return {"prompt": f"[{tag}] {q}"}  # no id: named after its line


_MALFORMED = (
    '{"prompt": "an unterminated line',
    "[1, 2, 3]",
    "{}",
    '{"prompt": 42}',
    '{"messages": []}',
    '{"messages": [{"role": "assistant", "content": "only an answer"}]}',
    '{"conversations": [{"from": "human"}]}',
    '{"messages": [{"role": "wizard", "content": "an unknown role"}]}',
)


def write_prompts(path: Path, count: int, seed: int) -> tuple[int, int]:
    """Write ``count`` valid prompts with the malformed lines spread among them.

    Every run gets a fresh tag in its ids, so the file (and so the job) is new each time.
    Returns (valid, invalid) as counted by the real reader.
    """
    rng = random.Random(seed)
    tag = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(2)}"
    lines = [json.dumps(_record(i, tag, rng)) for i in range(count)]
    dup = next(line for line in lines if '"id": "demo-' in line)
    extra = [*_MALFORMED, dup]  # a duplicate id
    for bad in extra:
        lines.insert(rng.randint(0, len(lines)), bad)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    invalid = sum(1 for item in read_input(path) if isinstance(item, InvalidLine))
    return len(lines) - invalid, invalid
