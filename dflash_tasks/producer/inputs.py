"""Read a JSONL prompt file, one line at a time, into chat samples.

Each line of the input (plain, or gzip when the name ends in ``.gz`` or the file starts with the
gzip magic bytes) yields exactly one item: a :class:`Sample` ready to send to a chat endpoint, or an
:class:`InvalidLine` saying precisely why the line cannot be used. So ``valid + invalid == lines``
always holds, and a bad line never stops the run. Only a file that cannot be read at all (missing,
a directory, a corrupt or truncated gzip stream) raises :class:`~dflash_tasks.core.errors.InputError`.

Accepted line shapes, in order of preference when an object has several of these keys::

    {"messages": [{"role": "user", "content": "..."}, ...]}          # OpenAI
    {"conversations": [{"from": "human", "value": "..."}, ...]}      # ShareGPT (or role/content)
    {"prompt": "..."}                                                # a single user turn

Content is a string or a list of OpenAI text parts (joined with ``"\\n"``). Trailing assistant turns
are dropped, since they are what gets regenerated. An optional ``"id"`` (string or integer) names the
sample; without one the id is ``"L<line number>"``. Ids must be unique across the file.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import stat
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Final

from dflash_tasks.core.errors import InputError
from dflash_tasks.core.sample import Sample

__all__ = ["InvalidLine", "input_fingerprint", "read_input", "summarize_invalid"]

GZIP_MAGIC: Final = b"\x1f\x8b"
_BLOCK: Final = 1 << 20
_UTF8_BOM: Final = b"\xef\xbb\xbf"
_SHAPES: Final = ("messages", "conversations", "prompt")
_ROLES: Final[dict[str, str]] = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
_GENERATED_ID: Final = re.compile(r"L([1-9][0-9]*)")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_READ_ERRORS: Final = (OSError, EOFError, zlib.error)


@dataclass(frozen=True, slots=True)
class InvalidLine:
    """One input line that cannot be used, with a specific reason."""

    file: str
    line: int
    reason: str


class _Invalid(Exception):
    """Raised inside the line parser; becomes an InvalidLine."""


def read_input(path: str | os.PathLike[str]) -> Iterator[Sample | InvalidLine]:
    """Stream ``path`` and yield one Sample or InvalidLine per line, in order.

    A missing file or a directory raises InputError at once; a corrupt or truncated gzip stream
    raises InputError when reached, after the lines before it have been yielded.
    """
    name = os.fspath(path)
    _check_file(name)
    return _read(name)


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


def _is_gzip(name: str) -> bool:
    if name.endswith(".gz"):
        return True
    with open(name, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def _open(name: str) -> tuple[BinaryIO | gzip.GzipFile, bool]:
    try:
        if _is_gzip(name):
            # No large buffer on top: on a truncated stream, lines buffered ahead would be lost.
            return gzip.open(name, "rb"), True
        return open(name, "rb", buffering=_BLOCK), False
    except OSError as exc:
        raise InputError(f"{name}: cannot open input file: {exc}") from exc


def _read(name: str) -> Iterator[Sample | InvalidLine]:
    ids = _Ids()
    fh, gzipped = _open(name)
    with fh:
        lines = enumerate(fh, 1)
        lineno = 0
        while True:
            try:
                lineno, raw = next(lines)
            except StopIteration:
                return
            except _READ_ERRORS as exc:
                what = "gzip stream is corrupt or truncated" if gzipped else "read failed"
                where = f"after line {lineno}" if lineno else "before the first line"
                raise InputError(f"{name}: {what} {where}: {exc}") from exc
            if lineno == 1 and raw.startswith(_UTF8_BOM):
                raw = raw[len(_UTF8_BOM) :]
            yield _classify(raw, lineno, name, ids)


# --- one line ----------------------------------------------------------------------------------


def _classify(raw: bytes, lineno: int, name: str, ids: _Ids) -> Sample | InvalidLine:
    try:
        ident, messages = _parse_line(raw)
        return Sample(ids.claim(ident, lineno), messages, lineno)
    except _Invalid as exc:
        return InvalidLine(name, lineno, exc.args[0])


def _parse_line(raw: bytes) -> tuple[str | None, list[dict[str, str]]]:
    """Return (explicit id or None, messages), or raise _Invalid."""
    if raw.isspace():
        raise _Invalid("blank line")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Invalid(f"invalid UTF-8 at byte {exc.start}") from None
    obj = _load_json(text)
    if type(obj) is not dict:
        raise _Invalid(f"expected a JSON object, got {_type_name(obj)}")
    ident = _id_of(obj)
    messages = _trim(_messages_of(obj))
    if "\\u" in text:
        _check_encodable(ident, messages)
    return ident, messages


def _load_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = "at end of line" if exc.pos >= len(text.rstrip()) else f"at column {exc.pos + 1}"
        raise _Invalid(f"malformed JSON: {exc.msg} {where}") from None
    except RecursionError:
        raise _Invalid("malformed JSON: nesting too deep") from None
    except ValueError as exc:  # e.g. an integer with more than 4300 digits
        raise _Invalid(f"malformed JSON: {str(exc).partition(':')[0]}") from None


def _id_of(obj: dict[str, Any]) -> str | None:
    value = obj.get("id")
    if value is None:
        return None
    if type(value) is str:
        if not value:
            raise _Invalid("id: expected a non-empty string")
        return value
    if type(value) is int:
        return str(value)
    raise _Invalid(f"id: expected a string or integer, got {_type_name(value)}")


def _messages_of(obj: dict[str, Any]) -> list[dict[str, str]]:
    if "messages" in obj:
        return _turns("messages", obj["messages"])
    if "conversations" in obj:
        return _turns("conversations", obj["conversations"])
    if "prompt" in obj:
        return [{"role": "user", "content": _text(obj["prompt"], "prompt")}]
    raise _Invalid(_unknown_shape(obj))


def _turns(key: str, turns: Any) -> list[dict[str, str]]:
    if type(turns) is not list:
        raise _Invalid(f"{key}: expected a list, got {_type_name(turns)}")
    return [_turn(turn, key, i) for i, turn in enumerate(turns)]


def _turn(turn: Any, key: str, i: int) -> dict[str, str]:
    if type(turn) is not dict:
        raise _Invalid(f"{key}[{i}]: expected an object, got {_type_name(turn)}")
    if "role" in turn:
        role_key, text_key = "role", "content"
    elif "from" in turn:
        role_key, text_key = "from", "value"
    else:
        raise _Invalid(f"{key}[{i}]: missing 'role' (or ShareGPT 'from')")
    role = _role(turn[role_key], key, i, role_key)
    if text_key not in turn:
        raise _Invalid(f"{key}[{i}]: missing {text_key!r}")
    return {"role": role, "content": _text(turn[text_key], f"{key}[{i}].{text_key}")}


def _role(value: Any, key: str, i: int, role_key: str) -> str:
    if type(value) is not str:
        raise _Invalid(f"{key}[{i}].{role_key}: expected a string, got {_type_name(value)}")
    role = _ROLES.get(value) or _ROLES.get(value.strip().lower())
    if role is None:
        raise _Invalid(f"{key}[{i}].{role_key}: unknown role {_quote(value)}")
    return role


def _text(value: Any, where: str) -> str:
    """Content as text: a string as-is, or text parts joined with newlines."""
    if type(value) is str:
        return value
    if type(value) is list:
        return "\n".join([_part(part, where, j) for j, part in enumerate(value)])
    raise _Invalid(f"{where}: expected a string or a list of text parts, got {_type_name(value)}")


def _part(part: Any, where: str, j: int) -> str:
    if type(part) is not dict:
        raise _Invalid(f"{where}[{j}]: expected a text part object, got {_type_name(part)}")
    kind = part.get("type")
    if kind != "text":
        found = _quote(kind) if type(kind) is str else _type_name(kind)
        raise _Invalid(f"{where}[{j}]: unsupported part type {found} (only 'text' parts are accepted)")
    text = part.get("text")
    if type(text) is not str:
        raise _Invalid(f"{where}[{j}].text: expected a string, got {_type_name(text)}")
    return text


def _trim(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Drop trailing assistant turns; require user text and a user or tool turn last."""
    end = len(messages)
    while end and messages[end - 1]["role"] == "assistant":
        end -= 1
    del messages[end:]
    if not any(m["role"] == "user" and _has_text(m["content"]) for m in messages):
        raise _Invalid("empty prompt: no user message with text")
    last = messages[-1]["role"]
    if last != "user" and last != "tool":
        raise _Invalid(f"empty prompt: the conversation ends with a {last} turn, not a user or tool turn")
    return messages


