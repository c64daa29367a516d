"""The checker: reads the whole history and the final store, and says which invariants broke.

Invariants (each a :class:`Violation` when broken):

* every valid input line is in exactly one current record (ok or failed: the chunk file's, or
  its latest repair round's), and the same holds for an ``export`` of the job; every invalid line
  is reported (``verify`` passes);
* each repair round wrote only what a round may (:mod:`tests.chaos.rounds`): no sample twice, none
  it should not touch, every cut thought continued as its parts joined or left as it was; none is
  left cut, and no transient failure is left, once the cluster healed;
* no chunk output is rewritten with other bytes once it appeared (``verify``, run during the run,
  counts a chunk as soon as it exists), none vanishes, none is unreadable;
* the progress counters never exceed what the store holds: Redis's done set and sample counters,
  and ``progress.json``, each read before the store was listed;
* the job is done within the stated bound after the last fault healed;
* no process of the run is left once its nodes were stopped, no namespace or link either.

It also reports wasted generation (requests the simulators served beyond one per sample turn and
one per continuation), each fault's recovery time, the thoughts cut, continued and whose
continuation failed, and the faults that overlapped the repair rounds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import REPO
from tests.reliability.support import account_ids


@dataclass
class Result:
    seed: int
    minutes: float
    store: str
    label: str = ""
    faults_scheduled: int = 0
    faults_injected: int = 0
    faults_skipped: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    max_overlap: int = 0
    samples_expected: int = 0
    stored_once: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    failed_records: int = 0  # current records (after the repair rounds) that failed
    repaired: int = 0  # samples a repair round regenerated or continued into an ok record
    transient_left: int = 0  # samples left failed by a transient fault after the repair rounds
    max_tokens: int = 0  # the job's budget
    cut_thoughts: int = 0  # samples whose thought a request cut at max_tokens
    continued: int = 0  # of them, continued to an answer by repair rounds
    continuations_failed: int = 0  # round records that left a cut thought as it was (retried later)
    left_cut: int = 0  # thoughts still cut after the repair rounds
    continuation_requests: int = 0  # one per part after the first of each continued turn
    repair_rounds: int = 0  # repair files written (one per chunk and round)
    repair_phase: list[float] = field(default_factory=list)  # [first round started, last stored]
    faults_during_repairs: dict[str, int] = field(default_factory=dict)  # kind -> faults overlapping
    reruns_for_repairs: int = 0  # producer re-runs after it finished with samples left to repair
    invalid_lines: int = 0
    requests_served: int = 0
    wasted_requests: int = 0
    sim_faults_fired: int = 0
    worst_recovery_s: float | None = None
    worst_recovery: str = ""
    unrecovered: int = 0
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    done_after_last_fault_s: float | None = None
    bound_s: float = 0.0
    run_s: float = 0.0
    violations: list[str] = field(default_factory=list)
    replay: str = ""
    run_dir: str = ""

    @property
    def passed(self) -> bool:
        return not self.violations

    def summary_line(self) -> str:
        worst = (
            "-" if self.worst_recovery_s is None else f"{self.worst_recovery_s:.1f} s ({self.worst_recovery})"
        )
        done = "never" if self.done_after_last_fault_s is None else f"{self.done_after_last_fault_s:.1f} s"
        verdict = "PASS" if self.passed else f"FAIL ({len(self.violations)} invariant(s) broken)"
        return (
            f"chaos seed={self.seed} minutes={self.minutes:g} store={self.store}: "
            f"{self.faults_injected} faults injected ({self.faults_skipped} skipped), "
            f"{self.samples_expected:,} samples expected, {self.stored_once:,} stored once, "
            f"{self.lost} lost, {self.duplicated} duplicated, {self.wasted_requests:,} wasted requests, "
            f"{self.repaired} repaired, samples left failed by a transient fault after repair: "
            f"{self.transient_left}, {self.cut_thoughts} thoughts cut at max_tokens {self.max_tokens}: "
            f"{self.continued} continued, {self.continuations_failed} continuations failed, "
            f"{self.left_cut} left cut, in {self.repair_rounds} repair files under "
            f"{sum(self.faults_during_repairs.values())} faults, "
            f"worst recovery {worst}; done {done} after the last fault (bound {self.bound_s:.0f} s): "
            + verdict
        )

    def as_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["passed"] = self.passed
        return doc


account = account_ids  # every sample stored once: the same count as the single-fault suite


def repair_counts(records: list[dict[str, Any]]) -> tuple[int, int]:
    """(repaired, left failed by a transient fault) among the current records."""
    repaired = sum(1 for r in records if r.get("status") == "ok" and r.get("repair") is not None)
    left = sum(1 for r in records if r.get("status") != "ok" and r.get("failure") != "permanent")
    return repaired, left


def verify_and_export(
    inp: Path,
    output: str,
    expected: set[str],
    bad_lines: int,
    folder: Path,
    env: dict[str, str],
    continued: dict[str, tuple[str, str]],
) -> list[str]:
    """``verify`` passes and counts every bad line as reported; an ``export`` has every sample once
    (:func:`export_problems`; ``continued``: each continued turn's text, by sample id)."""
    problems: list[str] = []
    verify = [sys.executable, "-m", "dflash_tasks.verify", "--input", str(inp), "--output", output, "--json"]
    res = subprocess.run(verify, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    try:
        doc = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [f"verify printed no JSON: {res.stderr[-500:]}"]
    if res.returncode != 0 or not doc.get("passed"):
        problems.append(f"verify failed: {doc.get('problems')}")
    if doc.get("invalid") != bad_lines or doc.get("invalid_reported") != bad_lines:
        problems.append(
            f"{bad_lines} bad input lines: verify saw {doc.get('invalid')}, "
            f"reported {doc.get('invalid_reported')}"
        )
    to = folder / "export.jsonl"
    export = [sys.executable, "-m", "dflash_tasks.export", "--output", output, "--to", str(to)]
    export += ["--keep-failed", "--layout", "conversation"]  # one row per sample: "every sample once"
    res = subprocess.run(export, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        return [*problems, f"export failed: {res.stderr[-500:]}"]
    dropped = to.with_name(to.name + ".dropped.jsonl")
    return problems + export_problems(_jsonl(to), _jsonl(dropped), expected, continued)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def export_problems(
    rows: list[dict[str, Any]],
    dropped: list[dict[str, Any]],
    expected: set[str],
    continued: dict[str, tuple[str, str]],
) -> list[str]:
    """Every sample once in the export: a row written, or a line of the dropped file naming its
    reason (an answer cut at ``max_tokens`` is not continued: the trainer's mode drops it). Each
    continued thought is written, its row holding the whole turn: the parts joined."""
    problems = []
    written = [str(r["id"]) for r in rows]
    ids = written + [str(d["id"]) for d in dropped]
    dupes = len(ids) - len(set(ids))
    missing = len(expected - set(ids))
    if dupes or missing or len(ids) != len(expected):
        problems.append(
            f"export: {len(rows)} rows and {len(dropped)} dropped, {dupes} duplicates, "
            f"{missing} samples missing"
        )
    by_id = {str(r["id"]): r for r in rows}
    for sid, (reasoning, content) in sorted(continued.items()):
        row = by_id.get(sid)
        if row is None:
            problems.append(f"export: continued sample {sid} not written")
            continue
        text = _assistant_text(row)
        if reasoning.strip() not in text or content.strip() not in text:
            problems.append(f"export: the row of continued sample {sid} is not its joined turn")
    return dedupe(problems)


def _assistant_text(row: dict[str, Any]) -> str:
    """Every string of the row's last assistant message (its content, and reasoning where apart)."""
    messages = row.get("messages") or row.get("conversations") or []
    last = [m for m in messages if isinstance(m, dict) and m.get("role") in ("assistant", "gpt")][-1:]
    return "\n".join(str(v) for m in last for v in m.values() if isinstance(v, str))


def repair_overlap(events: list[dict[str, Any]]) -> tuple[list[float], dict[str, int]]:
    """The repair phase ([the first round started, the last round stored]; [] when no round ran)
    and the faults in effect during it, by kind.

    A fault with a duration is in effect until it healed; a kill, until the run saw it recovered
    (its victims' chunks taken over and the job moving again).
    """
    begun = [e["t"] for e in events if e["type"] in ("repair_round", "repair_stored")]
    stored = [e["t"] for e in events if e["type"] == "repair_stored"]
    if not begun:
        return [], {}
    phase = [float(min(begun)), float(max([*stored, min(begun)]))]
    healed = {int(e["index"]): float(e["t"]) for e in events if e["type"] == "fault_stop"}
    recovered = {int(e["index"]): float(e["t"]) for e in events if e["type"] == "recovered"}
    kinds: Counter[str] = Counter()
    for e in events:
        if e["type"] == "fault_start":
            start, index = float(e["t"]), int(e["index"])
            end = healed.get(index, recovered.get(index, start))
            if start <= phase[1] and end >= phase[0]:
                kinds[e["kind"]] += 1
    return [round(phase[0], 1), round(phase[1], 1)], dict(kinds)


def check_history(events: list[dict[str, Any]]) -> list[str]:
    """The invariants that the history alone decides (store rewrites, counters, mid-run verify)."""
    problems: list[str] = []
    counted: dict[int, float] = {}  # chunk -> when a verify run during the job first counted it
    for e in events:
        kind = e["type"]
        if kind == "verify":
            for chunk in e.get("counted") or ():
                counted.setdefault(int(chunk), float(e["t"]))
        if kind == "chunk_rewritten":
            number = int(e["chunk"].split("-")[1].split(".")[0])
            when = counted.get(number)
            seen = f" after verify counted it at t={when:.1f}s" if when is not None and when < e["t"] else ""
            problems.append(
                f"t={e['t']:.1f}s {e['chunk']} rewritten with other contents{seen} ({e['first']} -> "
                f"{e['now']}; failed records {e['failed_before']} -> {e['failed_now']})"
            )
        elif kind == "chunk_vanished":
            problems.append(f"t={e['t']:.1f}s {e['chunk']} vanished from the store")
        elif kind == "chunk_corrupt":
            problems.append(f"t={e['t']:.1f}s {e['chunk']} is not valid JSON lines ({e['size']} bytes)")
        elif kind == "counters":
            chunks, samples, failed = e["store"]
            for name, value, limit in (
                ("done chunks", e["done_chunks"], chunks),
                ("counted samples", e["samples"], samples),
                ("failed samples", e["failed"], failed),
            ):
                if value > limit:
                    problems.append(f"t={e['t']:.1f}s Redis {name} {value} > {limit} in the store")
        elif kind == "progress":
            chunks, samples, failed = e["store"]
            for name, value, limit in (
                ("chunks.done", e["chunks"], chunks),
                ("samples.done", e["samples"], samples),
                ("tokens.counted_samples", e["counted"], samples),
                ("samples.failed", e["failed"], failed),
            ):
                if value > limit:
                    problems.append(f"t={e['t']:.1f}s progress.json {name} {value} > {limit} in the store")
        elif kind == "verify":
            bad = {k: e.get(k) for k in ("duplicated", "unexpected", "corrupted") if e.get(k)}
            if bad:
                problems.append(f"t={e['t']:.1f}s verify during the run: {bad}")
    return dedupe(problems)


def dedupe(problems: list[str], keep: int = 20) -> list[str]:
    """The first ``keep`` problems, and how many more."""
    if len(problems) <= keep:
        return problems
    return [*problems[:keep], f"... and {len(problems) - keep} more"]


def recoveries(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float | None, str]:
    """Each fault's recovery; the worst (the longest of take-over and resume) and which fault it was."""
    rows = [{k: v for k, v in e.items() if k != "type"} for e in events if e["type"] == "recovered"]
    worst: float | None = None
    which = ""
    for row in rows:
        value = max((v for v in (row.get("takeover_s"), row.get("resume_s")) if v is not None), default=None)
        if value is not None and (worst is None or value > worst):
            worst, which = value, f"{row['kind']} #{row['index']}"
    return rows, worst, which


def faults_summary(events: list[dict[str, Any]]) -> tuple[int, int, dict[str, int]]:
    started = [e for e in events if e["type"] == "fault_start"]
    skipped = [e for e in events if e["type"] == "fault_skipped"]
    return len(started), len(skipped), dict(Counter(e["kind"] for e in started))


def write_artifacts(result: Result, folder: Any) -> tuple[Any, Any]:
    """Add (or replace) this run's row in ``chaos.json`` and re-render ``chaos.md`` from all rows."""
    folder.mkdir(parents=True, exist_ok=True)
    js, md = folder / "chaos.json", folder / "chaos.md"
    try:
        runs = dict(json.loads(js.read_text()).get("runs", {}))
    except (OSError, ValueError):
        runs = {}
    runs[result.label] = result.as_dict()
    js.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    md.write_text(markdown(list(runs.values())) + "\n")
    return md, js


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| run | faults injected | max at once | samples expected | stored once | lost | duplicated "
        "| failed records | repaired | thoughts cut | continued | continuations failed | left cut "
        "| repair files (faults meanwhile) | wasted requests | worst recovery (s) "
        "| done after last fault (s) | result |"
    )
    lines = [head, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for r in rows:
        worst = (
            "-" if r["worst_recovery_s"] is None else f"{r['worst_recovery_s']:.1f} ({r['worst_recovery']})"
        )
        done = "-" if r["done_after_last_fault_s"] is None else f"{r['done_after_last_fault_s']:.1f}"
        verdict = "pass" if r["passed"] else "**FAIL**: " + "; ".join(r["violations"][:3])
        lines.append(
            f"| {r['label']} | {r['faults_injected']} | {r['max_overlap']} | {r['samples_expected']:,} "
            f"| {r['stored_once']:,} | {r['lost']} | {r['duplicated']} | {r['failed_records']} "
            f"| {r.get('repaired', 0)} | {r.get('cut_thoughts', 0)} | {r.get('continued', 0)} "
            f"| {r.get('continuations_failed', 0)} | {r.get('left_cut', 0)} "
            f"| {r.get('repair_rounds', 0)} ({sum(r.get('faults_during_repairs', {}).values())}) "
            f"| {r['wasted_requests']:,} | {worst} "
            f"| {done} (bound {r['bound_s']:.0f}) | {verdict} |"
        )
    return "\n".join(lines)
