"""``python -m dflash_tasks.enqueue``: stage a prompt file and queue one task per chunk.

Re-running the same command resumes the job: finished chunks are skipped (the store is the
truth), chunks already queued or running are not queued twice, and chunks lost with a crashed
worker or a wiped Redis are queued again.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from dflash_tasks.bookkeeping import Bookkeeping
from dflash_tasks.errors import ConfigError, DflashError
from dflash_tasks.inputs import input_fingerprint, summarize_invalid
from dflash_tasks.job import (
    JOB_KEY,
    GenerationSpec,
    JobDefinition,
    Manifest,
    check_same_job,
    done_chunks,
    load_job,
    load_manifest,
)
from dflash_tasks.planner import Plan, plan_job
from dflash_tasks.progress_bar import ProgressBar, RateWindow
from dflash_tasks.settings import Settings
from dflash_tasks.staging import stage_input
from dflash_tasks.store import LocalStore, Store, open_store

log = logging.getLogger("dflash_tasks.enqueue")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dflash_tasks.enqueue", description=__doc__.splitlines()[0])
    p.add_argument("--input", required=True, help="prompts JSONL (.jsonl or .jsonl.gz)")
    p.add_argument("--output", required=True, help="output root: a directory")
    p.add_argument("--model", help="model name sent to SGLang (required for a new job)")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=20)
    p.add_argument("--no-thinking", action="store_true", help="generate without thinking mode")
    p.add_argument("--chunk-size", type=int, default=64, help="prompts per task (default 64)")
    p.add_argument("--broker-url", help="Redis URL [DFLASH_BROKER_URL]")
    p.add_argument("--queue", help="queue name [DFLASH_QUEUE]")
    p.add_argument("--wait", action="store_true", help="show a progress bar until the job is finished")
    p.add_argument("--replan-seconds", type=float, default=60.0, help="with --wait: re-plan this often")
    p.add_argument("--json", action="store_true", help="print one JSON summary as the last line")
    p.add_argument("--dry-run", action="store_true", help="plan and print; write and queue nothing")
    return p


def spec_from_args(args: argparse.Namespace) -> GenerationSpec:
    if not args.model:
        raise ConfigError("--model is required (the model name the SGLang servers serve)")
    checks = [
        (args.max_tokens >= 1, f"--max-tokens must be >= 1, got {args.max_tokens}"),
        (args.temperature >= 0, f"--temperature must be >= 0, got {args.temperature}"),
        (0 < args.top_p <= 1, f"--top-p must be in (0, 1], got {args.top_p}"),
        (args.top_k == -1 or args.top_k >= 1, f"--top-k must be -1 or >= 1, got {args.top_k}"),
        (args.chunk_size >= 1, f"--chunk-size must be >= 1, got {args.chunk_size}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    return GenerationSpec(
        model=args.model,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        thinking=not args.no_thinking,
        chunk_size=args.chunk_size,
    )


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    job: JobDefinition
    manifest: Manifest
    plan: Plan
    enqueued: int
    output: str

    def summary(self) -> dict[str, Any]:
        return {
            "job_id": self.job.job_id,
            "output": self.output,
            "lines": self.manifest.lines,
            "samples": self.manifest.samples,
            "invalid": self.manifest.invalid,
            "chunks": self.manifest.chunks,
            "chunks_done": len(self.plan.done),
            "chunks_pending": self.plan.pending,
            "chunks_running": len(self.plan.running),
            "chunks_queued_before": len(self.plan.queued),
            "chunks_enqueued": self.enqueued,
        }


def registered_location(store: Store) -> str:
    """Where workers find the store: absolute for a local directory."""
    return str(store.root) if isinstance(store, LocalStore) else store.uri


def enqueue(args: argparse.Namespace, settings: Settings) -> EnqueueResult:
    """Stage (once) and queue what is missing; returns what was done."""
    from dflash_tasks.celery_app import app, configure
    from dflash_tasks.publish import publish_chunks

    spec = spec_from_args(args)
    wanted = JobDefinition.create(input_fingerprint(args.input), os.path.basename(args.input), spec)
    store = open_store(args.output)
    existing = load_job(store)
    if existing is not None:
        check_same_job(existing, wanted, args.output)
    manifest = load_manifest(store)
    if args.dry_run:
        if manifest is None:
            report = stage_input(args.input, None, wanted.job_id, spec.chunk_size)
            manifest = report.manifest
            if report.invalid:
                print(summarize_invalid(report.invalid), file=sys.stderr)
        plan = plan_job(store, None, None, settings.queue, wanted.job_id, manifest.chunks)
        return EnqueueResult(wanted, manifest, plan, 0, args.output)
    bk = Bookkeeping.from_url(settings.broker_url, settings.redis_prefix)
    bk.ping()  # fail before writing anything when the broker is unreachable
    if existing is None:
        store.write(JOB_KEY, wanted.to_json())
    if manifest is None:
        report = stage_input(args.input, store, wanted.job_id, spec.chunk_size)
        manifest = report.manifest
        if report.invalid:
            print(summarize_invalid(report.invalid), file=sys.stderr)
    elif manifest.invalid:
        print(f"{manifest.invalid} invalid lines (details in {args.output}/invalid.jsonl)", file=sys.stderr)
    bk.register_job(wanted.job_id, registered_location(store))
    plan = plan_job(store, bk, bk.client, settings.queue, wanted.job_id, manifest.chunks)
    bk.mark_done(wanted.job_id, plan.done)
    configure(app, settings)
    enqueued = publish_chunks(app, wanted.job_id, plan.to_enqueue)
    return EnqueueResult(wanted, manifest, plan, enqueued, args.output)


def wait_for_job(result: EnqueueResult, args: argparse.Namespace, settings: Settings) -> bool:
    """Show progress until every chunk is stored; re-plan now and then (a Redis loss heals itself)."""
    from dflash_tasks.celery_app import app
    from dflash_tasks.publish import publish_chunks

    store = open_store(args.output)
    manifest = result.manifest
    bk = Bookkeeping.from_url(settings.broker_url, settings.redis_prefix)
    bar = ProgressBar(manifest.samples)
    window = RateWindow(60.0)
    job_id = result.job.job_id
    last_replan = time.monotonic()
    try:
        while True:
            done = done_chunks(store)
            samples = sum(manifest.chunk_samples(c) for c in done if c < manifest.chunks)
            try:
                tokens = bk.stats(job_id).get("completion_tokens", 0.0)
            except DflashError:
                tokens = 0.0
            window.add(samples, tokens)
            samples_s, tokens_s = window.rates()
            bar.update(samples, samples_s, tokens_s, force=len(done) >= manifest.chunks)
            if len(done) >= manifest.chunks:
                return True
            if time.monotonic() - last_replan >= args.replan_seconds:
                last_replan = time.monotonic()
                try:
                    bk.register_job(job_id, registered_location(store))
                    plan = plan_job(store, bk, bk.client, settings.queue, job_id, manifest.chunks)
                    bk.mark_done(job_id, plan.done)
                    if plan.to_enqueue:
                        sent = publish_chunks(app, job_id, plan.to_enqueue)
                        print(
                            f"\nre-queued {sent} chunks that were neither queued nor running", file=sys.stderr
                        )
                except DflashError as exc:
                    print(f"\nre-plan failed (will retry): {exc}", file=sys.stderr)
            time.sleep(1.0)
    finally:
        bar.close()


def print_summary(result: EnqueueResult, dry_run: bool) -> None:
    s = result.summary()
    verb = "would queue" if dry_run else "queued"
    count = len(result.plan.to_enqueue) if dry_run else s["chunks_enqueued"]
    print(
        f"job {s['job_id']} at {s['output']}: {s['samples']:,} samples in {s['chunks']:,} chunks "
        f"({s['invalid']:,} invalid lines kept out)\n"
        f"  done {s['chunks_done']:,} | running {s['chunks_running']:,} | already queued "
        f"{s['chunks_queued_before']:,} | {verb} {count:,}",
        file=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        settings = Settings.load(broker_url=args.broker_url, queue=args.queue)
        result = enqueue(args, settings)
        print_summary(result, args.dry_run)
        finished = wait_for_job(result, args, settings) if args.wait and not args.dry_run else True
    except DflashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "\ninterrupted: the job keeps running; re-run this command to watch or resume it", file=sys.stderr
        )
        return 130
    if args.json:
        summary = result.summary()
        if args.wait and finished:
            summary.update(chunks_done=summary["chunks"], chunks_pending=0)
        print(json.dumps(summary))
    return 0 if finished else 1


if __name__ == "__main__":
    sys.exit(main())
