"""The repetition detector's cost per token: what watching a stream for loops adds to each delta.

Streams are fed token by token (SGLang's default ``--stream-interval 1``) and 4 tokens a delta
(a larger interval, or speculative decoding's several tokens a step), through fresh detectors with
the default thresholds: the corpus of natural reasoning (tests/core/data/reasoning, joined, about
15,000 tokens), a worst case for the candidate search (a long table whose rows differ only in
their index: the tail recurs once a row, every check verifies the most candidates), and a loop
until it is seen. Figures are nanoseconds per token (``perf_counter_ns``, the best of the runs,
tokenized beforehand).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from benchmarks.common import Benchmark, Figures, Goal, Options, say
from dflash_tasks.core.repetition import RepetitionDetector
from tests.repetition_support import PARAGRAPH, corpus, looping, tokens


def _chunks(pieces: Sequence[str], per_chunk: int) -> list[tuple[str, int]]:
    return [
        ("".join(pieces[at : at + per_chunk]), len(pieces[at : at + per_chunk]))
        for at in range(0, len(pieces), per_chunk)
    ]


def _ns_per_token(chunks: list[tuple[str, int]], runs: int, expect_loop: bool) -> float:
    best = float("inf")
    for _ in range(runs):
        detector = RepetitionDetector()
        fed = 0
        started = time.perf_counter_ns()
        for delta, count in chunks:
            fed += count
            if detector.feed(delta, count) is not None:
                break
        elapsed = time.perf_counter_ns() - started
        if (detector.loop is not None) != expect_loop:
            raise AssertionError(f"expected a loop: {expect_loop}, got {detector.loop}")
        best = min(best, elapsed / fed)
    return best


def _numbered_zero_table(rows: int) -> str:
    return "".join(f"| {i} | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 |\n" for i in range(rows))


def run(opts: Options) -> tuple[Figures, dict[str, Any]]:
    runs = int(opts.get("runs", 3 if opts.quick else 10))
    natural = "\n\n".join(corpus().values())
    texts = {
        "natural": (natural, False),
        "table": (_numbered_zero_table(int(opts.get("table_rows", 400))), False),
        "loop": (looping(natural[:6000], PARAGRAPH), True),
    }
    figures: Figures = {}
    detail: dict[str, Any] = {"runs": runs}
    for name, (text, expect_loop) in texts.items():
        pieces = tokens(text)
        detail[f"{name}_tokens"] = len(pieces)
        for per_chunk in (1, 4):
            key = f"{name}_ns_per_token_{per_chunk}_per_delta"
            figures[key] = _ns_per_token(_chunks(pieces, per_chunk), runs, expect_loop)
            say(f"{name}, {per_chunk} token(s) a delta: {figures[key]:.0f} ns per token")
    return figures, detail


def goals(opts: Options) -> list[Goal]:
    return [
        Goal("natural_ns_per_token_1_per_delta", "<=", 1000.0, "natural reasoning, one token a delta"),
        Goal("table_ns_per_token_1_per_delta", "<=", 1000.0, "the candidate search's worst case"),
    ]


BENCHMARK = Benchmark("repetition", __doc__.splitlines()[0], run, goals)
