"""``python -m dflash_tasks.export --output URI --to PATH``: the training set for a drafter trainer.

One row per sample, in input order, each sample once, in the ShareGPT-style layout that
SpecForge-style EAGLE3/DFlash pipelines read; every generated assistant turn carries its reasoning::

    {"id": "...", "status": "success",
     "conversations": [{"role": "system", "content": ..., "reasoning_content": null},
                       {"role": "user", "content": ..., "reasoning_content": null},
                       {"role": "assistant", "content": ANSWER_1, "reasoning_content": REASONING_1},
                       {"role": "user", "content": ..., "reasoning_content": null},
                       {"role": "assistant", "content": ANSWER_2, "reasoning_content": REASONING_2}]}

By default the file is one the trainer accepts: every row it would reject is left out (failed,
truncated, empty answer, think markers, missing reasoning where reasoning is expected, and any
row breaking SpecForge's validator rules, see :mod:`dflash_tasks.output.trainer_rules`). The
count per reason is printed; ``--keep REASON`` keeps such rows, ``--keep-failed`` failed ones. A
manifest (``PATH.manifest.json``) records counts, what was left out and why, filters, the job
spec and checksums; ``PATH.dropped.jsonl`` lists every row left out, with its reason.

With a tokenizer (``--tokenizer``, else the served model's path when readable here) the manifest
also carries ``trainable_tokens``: the exported rows' loss tokens under the model's chat template
and the trainer's ``--train-max-length`` (:mod:`dflash_tasks.core.trainable`), the size a drafter
trainer cares about.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_tasks.core.errors import ConfigError, DflashError, StoreError
from dflash_tasks.core.loss_tokens import row_messages
from dflash_tasks.core.quality import CHECKS, QualitySettings, check_record
from dflash_tasks.core.record import Record
from dflash_tasks.core.settings import CommonSettings
from dflash_tasks.core.source_quality import SourceTally
from dflash_tasks.core.trainable import TrainableSummary, TrainableTally
from dflash_tasks.core.trainer_view import TrainerView, add_trainer_flags, view_from_args
from dflash_tasks.output.trainer_rules import REASONS, row_problem
from dflash_tasks.store import open_store
from dflash_tasks.store.jobfiles import load_job, load_manifest
from dflash_tasks.store.records import iter_records

_PARQUET_BATCH = 10_000

#: Quality checks whose rows the trainer rejects (or should never see): left out by default.
DEFAULT_DROPS = ("think_marker", "truncated", "empty_answer", "no_reasoning", "unexpected_reasoning")

#: Every reason a row can be left out, with what it means (the manifest repeats the ones used).
WHY: dict[str, str] = {
    "failed": "generation failed (the record's error says why); keep with --keep-failed",
    "truncated": "a turn hit max_tokens",
    "empty_answer": "a turn has no answer after its reasoning",
    "short": "a turn is shorter than min_completion_tokens (--drop-check short)",
    "source_answers": "assistant turns copied from the input (turns: last) carry no reasoning",
    "duplicate": "the sample was seen before (impossible with a sound store)",
    **REASONS,
}
#: Reasons ``--keep`` accepts.
KEEPABLE = tuple(sorted(set(WHY) - {"failed", "duplicate"}))


@dataclass(frozen=True, slots=True)
class ExportOptions:
    drop_checks: frozenset[str] = frozenset()  # checks left out on top of the default ones
    keep_failed: bool = False
    keep: frozenset[str] = frozenset()  # reasons whose rows are written anyway


@dataclass(slots=True)
class ExportCounts:
    exported: int = 0
    failed_kept: int = 0
    assistant_turns: int = 0
    multi_turn: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    kept: Counter[str] = field(default_factory=Counter)  # rows written despite a reason, by --keep
    left_out: list[dict[str, str]] = field(default_factory=list)


def to_row(
    record: Record, options: ExportOptions, counts: ExportCounts, thinking: bool = True
) -> dict[str, Any] | None:
    """The export row of one output record, or None when it is left out (counted in ``counts``)."""
    sample_id = record.id
    turns = row_messages(record)  # the very rows the loss-token count renders
    if not record.ok:
        if not options.keep_failed:
            return _leave_out(counts, sample_id, "failed", record.error or "")
        counts.failed_kept += 1
        return {"id": sample_id, "status": "failed", "conversations": turns, "error": record.error}
    row: dict[str, Any] = {"id": sample_id, "status": "success", "conversations": turns}
    copied = _copied_answers(record)
    generated = sum(1 for m in turns if m["role"] == "assistant") - len(copied)
    kept: list[str] = []
    for reason, detail in _reasons(record, row, options, thinking, copied):
        if reason not in options.keep:
            return _leave_out(counts, sample_id, reason, detail)
        kept.append(reason)
    counts.kept.update(kept)
    counts.exported += 1
    counts.assistant_turns += generated + len(copied)
    counts.multi_turn += generated + len(copied) > 1
    if options.keep_failed:
        row["error"] = None
    return row


def _copied_answers(record: Record) -> frozenset[int]:
    """Indexes (in the exported conversation) of assistant messages copied from the input."""
    copied: set[int] = set()
    index = 0
    for turn in record.turns:
        for message in turn.input:
            if message["role"] == "assistant":
                copied.add(index)
            index += 1
        index += turn.ok
    return frozenset(copied)


def _reasons(
    record: Record,
    row: dict[str, Any],
    options: ExportOptions,
    thinking: bool,
    copied: frozenset[int],
) -> Iterator[tuple[str, str]]:
    """Why the trainer would reject ``row`` (or ``--drop-check`` leaves it out), most telling first."""
    checks = set(record.checks or check_record(record, thinking, QualitySettings()))
    for check in (*DEFAULT_DROPS, *sorted(options.drop_checks)):
        if check in checks:
            yield check, ""
    if thinking and copied:
        yield "source_answers", f"{len(copied)} assistant turns copied from the input"
    # Kept source answers are kept as they are: without reasoning.
    exempt = copied if "source_answers" in options.keep else frozenset()
    problem = row_problem(row, expect_reasoning=thinking, exempt=exempt)
    if problem is not None:
        yield problem.reason, problem.detail


def _leave_out(counts: ExportCounts, sample_id: str, reason: str, detail: str) -> dict[str, Any] | None:
    """Count a row left out; returns None (no row)."""
    counts.dropped[reason] += 1
    counts.left_out.append({"id": sample_id, "reason": reason, "detail": detail})
    return None


def write_jsonl(rows: Iterable[dict[str, Any]], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_parquet(rows: Iterable[dict[str, Any]], path: Path, with_error: bool) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    turn = pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning_content", pa.string())])
    fields = [("id", pa.string()), ("status", pa.string()), ("conversations", pa.list_(turn))]
    if with_error:
        fields.append(("error", pa.string()))
    schema = pa.schema(fields)
    with pq.ParquetWriter(path, schema) as writer:
        batch: list[dict[str, Any]] = []
        for row in rows:
            batch.append(row)
            if len(batch) >= _PARQUET_BATCH:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))


def export(
    output: str, to: Path, fmt: str, options: ExportOptions, trainer: TrainerView | None = None
) -> dict[str, Any]:
    """Write the export and its manifest; returns the manifest.

    ``trainer`` overrides the job's trainer view for the loss-token count."""
    store = open_store(output, CommonSettings.load())
    job, manifest = load_job(store), load_manifest(store)
    if job is None or manifest is None:
        raise StoreError(f"{output} holds no staged job")
    counts = ExportCounts()
    missing: list[int] = []
    seen: set[str] = set()
    thinking = job.spec.thinking
    view = trainer or job.trainer
    tally = TrainableTally(view, thinking, job.quality.min_loss_tokens, job.spec.keeps_history_reasoning)
    by_source, exported = SourceTally(), Counter[str]()  # a job of several input sources
    counted: list[str] = []  # the source of each row the loss-token tally counts, in order

    def rows() -> Iterator[dict[str, Any]]:
        for record in iter_records(store, manifest, missing):
            if record.id in seen:  # impossible with a sound store; never export a sample twice
                _leave_out(counts, record.id, "duplicate", "")
                continue
            seen.add(record.id)
            by_source.add(record)
            row = to_row(record, options, counts, thinking)
            if row is not None:
                if row["status"] == "success":
                    tally.add(record)
                    counted.append(record.source or "")
                exported[record.source or ""] += 1
                yield row

    tmp = to.with_name(f".{to.name}.tmp")
    if fmt == "parquet":
        write_parquet(rows(), tmp, options.keep_failed)
    else:
        write_jsonl(rows(), tmp)
    os.replace(tmp, to)
    dropped_path = to.with_name(to.name + ".dropped.jsonl")
    if counts.left_out:
        write_jsonl(counts.left_out, dropped_path)
    elif dropped_path.exists():
        dropped_path.unlink()  # from an earlier export to the same path
    doc = {
        "job_id": job.job_id,
        "source": output,
        "file": to.name,
        "format": fmt,
        "sha256": _sha256(to),
        "rows": counts.exported + counts.failed_kept,
        "success": counts.exported,
        "failed_kept": counts.failed_kept,
        "assistant_turns": counts.assistant_turns,
        "multi_turn_rows": counts.multi_turn,
        "dropped": dict(counts.dropped),
        "dropped_why": {reason: WHY[reason] for reason in counts.dropped},
        "dropped_file": dropped_path.name if counts.left_out else None,
        "kept_despite": dict(counts.kept),
        "trainable_tokens": None if (summary := tally.summary) is None else summary.total,
        "trainable": None if summary is None else summary.to_dict(),
        "trainer": {**view.to_dict(), "note": tally.note},
        "filters": {
            "drop_checks": sorted({*DEFAULT_DROPS, *options.drop_checks} - options.keep),
            "keep": sorted(options.keep),
            "keep_failed": options.keep_failed,
            "expect_reasoning": thinking,
            "strict_think_markers": True,
        },
        "complete": not missing,
        "chunks_missing": len(missing),
        "samples_in_job": manifest.samples,
        "sources": _per_source(by_source, exported, counted, summary),
        "spec": json.loads(job.to_json()),
    }
    manifest_path = to.with_name(to.name + ".manifest.json")
    manifest_path.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def _per_source(
    by_source: SourceTally, exported: Counter[str], counted: list[str], summary: TrainableSummary | None
) -> dict[str, Any] | None:
    """Per input source (a job of several): its records' figures, the rows exported, their loss tokens."""
    doc = by_source.to_dict()
    if not doc:
        return None
    loss: Counter[str] = Counter()
    for name, tokens in zip(counted, summary.loss_tokens if summary is not None else (), strict=False):
        loss[name] += tokens
    for name, figures in doc.items():
        figures["rows_exported"] = exported[name]
        figures["loss_tokens"] = loss[name] if summary is not None else None
        figures.pop("few_loss_tokens", None)
    return doc


