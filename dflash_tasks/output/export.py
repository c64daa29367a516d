"""``python -m dflash_tasks.export --output URI --to PATH``: the training set for a drafter trainer.

One row per sample (``--layout conversation``) or per generated assistant turn (``per-turn``,
SpecForge's expanded layout; ``auto``, the default, picks it where the trainer's template would leave
earlier turns untrained; :mod:`dflash_tasks.core.export_rows`), in input order, each sample once, in
the ShareGPT-style layout that SpecForge-style EAGLE3/DFlash pipelines read; every generated
assistant turn carries its reasoning::

    {"id": "...", "status": "success",
     "conversations": [{"role": "system", "content": ..., "reasoning_content": null},
                       {"role": "user", "content": ..., "reasoning_content": null},
                       {"role": "assistant", "content": ANSWER_1, "reasoning_content": REASONING_1},
                       {"role": "user", "content": ..., "reasoning_content": null},
                       {"role": "assistant", "content": ANSWER_2, "reasoning_content": REASONING_2}]}

By default (``--mode trainer``) the file is one the trainer reads: rows cut at ``max_tokens`` whose
cut lies past the trainer's ``max_length`` are written (the horizon rule); ``--mode validator``
leaves out every truncated row, so SpecForge's validator script accepts the file. Either way every
other row the trainer would reject is left out (failed, truncated short of the horizon, empty
answer, think markers, missing reasoning where reasoning is expected, and any
row breaking SpecForge's validator rules, see :mod:`dflash_tasks.core.trainer_rules`). The
count per reason is printed; ``--keep REASON`` keeps such rows, ``--keep-failed`` failed ones. A
manifest (``PATH.manifest.json``) records counts, what was left out and why, filters, the job
spec and checksums; ``PATH.dropped.jsonl`` lists every row left out, with its reason.

The manifest says which layout and mode were written, and the trainable yield (generated tokens
against the loss tokens of the rows written, and where the rest went; :mod:`dflash_tasks.core.yields`).
With a tokenizer (``--tokenizer``, else the served model's path when readable here) the manifest
also carries ``trainable_tokens``: the exported rows' loss tokens under the model's chat template
and the trainer's ``--train-max-length`` (:mod:`dflash_tasks.core.trainable`), the size a drafter
trainer cares about.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dflash_tasks.cli.commands import prog
from dflash_tasks.cli.flags import json_flag, load_settings, store_flags
from dflash_tasks.cli.trainer_flags import add_trainer_flags, view_from_args
from dflash_tasks.core.errors import ConfigError, DflashError, StoreError
from dflash_tasks.core.exit_codes import ExitCode
from dflash_tasks.core.export_rows import DEFAULT_DROPS, LAYOUTS, MODES
from dflash_tasks.core.job import JobDefinition
from dflash_tasks.core.quality import CHECKS
from dflash_tasks.core.repair import Superseded
from dflash_tasks.core.row_planner import ExportOptions, RowPlanner
from dflash_tasks.core.settings import CommonSettings
from dflash_tasks.core.trainer_rules import REASONS
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.store import open_store
from dflash_tasks.store.jobfiles import load_job, load_manifest
from dflash_tasks.store.records import iter_records

_PARQUET_BATCH = 10_000

#: What each mode's file is, for the manifest.
MODE_MEANS = {
    "trainer": "rows SpecForge's trainer reads; rows cut at max_tokens past its max_length are in (the "
    "horizon rule), their answers may be blank, which SpecForge's validator script refuses",
    "validator": "rows SpecForge's validator script accepts (--expect-reasoning --strict-think-markers): "
    "every truncated row is left out",
}

#: Every reason a row can be left out, with what it means (the manifest repeats the ones used).
WHY: dict[str, str] = {
    "failed": "generation failed (the record's error says why); keep with --keep-failed",
    "truncated": "a turn hit max_tokens, or was cut where its loop starts (in trainer mode: short of the "
    "trainer's max_length, to continue or drop)",
    "empty_answer": "a turn has no answer after its reasoning",
    "short": "a turn is shorter than min_completion_tokens (--drop-check short)",
    "source_answers": "assistant turns copied from the input (turns: last) carry no reasoning",
    "duplicate": "the sample was seen before (impossible with a sound store)",
    "looping": "a turn was stopped in a loop and the job's --on-loop keeps no prefix of it; --keep looping "
    "writes it cut where the loop starts (as a truncated row), never the loop",
    **REASONS,
}
#: Reasons ``--keep`` accepts.
KEEPABLE = tuple(sorted(set(WHY) - {"failed", "duplicate"}))


def write_jsonl(rows: Iterable[dict[str, Any]], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_parquet(
    rows: Iterable[dict[str, Any]], path: Path, with_error: bool, per_turn: bool = False
) -> None:
    """Rows as Parquet; ``per_turn`` adds ``source_id`` and ``assistant_turn_index`` (null for
    the plain rows of one-turn samples)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    turn = pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning_content", pa.string())])
    fields = [("id", pa.string()), ("status", pa.string()), ("conversations", pa.list_(turn))]
    if with_error:
        fields.append(("error", pa.string()))
    if per_turn:
        fields += [("source_id", pa.string()), ("assistant_turn_index", pa.int64())]
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
    output: str,
    to: Path,
    fmt: str,
    options: ExportOptions,
    trainer: TrainerView | None = None,
    settings: CommonSettings | None = None,
) -> dict[str, Any]:
    """Write the export and its manifest; returns the manifest.

    ``trainer`` overrides the job's trainer view for the loss-token count."""
    store = open_store(output, settings or CommonSettings.load())
    job, manifest = load_job(store), load_manifest(store)
    if job is None or manifest is None:
        raise StoreError(f"{output} holds no staged job")
    missing: list[int] = []
    view = trainer or job.trainer
    planner = RowPlanner(job, view, options)
    counts = planner.counts
    superseded = Superseded()  # turns repair rounds generated again: paid for, counted as generated
    rows = planner.rows(iter_records(store, manifest, missing, on_replaced=superseded))

    tmp = to.with_name(f".{to.name}.tmp")
    if fmt == "parquet":  # the layout is settled at the first record, before the first row
        first = next(rows, None)
        ahead = itertools.chain([] if first is None else [first], rows)
        multi = options.layout == "per-turn" or (manifest.turns or 0) > manifest.samples
        write_parquet(ahead, tmp, options.keep_failed, planner.per_turn and multi)
    else:
        write_jsonl(rows, tmp)
    os.replace(tmp, to)
    planner.add_superseded(superseded)
    dropped_path = to.with_name(to.name + ".dropped.jsonl")
    if counts.left_out:
        write_jsonl(counts.left_out, dropped_path)
    elif dropped_path.exists():
        dropped_path.unlink()  # from an earlier export to the same path
    doc = manifest_doc(job, output, to, fmt, options, planner, missing, manifest.samples)
    manifest_path = to.with_name(to.name + ".manifest.json")
    manifest_path.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def manifest_doc(
    job: JobDefinition,
    output: str,
    to: Path,
    fmt: str,
    options: ExportOptions,
    planner: RowPlanner,
    missing: list[int],
    samples: int,
) -> dict[str, Any]:
    """The export's manifest (``<file>.manifest.json``): what was written, left out and why."""
    counts, view = planner.counts, planner.view
    dropped_path = to.with_name(to.name + ".dropped.jsonl")
    return {
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
        "layout": planner.layout,
        "mode": options.mode,
        "mode_means": MODE_MEANS[options.mode],
        "trainable_tokens": planner.summary.total if planner.counted else None,
        "trainable": planner.summary.to_dict() if planner.counted else None,
        "yield": planner.yields.to_dict(),
        "trainer": {**view.to_dict(), "note": planner.note},
        "filters": {
            "drop_checks": sorted({*DEFAULT_DROPS, *options.drop_checks} - options.keep),
            "horizon_rule": options.mode == "trainer",
            "keep": sorted(options.keep),
            "keep_failed": options.keep_failed,
            "expect_reasoning": job.spec.thinking,
            "strict_think_markers": True,
        },
        "complete": not missing,
        "chunks_missing": len(missing),
        "samples_in_job": samples,
        "sources": planner.per_source(),
        "spec": json.loads(job.to_json()),
    }


