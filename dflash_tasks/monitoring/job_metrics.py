"""The job-level figures of ``progress.json`` as Prometheus gauges (ETA, cost, totals, pause).

A worker's own counters cannot tell how many samples a job has, when it will end or what it
costs: those come from the progress document. Whichever worker writes a job's ``progress.json``
(one per period, by lock) also exports that document here, for ``fresh_s`` seconds; so at any
moment one or two workers export a job's figures, which agree to within one period, and
dashboards read them with ``max by (job)``. Series (besides the ``worker`` label):

    dflash_job_samples{job,kind}           total, done, ok, failed, remaining
    dflash_job_chunks{job,kind}            total, done, running, pending
    dflash_job_tokens{job,kind}            generated, prompt (stored chunks, counted once)
    dflash_job_eta_seconds{job}            remaining ÷ the last minute's rate (absent while unknown)
    dflash_job_elapsed_seconds{job}        first chunk → now (or the finish)
    dflash_job_cost_usd{job,kind}          spent, projected (total at the end); absent without a price
    dflash_job_gpu_hours{job}              GPU time billed so far
    dflash_job_gpus{job}                   live workers on the job
    dflash_job_accept_length{job,window}   job (every stored sample), last_minute
    dflash_job_yield_tokens{job,kind}      generated, trainable (the counted chunks; absent without a count)
    dflash_job_yield_ratio{job}            trainable ÷ generated tokens of the counted chunks
    dflash_job_yield_rest_tokens{job,where}  the other generated tokens: dropped_<reason>, failed_turns,
                                           superseded, looping, past_max_length, untrained
    dflash_job_usd_per_million_trainable{job}  spend per generated token ÷ the yield; absent without a price
    dflash_job_loops{job,kind}             samples (first passes stopped in a loop), generations (repair
                                           rounds' too), tokens_saved (budget their stops left unspent)
    dflash_job_paused{job,reason}          1 while a quality gate holds the job paused, else 0
    dflash_job_done{job}                   1 once every chunk is stored
    dflash_job_progress_timestamp_seconds{job}  when the document was computed
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dflash_tasks.core.on_loop import loop_figures

#: Labels of every family below, in this order.
_JOB = ["worker", "job"]


class JobProgressGauges(Collector):
    """The last progress document this process wrote per job, while it is fresh."""

    def __init__(self, worker: str, fresh_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.worker = worker
        self.fresh_s = fresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._docs: dict[str, tuple[float, Mapping[str, Any]]] = {}

    def written(self, doc: Mapping[str, Any]) -> None:
        """Remember ``doc`` (a progress document this process just wrote)."""
        with self._lock:
            self._docs[str(doc["job_id"])] = (self._clock(), doc)

    def fresh(self) -> list[Mapping[str, Any]]:
        now = self._clock()
        with self._lock:
            for job in [j for j, (t, _) in self._docs.items() if now - t > self.fresh_s]:
                del self._docs[job]
            return [doc for _, doc in self._docs.values()]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        docs = self.fresh()
        if not docs:
            return
        families = {
            name: GaugeMetricFamily(name, help_, labels=labels)
            for name, help_, labels in (
                ("dflash_job_samples", "Samples of the job, by kind.", [*_JOB, "kind"]),
                ("dflash_job_chunks", "Chunks of the job, by kind.", [*_JOB, "kind"]),
                ("dflash_job_tokens", "Tokens of the job's stored chunks, by kind.", [*_JOB, "kind"]),
                ("dflash_job_eta_seconds", "Seconds until the job is done, at the last minute's rate.", _JOB),
                ("dflash_job_elapsed_seconds", "Seconds since the job's first chunk (to its finish).", _JOB),
                ("dflash_job_cost_usd", "GPU cost of the job: spent, projected total.", [*_JOB, "kind"]),
                ("dflash_job_gpu_hours", "GPU-hours billed to the job so far.", _JOB),
                ("dflash_job_gpus", "Live workers on the job.", _JOB),
                ("dflash_job_accept_length", "Accept length of the job's samples.", [*_JOB, "window"]),
                (
                    "dflash_job_yield_tokens",
                    "Generated and trainable tokens of counted chunks.",
                    [*_JOB, "kind"],
                ),
                ("dflash_job_yield_ratio", "Trainable tokens per generated token (counted chunks).", _JOB),
                (
                    "dflash_job_yield_rest_tokens",
                    "Generated tokens the trainer does not get, by where they went.",
                    [*_JOB, "where"],
                ),
                ("dflash_job_usd_per_million_trainable", "Cost of a million trainable tokens so far.", _JOB),
                (
                    "dflash_job_loops",
                    "Loops: samples and generations stopped in one, tokens their stops saved.",
                    [*_JOB, "kind"],
                ),
                ("dflash_job_paused", "1 while a quality gate holds the job paused.", [*_JOB, "reason"]),
                ("dflash_job_done", "1 once every chunk of the job is stored.", _JOB),
                ("dflash_job_progress_timestamp_seconds", "When the progress was computed.", _JOB),
            )
        }
        for doc in docs:
            for name, labels, value in job_samples(doc):
                families[name].add_metric([self.worker, str(doc["job_id"]), *labels], value)
        yield from families.values()


def job_samples(doc: Mapping[str, Any]) -> Iterator[tuple[str, tuple[str, ...], float]]:
    """``(family, extra label values, value)`` for each gauge of one progress document."""
    for family, section, kinds in (
        ("dflash_job_samples", "samples", ("total", "done", "ok", "failed", "remaining")),
        ("dflash_job_chunks", "chunks", ("total", "done", "running", "pending")),
        ("dflash_job_tokens", "tokens", ("generated", "prompt")),
    ):
        part = doc.get(section) or {}
        for kind in kinds:
            if isinstance(part.get(kind), int | float):
                yield family, (kind,), float(part[kind])
    for family, value in (
        ("dflash_job_eta_seconds", doc.get("eta_s")),
        ("dflash_job_elapsed_seconds", doc.get("elapsed_s")),
        ("dflash_job_progress_timestamp_seconds", doc.get("updated_at")),
    ):
        if isinstance(value, int | float):
            yield family, (), float(value)
    cost = doc.get("cost") or {}
    for kind, key in (("spent", "usd"), ("projected", "projected_total_usd")):
        if isinstance(cost.get(key), int | float):
            yield "dflash_job_cost_usd", (kind,), float(cost[key])
    yield "dflash_job_gpu_hours", (), float(cost.get("gpu_hours") or 0.0)
    yield "dflash_job_gpus", (), float(cost.get("gpus") or 0)
    spec = doc.get("spec") or {}
    for window, key in (("job", "job"), ("last_minute", "window")):
        if isinstance(spec.get(key), int | float):
            yield "dflash_job_accept_length", (window,), float(spec[key])
    yield from yield_samples(doc.get("yield") or {})
    for kind, n in (loop_figures(doc.get("counters") or {}) or {}).items():
        yield "dflash_job_loops", (kind,), float(n)
    paused = doc.get("state") == "paused"
    yield "dflash_job_paused", (str(doc.get("pause_reason") or "") if paused else "",), 1.0 if paused else 0.0
    yield "dflash_job_done", (), 1.0 if doc.get("state") == "done" else 0.0


def yield_samples(section: Mapping[str, Any]) -> Iterator[tuple[str, tuple[str, ...], float]]:
    """The gauges of the progress document's ``yield`` section (none before a counted chunk)."""
    for kind, key in (("generated", "generated_tokens"), ("trainable", "trainable_tokens")):
        if isinstance(section.get(key), int | float):
            yield "dflash_job_yield_tokens", (kind,), float(section[key])
    for family, key in (
        ("dflash_job_yield_ratio", "yield"),
        ("dflash_job_usd_per_million_trainable", "usd_per_million_trainable"),
    ):
        if isinstance(section.get(key), int | float):
            yield family, (), float(section[key])
    rest = section.get("where_the_rest_went") or {}
    for reason, n in (rest.get("dropped_rows") or {}).items():
        yield "dflash_job_yield_rest_tokens", (f"dropped_{reason}",), float(n)
    for where, key in (
        ("failed_turns", "failed_turns"),
        ("superseded", "superseded"),
        ("looping", "looping"),
        ("past_max_length", "past_max_length"),
        ("untrained", "untrained_in_written_rows"),
    ):
        if isinstance(rest.get(key), int | float):
            yield "dflash_job_yield_rest_tokens", (where,), float(rest[key])
