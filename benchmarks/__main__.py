"""``python -m benchmarks [name ...] [--quick] [--repeat N] [--set KEY=VALUE]``.

Runs the named benchmarks (default: all), each ``--repeat`` times, prints every run's figures and
their medians, writes ``benchmarks/results/<name>.json`` and exits 1 when a goal is missed by the
medians (2 when a benchmark could not run).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import signal
import sys
import time
import traceback
from typing import Any

from benchmarks.common import RESULTS_DIR, Benchmark, Figures, Options, median_figures, say

NAMES = (
    "saturation",
    "scale",
    "inputs",
    "overhead",
    "tune",
    "loss_tokens",
    "yield",
    "continuation",
    "page",
    "stored_counts",
    "repetition",
    "stream",
)
#: Benchmarks whose module is not named after them (``yield`` is a keyword).
MODULES = {"yield": "trainable_yield"}


def load(name: str) -> Benchmark:
    bench: Benchmark = importlib.import_module(f"benchmarks.{MODULES.get(name, name)}").BENCHMARK
    return bench


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_1m": os.getloadavg()[0],
    }


def print_figures(title: str, figures: Figures) -> None:
    print(title)
    for key, value in figures.items():
        print(f"  {key:42s} {value:14.4f}")


def run_one(bench: Benchmark, opts: Options, repeat: int) -> bool:
    runs: list[Figures] = []
    details: list[dict[str, Any]] = []
    for i in range(repeat):
        say(f"{bench.name}: run {i + 1}/{repeat}{' (quick)' if opts.quick else ''}")
        started = time.monotonic()
        figures, detail = bench.run(opts)
        detail["wall_seconds"] = time.monotonic() - started
        detail["load_avg_1m_after"] = os.getloadavg()[0]
        runs.append(figures)
        details.append(detail)
        print_figures(f"{bench.name} run {i + 1}:", figures)
    medians = median_figures(runs)
    goals = bench.goals(opts)
    verdicts = [{"goal": g.render(medians), "met": g.met(medians)} for g in goals]
    if repeat > 1:
        print_figures(f"{bench.name} medians of {repeat} runs:", medians)
    for v in verdicts:
        print(f"  {v['goal']}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": bench.name,
        "description": bench.description,
        "quick": opts.quick,
        "params": opts.params,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "medians": medians,
        "goals": verdicts,
        "passed": all(v["met"] for v in verdicts),
        "runs": runs,
        "details": details,
    }
    path = RESULTS_DIR / f"{bench.name}{'-quick' if opts.quick else ''}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    say(f"wrote {path}")
    return bool(doc["passed"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help=f"benchmarks to run (default: all of {', '.join(NAMES)})")
    p.add_argument("--quick", action="store_true", help="smaller inputs, shorter runs")
    p.add_argument("--repeat", type=int, default=1, help="runs per benchmark; goals apply to the medians")
    p.add_argument("--keep", action="store_true", help="keep each run's work directory (logs, outputs)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="benchmark parameter")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in NAMES]
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    params = dict(item.split("=", 1) for item in args.set)
    # a `kill` unwinds like Ctrl-C: the servers, workers and Redis a benchmark started are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    opts = Options(quick=args.quick, keep=args.keep, params=params)
    status = 0
    for name in args.names or NAMES:
        try:
            if not run_one(load(name), opts, max(1, args.repeat)):
                status = max(status, 1)
        except Exception:
            traceback.print_exc()
            say(f"{name}: could not run")
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
