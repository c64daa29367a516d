"""The job page on a large output: a generated 1M-sample local output (``--quick``: 100k), served by
``python -m dflash_tasks.page`` in its own process (no Redis: the finished-job path), asked over HTTP.

The output is 1,000-sample chunk files of short records (a tenth truncated, one in a thousand
failed), written by repeating one encoded chunk with its ids renumbered. Figures: seconds to the
first answer of each view (the run view, the first page of samples, a rare-filter page, one sample
by its shared address with and without the chunk hint, a random sample), and the page process's
peak resident memory (VmHWM) after all of them. The job's final ``progress.json`` is written too, as
a finished job leaves it: without one, ``status`` and the page recount every stored record once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import requests

from benchmarks.common import Benchmark, Figures, Goal, Options, say, stack, workspace
from dflash_tasks.coord.progress_keys import PROGRESS_KEY
from dflash_tasks.core.job import GenerationSpec, JobDefinition, Manifest, output_key
from dflash_tasks.store import LocalStore
from tests.helpers import free_port, wait_until
from tests.monitoring.page.records_support import make_record

CHUNK = 1000
AUTH = ("bench", "bench-password")


def write_output(root: Path, samples: int) -> tuple[str, str]:
    """A job of ``samples`` samples, every chunk stored; returns (an id in the last chunk, that chunk)."""
    store = LocalStore(str(root))
    chunks = samples // CHUNK
    definition = JobDefinition.create("bench", "bench.jsonl", GenerationSpec(model="bench/model"))
    store.write("job.json", definition.to_json())
    manifest = Manifest(definition.job_id, samples, samples, 0, CHUNK, chunks)
    store.write("manifest.json", manifest.to_json())
    lines = []
    for i in range(CHUNK):
        truncated = i % 10 == 0
        record = make_record(
            f"ID{i:04d}-CHUNK",
            tokens=600 if truncated else 40 + i % 500,
            finish="length" if truncated else "stop",
            ok=i != 500,
            checks=("truncated",) if truncated else (),
            prompt=f"Question {i}: what is {i} * 7?",
            reasoning="alpha beta gamma delta " * 20,
            answer=f"The answer is {i * 7}.",
        )
        lines.append(record.to_json())
    template = "\n".join(lines) + "\n"
    for chunk in range(chunks):
        store.write(output_key(chunk), template.replace("-CHUNK", f"-{chunk:06d}").encode())
    store.write(PROGRESS_KEY, json.dumps(final_progress(definition.job_id, samples)).encode())
    return f"ID0999-{chunks - 1:06d}", str(chunks - 1)


def final_progress(job_id: str, samples: int) -> dict[str, Any]:
    """The final progress.json a finished job leaves (what the page reads once Redis is gone)."""
    failed = samples // CHUNK
    now = time.time()
    return {
        "version": 1,
        "job_id": job_id,
        "state": "done",
        "started_at": now - 3600,
        "finished_at": now,
        "updated_at": now,
        "updated_at_iso": "",
        "samples": {"done": samples, "failed": failed},
        "tokens": {"generated": 300 * samples, "prompt": 5 * samples, "counted_samples": samples},
        "cost": {"gpu_hours": 8.0, "gpu_hour_usd": 2.5},
        "counters": {"check_truncated": samples // 10},
    }


def timed_get(url: str) -> tuple[float, requests.Response]:
    started = time.perf_counter()
    res = requests.get(url, auth=AUTH, timeout=300, allow_redirects=False)
    return time.perf_counter() - started, res


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(opts: Options) -> tuple[Figures, dict[str, Any]]:
    samples = int(opts.get("samples", 100_000 if opts.quick else 1_000_000))
    with workspace("page", opts) as work, stack(work) as (_, procs):
        out = work / "out"
        made = time.perf_counter()
        last_id, last_chunk = write_output(out, samples)
        say(f"wrote {samples:,} samples in {time.perf_counter() - made:.0f} s")
        port = free_port()
        procs.env["DFLASH_PAGE_BASIC_AUTH"] = ":".join(AUTH)
        procs.env["DFLASH_BROKER_URL"] = f"redis://127.0.0.1:{free_port()}/0"  # a finished job: no Redis
        page = procs.spawn(["-m", "dflash_tasks.page", "--output", str(out), "--port", str(port)], "page.log")
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _up(url), 120, "the page")
        figures: Figures = {"samples": float(samples)}
        for key, path in (
            ("run_view_s", "/"),
            ("first_samples_page_s", "/samples"),
            ("failed_filter_page_s", "/samples?outcome=failed"),
            ("truncated_filter_page_s", "/samples?outcome=truncated"),
            ("sample_with_chunk_hint_s", f"/samples/{last_id}?chunk={last_chunk}"),
            ("random_sample_s", "/samples/random"),
            ("sample_by_id_scan_s", f"/samples/{last_id}"),
        ):
            seconds, res = timed_get(url + path)
            assert res.status_code in (200, 302), (path, res.status_code)
            figures[key] = seconds
            say(f"{path}: {seconds:.3f} s")
        figures["peak_rss_mb"] = peak_rss_mb(page.pid)
    return figures, {"chunk_size": CHUNK}


def _up(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 401
    except requests.RequestException:
        return False


def goals(opts: Options) -> list[Goal]:
    return [
        Goal("run_view_s", "<=", 1.0, "the run view answers within a second"),
        Goal("first_samples_page_s", "<=", 1.0, "the first page of samples within a second"),
        Goal("sample_with_chunk_hint_s", "<=", 1.0, "a shared sample address within a second"),
        Goal("peak_rss_mb", "<=", 300.0, "memory bounded: the page never holds the whole output"),
    ]


BENCHMARK = Benchmark("page", __doc__.splitlines()[0], run, goals)
