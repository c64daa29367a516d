"""The output store failing while chunks are written: a full disk, S3 refusing writes.

A failed write leaves nothing behind (a local write goes to a temp file linked into place; an
S3 object is one PUT) and the chunk is not marked done. A transient failure (a full disk, S3 5xx
past botocore's retries) is retried in place with the chunk's lease held, for
``DFLASH_STORE_RETRY_SECONDS`` (300 s), so the generated records are kept; a permanent one (a
read-only folder, S3 403), or one lasting longer, puts the chunk back on the queue with a backoff
(``DFLASH_REQUEUE_BACKOFF``, 1 s here, 30 s by default, doubling per failure) and it is generated
again.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Processes, wait_until
from tests.reliability.support import (
    Collector,
    enqueue_ok,
    logs,
    outputs,
    settle,
    start_worker,
    write_questions,
)
from tests.s3_support import FaultProxy, MotoServer, aws_env
from tests.store.test_s3_e2e import objects, records

pytestmark = pytest.mark.reliability

REQUEUED = "re-queued in"  # the worker's log line for a chunk put back with a backoff
RETRIED = "retrying in"  # the worker's log line for a store write retried in place


def failed_writes(log: str) -> int:
    """Chunk writes that failed: retried in place, or given up and re-queued."""
    return log.count(REQUEUED) + log.count(RETRIED)


class Outage:
    """Makes the local output's ``outputs/`` folder unwritable, and writable again.

    With a tiny tmpfs (root can mount one) the disk fills up, so the chunk write fails midway
    (ENOSPC after the first bytes). Otherwise the folder is made read-only (chmod; for root,
    which ignores modes, ``chattr +i``).
    """

    def __init__(self, root: Path, mounted: bool) -> None:
        self.root = root
        self.mounted = mounted
        self.kind = "disk full (tiny tmpfs): write fails midway, ENOSPC" if mounted else ""

    def start(self) -> None:
        folder = self.root / "outputs"
        folder.mkdir(parents=True, exist_ok=True)
        if self.mounted:
            free = os.statvfs(self.root).f_bavail * os.statvfs(self.root).f_frsize
            with open(self.root / "filler", "wb") as fh:  # leave 4 KiB: less than any chunk file
                fh.write(b"\0" * max(0, free - 4096))
        elif os.geteuid() != 0:
            folder.chmod(0o500)
            self.kind = "outputs/ read-only (chmod)"
        elif subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
            self.kind = "outputs/ immutable (chattr +i)"
        else:
            pytest.skip("cannot make the output unwritable here (no tmpfs mount, no chattr)")

    def stop(self) -> None:
        folder = self.root / "outputs"
        if self.mounted:
            (self.root / "filler").unlink()
        elif os.geteuid() != 0:
            folder.chmod(0o755)
        else:
            subprocess.run(["chattr", "-i", str(folder)], check=True)


@pytest.fixture
def output_root(tmp_path: Path) -> Iterator[tuple[Path, bool]]:
    """A 1 MiB tmpfs when this process may mount one, else a plain folder."""
    mnt = tmp_path / "tinyfs"
    mnt.mkdir()
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(mnt)], capture_output=True
        ).returncode
        == 0
    )
    try:
        yield mnt / "out", mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        else:
            with contextlib.suppress(OSError):
                subprocess.run(["chattr", "-R", "-i", str(mnt)], capture_output=True)


def test_local_write_failing_leaves_no_partial_chunk_and_is_retried(
    output_root: tuple[Path, bool], procs: Processes, tmp_path: Path, reliability: Collector
) -> None:
    out, mounted = output_root
    procs.env["DFLASH_REQUEUE_BACKOFF"] = "1"
    inp = write_questions(tmp_path / "prompts.jsonl", 96, "disk")
    summary = enqueue_ok(procs, inp, out, "--chunk-size", "8")  # staged and queued; no worker yet
    chunks = int(summary["chunks"])
    outage = Outage(out, mounted)
    outage.start()
    sim = procs.simulator("--time-scale", "0.002", "--mean-output-tokens", "400")
    start_worker(procs, sim, "disk-gpu0", "--max-chunks", "2")
    wait_until(lambda: failed_writes(logs(procs, "disk-gpu0.log")) >= 3, 60, "failed chunk writes")
    # A write in progress has a temp file for a moment; a leaked one would still be there later
    # (every attempt uses a new temp name).
    first = set((out / "outputs").iterdir())
    time.sleep(1.0)
    leftovers = sorted(first & set((out / "outputs").iterdir()))
    cleared = time.monotonic()
    outage.stop()
    assert leftovers == [], f"a failed write left {leftovers}"
    wait_until(lambda: len(outputs(out)) == chunks, 120, "the job to complete")
    recovered = time.monotonic() - cleared
    assert not [p for p in (out / "outputs").iterdir() if p.name.startswith(".")], "temp files left"
    log = logs(procs, "disk-gpu0.log")
    failures, retried = log.count(REQUEUED), log.count(RETRIED)
    settle(
        reliability,
        procs,
        family="7",
        fault=f"local store: {outage.kind}",
        inp=inp,
        out=out,
        runs=retried + failures,
        recover_s=recovered,
        measured="space back → job complete (with the retry or re-queue backoff)",
        notes=f"{retried} failed chunk writes retried in place (lease held), {failures} re-queued "
        "(backoff 1 s doubling) and their chunks generated again; no partial or temp file left",
        sims=[sim],
        allowed_waste=8 * failures,  # only a re-queued chunk is generated again
    )
    if mounted:  # a full disk is transient: its writes are retried, no chunk is generated twice
        assert "No space left on device" in log and retried >= 3 and failures == 0, (retried, failures)


def test_s3_writes_refused_then_retried_leave_no_partial_object(
    procs: Processes, tmp_path: Path, moto: MotoServer, reliability: Collector
) -> None:
    proxy = FaultProxy(moto.port)
    try:
        _s3_job(procs, tmp_path, moto, proxy, reliability)
    finally:
        proxy.close()


def _s3_job(
    procs: Processes, tmp_path: Path, moto: MotoServer, proxy: FaultProxy, reliability: Collector
) -> None:
    bucket, prefix = moto.new_bucket(), "store-faults"
    out = f"s3://{bucket}/{prefix}"
    procs.env.update(aws_env(proxy.url))
    procs.env["DFLASH_REQUEUE_BACKOFF"] = "1"
    inp = write_questions(tmp_path / "prompts.jsonl", 96, "s3")
    summary = enqueue_ok(procs, inp, out, "--chunk-size", "8")
    chunks = int(summary["chunks"])
    # botocore retries 503 SlowDown and resets itself (10 retries, standard mode); a 403 it does
    # not retry, so those writes fail and the worker re-queues their chunks.
    proxy.inject("slowdown", 3, method="PUT", path_contains="/outputs/", every=2)
    proxy.inject("reset", 2, method="PUT", path_contains="/outputs/", every=3)
    proxy.inject("forbidden", 2, method="PUT", path_contains="/outputs/")
    sim = procs.simulator("--time-scale", "0.002", "--mean-output-tokens", "400")
    start_worker(procs, sim, "s3-gpu0", "--max-chunks", "2")
    wait_until(lambda: proxy.pending() == 0, 90, "every injected S3 fault to fire")
    cleared = time.monotonic()
    done: dict[str, Any] = {}

    def complete() -> bool:
        done.update(objects(moto, bucket, f"{prefix}/outputs/"))
        return len(done) == chunks

    wait_until(complete, 120, "every chunk stored in S3", interval=0.5)
    recovered = time.monotonic() - cleared
    blobs = objects(moto, bucket)
    assert not [k for k in blobs if k.rsplit("/", 1)[1].startswith(".")]  # no probe, no temp object
    fired = proxy.fired
    failures = logs(procs, "s3-gpu0.log").count(REQUEUED)
    settle(
        reliability,
        procs,
        family="7",
        fault="S3 store: PUT 503 SlowDown x3, connection reset x2, 403 x2",
        inp=inp,
        out=out,
        runs=sum(fired.values()),
        recover_s=recovered,
        measured="last fault → job complete",
        records=records(blobs),
        notes=f"503/resets retried by botocore; {failures} refused (403) writes, never retried in "
        "place, re-queued (backoff 1 s) and their chunks generated again; no partial object",
        sims=[sim],
        allowed_waste=8 * failures,
    )
    assert fired["slowdown"] == 3 and fired["reset"] == 2 and fired["forbidden"] == 2, fired
    assert failures >= 2
