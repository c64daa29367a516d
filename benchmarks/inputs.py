"""Inputs: the same chat prompts staged from each input format, time and peak memory per format.

``--set rows=N`` prompts (default 5,000,000, the issue's scale; ``--quick``: 100,000), about 1 KB
each (``{"id", "messages"}``), generated once into ``benchmarks/.cache/`` as one JSONL file (plain,
gzip, zstd), Parquet shards of 250,000 rows (one row group each) and Arrow IPC stream shards. Each
format is staged and queued by ``python -m dflash_tasks.enqueue --no-preflight`` on a fresh output
root against a private Redis, under GNU time:

* ``<format>_s``: wall time of the command (listing, fingerprint, reading and validating every
  row, chunk files, manifest, one message per chunk), and ``<format>_us_per_row``;
* ``<format>_peak_mb``: its peak resident memory;
* ``parquet_vs_jsonl_per_row``: Parquet's time per row over plain JSONL's, and
  ``parquet_over_jsonl_peak_mb``: how much more memory Parquet's run took.

``--set s3=1`` also stages the gzipped JSONL file and the Parquet shards from a moto S3 server
(``s3-jsonl.gz``, ``s3-parquet``: streamed through the store's S3 boundary); moto holds its objects
in memory, so keep it to a few hundred thousand rows. ``--set formats=jsonl,parquet`` stages only
those. The 5,000,000-row run, ``python -m benchmarks inputs --set rows=5000000``, needs about 20 GB
of free disk for the cached inputs, plus one staged copy (about 5 GB) while a format runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Benchmark,
    Figures,
    Goal,
    Options,
    check,
    enqueue_args,
    last_json,
    say,
    stack,
    workspace,
)
from benchmarks.prompts import CHAT_FORMATS, cached_chat_formats
from tests.helpers import REPO

FULL = 5_000_000
QUICK = 100_000
S3_FORMATS = ("jsonl.gz", "parquet")


def run(opts: Options) -> tuple[Figures, dict[str, Any]]:
    rows = int(opts.get("rows", QUICK if opts.quick else FULL))
    chosen = _formats(opts)
    check(set(chosen) <= set(CHAT_FORMATS), f"--set formats: choose among {', '.join(CHAT_FORMATS)}")
    paths = cached_chat_formats(rows)
    figures: Figures = {"rows": float(rows), "load_avg_1m_before": os.getloadavg()[0]}
    with workspace("inputs", opts) as work, stack(work) as (_, procs):
        for fmt in chosen:
            figures.update(_stage(procs, fmt, str(paths[fmt]), rows, work))
        if opts.get("s3", 0):
            with _s3_copies(work, paths) as (locations, env):
                for fmt in S3_FORMATS:
                    figures.update(_stage(procs, f"s3-{fmt}", locations[fmt], rows, work, env))
    if "parquet_s" in figures and "jsonl_s" in figures:
        figures["parquet_vs_jsonl_per_row"] = figures["parquet_s"] / figures["jsonl_s"]
        figures["parquet_over_jsonl_peak_mb"] = figures["parquet_peak_mb"] - figures["jsonl_peak_mb"]
    return figures, {"formats": chosen, "inputs": {k: str(v) for k, v in paths.items()}}


def _stage(
    procs: Any, label: str, location: str, rows: int, work: Path, env: dict[str, str] | None = None
) -> Figures:
    """Stage and queue ``location`` on a fresh output root; the figures of ``label``."""
    out = work / f"out-{label}"
    say(f"stage + enqueue {rows:,} chat prompts from {label} ...")
    args = ["--input", location, *enqueue_args(out, out, "--json")[2:]]  # an s3:// location is no Path
    seconds, peak_kb, stdout = _timed({**procs.env, **(env or {})}, args)
    check(int(last_json(stdout)["samples"]) == rows, f"{label}: not every row staged")
    shutil.rmtree(out, ignore_errors=True)  # one staged copy on disk at a time
    say(f"{label}: {seconds:.1f}s, {seconds / rows * 1e6:.1f} µs/row, peak {peak_kb / 1024:.0f} MB")
    key = label.replace(".", "_").replace("-", "_")
    return {f"{key}_s": seconds, f"{key}_us_per_row": seconds / rows * 1e6, f"{key}_peak_mb": peak_kb / 1024}


def _timed(env: dict[str, str], args: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak resident KB, stdout) of ``enqueue args`` under GNU time."""
    started = time.monotonic()
    res = subprocess.run(
        ["/usr/bin/time", "-f", "PEAK_KB %M", sys.executable, "-m", "dflash_tasks.producer.enqueue", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=4 * 3600,
    )
    seconds = time.monotonic() - started
    check(res.returncode == 0, f"enqueue exited {res.returncode}: {res.stderr[-2000:]}")
    peak = [line for line in res.stderr.splitlines() if line.startswith("PEAK_KB ")][-1]
    return seconds, float(peak.split()[1]), res.stdout


@contextmanager
def _s3_copies(work: Path, paths: dict[str, Path]) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """The S3 formats uploaded to a moto server: ({format: s3:// location}, the reader's environment)."""
    from tests.s3_support import MotoServer, aws_env

    server = MotoServer(work / "moto.log")
    try:
        bucket = server.new_bucket("inputs")
        client = server.client()
        locations: dict[str, str] = {}
        for fmt in S3_FORMATS:
            path = paths[fmt]
            files = sorted(path.iterdir()) if path.is_dir() else [path]
            for f in files:
                client.upload_file(str(f), bucket, f"{fmt}/{f.name}")
            locations[fmt] = f"s3://{bucket}/{fmt}" if path.is_dir() else f"s3://{bucket}/{fmt}/{path.name}"
        yield locations, aws_env(server.url)
    finally:
        server.stop()


def _formats(opts: Options) -> list[str]:
    return opts.params.get("formats", ",".join(CHAT_FORMATS)).split(",")


def goals(opts: Options) -> list[Goal]:
    """Parquet against JSONL, when both are staged."""
    if not {"jsonl", "parquet"} <= set(_formats(opts)):
        return []
    return [
        Goal("parquet_vs_jsonl_per_row", "<=", 1.0, "Parquet staged at least as fast per row as JSONL"),
        Goal(
            "parquet_over_jsonl_peak_mb",
            "<=",
            80,
            "Parquet's memory beyond JSONL's: its library and a few batches, not a row group",
        ),
    ]


BENCHMARK = Benchmark("inputs", __doc__.splitlines()[0], run, goals)