def _recorded_view(output: str, settings: CommonSettings) -> TrainerView:
    job = load_job(open_store(output, settings))
    return job.trainer if job is not None else TrainerView()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog("dflash_tasks.export"),
        description=__doc__.splitlines()[0],
        parents=[
            store_flags(),
            json_flag("print the export's manifest (what the .manifest.json holds) as JSON"),
        ],
    )
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
    p.add_argument("--drop-truncated", action="store_true", help="(kept for old scripts; see --mode)")
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="auto",
        help="conversation: one row per sample; per-turn: one row per assistant turn (id#turnN, "
        "SpecForge's expanded layout, trained with train_only_last_turn); auto (default): per-turn "
        "where the trainer's template would leave earlier turns untrained",
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        default="trainer",
        help="trainer (default): rows cut at max_tokens past the trainer's max_length are written "
        "(the horizon rule); validator: every truncated row is left out, so SpecForge's validator "
        "script accepts the file",
    )
    add_trainer_flags(p)
    return p


def options_from_args(args: argparse.Namespace) -> ExportOptions:
    """The export's options from its flags; :class:`ConfigError` naming an unknown check or reason."""
    unknown = set(args.drop_check) - set(CHECKS)
    if unknown:
        raise ConfigError(f"--drop-check {sorted(unknown)[0]!r}: not a check (one of {', '.join(CHECKS)})")
    bad_keep = set(args.keep) - set(KEEPABLE)
    if bad_keep:
        raise ConfigError(f"--keep {sorted(bad_keep)[0]!r}: not a reason (one of {', '.join(KEEPABLE)})")
    return ExportOptions(
        frozenset(args.drop_check), args.keep_failed, frozenset(args.keep), args.layout, args.mode
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    to = Path(args.to)
    fmt = args.format or ("parquet" if to.suffix == ".parquet" else "jsonl")
    try:
        settings = load_settings(CommonSettings, args)
        recorded = _recorded_view(args.output, settings)
        doc = export(args.output, to, fmt, options_from_args(args), view_from_args(args, recorded), settings)
    except DflashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    print_summary(doc, to, fmt)
    if args.json:
        print(json.dumps(doc))
    return ExitCode.OK


def print_summary(doc: dict[str, Any], to: Path, fmt: str) -> None:
    """What was written and left out, the yield and the trainer's note, to stderr."""
    err = sys.stderr
    multi = f", {doc['multi_turn_rows']:,} multi-turn" if doc["multi_turn_rows"] else ""
    print(
        f"exported {doc['rows']:,} rows{multi} ({doc['assistant_turns']:,} assistant turns) to {to} ({fmt})"
        + ("" if doc["complete"] else f"; WARNING: {doc['chunks_missing']} chunks not done yet"),
        file=err,
    )
    if doc["dropped"]:
        total = sum(doc["dropped"].values())
        print(
            f"left out {total:,} rows the trainer would reject (listed in {doc['dropped_file']}):", file=err
        )
        for reason, n in sorted(doc["dropped"].items(), key=lambda kv: -kv[1]):
            print(f"  {reason:<22} {n:>8,}  {WHY[reason]}", file=err)
        print("keep them anyway with --keep REASON (--keep-failed for failed samples)", file=err)
    print(f"layout {doc['layout']}, mode {doc['mode']}: {doc['mode_means']}", file=err)
    y = doc["yield"]
    if y["yield"] is not None:
        print(
            f"yield {y['yield']:.3f}: {y['trainable_tokens']:,} trainable of {y['generated_tokens']:,} "
            f"generated tokens; the rest: {json.dumps(y['where_the_rest_went'])}",
            file=err,
        )
    if doc["trainable"] is not None:
        t = doc["trainable"]
        print(
            f"trainable: {t['total_loss_tokens']:,} loss tokens in {t['samples']:,} rows "
            f"(p50 {t['loss_tokens']['p50']:,} per row; {t['truncated_by_trainer']:,} rows cut by "
            f"max_length {t['max_length']:,}, {t['few_loss_tokens']:,} under {t['min_loss_tokens']})",
            file=err,
        )
    print(doc["trainer"]["note"] or "loss tokens not counted: no ok rows", file=err)
    for reason, n in doc["kept_despite"].items():
        print(f"kept {n:,} rows despite {reason} (--keep {reason})", file=err)


if __name__ == "__main__":
    sys.exit(main())
