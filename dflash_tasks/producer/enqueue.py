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

import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import Celery

from dflash_tasks.cli.flags import load_settings
from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.planner import Plan, plan_job, queue_missing
from dflash_tasks.coord.routing import model_queue
from dflash_tasks.core.errors import ConfigError, DflashError
from dflash_tasks.core.exit_codes import ExitCode
from dflash_tasks.core.job import (
    JOB_KEY,
    Amendment,
    JobDefinition,
    Manifest,
    check_same_job,
    output_key,
)
from dflash_tasks.core.loss_tokens import load_tokenizer
from dflash_tasks.core.settings import CommonSettings, ProducerSettings, WorkerSettings
from dflash_tasks.core.states import JobState
from dflash_tasks.core.trainable import TRAINABLE_KEY, trainable_doc
from dflash_tasks.monitoring.fleet import capacity, live_fleet
from dflash_tasks.monitoring.progress_writer import record_gpu_price
from dflash_tasks.producer.enqueue_args import build_parser, options_from_args
from dflash_tasks.producer.enqueue_options import EnqueueOptions
from dflash_tasks.producer.inputs import summarize_invalid
from dflash_tasks.producer.mix import InputMix
from dflash_tasks.producer.preflight import (
    PREFLIGHT_KEY,
    PreflightReport,
    judge,
    preflight_chunks,
    print_progress,
    wait_for_chunks,
    wait_for_leases,
)
from dflash_tasks.producer.repair import RepairPlan, describe, queue_repairs, repair_after_wait
from dflash_tasks.producer.serving import ServingWatch
from dflash_tasks.producer.sources import parse_sources
from dflash_tasks.producer.staging import NoValidSample, stage_input
from dflash_tasks.producer.waiting import wait_for_job
from dflash_tasks.store import Store, open_store
from dflash_tasks.store.jobfiles import done_chunks, load_job, load_manifest

log = logging.getLogger("dflash_tasks.producer.enqueue")


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
            "repair_truncated_samples": 0 if repair is None else repair.truncated,
            "repair_continued_samples": 0 if repair is None else repair.continued,
            "repair_max_tokens": self.job.repair_max_tokens,
        }


class PreflightFailed(DflashError):
    """The preflight sample failed the quality gates; the job is paused."""


def celery_app(settings: CommonSettings) -> Celery:
    from dflash_tasks.coord.celery_app import app, configure

    return configure(app, settings)


def input_mix(options: EnqueueOptions, settings: CommonSettings | None = None) -> InputMix:
    """The job's input sources, from ``--input`` (repeated) and the column flags."""
    return InputMix(parse_sources(list(options.inputs), options.columns), options.sample_seed, settings)


def prepare(
    options: EnqueueOptions, settings: CommonSettings | None = None, mix: InputMix | None = None
) -> tuple[JobDefinition, Store, JobDefinition | None, Manifest | None]:
    """Define the job and check it against what the output root already holds.

    With ``repair_truncated``, ``spec.max_tokens`` is the budget for the truncated samples, not
    the job's: the job keeps its own, and gets an amendment naming the new one. Under ``horizon``
    the job's ``max_tokens`` is the trainer's ``max_length`` (the job's own on a re-run without
    ``--train-max-length``).
    """
    store = open_store(options.output, settings)
    existing = load_job(store)
    spec = options.spec
    if spec.at_horizon:
        view = options.trainer.on(existing.trainer if existing is not None else None)
        spec = dataclasses.replace(spec, max_tokens=view.max_length)
    budget = None
    if options.repair_truncated:
        if existing is None:
            raise ConfigError(f"--repair-truncated: {options.output} holds no job yet; run the job first")
        if spec.at_horizon or existing.spec.at_horizon:
            raise ConfigError(
                "--repair-truncated: a --max-tokens horizon job is cut at the trainer's horizon, where "
                "the trainer cuts its rows anyway; give a number of tokens above the job's (for a job "
                "with a fixed budget)"
            )
        budget, spec = spec.max_tokens, dataclasses.replace(spec, max_tokens=existing.spec.max_tokens)
        if budget <= existing.spec.max_tokens:
            raise ConfigError(
                f"--repair-truncated --max-tokens {budget}: the job's samples were generated with "
                f"max_tokens {existing.spec.max_tokens}; give a larger budget"
            )
    fingerprint, name, inputs = (mix or input_mix(options, settings)).identity()
    wanted = JobDefinition.create(
        fingerprint, name, spec, options.quality, options.trainer.on(), inputs=inputs
    )
    if existing is not None:
        check_same_job(existing, wanted, options.output)
    job = existing or wanted
    if budget is not None and job.repair_max_tokens != budget:
        job = dataclasses.replace(job, amendments=(*job.amendments, Amendment(budget, round(time.time(), 3))))
    return job, store, existing, load_manifest(store)


