"""The job figures of the progress.json a worker wrote, as Prometheus gauges, while fresh."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from dflash_tasks.monitoring.job_metrics import JobProgressGauges

DOC: dict[str, Any] = {
    "job_id": "j1",
    "state": "paused",
    "pause_reason": "empty answers 12% > 5%",
    "updated_at": 1_800_000_000.0,
    "elapsed_s": 120.0,
    "eta_s": None,  # unknown: no series
    "samples": {"total": 1000, "done": 400, "ok": 398, "failed": 2, "remaining": 600},
    "chunks": {"total": 50, "done": 20, "running": 3, "pending": 27},
    "tokens": {"generated": 900_000, "prompt": 40_000},
    "cost": {"gpus": 7, "gpu_hours": 0.23, "usd": 0.9, "projected_total_usd": None},
    "spec": {"job": 3.1, "window": 2.9},
}


def scrape(gauges: JobProgressGauges) -> str:
    registry = CollectorRegistry()
    registry.register(gauges)
    return generate_latest(registry).decode()


def test_a_fresh_document_is_exported_then_dropped() -> None:
    now = [100.0]
    gauges = JobProgressGauges("gpu0@n", fresh_s=15.0, clock=lambda: now[0])
    assert scrape(gauges) == ""
    gauges.written(DOC)
    text = scrape(gauges)
    for line in (
        'dflash_job_samples{job="j1",kind="done",worker="gpu0@n"} 400.0',
        'dflash_job_chunks{job="j1",kind="pending",worker="gpu0@n"} 27.0',
        'dflash_job_tokens{job="j1",kind="generated",worker="gpu0@n"} 900000.0',
        'dflash_job_cost_usd{job="j1",kind="spent",worker="gpu0@n"} 0.9',
        'dflash_job_gpus{job="j1",worker="gpu0@n"} 7.0',
        'dflash_job_accept_length{job="j1",window="last_minute",worker="gpu0@n"} 2.9',
        'dflash_job_paused{job="j1",reason="empty answers 12% > 5%",worker="gpu0@n"} 1.0',
        'dflash_job_done{job="j1",worker="gpu0@n"} 0.0',
    ):
        assert line in text, line
    assert "dflash_job_eta_seconds{" not in text and 'kind="projected"' not in text  # unknown
    now[0] += 16  # another worker writes the job's progress now: this one stops exporting it
    assert scrape(gauges) == ""


def test_the_yield_section_as_gauges() -> None:
    section = {
        "generated_tokens": 90_000,
        "trainable_tokens": 72_000,
        "yield": 0.8,
        "where_the_rest_went": {
            "dropped_rows": {"truncated": 7_000},
            "failed_turns": 1_000,
            "superseded": 2_000,
            "looping": 4_000,
            "past_max_length": 3_000,
            "untrained_in_written_rows": 5_000,
        },
        "usd_per_million_trainable": 15.15,
    }
    gauges = JobProgressGauges("gpu0@n", fresh_s=15.0)
    gauges.written({**DOC, "yield": section})
    text = scrape(gauges)
    for line in (
        'dflash_job_yield_tokens{job="j1",kind="generated",worker="gpu0@n"} 90000.0',
        'dflash_job_yield_tokens{job="j1",kind="trainable",worker="gpu0@n"} 72000.0',
        'dflash_job_yield_ratio{job="j1",worker="gpu0@n"} 0.8',
        'dflash_job_yield_rest_tokens{job="j1",where="dropped_truncated",worker="gpu0@n"} 7000.0',
        'dflash_job_yield_rest_tokens{job="j1",where="superseded",worker="gpu0@n"} 2000.0',
        'dflash_job_yield_rest_tokens{job="j1",where="looping",worker="gpu0@n"} 4000.0',
        'dflash_job_yield_rest_tokens{job="j1",where="untrained",worker="gpu0@n"} 5000.0',
        'dflash_job_usd_per_million_trainable{job="j1",worker="gpu0@n"} 15.15',
    ):
        assert line in text, line
    gauges.written(DOC)  # a job no worker counted: no yield series
    samples = [line for line in scrape(gauges).splitlines() if not line.startswith("#")]
    assert not [line for line in samples if "yield" in line or "per_million" in line]


def test_loops_as_gauges_from_the_jobs_counters() -> None:
    gauges = JobProgressGauges("gpu0@n", fresh_s=15.0)
    gauges.written(DOC)
    assert "dflash_job_loops{" not in scrape(gauges)  # no loop yet: no series
    counters = {"check_looping": 40.0, "looped_generations": 52.0, "loop_tokens_saved": 150_000.0}
    gauges.written({**DOC, "counters": counters})
    text = scrape(gauges)
    for line in (
        'dflash_job_loops{job="j1",kind="samples",worker="gpu0@n"} 40.0',
        'dflash_job_loops{job="j1",kind="generations",worker="gpu0@n"} 52.0',
        'dflash_job_loops{job="j1",kind="tokens_saved",worker="gpu0@n"} 150000.0',
    ):
        assert line in text, line