def _recorded_view(output: str) -> TrainerView:
    job = load_job(open_store(output, CommonSettings.load()))
    return job.trainer if job is not None else TrainerView()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_tasks.export", description=__doc__.splitlines()[0])
    p.add_argument("--output", required=True, help="the job's output root")
    p.add_argument("--to", required=True, help="the file to write")
    p.add_argument("--format", choices=["jsonl", "parquet"], help="default: from the file name, else jsonl")
    p.add_argument(
        "--drop-check",
        action="append",
        default=[],
        metavar="CHECK",
        help=f"also leave out rows failing CHECK (e.g. short); one of {', '.join(CHECKS)}",
    )
    p.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="REASON",
        help=f"write rows the trainer would reject for REASON anyway; one of {', '.join(KEEPABLE)}",
    )
    p.add_argument(
        "--keep-failed", action="store_true", help="keep failed samples (status 'failed', no answer)"
    )
    p.add_argument("--drop-truncated", action="store_true", help="(the default now; kept for old scripts)")
    add_trainer_flags(p)
    args = p.parse_args(argv)
    to = Path(args.to)
    fmt = args.format or ("parquet" if to.suffix == ".parquet" else "jsonl")
    try:
        unknown = set(args.drop_check) - set(CHECKS)
        if unknown:
            raise ConfigError(
                f"--drop-check {sorted(unknown)[0]!r}: not a check (one of {', '.join(CHECKS)})"
            )
        bad_keep = set(args.keep) - set(KEEPABLE)
        if bad_keep:
            raise ConfigError(f"--keep {sorted(bad_keep)[0]!r}: not a reason (one of {', '.join(KEEPABLE)})")
        options = ExportOptions(frozenset(args.drop_check), args.keep_failed, frozenset(args.keep))
        doc = export(args.output, to, fmt, options, view_from_args(args, _recorded_view(args.output)))
    except DflashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    multi = f", {doc['multi_turn_rows']:,} multi-turn" if doc["multi_turn_rows"] else ""
    print(
        f"exported {doc['rows']:,} rows{multi} ({doc['assistant_turns']:,} assistant turns) to {to} ({fmt})"
        + ("" if doc["complete"] else f"; WARNING: {doc['chunks_missing']} chunks not done yet"),
        file=sys.stderr,
    )
    if doc["dropped"]:
        total = sum(doc["dropped"].values())
        where = doc["dropped_file"]
        print(f"left out {total:,} rows the trainer would reject (listed in {where}):", file=sys.stderr)
        for reason, n in sorted(doc["dropped"].items(), key=lambda kv: -kv[1]):
            print(f"  {reason:<22} {n:>8,}  {WHY[reason]}", file=sys.stderr)
        print("keep them anyway with --keep REASON (--keep-failed for failed samples)", file=sys.stderr)
    if doc["trainable"] is not None:
        t = doc["trainable"]
        print(
            f"trainable: {t['total_loss_tokens']:,} loss tokens in {t['samples']:,} rows "
            f"(p50 {t['loss_tokens']['p50']:,} per row; {t['truncated_by_trainer']:,} rows cut by "
            f"max_length {t['max_length']:,}, {t['few_loss_tokens']:,} under {t['min_loss_tokens']})",
            file=sys.stderr,
        )
    print(doc["trainer"]["note"] or "loss tokens not counted: no ok rows", file=sys.stderr)
    for reason, n in doc["kept_despite"].items():
        print(f"kept {n:,} rows despite {reason} (--keep {reason})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