def enqueue(
    options: EnqueueOptions, settings: ProducerSettings, say: Callable[[str], None] = log.warning
) -> EnqueueResult:
    """Stage (once), run the preflight (new jobs), and queue what is missing; ``say`` takes the
    notes a person should read (invalid input lines, the preflight's report).

    Raises :class:`PreflightFailed` when the preflight fails its gates (the job is then paused),
    another :class:`DflashError` when the input, the store or the broker is not usable.
    """
    mix = input_mix(options, settings)
    job, store, existing, manifest = prepare(options, settings, mix)
    if options.dry_run:
        if manifest is None:
            report = stage_input(mix, None, job.job_id, job.spec.chunk_size, job.spec.turns)
            manifest = report.manifest
            if report.invalid:
                say(summarize_invalid(report.invalid))
        queue = model_queue(settings.queue, job.spec.model)
        plan = plan_job(store, None, queue, job.job_id, manifest.chunks)
        return EnqueueResult(job, manifest, plan, 0, options.output)
    bk = Bookkeeping.from_url(settings.broker_url, settings.redis_prefix)
    bk.ping()  # fail before writing anything when the broker is unreachable
    if (tokenizer := options.trainer.on(job.trainer).tokenizer) is not None:
        load_tokenizer(tokenizer)  # ... or the trainer's tokenizer cannot be read
    store.check_writable()  # ... or the store cannot be written (no bucket, access denied, read-only)
    if existing is None or job != existing:  # a new job, or an amendment to it
        store.write(JOB_KEY, job.to_json())
    if manifest is None:
        try:
            report = stage_input(mix, store, job.job_id, job.spec.chunk_size, job.spec.turns)
        except NoValidSample:
            if existing is None:  # nothing was staged: a fixed input may define the job afresh
                store.delete(JOB_KEY)
            raise
        manifest = report.manifest
        if report.invalid:
            say(summarize_invalid(report.invalid))
    elif manifest.invalid:
        say(f"{manifest.invalid} invalid lines (details in {options.output}/invalid.jsonl)")
    bk.resume_job(job.job_id)  # a re-run continues a paused job
    record_gpu_price(bk, job.job_id, settings.gpu_hour_usd)
    app = celery_app(settings)
    if options.preflight > 0 and not store.exists(PREFLIGHT_KEY):
        run_preflight(options, settings, Staged(job, manifest, store, bk, app), say)
    plan, sent = queue_missing(store, bk, app, settings, job.job_id, manifest.chunks, job.spec.model)
    repair = None
    if not options.wait:  # --wait watches this itself, and runs the repair rounds once the chunks are in
        if len(plan.done) >= manifest.chunks:
            repair = queue_repairs(store, manifest, bk, app, settings, job, permanent=options.retry_failed)
        ServingWatch(bk, job.spec.model).poll()
    return EnqueueResult(job, manifest, plan, sent, options.output, repair)


@dataclass(frozen=True, slots=True)
class Staged:
    """A staged job and what reaches it: its store, Redis and the Celery app."""

    job: JobDefinition
    manifest: Manifest
    store: Store
    bk: Bookkeeping
    app: Celery


def run_preflight(
    options: EnqueueOptions, settings: ProducerSettings, staged: Staged, say: Callable[[str], None]
) -> None:
    """Generate the preflight chunks, judge them, and raise :class:`PreflightFailed` if the gates trip."""
    job, manifest, store, bk = staged.job, staged.manifest, staged.store, staged.bk
    chunks = preflight_chunks(manifest, options.preflight)
    started = time.monotonic()
    bk.set_preflight(job.job_id, True)
    queue_missing(store, bk, staged.app, settings, job.job_id, manifest.chunks, job.spec.model, only=chunks)
    say(f"preflight: {len(chunks)} chunks spread over the input; waiting for workers ...")
    done_sample = _wait_for_sample(staged, chunks, settings)
    report = _judge_sample(staged, done_sample, time.monotonic() - started, options, settings)
    say(report.render())
    if report.passed:
        store.write(PREFLIGHT_KEY, (json.dumps(report.to_dict(), indent=2) + "\n").encode())
        if report.trainable is not None:
            doc = trainable_doc(report.trainable, "preflight", manifest.samples)
            store.write(TRAINABLE_KEY, (json.dumps(doc, indent=2) + "\n").encode())
        bk.set_preflight(job.job_id, False)
        return
    reason = "preflight failed: " + "; ".join(f.message for f in report.failures)
    bk.pause_job(job.job_id, reason)
    # Bad data: delete it so that it is regenerated once the cause is fixed, but only once no
    # worker still runs one of these chunks: one would store its output after the deletion (a
    # worker checks the pause after taking a chunk's lease, so none starts after this wait).
    wait_for_leases(bk, job.job_id, chunks, settings.preflight_timeout_seconds)
    for chunk in chunks:
        store.delete(output_key(chunk))
    bk.unmark_done(job.job_id, chunks)
    raise PreflightFailed(reason + "\nFix the cause, then re-run this command.")


