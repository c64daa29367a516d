"""The job's input: prompts in every accepted one-turn shape, with some malformed lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BAD_EVERY = 97


def write_input(path: Path, count: int) -> tuple[set[str], int]:
    """``count`` lines in every accepted one-turn shape, every ``BAD_EVERY``-th one malformed.

    Returns the ids of the valid samples and the number of bad lines.
    """
    bad_shapes = ['{"messages": [', '{"prompt": ""}', "[1, 2]", "not json at all"]
    ids: set[str] = set()
    bad = 0
    with open(path, "w") as fh:
        for i in range(count):
            if i % BAD_EVERY == BAD_EVERY - 1:
                fh.write(bad_shapes[bad % len(bad_shapes)] + "\n")
                bad += 1
                continue
            text = f"chaos question {i}: what is {i} * 7, and why?"
            sid = f"c{i}"
            shape = i % 3
            if shape == 0:
                doc: dict[str, Any] = {"id": sid, "messages": [{"role": "user", "content": text}]}
            elif shape == 1:
                doc = {"id": sid, "prompt": text}
            else:
                doc = {
                    "id": sid,
                    "conversations": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": text},
                    ],
                }
            ids.add(sid)
            fh.write(json.dumps(doc) + "\n")
    return ids, bad
