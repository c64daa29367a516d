"""One row per worker of a job in the progress document: its counts, rates, state and accept length."""

from __future__ import annotations

from dflash_tasks.core.spec_stats import SOURCE_PER_REQUEST, SOURCE_SERVER, pooled_accept_length
from dflash_tasks.core.tuner_state import TunerState
from dflash_tasks.monitoring.fleet import alive
from dflash_tasks.monitoring.progress_document import WorkerRow
from dflash_tasks.monitoring.rates import rounded, window_rate, window_total
from dflash_tasks.monitoring.snapshot import Snapshot, num


def worker_rows(snap: Snapshot, now: float) -> tuple[WorkerRow, ...]:
    """The job's workers, by name: what each did for it and its state now."""
    rows: list[WorkerRow] = []
    for name in sorted(snap.per_worker):
        counts = snap.per_worker[name]
        beat = snap.workers.get(name, {})
        first = counts.get("first") or None
        server = num(beat.get("server_accept_length")) or None
        own = pooled_accept_length(counts.get("spec_tokens", 0.0), counts.get("verify", 0.0))
        window = pooled_accept_length(
            window_total(snap.buckets, f"{name}|spec_tokens", now),
            window_total(snap.buckets, f"{name}|verify", now),
        )
        accept, source = (own, SOURCE_PER_REQUEST) if own is not None else (server, SOURCE_SERVER)
        rows.append(
            WorkerRow(
                name=name,
                endpoint=beat.get("endpoint", ""),
                alive=bool(beat) and alive(beat, now),
                last_seen_s=rounded(now - num(beat.get("last_seen")), 1) if beat else None,
                healthy=beat.get("healthy") == "1" if beat else None,
                samples=int(counts.get("samples", 0.0)),
                failed=int(counts.get("failed", 0.0)),
                tokens=int(counts.get("tokens", 0.0)),
                chunks=int(counts.get("chunks", 0.0)),
                samples_per_s=round(window_rate(snap.buckets, f"{name}|samples", now, first), 3),
                tokens_per_s=round(window_rate(snap.buckets, f"{name}|tokens", now, first), 1),
                inflight=int(num(beat.get("inflight"))),
                waiting=int(num(beat.get("waiting"))),
                max_inflight=int(num(beat.get("max_inflight"))),
                held_chunks=int(num(beat.get("held_chunks"))),
                spec_accept_length=rounded(accept, 3),
                spec_accept_source=source if accept is not None else None,
                spec_accept_length_window=rounded(window, 3),
                server_accept_length=rounded(server, 3),
                tuner=TunerState.from_json(beat.get("tuner", "")),
            )
        )
    return tuple(rows)
