"""Resolving a job id (all a task message carries) to its store, definition and manifest."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from dflash_tasks.bookkeeping import Bookkeeping
from dflash_tasks.errors import StoreError
from dflash_tasks.job import JobDefinition, Manifest, load_job, load_manifest
from dflash_tasks.settings import Settings
from dflash_tasks.store import Store, open_store


@dataclass(frozen=True, slots=True)
class JobHandle:
    definition: JobDefinition
    manifest: Manifest
    store: Store


class UnknownJob(StoreError):
    """A message names a job that is not registered (e.g. Redis was flushed); re-running enqueue fixes it."""


class JobCache:
    """Job handles by id, read once per worker process."""

    def __init__(self, bookkeeping: Bookkeeping, settings: Settings | None = None) -> None:
        self._bk = bookkeeping
        self._settings = settings  # for the S3 endpoint of s3:// outputs
        self._jobs: dict[str, JobHandle] = {}
        self._lock = threading.Lock()

    def get(self, job_id: str) -> JobHandle:
        with self._lock:
            handle = self._jobs.get(job_id)
        if handle is not None:
            return handle
        output = self._bk.job_info(job_id).get("output")
        if not output:
            raise UnknownJob(f"job {job_id} is not registered in Redis; re-run enqueue to register it")
        store = open_store(output, self._settings)
        definition, manifest = load_job(store), load_manifest(store)
        if definition is None or manifest is None or definition.job_id != job_id:
            raise UnknownJob(f"{output} does not hold a staged job {job_id}")
        handle = JobHandle(definition, manifest, store)
        with self._lock:
            self._jobs[job_id] = handle
        return handle
