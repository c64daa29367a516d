"""What an input location holds: its files and their format, told by name and by content.

Formats: ``jsonl`` (plain, gzip or zstd), ``parquet`` and ``arrow`` (Arrow IPC, stream or file:
what a Hugging Face ``save_to_disk`` folder holds). A location is one file, a folder (a
``save_to_disk`` folder is read in its ``state.json`` order; any other folder, such as a Hub
snapshot, yields its files of one format, sorted, hidden ones skipped) or a glob, on the local
disk or in S3 alike (:mod:`dflash_tasks.producer.input_files`). A file whose content is another
format than its name or ``format=`` says is refused, naming what it is and the option that reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from dflash_tasks.core.errors import InputError
from dflash_tasks.producer.input_files import FileTree, InputFile, head, is_glob

FORMATS: Final = ("jsonl", "parquet", "arrow")
_SUFFIXES: Final = (
    (".jsonl", "jsonl"),
    (".jsonl.gz", "jsonl"),
    (".jsonl.zst", "jsonl"),
    (".json.gz", "jsonl"),
    (".ndjson", "jsonl"),
    (".parquet", "parquet"),
    (".arrow", "arrow"),
)
_MAGIC: Final = (
    (b"PAR1", "parquet", "a Parquet file"),
    (b"ARROW1", "arrow", "an Arrow IPC file"),
    (b"\xff\xff\xff\xff", "arrow", "an Arrow IPC stream (a Hugging Face save_to_disk shard)"),
    (b"PK\x03\x04", "", "a zip archive"),
    (b"\x1f\x8b", "jsonl", "gzip"),
    (b"\x28\xb5\x2f\xfd", "jsonl", "zstd"),
)


@dataclass(frozen=True, slots=True)
class InputFiles:
    """The files of one location, in reading order, and their format."""

    files: tuple[InputFile, ...]
    format: str


def format_of_name(name: str) -> str | None:
    """The format a file's name says, or None."""
    lower = name.lower()
    for suffix, fmt in _SUFFIXES:
        if lower.endswith(suffix):
            return fmt
    return None


def sniff(data: bytes) -> tuple[str, str] | None:
    """(format, description) from a file's first bytes, or None for text (JSONL)."""
    for magic, fmt, what in _MAGIC:
        if data.startswith(magic):
            return fmt, what
    return None


def check_content(file: InputFile, fmt: str, option: str) -> None:
    """Refuse a file whose bytes are another format than ``fmt``, naming the option that reads it."""
    found = sniff(head(file))
    if found is None:
        if fmt != "jsonl":
            raise InputError(
                f"{file.name}: not a {fmt} file (it reads as text: JSONL? {option}=jsonl reads it)"
            )
        return
    actual, what = found
    if actual == fmt:
        return
    if not actual:
        raise InputError(f"{file.name}: this is {what}, not {fmt}: unpack it and give the files inside")
    raise InputError(f"{file.name}: this is {what}, not {fmt}: read it with {option}={actual}")


def list_files(tree: FileTree, location: str, fmt: str | None, option: str) -> InputFiles:
    """The files ``location`` (file, folder or glob) names in ``tree``, and their format."""
    if is_glob(location):
        files = tree.matching(location)
        if not files:
            raise InputError(f"{location}: no file matches")
        return _one_format(location, files, fmt, option)
    single = tree.file(location)
    if single is not None:
        found = fmt or format_of_name(single.name) or _sniffed(single)
        check_content(single, found, option)
        return InputFiles((single,), found)
    entries = dict(tree.under(location))
    if "dataset_dict.json" in entries:
        splits = sorted({rel.split("/")[0] for rel in entries if "/" in rel})
        example = f"{location.rstrip('/')}/{splits[0] if splits else 'train'}"
        raise InputError(
            f"{location}: a Hugging Face DatasetDict with splits {', '.join(splits) or 'none'}: "
            f"give one split's folder, e.g. {example}"
        )
    if "state.json" in entries:
        return InputFiles(_save_to_disk_files(location, entries), "arrow")
    files = [f for rel, f in entries.items() if format_of_name(rel)]
    if not files:
        raise InputError(f"{location}: the folder holds no .jsonl, .parquet or .arrow file")
    return _one_format(location, files, fmt, option)


def _sniffed(file: InputFile) -> str:
    found = sniff(head(file))
    return found[0] if found is not None and found[0] else "jsonl"


def _one_format(location: str, files: list[InputFile], fmt: str | None, option: str) -> InputFiles:
    if fmt is not None:
        for f in files:
            check_content(f, fmt, option)
        return InputFiles(tuple(files), fmt)
    named = {f.name: format_of_name(f.name) for f in files}
    kinds = {k for k in named.values() if k}
    if len(kinds) > 1:
        raise InputError(
            f"{location}: holds files of several formats ({', '.join(sorted(kinds))}): "
            "give a glob that matches one, e.g. DIR/**/*.parquet"
        )
    found = kinds.pop() if kinds else _sniffed(files[0])
    chosen = [f for f in files if named[f.name] in (found, None)]
    for f in chosen:
        check_content(f, found, option)
    return InputFiles(tuple(chosen), found)


def _save_to_disk_files(location: str, entries: dict[str, InputFile]) -> tuple[InputFile, ...]:
    state = entries["state.json"]
    try:
        with state.open() as fh:
            doc = json.loads(fh.read())
        names = [str(item["filename"]) for item in doc["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{state.name}: not a Hugging Face save_to_disk state file: {exc}") from None
    missing = [n for n in names if n not in entries]
    if missing:
        raise InputError(f"{location.rstrip('/')}/{missing[0]}: named in {state.name} but missing")
    return tuple(entries[n] for n in names)
