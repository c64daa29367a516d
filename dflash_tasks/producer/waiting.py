"""``enqueue --wait``: the progress bar until every chunk is stored, re-planning now and then.

A Redis loss heals itself here: every ``replan_seconds`` the job is re-planned from the store and
what is neither stored, running nor queued is queued again.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Mapping

from celery import Celery

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.celery_app import app as celery_app
from dflash_tasks.coord.celery_app import configure
from dflash_tasks.coord.planner import queue_missing
from dflash_tasks.core.errors import DflashError
from dflash_tasks.core.job import (
    JobDefinition,
    Manifest,
)
from dflash_tasks.core.settings import ProgressSettings
from dflash_tasks.core.states import JobState
from dflash_tasks.monitoring.progress_bar import ProgressBar, live_rates
from dflash_tasks.monitoring.progress_writer import ProgressWriter
from dflash_tasks.producer.serving import ServingWatch
from dflash_tasks.store import Store, open_store
from dflash_tasks.store.jobfiles import done_chunks

log = logging.getLogger(__name__)


def wait_for_job(
    job: JobDefinition, manifest: Manifest, output: str, replan_seconds: float, settings: ProgressSettings
) -> bool:
    """Show progress until every chunk is stored; re-plan now and then (a Redis loss heals itself).

    Returns False when the job is paused by the live quality gate, or when every chunk not done
    is parked after repeated failures.
    """
    store = open_store(output, settings)
    bk = Bookkeeping.from_url(settings.broker_url, settings.redis_prefix)
    app = configure(celery_app, settings)
    bar = ProgressBar(manifest.samples)
    job_id = job.job_id
    last_replan = time.monotonic()
    progress = ProgressWriter(
        bk, f"enqueue@{socket.gethostname()}/{os.getpid()}", settings.progress_seconds, settings.queue
    )
    watch = ServingWatch(bk, job.spec.model, newline=True)
    done: set[int] = set()
    listed = float("-inf")
    try:
        while True:
            # The store is the truth, but listing it (on S3, a page per 1,000 chunks) every second
            # is waste: between listings, Redis's done set (filled as chunks are stored) drives the
            # bar, and the store is listed every 30 s or as soon as that set says the job is done.
            try:
                counted: int | None = bk.done_count(job_id)
            except DflashError:
                counted = None
            now = time.monotonic()
            if counted is None or counted >= manifest.chunks or now - listed >= 30.0:
                done = {c for c in done_chunks(store) if c < manifest.chunks}
                listed = now
                samples = sum(manifest.chunk_samples(c) for c in done)
            else:
                samples = min(manifest.samples, max(counted, len(done)) * manifest.chunk_size)
            try:
                samples_s, tokens_s = live_rates(bk, job_id)
                state, reason = bk.job_state(job_id)
                parked = bk.parked(job_id)
            except DflashError:
                samples_s, tokens_s, state, reason, parked = 0.0, 0.0, JobState.RUNNING, "", {}
            bar.update(samples, samples_s, tokens_s, force=len(done) >= manifest.chunks)
            _write_progress(progress, job, manifest, store, final=len(done) >= manifest.chunks)
            if len(done) >= manifest.chunks:
                return True
            watch.poll()
            if _stopped(state, reason, parked, done, manifest.chunks, output, bar):
                return False
            if time.monotonic() - last_replan >= replan_seconds:
                last_replan = time.monotonic()
                _replan(store, bk, app, settings, job, manifest.chunks, parked)
            time.sleep(1.0)
    finally:
        bar.close()


def _stopped(
    state: JobState,
    reason: str,
    parked: Mapping[int, str],
    done: set[int],
    chunks: int,
    output: str,
    bar: ProgressBar,
) -> bool:
    """Whether the wait ends unfinished, and why (the bar closed first), to stderr: the job is
    paused, or every chunk not done is parked after repeated failures."""
    if state == JobState.PAUSED:
        bar.close()
        print(f"job paused: {reason}", file=sys.stderr)
    elif parked and len(done | set(parked)) >= chunks:
        bar.close()
        print(f"{len(parked)} chunks keep failing and are parked:", file=sys.stderr)
        for chunk, why in sorted(parked.items())[:10]:
            print(f"  chunk {chunk}: {why}", file=sys.stderr)
    else:
        return False
    print(f"fix the cause, then: python -m dflash_tasks.resume --output {output}", file=sys.stderr)
    return True


def _replan(
    store: Store,
    bk: Bookkeeping,
    app: Celery,
    settings: ProgressSettings,
    job: JobDefinition,
    chunks: int,
    parked: Mapping[int, str],
) -> None:
    """Queue what is neither done, running, queued nor parked (a lost message, a wiped Redis)."""
    try:
        _, sent = queue_missing(store, bk, app, settings, job.job_id, chunks, job.spec.model, exclude=parked)
        if sent:
            print(f"\nre-queued {sent} chunks that were neither queued nor running", file=sys.stderr)
    except DflashError as exc:
        print(f"\nre-plan failed (will retry): {exc}", file=sys.stderr)


def _write_progress(
    writer: ProgressWriter, job: JobDefinition, manifest: Manifest, store: Store, final: bool
) -> None:
    """progress.json: when no other process wrote it this period, and always once the job is done."""
    try:
        if final:
            writer.write(job.job_id, store, manifest, job)
        else:
            writer.write_if_due(job.job_id, store, manifest, job)
    except DflashError as exc:  # the workers write it too
        log.debug("progress.json not written: %s", exc)
