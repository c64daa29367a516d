"""Read a JSONL prompt file, one line at a time, into chat samples.

Each line of the input (plain, gzip or zstd: by the name's ``.gz``/``.zst`` or the file's magic
bytes) yields exactly one item: a :class:`Sample` ready to send to a chat endpoint, or an
:class:`InvalidLine` saying precisely why the line cannot be used. So ``valid + invalid == lines``
always holds, and a bad line never stops the run. Only a file that cannot be read at all (missing,
a directory, a corrupt or truncated compressed stream, or a file of another format) raises
:class:`~dflash_tasks.core.errors.InputError`.

The accepted shapes are :mod:`dflash_tasks.producer.prompt_row`'s. An optional ``"id"`` (string
or integer) names the sample; without one the id is ``"L<line number>"``. Ids must be unique
across the file. Parquet, Arrow and several sources in one job: :mod:`dflash_tasks.producer.mix`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Final

import pyarrow as pa

from dflash_tasks.core.errors import InputError
from dflash_tasks.core.sample import Sample
from dflash_tasks.producer.input_formats import check_content
from dflash_tasks.producer.prompt_row import (
    ColumnMap,
    RowIds,
    RowInvalid,
    check_encodable,
    parse_row,
    type_name,
)

__all__ = ["InvalidLine", "input_fingerprint", "read_input", "summarize_invalid"]

GZIP_MAGIC: Final = b"\x1f\x8b"
ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
_BLOCK: Final = 1 << 20
_UTF8_BOM: Final = b"\xef\xbb\xbf"
_READ_ERRORS: Final = (OSError, EOFError, zlib.error, pa.ArrowException)
_PLAIN: Final = ColumnMap()


@dataclass(frozen=True, slots=True)
class InvalidLine:
    """One input line that cannot be used, with a specific reason."""

    file: str
    line: int  # the line (a row of Parquet or Arrow) in ``file``
    reason: str
    source: str | None = None  # the source's name, in a job of several sources


def read_input(path: str | os.PathLike[str], columns: ColumnMap = _PLAIN) -> Iterator[Sample | InvalidLine]:
    """Stream ``path`` and yield one Sample or InvalidLine per line, in order.

    A missing file, a directory or a file of another format raises InputError at once; a corrupt
    or truncated compressed stream raises InputError when reached, after the lines before it have
    been yielded.
    """
    name = os.fspath(path)
    _check_file(name)
    check_content(name, "jsonl", f"--input {name},format")
    return _read(name, columns)


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
    try:
        mode = os.stat(name).st_mode
    except FileNotFoundError:
        raise InputError(f"{name}: input file not found") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot access input file: {exc}") from exc
    if stat.S_ISDIR(mode):
        raise InputError(f"{name}: input path is a directory, not a file")


def _compression(name: str) -> str | None:
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith(".zst"):
        return "zstd"
    with open(name, "rb") as fh:
        head = fh.read(4)
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


def _open(name: str) -> tuple[BinaryIO | io.BufferedIOBase | gzip.GzipFile, str | None]:
    try:
        kind = _compression(name)
        if kind == "gzip":
            # No large buffer on top: on a truncated stream, lines buffered ahead would be lost.
            return gzip.open(name, "rb"), kind
        if kind == "zstd":
            return io.BufferedReader(_ArrowRaw(pa.input_stream(name, compression="zstd")), _BLOCK), kind
        return open(name, "rb", buffering=_BLOCK), None
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{name}: cannot open input file: {exc}") from exc


def jsonl_lines(name: str) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line) of a JSONL file; a broken compressed stream raises InputError."""
    fh, kind = _open(name)
    with fh:
        lines = enumerate(fh, 1)
        lineno = 0
        while True:
            try:
                lineno, raw = next(lines)
            except StopIteration:
                return
            except _READ_ERRORS as exc:
                what = f"{kind} stream is corrupt or truncated" if kind else "read failed"
                where = f"after line {lineno}" if lineno else "before the first line"
                raise InputError(f"{name}: {what} {where}: {exc}") from exc
            if lineno == 1 and raw.startswith(_UTF8_BOM):
                raw = raw[len(_UTF8_BOM) :]
            yield lineno, raw


def count_lines(name: str) -> int:
    """The lines :func:`jsonl_lines` yields for ``name``."""
    return sum(1 for _ in jsonl_lines(name))


def _read(name: str, columns: ColumnMap) -> Iterator[Sample | InvalidLine]:
    ids = RowIds()
    for lineno, raw in jsonl_lines(name):
        try:
            ident, messages = parse_json_line(raw, columns)
            yield Sample(ids.claim(ident, lineno), messages, lineno)
        except RowInvalid as exc:
            yield InvalidLine(name, lineno, exc.args[0])


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
