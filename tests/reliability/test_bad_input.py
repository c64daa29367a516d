"""Bad input, fuzzed with hypothesis, run as real jobs: every bad line is a clear per-line error,
too-long prompts are failed samples (HTTP 400 from the server), the rest of the job proceeds,
and the worker never falls over.

Each example is a file of a few hundred lines: valid prompts, hypothesis-made junk (random
bytes, invalid UTF-8, JSON of the wrong shape with wrong types in every field) and fixed
adversarial lines (a 3 MB prompt, a 100k-token prompt, 100,000 levels of nesting, a 2 MB
unterminated line, a 5,000-digit id, lone surrogates, a stray BOM, NUL bytes), shuffled.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dflash_tasks.core.sample import Sample
from dflash_tasks.producer.inputs import InvalidLine
from dflash_tasks.producer.mix import read_input
from tests.helpers import Processes, RedisServer, generation, processes, read_records
from tests.reliability.support import (
    Collector,
    Row,
    account,
    enqueue_ok,
    expected_ids,
    export_check,
    logs,
    reset_sim_stats,
    start_worker,
    verify_json,
)

pytestmark = pytest.mark.reliability

EXAMPLES = 3
TOO_LONG = {"huge-prompt-3MB", "prompt-100k-tokens"}

ADVERSARIAL: list[bytes] = [
    json.dumps({"id": "huge-prompt-3MB", "prompt": "word " * 600_000}).encode(),
    json.dumps(
        {"id": "prompt-100k-tokens", "messages": [{"role": "user", "content": "tok " * 100_000}]}
    ).encode(),
    b"[" * 100_000 + b"]" * 100_000,
    b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    b'{"prompt": "' + b"x" * 2_000_000,  # 2 MB, never closed
    b'{"id": ' + b"7" * 5_000 + b', "prompt": "big id"}',
    b'{"prompt": "caf\xe9 au lait"}',  # Latin-1, not UTF-8
    b'{"prompt": "\\ud800 lone surrogate"}',
    b'\xef\xbb\xbf{"prompt": "a BOM, not on the first line"}',
    b"\x00\x01\x02\xff binary junk",
    b"   ",
    json.dumps({"id": "../../etc/x", "prompt": "an id that looks like a path"}).encode(),
    json.dumps({"id": "dup", "prompt": "first"}).encode(),
    json.dumps({"id": "dup", "prompt": "second, same id"}).encode(),
]

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
TURNS = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "role": JSON_VALUES | st.sampled_from(["user", "assistant", "system", "tool", "robot"]),
            "content": JSON_VALUES,
            "from": JSON_VALUES | st.sampled_from(["human", "gpt"]),
            "value": JSON_VALUES,
        },
    ),
    max_size=3,
)
WRONG_TYPES = st.fixed_dictionaries(
    {},
    optional={
        "id": JSON_VALUES,
        "messages": TURNS | JSON_VALUES,
        "conversations": TURNS | JSON_VALUES,
        "prompt": JSON_VALUES,
    },
).map(lambda doc: json.dumps(doc).encode())
RANDOM_BYTES = st.binary(min_size=1, max_size=80).map(lambda b: b.replace(b"\n", b" "))
BAD_UTF8 = st.binary(min_size=1, max_size=20).map(
    lambda b: b'{"prompt": "' + b.replace(b"\n", b" ").replace(b'"', b"'") + b'\xc3\x28"}'
)
ANY_JSON = JSON_VALUES.map(lambda v: json.dumps(v).encode())
FUZZ_LINE = WRONG_TYPES | RANDOM_BYTES | BAD_UTF8 | ANY_JSON


@st.composite
def fuzzed_files(draw: st.DrawFn) -> list[bytes]:
    junk = draw(st.lists(FUZZ_LINE, min_size=40, max_size=80))
    good = [
        json.dumps({"id": f"ok-{i}", "prompt": f"fine question {i}: what is {i} + 1?"}).encode()
        for i in range(draw(st.integers(150, 250)))
    ]
    lines = junk + good + ADVERSARIAL
    return [lines[i] for i in draw(st.permutations(range(len(lines))))]


@dataclass
class Fuzzer:
    procs: Processes
    worker_pid: int
    tmp: Path
    sim: str
    totals: dict[str, int] = field(default_factory=dict)


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[Fuzzer]:
    tmp = tmp_path_factory.mktemp("fuzz")
    with processes(tmp, redis_server.url, f"q{uuid.uuid4().hex[:8]}") as procs:
        sim = procs.simulator("--time-scale", "0.0005", "--mean-output-tokens", "300")
        worker = start_worker(procs, sim, "fuzz-gpu0")
        yield Fuzzer(procs, worker.pid, tmp, sim)


def run_fuzzed_job(fz: Fuzzer, lines: list[bytes]) -> dict[str, Any]:
    procs = fz.procs
    name = uuid.uuid4().hex[:8]
    inp, out = fz.tmp / f"{name}.jsonl", fz.tmp / f"out-{name}"
    inp.write_bytes(b"".join(line + b"\n" for line in lines))
    items = list(read_input(inp))
    bad = [i for i in items if isinstance(i, InvalidLine)]
    reset_sim_stats(fz.sim)  # count this job's generation alone
    summary = enqueue_ok(procs, inp, out, "--chunk-size", "32", "--wait")
    assert summary["invalid"] == len(bad) and summary["samples"] == len(items) - len(bad)

    reported = [json.loads(line) for line in (out / "invalid.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in reported] == [(b.line, b.reason) for b in bad]
    assert all(r["reason"] and r["file"].endswith(f"{name}.jsonl") for r in reported)
    reasons = {b.line: b.reason for b in bad}
    line_of = {line: n for n, line in enumerate(lines, 1)}
    assert reasons[line_of[b"[" * 100_000 + b"]" * 100_000]] == "malformed JSON: nesting too deep"
    assert reasons[line_of[b'{"prompt": "caf\xe9 au lait"}']].startswith("invalid UTF-8 at byte")
    dups = [reasons.get(line_of[line], "") for line in ADVERSARIAL[-2:]]  # whichever comes second
    assert sum("duplicate id 'dup'" in reason for reason in dups) == 1, dups

    records = read_records(out)
    failed = {r["id"]: r for r in records if r["status"] != "ok"}
    assert set(failed) == TOO_LONG, sorted(failed)
    assert all("context length" in r["error"] and r["attempts"] == 1 for r in failed.values())
    assert any(r["id"] == "../../etc/x" and r["status"] == "ok" for r in records)

    acc = account(inp, records)
    export_check(procs, str(out), expected_ids(inp), acc)
    rc, report = verify_json(procs, inp, out)
    assert rc == 0, report
    assert acc.lost == acc.duplicated == acc.unexpected == acc.export_duplicates == acc.export_missing == 0
    assert sum(isinstance(i, Sample) for i in items) == acc.expected
    gen = generation(inp, [fz.sim])
    assert gen.wasted == 0 and gen.ungenerated == len(TOO_LONG), gen  # rejected (400): never generated
    return {
        "lines": len(lines),
        "expected": acc.expected,
        "stored_once": acc.stored_once,
        "lost": acc.lost,
        "duplicated": acc.duplicated + acc.export_duplicates,
        "invalid": len(bad),
        "failed": len(failed),
        "wasted": gen.wasted,
    }


@pytest.mark.filterwarnings("ignore:Generating overly large repr")
def test_fuzzed_input_files_run_as_jobs(fuzzer: Fuzzer, reliability: Collector) -> None:
    results: list[dict[str, Any]] = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # a real job per example: no shrinking runs
        suppress_health_check=list(HealthCheck),
    )
    @given(lines=fuzzed_files())
    def one_file(lines: list[bytes]) -> None:
        results.append(run_fuzzed_job(fuzzer, lines))

    try:
        one_file()
    finally:
        total = {k: sum(r[k] for r in results) for k in results[0]} if results else {}
        log = logs(fuzzer.procs, "fuzz-gpu0.log")
        alive = _alive(fuzzer.worker_pid)
        if total:
            reliability.add(
                Row(
                    family="9",
                    fault="fuzzed input (hypothesis): random bytes, invalid UTF-8, 2-3 MB lines, "
                    "100k-level nesting, wrong types in every field, 100k-token prompts",
                    runs=len(results),
                    expected=total["expected"],
                    stored_once=total["stored_once"],
                    lost=total["lost"],
                    duplicated=total["duplicated"],
                    wasted=total["wasted"],
                    recover_s=None,
                    notes=f"{len(results)} jobs, {total['lines']:,} lines: {total['invalid']} invalid lines "
                    f"each reported with its reason, {total['failed']} too-long prompts stored as failed "
                    "samples (HTTP 400), the rest ok; worker "
                    + ("up throughout, no traceback" if alive and "Traceback" not in log else "IN TROUBLE"),
                    passed=len(results) == EXAMPLES and total["lost"] == total["duplicated"] == 0,
                    test="tests/reliability/test_bad_input.py::test_fuzzed_input_files_run_as_jobs",
                )
            )
    assert len(results) == EXAMPLES
    assert _alive(fuzzer.worker_pid), "the worker died"
    assert "Traceback" not in logs(fuzzer.procs, "fuzz-gpu0.log")


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
