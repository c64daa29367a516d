"""JSONL prompt files, one line at a time: their lines, each line's prompt, and what is wrong with one.

A file (plain, gzip or zstd: by the name's ``.gz``/``.zst`` or the file's magic bytes, local or in
S3) is streamed line by line. A line yields its prompt, or an :class:`InvalidLine` saying precisely
why it cannot be used, so a bad line never stops the run. Only a file that cannot be read at all
(a corrupt or truncated compressed stream, an S3 object replaced while it is read) raises
:class:`~dflash_tasks.core.errors.InputError`, naming the file and the line after which it stopped.

The accepted shapes are :mod:`dflash_tasks.producer.prompt_row`'s. Reading a job's input, of one
source or several: :mod:`dflash_tasks.producer.mix`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

from dflash_tasks.core.errors import DflashError, InputError
from dflash_tasks.producer.input_files import InputFile, is_local_folder
from dflash_tasks.producer.prompt_row import ColumnMap, RowInvalid, check_encodable, parse_row, type_name

__all__ = ["InvalidLine", "input_fingerprint", "jsonl_lines", "parse_json_line", "summarize_invalid"]

GZIP_MAGIC: Final = b"\x1f\x8b"
ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
_BLOCK: Final = 1 << 20
_UTF8_BOM: Final = b"\xef\xbb\xbf"
_READ_ERRORS: Final = (OSError, EOFError, zlib.error, pa.ArrowException)


@dataclass(frozen=True, slots=True)
class InvalidLine:
    """One input line that cannot be used, with a specific reason."""

    file: str
    line: int  # the line (a row of Parquet or Arrow) in ``file``
    reason: str
    source: str | None = None  # the source's name, in a job of several sources


def input_fingerprint(path: str | os.PathLike[str]) -> str:
    """Return ``"sha256:<hex>"`` of the raw file bytes, read in 1 MiB blocks."""
    name = os.fspath(path)
    _check_file(name)
    digest = hashlib.sha256()
    buf = bytearray(_BLOCK)
    view = memoryview(buf)
    try:
        with open(name, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                digest.update(view[:n])
    except OSError as exc:
        raise InputError(f"{name}: cannot read input file: {exc}") from exc
    return "sha256:" + digest.hexdigest()


def summarize_invalid(invalid: Iterable[InvalidLine], limit: int = 10) -> str:
    """Render ``"N invalid lines"`` then up to ``limit`` lines ``"path:LINE: reason"``."""
    shown: list[str] = []
    total = 0
    for item in invalid:
        total += 1
        if len(shown) < limit:
            shown.append(f"{item.file}:{item.line}: {item.reason}")
    head = f"{total} invalid line" + ("" if total == 1 else "s")
    more = [f"... and {total - len(shown)} more"] if total > len(shown) else []
    return "\n".join([head, *shown, *more])


# --- file access -------------------------------------------------------------------------------


def _check_file(name: str) -> None:
    if is_local_folder(name):
        raise InputError(f"{name}: input path is a directory, not a file")


def _compression(name: str, stream: io.BufferedReader[io.RawIOBase]) -> str | None:
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith(".zst"):
        return "zstd"
    head = stream.peek(4)[:4]
    return "gzip" if head.startswith(GZIP_MAGIC) else "zstd" if head == ZSTD_MAGIC else None


class _ArrowRaw(io.RawIOBase):
    """pyarrow's zstd stream as a raw file, so that io.BufferedReader can split its lines."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._stream.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._stream.close()
        super().close()


def _decoded(name: str, raw: io.RawIOBase) -> tuple[io.BufferedIOBase | gzip.GzipFile, str | None]:
    """The file's decompressed bytes, and its compression."""
    try:
        buffered = io.BufferedReader(raw, _BLOCK)
        kind = _compression(name, buffered)
        if kind == "gzip":
            # No large buffer on top: on a truncated stream, lines buffered ahead would be lost.
            return gzip.GzipFile(fileobj=buffered, mode="rb"), kind
        if kind == "zstd":
            return io.BufferedReader(_ArrowRaw(pa.input_stream(buffered, compression="zstd")), _BLOCK), kind
        return buffered, None
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{name}: cannot open input file: {exc}") from exc


def jsonl_lines(file: InputFile) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line) of a JSONL file, streamed; a broken stream raises InputError."""
    name = file.name
    with file.open() as raw:
        fh, kind = _decoded(name, raw)
        with fh:
            lines = enumerate(fh, 1)
            lineno = 0
            while True:
                try:
                    lineno, raw_line = next(lines)
                except StopIteration:
                    return
                except _READ_ERRORS as exc:
                    what = f"{kind} stream is corrupt or truncated" if kind else "read failed"
                    raise InputError(f"{name}: {what} {_after(lineno)}: {exc}") from exc
                except DflashError as exc:  # from the store: an object replaced, or a failure past retries
                    raise InputError(f"{name}: read stopped {_after(lineno)}: {exc}") from exc
                if lineno == 1 and raw_line.startswith(_UTF8_BOM):
                    raw_line = raw_line[len(_UTF8_BOM) :]
                yield lineno, raw_line


def _after(lineno: int) -> str:
    return f"after line {lineno}" if lineno else "before the first line"


def count_lines(file: InputFile) -> int:
    """The lines :func:`jsonl_lines` yields for ``file``."""
    return sum(1 for _ in jsonl_lines(file))


def parse_json_line(raw: bytes, columns: ColumnMap) -> tuple[str | None, list[dict[str, str]]]:
    """Return (explicit id or None, messages) of one JSONL line, or raise RowInvalid."""
    if raw.isspace():
        raise RowInvalid("blank line")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RowInvalid(f"invalid UTF-8 at byte {exc.start}") from None
    obj = _load_json(text)
    if type(obj) is not dict:
        raise RowInvalid(f"expected a JSON object, got {type_name(obj)}")
    ident, messages = parse_row(obj, columns)
    if "\\u" in text:
        check_encodable(ident, messages)
    return ident, messages


def _load_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = "at end of line" if exc.pos >= len(text.rstrip()) else f"at column {exc.pos + 1}"
        raise RowInvalid(f"malformed JSON: {exc.msg} {where}") from None
    except RecursionError:
        raise RowInvalid("malformed JSON: nesting too deep") from None
    except ValueError as exc:  # e.g. an integer with more than 4300 digits
        raise RowInvalid(f"malformed JSON: {str(exc).partition(':')[0]}") from None
