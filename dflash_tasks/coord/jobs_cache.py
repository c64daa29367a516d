"""Resolving a job id (all a task message carries) to its store, definition and manifest."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.core.errors import DflashError, StoreError
from dflash_tasks.core.job import JobDefinition, Manifest
from dflash_tasks.core.settings import CommonSettings
from dflash_tasks.store import Store, open_store
from dflash_tasks.store.jobfiles import load_job, load_manifest


@dataclass(frozen=True, slots=True)
class JobHandle:
    definition: JobDefinition
    manifest: Manifest
    store: Store
    output: str = ""  # the registered location it was opened from


class UnknownJob(StoreError):
    """A message names a job that is not registered (e.g. Redis was flushed); re-running enqueue fixes it."""


class UnknownChunk(UnknownJob):
    """A message names a chunk its job does not have (a hand-made or corrupted message): dropped."""


class JobCache:
    """Job handles by id, read once per worker process and output location."""

    def __init__(self, bookkeeping: Bookkeeping, settings: CommonSettings | None = None) -> None:
        self._bk = bookkeeping
        self._settings = settings  # for the S3 endpoint of s3:// outputs
        self._jobs: dict[str, JobHandle] = {}
        self._lock = threading.Lock()

    def get(self, job_id: str) -> JobHandle:
        """The job's handle; opened again when the registry names another output than the cached one.

        The same input and settings make the same job id, so a finished job may be enqueued again
        into a new output: the registry then names the new output, and chunks must go there. While
        the registry entry is missing (lost with Redis) or unreadable, a cached handle still serves.
        """
        with self._lock:
            handle = self._jobs.get(job_id)
        try:
            output = self._bk.job_info(job_id).get("output")
        except DflashError:
            if handle is not None:
                return handle
            raise
        if handle is not None and (not output or output == handle.output):
            return handle
        if not output:
            raise UnknownJob(f"job {job_id} is not registered in Redis; re-run enqueue to register it")
        store = open_store(output, self._settings)
        definition, manifest = load_job(store), load_manifest(store)
        if definition is None or manifest is None or definition.job_id != job_id:
            raise UnknownJob(f"{output} does not hold a staged job {job_id}")
        handle = JobHandle(definition, manifest, store, output)
        with self._lock:
            self._jobs[job_id] = handle
        return handle
