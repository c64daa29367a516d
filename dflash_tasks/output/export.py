"""``python -m dflash_tasks.export --output URI --to PATH``: the training set for a drafter trainer.

One row per sample, in input order, each sample once, in the ShareGPT-style layout that
SpecForge-style EAGLE3/DFlash pipelines read::

    {"id": "...", "status": "success",
     "conversations": [...prompt turns...,
                       {"role": "assistant", "content": ANSWER, "reasoning_content": REASONING}]}

Rows whose text leaks ``<think>`` markers are always dropped (their split is unreliable). A
manifest (``PATH.manifest.json``) records counts, filters, the job spec and checksums.
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
from dflash_tasks.core.quality import CHECKS
from dflash_tasks.core.settings import Settings
from dflash_tasks.store import open_store
from dflash_tasks.store.jobfiles import load_job, load_manifest
from dflash_tasks.store.records import iter_records

_PARQUET_BATCH = 10_000


@dataclass(frozen=True, slots=True)
class ExportOptions:
    drop_checks: frozenset[str] = frozenset()
    keep_failed: bool = False


@dataclass(slots=True)
class ExportCounts:
    exported: int = 0
    failed_kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)


def to_row(record: dict[str, Any], options: ExportOptions, counts: ExportCounts) -> dict[str, Any] | None:
    """The export row of one output record, or None when a filter drops it."""
    checks = set(record.get("checks") or [])
    turns = [
        {"role": m["role"], "content": m["content"], "reasoning_content": None} for m in record["messages"]
    ]
    if record.get("status") != "ok":
        if not options.keep_failed:
            counts.dropped["failed"] += 1
            return None
        counts.failed_kept += 1
        return {
            "id": str(record["id"]),
            "status": "failed",
            "conversations": turns,
            "error": record.get("error"),
        }
    for check in ("think_marker", *sorted(options.drop_checks)):
        if check in checks:
            counts.dropped[check] += 1
            return None
    turns.append(
        {"role": "assistant", "content": record["content"], "reasoning_content": record["reasoning"]}
    )
    counts.exported += 1
    row: dict[str, Any] = {"id": str(record["id"]), "status": "success", "conversations": turns}
    if options.keep_failed:
        row["error"] = None
    return row


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


def export(output: str, to: Path, fmt: str, options: ExportOptions) -> dict[str, Any]:
    """Write the export and its manifest; returns the manifest."""
    store = open_store(output, Settings.load())
    job, manifest = load_job(store), load_manifest(store)
    if job is None or manifest is None:
        raise StoreError(f"{output} holds no staged job")
    counts = ExportCounts()
    missing: list[int] = []
    seen: set[str] = set()

    def rows() -> Iterator[dict[str, Any]]:
        for record in iter_records(store, manifest, missing):
            if record["id"] in seen:  # impossible with a sound store; never export a sample twice
                counts.dropped["duplicate"] += 1
                continue
            seen.add(record["id"])
            row = to_row(record, options, counts)
            if row is not None:
                yield row

    tmp = to.with_name(f".{to.name}.tmp")
    if fmt == "parquet":
        write_parquet(rows(), tmp, options.keep_failed)
    else:
        write_jsonl(rows(), tmp)
    os.replace(tmp, to)
    doc = {
        "job_id": job.job_id,
        "source": output,
        "file": to.name,
        "format": fmt,
        "sha256": _sha256(to),
        "rows": counts.exported + counts.failed_kept,
        "success": counts.exported,
        "failed_kept": counts.failed_kept,
        "dropped": dict(counts.dropped),
        "filters": {
            "drop_checks": sorted({"think_marker", *options.drop_checks}),
            "keep_failed": options.keep_failed,
        },
        "complete": not missing,
        "chunks_missing": len(missing),
        "samples_in_job": manifest.samples,
        "spec": json.loads(job.to_json()),
    }
    manifest_path = to.with_name(to.name + ".manifest.json")
    manifest_path.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


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
    p.add_argument("--drop-truncated", action="store_true", help="leave out samples that hit max_tokens")
    p.add_argument(
        "--drop-check", action="append", default=[], metavar="CHECK", help=f"also drop: {', '.join(CHECKS)}"
    )
    p.add_argument(
        "--keep-failed", action="store_true", help="keep failed samples (status 'failed', no answer)"
    )
    args = p.parse_args(argv)
    to = Path(args.to)
    fmt = args.format or ("parquet" if to.suffix == ".parquet" else "jsonl")
    drops = set(args.drop_check) | ({"truncated"} if args.drop_truncated else set())
    try:
        unknown = drops - set(CHECKS)
        if unknown:
            raise ConfigError(
                f"--drop-check {sorted(unknown)[0]!r}: not a check (one of {', '.join(CHECKS)})"
            )
        doc = export(args.output, to, fmt, ExportOptions(frozenset(drops), args.keep_failed))
    except DflashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    dropped = ", ".join(f"{k} {v:,}" for k, v in doc["dropped"].items()) or "none"
    print(
        f"exported {doc['rows']:,} rows to {to} ({fmt}); dropped: {dropped}"
        + ("" if doc["complete"] else f"; WARNING: {doc['chunks_missing']} chunks not done yet"),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
