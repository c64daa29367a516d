"""Reading a job's files from its store: the definition, the manifest and which chunks are done."""

from __future__ import annotations

from dflash_tasks.core.job import (
    JOB_KEY,
    MANIFEST_KEY,
    OUTPUTS_PREFIX,
    JobDefinition,
    Manifest,
    parse_chunk_key,
)
from dflash_tasks.store.base import Store


def done_chunks(store: Store) -> set[int]:
    """Chunks whose completions exist: one listing of ``outputs/``."""
    found = (parse_chunk_key(k) for k in store.list(OUTPUTS_PREFIX))
    return {c for c in found if c is not None}


def load_job(store: Store) -> JobDefinition | None:
    """The job at this output root, or None when the root holds none yet."""
    try:
        data = store.read(JOB_KEY)
    except KeyError:
        return None
    return JobDefinition.from_json(data, f"{store.uri}/{JOB_KEY}")


def load_manifest(store: Store) -> Manifest | None:
    try:
        data = store.read(MANIFEST_KEY)
    except KeyError:
        return None
    return Manifest.from_json(data, f"{store.uri}/{MANIFEST_KEY}")
