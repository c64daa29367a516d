"""A finished job's figures once Redis no longer holds them (lost its keys, or unreachable).

The store says every chunk is done, but Redis has no ``finished_at`` of the job: its counters
(tokens, failures, GPU time, the finish time) are gone. The figures then come from the job's
final ``progress.json`` (written while they were still there), else they are recounted from the
stored records, the truth. Never from the empty counters, and never ``now - start``: a job
finished in 3 s still reads 3 s 45 minutes later, and a finish time nobody recorded is shown as
unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from dflash_tasks.core.errors import DflashError
from dflash_tasks.core.spec_stats import spec_counts
from dflash_tasks.core.states import JobState
from dflash_tasks.monitoring.snapshot import Snapshot, num
from dflash_tasks.store import Store
from dflash_tasks.store.jobfiles import load_manifest
from dflash_tasks.store.records import iter_records


def counters_gone(snap: Snapshot) -> bool:
    """True when the store holds every chunk but Redis does not know when the job finished,
    and cannot soon: it is unreachable, or lost the job's keys (no ``started_at`` either)."""
    done = snap.done_chunks >= snap.total_chunks
    return done and not snap.job.get("finished_at") and (not snap.redis_ok or not snap.job.get("started_at"))


def is_final(previous: Mapping[str, Any] | None, snap: Snapshot) -> bool:
    """``previous`` is this job's final progress.json: done, with its finish time, every sample counted."""
    if not previous or previous.get("job_id") != snap.job_id:
        return False
    samples = previous.get("samples") or {}
    return (
        previous.get("state") == JobState.DONE
        and bool(previous.get("finished_at"))
        and isinstance(samples, Mapping)
        and samples.get("done") == snap.done_samples
    )


def stats_of(previous: Mapping[str, Any]) -> dict[str, float]:
    """The counters a progress document carries, as Redis holds them (speculative stats aside)."""
    samples, tokens = (previous.get(k) or {} for k in ("samples", "tokens"))
    failed = num(samples.get("failed"))
    return {
        **{k: num(v) for k, v in (previous.get("counters") or {}).items()},
        "samples_ok": num(tokens.get("counted_samples")) - failed,
        "samples_failed": failed,
        "samples_repaired": num(samples.get("repaired")),
        "completion_tokens": num(tokens.get("generated")),
        "prompt_tokens": num(tokens.get("prompt")),
    }


def from_final(snap: Snapshot, previous: Mapping[str, Any]) -> Snapshot:
    """``snap`` with the counters, start, finish and GPU time of the final ``previous`` document."""
    cost_doc = previous.get("cost") or {}
    spec = previous.get("spec") or {}
    stats = stats_of(previous)
    stats["spec_tokens"] = num(spec.get("tokens")) if isinstance(spec, Mapping) else 0.0
    stats["spec_verify_ct"] = num(spec.get("verify_passes")) if isinstance(spec, Mapping) else 0.0
    job = {
        **snap.job,
        "started_at": str(previous.get("started_at") or ""),
        "finished_at": str(previous["finished_at"]),
        "gpu_seconds": str(num(cost_doc.get("gpu_hours")) * 3600.0),
    }
    note = f"finished job: figures from its final progress.json of {previous.get('updated_at_iso')}"
    price = snap.gpu_hour_usd or num(cost_doc.get("gpu_hour_usd"))
    return replace(snap, job=job, stats=stats, notes=(*snap.notes, note), gpu_hour_usd=price, settled=True)


def recounted(store: Store, snap: Snapshot, previous: Mapping[str, Any] | None) -> Snapshot | None:
    """``snap`` with its counters recounted from the stored records; None when a record cannot be read.

    The start time and GPU time come from ``previous`` (the last progress.json of the job, not
    final) when there is one; the finish time is unknown.
    """
    stats = {"samples_ok": 0.0, "samples_failed": 0.0, "completion_tokens": 0.0, "prompt_tokens": 0.0}
    stats["samples_repaired"] = 0.0
    stats |= {"spec_tokens": 0.0, "spec_verify_ct": 0.0}
    try:
        manifest = load_manifest(store)
        if manifest is None:
            return None
        for record in iter_records(store, manifest):
            stats["samples_ok" if record.ok else "samples_failed"] += 1
            stats["samples_repaired"] += record.ok and record.repair is not None
            stats["completion_tokens"] += record.usage.completion_tokens
            stats["prompt_tokens"] += record.usage.prompt_tokens
            tokens, verify = spec_counts(record)
            stats["spec_tokens"] += tokens
            stats["spec_verify_ct"] += verify
    except DflashError:
        return None
    job = dict(snap.job)
    ours = previous if previous and previous.get("job_id") == snap.job_id else {}
    if ours.get("started_at"):
        job["started_at"] = str(ours["started_at"])
    cost_doc = ours.get("cost") or {}
    job["gpu_seconds"] = str(
        num(cost_doc.get("gpu_hours")) * 3600.0 if isinstance(cost_doc, Mapping) else 0.0
    )
    note = (
        f"finished job: counts recounted from its {int(stats['samples_ok'] + stats['samples_failed']):,} "
        "stored records (Redis holds none of its counters and no final progress.json was written); "
        "the finish time is unknown"
    )
    return replace(snap, job=job, stats=stats, notes=(*snap.notes, note), settled=True)


def settle(store: Store, snap: Snapshot, previous: Mapping[str, Any] | None) -> Snapshot | None:
    """The finished job's figures when :func:`counters_gone`, else None (``snap`` is fine as read)."""
    if not counters_gone(snap):
        return None
    if is_final(previous, snap):
        assert previous is not None
        return from_final(snap, previous)
    return recounted(store, snap, previous)
