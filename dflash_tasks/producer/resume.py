"""``python -m dflash_tasks.resume --output URI``: continue a paused job.

Clears the pause (set by the live quality gate or a failed preflight) and queues every chunk
that is neither done, running nor queued. Fix the cause first: the gate trips again otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys

from dflash_tasks.cli.commands import prog
from dflash_tasks.cli.flags import broker_flags, json_flag, load_settings, store_flags
from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.celery_app import app, configure
from dflash_tasks.coord.planner import queue_missing
from dflash_tasks.core.errors import DflashError, StoreError
from dflash_tasks.core.exit_codes import ExitCode
from dflash_tasks.core.settings import ProducerSettings
from dflash_tasks.core.states import JobState
from dflash_tasks.producer.serving import ServingWatch
from dflash_tasks.store import open_store
from dflash_tasks.store.jobfiles import load_job, load_manifest


def build_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=prog("dflash_tasks.resume"),
        description=__doc__.splitlines()[0],
        parents=[store_flags(), broker_flags(), json_flag("print a JSON summary")],
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(ProducerSettings, args)
        store = open_store(args.output, settings)
        job, manifest = load_job(store), load_manifest(store)
        if job is None or manifest is None:
            raise StoreError(
                f"{args.output} holds no staged job: start it with python -m dflash_tasks.enqueue"
            )
        bk = Bookkeeping.from_url(settings.broker_url, settings.redis_prefix)
        state, reason = bk.job_state(job.job_id)
        bk.resume_job(job.job_id)
        configure(app, settings)
        plan, sent = queue_missing(store, bk, app, settings, job.job_id, manifest.chunks, job.spec.model)
    except DflashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    was = f"was paused ({reason})" if state == JobState.PAUSED else "was not paused"
    print(
        f"job {job.job_id} {was}; resumed: {len(plan.done):,}/{manifest.chunks:,} chunks done, "
        f"{sent:,} queued",
        file=sys.stderr,
    )
    ServingWatch(bk, job.spec.model).poll()
    if args.json:
        print(
            json.dumps(
                {"job_id": job.job_id, "was_paused": state == JobState.PAUSED, "chunks_enqueued": sent}
            )
        )
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