def _has_text(content: str) -> bool:
    return bool(content) and not content.isspace()


def _check_encodable(ident: str | None, messages: list[dict[str, str]]) -> None:
    """Reject lone surrogates (from ``\\ud800``-style escapes): they cannot be sent as UTF-8."""
    if ident is not None and _SURROGATE.search(ident):
        raise _Invalid("id: contains a lone surrogate escape, not encodable as UTF-8")
    for i, message in enumerate(messages):
        if _SURROGATE.search(message["content"]):
            raise _Invalid(f"message {i}: text contains a lone surrogate escape, not encodable as UTF-8")


# --- ids ---------------------------------------------------------------------------------------


class _Ids:
    """Ids claimed so far. Generated ids ("L<line>") cost one byte per line, not a dict entry."""

    __slots__ = ("_explicit", "_generated")

    def __init__(self) -> None:
        self._explicit: dict[str, int] = {}
        self._generated = bytearray()

    def claim(self, ident: str | None, lineno: int) -> str:
        """Return the sample's id, or raise _Invalid if an earlier sample already has it."""
        if ident is None:
            ident = f"L{lineno}"
            self._refuse_if_seen(ident, self._explicit.get(ident))
            self._mark_generated(lineno)
            return ident
        self._refuse_if_seen(ident, self._explicit.get(ident) or self._generated_line(ident))
        self._explicit[ident] = lineno
        return ident

    def _generated_line(self, ident: str) -> int | None:
        match = _GENERATED_ID.fullmatch(ident)
        if match is None:
            return None
        line = int(match[1])
        return line if line < len(self._generated) and self._generated[line] else None

    def _mark_generated(self, lineno: int) -> None:
        if lineno >= len(self._generated):
            self._generated.extend(bytes(max(lineno + 1 - len(self._generated), 4096)))
        self._generated[lineno] = 1

    @staticmethod
    def _refuse_if_seen(ident: str, first: int | None) -> None:
        if first is not None:
            raise _Invalid(f"duplicate id {_quote(ident)} (first seen on line {first})")


# --- wording -----------------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _quote(text: str, limit: int = 40) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


def _unknown_shape(obj: dict[str, Any]) -> str:
    keys = [_quote(k) for k in list(obj)[:8]]
    if len(obj) > 8:
        keys.append("...")
    found = ", ".join(keys) or "none"
    expected = ", ".join(repr(s) for s in _SHAPES)
    return f"unknown shape: expected one of {expected} (found keys: {found})"
