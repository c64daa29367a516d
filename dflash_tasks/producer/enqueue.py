"""``python -m dflash_tasks.enqueue``: stage a prompt file and queue one task per chunk.

Re-running the same command resumes the job: finished chunks are skipped (the store is the
truth), chunks already queued or running are not queued twice, and chunks lost with a crashed
worker or a wiped Redis are queued again. Once every chunk is stored, a re-run queues a repair
round for the samples a passing fault failed (``--retry-failed``: every failed sample); with
``--wait`` the producer runs up to ``repair_rounds`` of them by itself
(:mod:`dflash_tasks.producer.repair`). A new job first runs a preflight sample through the
quality gates (``--preflight N``, ``--no-preflight``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from celery import Celery

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.planner import Plan, plan_job, queue_missing
from dflash_tasks.coord.routing import model_queue
from dflash_tasks.core.errors import ConfigError, DflashError
from dflash_tasks.core.job import (
    JOB_KEY,
    TURNS_MODES,
    GenerationSpec,
    JobDefinition,
    Manifest,
    check_same_job,
    output_key,
)
from dflash_tasks.core.model_name import check_model_name
from dflash_tasks.core.quality import CHECKS, QualitySettings
from dflash_tasks.core.settings import CommonSettings, ProducerSettings, WorkerSettings
from dflash_tasks.core.states import JobState
from dflash_tasks.monitoring.fleet import capacity, live_fleet
from dflash_tasks.monitoring.progress_writer import ProgressWriter, record_gpu_price
from dflash_tasks.producer.inputs import input_fingerprint, summarize_invalid
from dflash_tasks.producer.preflight import (
    PREFLIGHT_KEY,
    judge,
    preflight_chunks,
    print_progress,
    wait_for_chunks,
    wait_for_leases,
)
from dflash_tasks.producer.repair import RepairPlan, queue_repairs, run_repair_rounds
from dflash_tasks.producer.serving import ServingWatch
from dflash_tasks.producer.staging import stage_input
from dflash_tasks.producer.waiting import wait_for_job
from dflash_tasks.store import Store, open_store
from dflash_tasks.store.jobfiles import done_chunks, load_job, load_manifest

log = logging.getLogger("dflash_tasks.producer.enqueue")

EXIT_PREFLIGHT_FAILED = 3


#: GenerationSpec's defaults, which the flags show and use.
_SPEC_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(GenerationSpec) if f.default is not dataclasses.MISSING
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dflash_tasks.enqueue", description=__doc__.splitlines()[0])
    p.add_argument("--input", required=True, help="prompts JSONL (.jsonl or .jsonl.gz)")
    p.add_argument("--output", required=True, help="output root: a directory or s3://bucket/prefix")
    p.add_argument(
        "--s3-endpoint-url", help="S3-compatible endpoint for s3:// outputs [DFLASH_S3_ENDPOINT_URL]"
    )
    p.add_argument(
        "--model", help="the model's served name or the last part of its path, e.g. Qwen3-8B (required)"
    )
    spec = _SPEC_DEFAULTS  # the job spec holds the only defaults
    p.add_argument("--max-tokens", type=int, default=spec["max_tokens"], help="default %(default)s")
    p.add_argument("--temperature", type=float, default=spec["temperature"], help="default %(default)s")
    p.add_argument("--top-p", type=float, default=spec["top_p"], help="default %(default)s")
    p.add_argument("--top-k", type=int, default=spec["top_k"], help="default %(default)s")
    p.add_argument("--no-thinking", action="store_true", help="generate without thinking mode")
    p.add_argument(
        "--chunk-size", type=int, default=spec["chunk_size"], help="prompts per task (default %(default)s)"
    )
    p.add_argument(
        "--turns",
        choices=TURNS_MODES,
        default=spec["turns"],
        help="all (default): regenerate every assistant turn in order from the model's own answers; "
        "last: send the source's history as is and regenerate the last turn only",
    )
    p.add_argument("--broker-url", help="Redis URL [DFLASH_BROKER_URL]")
    p.add_argument("--queue", help="base queue name; chunks go to <base>.<model key> [DFLASH_QUEUE]")
    p.add_argument("--wait", action="store_true", help="show a progress bar until the job is finished")
    p.add_argument(
        "--wait-replan-seconds",
        "--replan-seconds",  # the old name, still accepted
        dest="wait_replan_seconds",
        type=float,
        default=60.0,
        help="with --wait: re-plan from the store this often (default 60)",
    )
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="repair rounds also regenerate samples that failed permanently (e.g. after raising the "
        "server's context length); nothing else about the job changes",
    )
    p.add_argument("--json", action="store_true", help="print one JSON summary as the last line")
    p.add_argument("--dry-run", action="store_true", help="plan and print; write and queue nothing")
    q = p.add_argument_group("quality")
    q.add_argument(
        "--preflight", type=int, default=200, metavar="N", help="preflight sample size (default 200)"
    )
    q.add_argument("--no-preflight", action="store_true", help="queue the whole job at once")
    q.add_argument(
        "--preflight-timeout", type=float, default=3600.0, help="seconds to wait for the preflight"
    )
    q.add_argument("--gpu-hour-usd", type=float, help="price of one GPU-hour, for cost projections")
    q.add_argument(
        "--min-completion-tokens", type=int, help="flag completions shorter than this (default 32)"
    )
    q.add_argument(
        "--max-share",
        action="append",
        default=[],
        metavar="CHECK=SHARE",
        help=f"gate threshold per check, e.g. no_reasoning=0.05; checks: {', '.join(CHECKS)}",
    )
    return p


def spec_from_args(args: argparse.Namespace) -> GenerationSpec:
    check_model_name(args.model or "")
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
        turns=args.turns,
    )


def quality_from_args(args: argparse.Namespace) -> QualitySettings:
    base = QualitySettings()
    shares = dict(base.max_share)
    for item in args.max_share:
        name, sep, value = item.partition("=")
        if not sep or name not in CHECKS:
            raise ConfigError(
                f"--max-share {item!r}: expected CHECK=SHARE with CHECK one of {', '.join(CHECKS)}"
            )
        try:
            shares[name] = float(value)
        except ValueError:
            raise ConfigError(f"--max-share {item!r}: {value!r} is not a number") from None
    minimum = base.min_completion_tokens if args.min_completion_tokens is None else args.min_completion_tokens
    return QualitySettings(min_completion_tokens=minimum, max_share=shares)


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    job: JobDefinition
    manifest: Manifest
    plan: Plan
    enqueued: int
    output: str
    repair: RepairPlan | None = None  # the repair round queued, once every chunk is stored

    def summary(self) -> dict[str, Any]:
        repair = self.repair
        return {
            "job_id": self.job.job_id,
            "output": self.output,
            "lines": self.manifest.lines,
            "samples": self.manifest.samples,
            "turns": self.manifest.total_turns,
            "invalid": self.manifest.invalid,
            "chunks": self.manifest.chunks,
            "chunks_done": len(self.plan.done),
            "chunks_pending": self.plan.pending,
            "chunks_running": len(self.plan.running),
            "chunks_queued_before": len(self.plan.queued),
            "chunks_enqueued": self.enqueued,
            "repair_samples": 0 if repair is None else repair.samples,
            "repair_chunks_queued": 0 if repair is None else len(repair.to_queue),
            "failed_permanent": 0 if repair is None else repair.failed_permanent,
        }


class PreflightFailed(DflashError):
    """The preflight sample failed the quality gates; the job is paused."""


def celery_app(settings: CommonSettings) -> Celery:
    from dflash_tasks.coord.celery_app import app, configure

    return configure(app, settings)


def prepare(
    args: argparse.Namespace, settings: CommonSettings | None = None
) -> tuple[JobDefinition, Store, JobDefinition | None, Manifest | None]:
    """Define the job and check it against what the output root already holds."""
    spec = spec_from_args(args)
    wanted = JobDefinition.create(
        input_fingerprint(args.input), os.path.basename(args.input), spec, quality_from_args(args)
    )
    store = open_store(args.output, settings)
    existing = load_job(store)
    if existing is not None:
        check_same_job(existing, wanted, args.output)
    return (existing or wanted), store, existing, load_manifest(store)


def enqueue(args: argparse.Namespace, settings: ProducerSettings) -> EnqueueResult:
    """Stage (once), run the preflight (new jobs), and queue what is missing."""
    job, store, existing, manifest = prepare(args, settings)
    if args.dry_run:
        if manifest is None:
            report = stage_input(args.input, None, job.job_id, job.spec.chunk_size, job.spec.turns)
            manifest = report.manifest
            if report.invalid:
                print(summarize_invalid(report.invalid), file=sys.stderr)
        queue = model_queue(settings.queue, job.spec.model)
        plan = plan_job(store, None, queue, job.job_id, manifest.chunks)
        return EnqueueResult(job, manifest, plan, 0, args.output)
    bk = Bookkeeping.from_url(settings.broker_url, settings.redis_prefix)
    bk.ping()  # fail before writing anything when the broker is unreachable
    store.check_writable()  # ... or the store cannot be written (no bucket, access denied, read-only)
    if existing is None:
        store.write(JOB_KEY, job.to_json())
    if manifest is None:
        report = stage_input(args.input, store, job.job_id, job.spec.chunk_size, job.spec.turns)
        manifest = report.manifest
        if report.invalid:
            print(summarize_invalid(report.invalid), file=sys.stderr)
    elif manifest.invalid:
        print(f"{manifest.invalid} invalid lines (details in {args.output}/invalid.jsonl)", file=sys.stderr)
    bk.resume_job(job.job_id)  # a re-run continues a paused job
    record_gpu_price(bk, job.job_id, args.gpu_hour_usd or settings.gpu_hour_usd)
    app = celery_app(settings)
    if not args.no_preflight and args.preflight > 0 and not store.exists(PREFLIGHT_KEY):
        run_preflight(args, settings, job, manifest, store, bk, app)
    plan, sent = queue_missing(store, bk, app, settings, job.job_id, manifest.chunks, job.spec.model)
    repair = None
    if not args.wait:  # --wait watches this itself, and runs the repair rounds once the chunks are in
        if len(plan.done) >= manifest.chunks:
            repair = queue_repairs(store, manifest, bk, app, settings, job, permanent=args.retry_failed)
        ServingWatch(bk, job.spec.model).poll()
    return EnqueueResult(job, manifest, plan, sent, args.output, repair)


def run_preflight(
    args: argparse.Namespace,
    settings: ProducerSettings,
    job: JobDefinition,
    manifest: Manifest,
    store: Store,
    bk: Bookkeeping,
    app: Celery,
) -> None:
    """Generate the preflight chunks, judge them, and raise :class:`PreflightFailed` if the gates trip."""
    chunks = preflight_chunks(manifest, args.preflight)
    started = time.monotonic()
    bk.set_preflight(job.job_id, True)
    queue_missing(store, bk, app, settings, job.job_id, manifest.chunks, job.spec.model, only=chunks)
    print(f"preflight: {len(chunks)} chunks spread over the input; waiting for workers ...", file=sys.stderr)
    watch, progress = ServingWatch(bk, job.spec.model), print_progress(len(chunks))

    def show(done: int) -> None:
        progress(done)
        watch.poll()

    # The live gate may pause the job before the whole sample is in: judge what is done then.
    done_sample = wait_for_chunks(
        store,
        chunks,
        args.preflight_timeout,
        show,
        stop=lambda: bk.job_state(job.job_id)[0] == JobState.PAUSED,
    )
    if done_sample is None:
        raise PreflightFailed(
            f"the preflight did not finish within {args.preflight_timeout:.0f}s: are workers running "
            f"(python -m workers --endpoint URL --name NAME) against servers of model {job.spec.model!r}, "
            f"with queue {settings.queue!r}?"
        )
    # The fleet's capacity from the workers' own heartbeats (each says its max_inflight); with
    # none alive, one worker at the workers' default (the producer never reads worker settings).
    workers, slots = capacity(job.spec.model, live_fleet(bk.heartbeats(), time.time()))
    workers, slots = max(workers, 1), slots or WorkerSettings().max_inflight
    done = [c for c in done_chunks(store) if c < manifest.chunks]
    report = judge(
        store,
        done_sample,
        job.quality,
        time.monotonic() - started,
        slots=slots,
        workers=workers,
        remaining=manifest.total_turns - sum(manifest.turns_of(c) for c in done),
        gpu_hour_usd=args.gpu_hour_usd or settings.gpu_hour_usd,
        remaining_samples=manifest.samples - sum(manifest.chunk_samples(c) for c in done),
    )
    print(report.render(), file=sys.stderr)
    if report.passed:
        store.write(PREFLIGHT_KEY, (json.dumps(report.to_dict(), indent=2) + "\n").encode())
        bk.set_preflight(job.job_id, False)
        return
    reason = "preflight failed: " + "; ".join(f.message for f in report.failures)
    bk.pause_job(job.job_id, reason)
    # Bad data: delete it so that it is regenerated once the cause is fixed, but only once no
    # worker still runs one of these chunks: one would store its output after the deletion (a
    # worker checks the pause after taking a chunk's lease, so none starts after this wait).
    wait_for_leases(bk, job.job_id, chunks, args.preflight_timeout)
    for chunk in chunks:
        store.delete(output_key(chunk))
    bk.unmark_done(job.job_id, chunks)
    raise PreflightFailed(reason + "\nFix the cause, then re-run this command.")


def print_summary(result: EnqueueResult, dry_run: bool) -> None:
    s = result.summary()
    verb = "would queue" if dry_run else "queued"
    count = len(result.plan.to_enqueue) if dry_run else s["chunks_enqueued"]
    turns = f" ({s['turns']:,} turns)" if s["turns"] != s["samples"] else ""
    print(
        f"job {s['job_id']} at {s['output']}: {s['samples']:,} samples{turns} in {s['chunks']:,} chunks "
        f"({s['invalid']:,} invalid lines kept out)\n"
        f"  done {s['chunks_done']:,} | running {s['chunks_running']:,} | already queued "
        f"{s['chunks_queued_before']:,} | {verb} {count:,}",
        file=sys.stderr,
    )
    repair = result.repair
    if repair is not None and repair.pending:
        running = len(repair.pending) - len(repair.to_queue)
        print(
            f"  repair: {repair.samples:,} failed samples to regenerate in {len(repair.pending):,} chunks"
            f" | queued {len(repair.to_queue):,} rounds" + (f" | {running:,} running" if running else ""),
            file=sys.stderr,
        )


def wait_for_repairs(result: EnqueueResult, settings: ProducerSettings, permanent: bool) -> RepairPlan:
    """``--wait`` once every chunk is stored: run the repair rounds and wait for them; then
    ``progress.json`` once more, with the repaired counts."""
    store = open_store(result.output, settings)
    bk = Bookkeeping.from_url(settings.broker_url, settings.redis_prefix)
    left, rounds = run_repair_rounds(
        store, result.manifest, bk, celery_app(settings), settings, result.job, permanent=permanent
    )
    if rounds:
        writer = ProgressWriter(bk, f"enqueue/{os.getpid()}", settings.progress_seconds, settings.queue)
        try:
            writer.write(result.job.job_id, store, result.manifest, result.job)
        except DflashError as exc:  # the counters in Redis stay right; status reads them
            log.warning("progress.json not written after the repair rounds: %s", exc)
    return left


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        settings = ProducerSettings.load(
            broker_url=args.broker_url, queue=args.queue, s3_endpoint_url=args.s3_endpoint_url
        )
        result = enqueue(args, settings)
        print_summary(result, args.dry_run)
        finished = (
            wait_for_job(result.job, result.manifest, args.output, args.wait_replan_seconds, settings)
            if args.wait and not args.dry_run
            else True
        )
        if args.wait and not args.dry_run and finished:
            result = dataclasses.replace(result, repair=wait_for_repairs(result, settings, args.retry_failed))
    except PreflightFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_PREFLIGHT_FAILED
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
