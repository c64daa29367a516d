"""What an input location holds: its files and their format, told by name and by content.

Formats: ``jsonl`` (plain, gzip or zstd), ``parquet`` and ``arrow`` (Arrow IPC, stream or file:
what a Hugging Face ``save_to_disk`` folder holds). A location is one file, a folder (a
``save_to_disk`` folder is read in its ``state.json`` order; any other folder, such as a Hub
snapshot, yields its files of one format, sorted, hidden ones skipped) or a glob. A file whose
content is another format than its name or ``format=`` says is refused, naming what it is and the
option that reads it.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from typing import Final

from dflash_tasks.core.errors import InputError

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

    files: tuple[str, ...]
    format: str


def format_of_name(name: str) -> str | None:
    """The format a file's name says, or None."""
    lower = name.lower()
    for suffix, fmt in _SUFFIXES:
        if lower.endswith(suffix):
            return fmt
    return None


def sniff(path: str) -> tuple[str, str] | None:
    """(format, description) from the file's first bytes, or None for text (JSONL)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise InputError(f"{path}: cannot open input file: {exc}") from exc
    for magic, fmt, what in _MAGIC:
        if head.startswith(magic):
            return fmt, what
    return None


def check_content(path: str, fmt: str, option: str) -> None:
    """Refuse a file whose bytes are another format than ``fmt``, naming the option that reads it."""
    found = sniff(path)
    if found is None:
        if fmt != "jsonl":
            raise InputError(f"{path}: not a {fmt} file (it reads as text: JSONL? {option}=jsonl reads it)")
        return
    actual, what = found
    if actual == fmt:
        return
    if not actual:
        raise InputError(f"{path}: this is {what}, not {fmt}: unpack it and give the files inside")
    raise InputError(f"{path}: this is {what}, not {fmt}: read it with {option}={actual}")


def list_local(location: str, fmt: str | None, option: str) -> InputFiles:
    """The files of a local ``location`` (file, folder or glob) and their format."""
    if any(ch in location for ch in "*?["):
        files = sorted(f for f in glob.glob(location, recursive=True) if os.path.isfile(f))
        if not files:
            raise InputError(f"{location}: no file matches")
        return _one_format(location, files, fmt, option)
    if not os.path.exists(location):
        raise InputError(f"{location}: input file not found")
    if not os.path.isdir(location):
        found = fmt or format_of_name(location) or _sniffed(location)
        check_content(location, found, option)
        return InputFiles((location,), found)
    if os.path.exists(os.path.join(location, "dataset_dict.json")):
        splits = sorted(d for d in os.listdir(location) if os.path.isdir(os.path.join(location, d)))
        raise InputError(
            f"{location}: a Hugging Face DatasetDict with splits {', '.join(splits) or 'none'}: "
            f"give one split's folder, e.g. {os.path.join(location, splits[0] if splits else 'train')}"
        )
    state = os.path.join(location, "state.json")
    if os.path.exists(state):
        return InputFiles(_save_to_disk_files(location, state), "arrow")
    files = sorted(_walk(location))
    if not files:
        raise InputError(f"{location}: the folder holds no .jsonl, .parquet or .arrow file")
    return _one_format(location, files, fmt, option)


def _sniffed(path: str) -> str:
    found = sniff(path)
    return found[0] if found is not None and found[0] else "jsonl"


def _one_format(location: str, files: list[str], fmt: str | None, option: str) -> InputFiles:
    if fmt is not None:
        for f in files:
            check_content(f, fmt, option)
        return InputFiles(tuple(files), fmt)
    named = {f: format_of_name(f) for f in files}
    kinds = {k for k in named.values() if k}
    if len(kinds) > 1:
        raise InputError(
            f"{location}: holds files of several formats ({', '.join(sorted(kinds))}): "
            "give a glob that matches one, e.g. DIR/**/*.parquet"
        )
    found = kinds.pop() if kinds else _sniffed(files[0])
    chosen = [f for f in files if named[f] in (found, None)]
    for f in chosen:
        check_content(f, found, option)
    return InputFiles(tuple(chosen), found)


def _walk(root: str) -> list[str]:
    """Data files under ``root`` (hidden folders and files skipped; symlinks to blobs followed)."""
    out: list[str] = []
    for folder, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out += [os.path.join(folder, n) for n in names if not n.startswith(".") and format_of_name(n)]
    return out


def _save_to_disk_files(location: str, state: str) -> tuple[str, ...]:
    try:
        with open(state, encoding="utf-8") as fh:
            doc = json.load(fh)
        names = [str(item["filename"]) for item in doc["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{state}: not a Hugging Face save_to_disk state file: {exc}") from None
    files = tuple(os.path.join(location, n) for n in names)
    for f in files:
        if not os.path.isfile(f):
            raise InputError(f"{f}: named in {state} but missing")
    return files