def _wait_for_sample(staged: Staged, chunks: list[int], settings: ProducerSettings) -> list[int]:
    """The preflight chunks done once all are, or once the live gate paused the job (judged as
    they are then); :class:`PreflightFailed` when the wait runs out."""
    job, bk = staged.job, staged.bk
    watch, progress = ServingWatch(bk, job.spec.model), print_progress(len(chunks))

    def show(done: int) -> None:
        progress(done)
        watch.poll()

    done_sample = wait_for_chunks(
        staged.store,
        chunks,
        settings.preflight_timeout_seconds,
        show,
        stop=lambda: bk.job_state(job.job_id)[0] == JobState.PAUSED,
    )
    if done_sample is None:
        raise PreflightFailed(
            f"the preflight did not finish within {settings.preflight_timeout_seconds:.0f}s: are workers "
            f"running (python -m workers --endpoint URL --name NAME) against servers of model "
            f"{job.spec.model!r}, with queue {settings.queue!r}?"
        )
    return done_sample


def _judge_sample(
    staged: Staged,
    done_sample: list[int],
    elapsed: float,
    options: EnqueueOptions,
    settings: ProducerSettings,
) -> PreflightReport:
    """The preflight's report on the sample, with projections for the rest of the job."""
    job, manifest, store = staged.job, staged.manifest, staged.store
    # The fleet's capacity from the workers' own heartbeats (each says its max_inflight); with
    # none alive, one worker at the workers' default (the producer never reads worker settings).
    workers, slots, tuned = capacity(job.spec.model, live_fleet(staged.bk.heartbeats(), time.time()))
    workers, slots = max(workers, 1), slots or WorkerSettings().max_inflight
    done = [c for c in done_chunks(store) if c < manifest.chunks]
    return judge(
        store,
        done_sample,
        job.quality,
        elapsed,
        slots=slots,
        workers=workers,
        tuned_workers=tuned,
        remaining=manifest.total_turns - sum(manifest.turns_of(c) for c in done),
        gpu_hour_usd=settings.gpu_hour_usd,
        remaining_samples=manifest.samples - sum(manifest.chunk_samples(c) for c in done),
        trainer=options.trainer.on(job.trainer),
        thinking=job.spec.thinking,
        preserve_thinking=job.spec.keeps_history_reasoning,
        job=job,
    )


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
            f"  repair: {describe(repair)} in {len(repair.pending):,} chunks"
            f" | queued {len(repair.to_queue):,} rounds" + (f" | {running:,} running" if running else ""),
            file=sys.stderr,
        )


def _to_stderr(note: str) -> None:
    print(note, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        settings = load_settings(ProducerSettings, args)
        result = enqueue(options_from_args(args, settings), settings, say=_to_stderr)
        print_summary(result, args.dry_run)
        finished = (
            wait_for_job(result.job, result.manifest, args.output, settings.wait_replan_seconds, settings)
            if args.wait and not args.dry_run
            else True
        )
        if args.wait and not args.dry_run and finished:
            left = repair_after_wait(result.job, result.manifest, result.output, settings, args.retry_failed)
            result = dataclasses.replace(result, repair=left)
    except PreflightFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.PREFLIGHT_FAILED
    except DflashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except KeyboardInterrupt:
        print(
            "\ninterrupted: the job keeps running; re-run this command to watch or resume it", file=sys.stderr
        )
        return ExitCode.INTERRUPTED
    if args.json:
        summary = result.summary()
        if args.wait and finished:
            summary.update(chunks_done=summary["chunks"], chunks_pending=0)
        print(json.dumps(summary))
    return ExitCode.OK if finished else ExitCode.NOT_PASSED


if __name__ == "__main__":
    sys.exit(main())
