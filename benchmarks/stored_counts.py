"""``python -m benchmarks stored_counts``: ``export`` and ``report`` of a 1M-sample output that adds up.

The workers store each record's loss counts (``loss_counts``, counted beside the server), so
``export`` and ``report`` add up instead of re-tokenizing. In-process generation, no services:
``distinct`` samples (default 2,000; a quarter multi-turn, thoughts of mean ``mean_tokens`` 300
tokens on the tests' tiny Qwen3-style tokenizer, ``benchmarks/trainable_yield.py``'s generator) are
counted once as the worker counts them (``count_ms_per_record``: the worker's cost per record)
and planned as the worker plans a stored chunk's live yield from those counts
(``live_yield_ms_per_record``: no row tokenized again), then repeated under fresh ids up to
``samples`` (default 1,000,000; ``--quick`` 100,000) in chunks of 500. Then, each in its own
process: ``python -m dflash_tasks.export`` (jsonl) and ``python -m dflash_tasks.report --json``:
wall time and peak memory (``VmHWM``, sampled every 0.2 s) of each, and the export's yield against
a recount of the ``distinct`` samples without stored counts.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import Benchmark, Figures, Goal, Options, check, say
from benchmarks.trainable_yield import CHUNK, MAX_LENGTH, TEMPLATE, Generator, make_records
from dflash_tasks.core.job import JOB_KEY, MANIFEST_KEY, GenerationSpec, JobDefinition, Manifest, output_key
from dflash_tasks.core.record import Record, encode_records
from dflash_tasks.core.stored_counts import RecordCounter
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir
from dflash_tasks.store import LocalStore
from workers.checks.chunk_yield import yield_counters
from workers.checks.loss_counting import LossCountCache


def _job(samples: int) -> JobDefinition:
    trainer = TrainerView(max_length=MAX_LENGTH, template=TEMPLATE)
    return JobDefinition.create(
        "sha256:bench", "in.jsonl", GenerationSpec("m", chunk_size=CHUNK), trainer=trainer
    )


def _write(root: Path, job: JobDefinition, distinct: list[Record], samples: int) -> None:
    store = LocalStore(root)
    store.write(JOB_KEY, job.to_json())
    chunks = math.ceil(samples / CHUNK)
    store.write(MANIFEST_KEY, Manifest("j", samples, samples, 0, CHUNK, chunks).to_json())
    for c in range(chunks):
        ids = range(c * CHUNK, min(samples, (c + 1) * CHUNK))
        batch = [replace(distinct[i % len(distinct)], id=f"s{i}") for i in ids]
        store.write(output_key(c), encode_records(batch))


def _live_yield_ms(job: JobDefinition, model: str, counted: list[Record]) -> float:
    """Milliseconds per record of the worker's live yield (:func:`workers.checks.chunk_yield.yield_counters`),
    a chunk at a time, from the stored counts (the counter is loaded before the clock starts)."""
    cache = LossCountCache()
    check(cache.counter("bench", job, model) is not None, "the worker cannot count here")
    started = time.monotonic()
    for at in range(0, len(counted), CHUNK):
        chunk = counted[at : at + CHUNK]
        check(bool(yield_counters(cache, "bench", job, model, chunk, where=f"records {at}+")), "not counted")
    return (time.monotonic() - started) * 1000 / len(counted)


def _timed(*argv: str) -> tuple[float, float, str]:
    """Seconds, peak RSS in MiB (``VmHWM``, read while it runs) and stdout of one command."""
    started = time.monotonic()
    peak_kib = 0
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([sys.executable, *argv], stdout=out, stderr=subprocess.DEVNULL)
        status = Path(f"/proc/{proc.pid}/status")
        while proc.poll() is None:
            try:
                lines = status.read_text().splitlines()
            except OSError:
                break
            peak_kib = max([peak_kib, *(int(x.split()[1]) for x in lines if x.startswith("VmHWM:"))])
            time.sleep(0.2)
        proc.wait()
        seconds = time.monotonic() - started
        out.seek(0)
        text = out.read().decode()
    check(proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}: {text[-2000:]}")
    return seconds, peak_kib / 1024, text


def _export_yield(root: Path, to: Path) -> tuple[float, float, dict[str, Any]]:
    seconds, mib, _ = _timed("-m", "dflash_tasks.export", "--output", str(root), "--to", str(to))
    manifest: dict[str, Any] = json.loads(Path(f"{to}.manifest.json").read_text())
    return seconds, mib, manifest


def run(opts: Options) -> tuple[Figures, dict[str, Any]]:
    samples = int(opts.get("samples", 100_000 if opts.quick else 1_000_000))
    distinct_n = int(opts.get("distinct", 2000))
    figures: Figures = {"samples": float(samples)}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model = str(build_model_dir(tmp / "model", QWEN3_TEMPLATE))
        gen = Generator(model, opts.get("mean_tokens", 300))
        job = _job(samples)
        plain = make_records(gen, distinct_n, model, MAX_LENGTH)  # the default budget
        started = time.monotonic()
        distinct = RecordCounter(job, model).counted(plain)
        figures["count_ms_per_record"] = (time.monotonic() - started) * 1000 / distinct_n
        say(
            f"counted {distinct_n:,} records as the worker does: {figures['count_ms_per_record']:.2f} ms each"
        )
        figures["live_yield_ms_per_record"] = _live_yield_ms(job, model, distinct)
        say(f"their live yield, chunk by chunk: {figures['live_yield_ms_per_record']:.3f} ms a record")

        # The recount: the distinct samples without stored counts, against the same samples with them.
        small_plain, small_stored = tmp / "plain", tmp / "stored"
        _write(small_plain, job, plain, distinct_n)
        _write(small_stored, job, distinct, distinct_n)
        s_plain, _, recount = _export_yield(small_plain, tmp / "plain.jsonl")
        s_stored, _, stored = _export_yield(small_stored, tmp / "stored.jsonl")
        check(stored["yield"]["yield"] is not None, f"the export counted no yield: {stored['yield']}")
        check(recount["yield"] == stored["yield"], f"stored {stored['yield']} != recount {recount['yield']}")
        figures.update(
            recount_export_s=s_plain, stored_export_s=s_stored, small_yield=stored["yield"]["yield"]
        )
        say(f"{distinct_n:,} samples: export {s_plain:.1f}s re-tokenizing, {s_stored:.1f}s adding up")

        root = tmp / "big"
        started = time.monotonic()
        _write(root, job, distinct, samples)
        figures["write_output_s"] = time.monotonic() - started
        figures["output_mb"] = sum(p.stat().st_size for p in (root / "outputs").iterdir()) / 2**20
        say(f"wrote {samples:,} samples ({figures['output_mb']:.0f} MB) in {figures['write_output_s']:.0f}s")
        seconds, mib, manifest = _export_yield(root, tmp / "big.jsonl")
        figures.update(export_s=seconds, export_peak_mib=mib, export_yield=manifest["yield"]["yield"])
        check(manifest["yield"]["yield"] == stored["yield"]["yield"], "the repeated output's yield differs")
        (tmp / "big.jsonl").unlink()
        say(f"export: {seconds:.0f}s, peak {mib:.0f} MiB, yield {manifest['yield']['yield']}")
        seconds, mib, _ = _timed(
            "-m", "dflash_tasks.report", "--output", str(root), "--json", "--png", str(tmp / "r.png")
        )
        figures.update(report_s=seconds, report_peak_mib=mib)
        say(f"report: {seconds:.0f}s, peak {mib:.0f} MiB")
    return figures, {"export_yield": manifest["yield"]}


def goals(opts: Options) -> list[Goal]:
    return [
        Goal("export_s", "<=", 1800, "export of the output with stored counts (2-core machine)"),
        Goal("export_peak_mib", "<=", 4096, "export's peak memory"),
        Goal("report_peak_mib", "<=", 4096, "report's peak memory"),
    ]


BENCHMARK = Benchmark("stored_counts", __doc__.splitlines()[0], run, goals)
