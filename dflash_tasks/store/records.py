"""Reading a job's output records, chunk by chunk, in input order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from dflash_tasks.core.job import Manifest, output_key
from dflash_tasks.store.base import Store


def iter_records(
    store: Store, manifest: Manifest, missing: list[int] | None = None
) -> Iterator[dict[str, Any]]:
    """Every stored record in input order; chunks not done yet are skipped (and listed in ``missing``)."""
    for chunk in range(manifest.chunks):
        try:
            data = store.read(output_key(chunk))
        except KeyError:
            if missing is not None:
                missing.append(chunk)
            continue
        for line in data.splitlines():
            if line.strip():
                yield json.loads(line)
