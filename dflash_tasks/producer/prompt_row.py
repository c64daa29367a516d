"""One input row (a JSON object, or a Parquet or Arrow row as a dict) into a prompt's messages.

The shapes accepted, in order of preference when a row has several of these keys::

    {"messages": [{"role": "user", "content": "..."}, ...]}          # OpenAI
    {"conversations": [{"from": "human", "value": "..."}, ...]}      # ShareGPT (or role/content)
    {"prompt": "..."}                                                # a single user turn

A :class:`ColumnMap` names other columns instead (``--messages-column``, ``--prompt-column``,
``--id-column``) and a system prompt put first (``--system-prompt``). Content is a string or a list
of OpenAI text parts (joined with ``"\\n"``). Trailing assistant turns are dropped, since they are
what gets regenerated. A row that cannot be used raises :class:`RowInvalid` with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

SHAPES: Final = ("messages", "conversations", "prompt")
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


class RowInvalid(Exception):
    """A row that cannot be used; ``args[0]`` is the reason."""


@dataclass(frozen=True, slots=True)
class ColumnMap:
    """Which columns hold a row's prompt and id; the defaults read the shapes above."""

    messages: str | None = None  # a column of chat turns (OpenAI role/content or ShareGPT from/value)
    prompt: str | None = None  # a column of user text
    id: str | None = None  # the id column (default: "id" where a row has one)
    system: str | None = None  # a system prompt put first, unless the row starts with its own

    def __post_init__(self) -> None:
        if self.messages and self.prompt:
            raise ValueError("give a messages column or a prompt column, not both")

    @property
    def id_column(self) -> str:
        return self.id or "id"

    def to_dict(self) -> dict[str, str]:
        """The non-default fields (what a job records of it)."""
        pairs = (
            ("messages", self.messages),
            ("prompt", self.prompt),
            ("id", self.id),
            ("system", self.system),
        )
        return {k: v for k, v in pairs if v}

    def wanted(self, available: Iterable[str]) -> list[str]:
        """The columns to read of a table with ``available`` columns, in its order."""
        want = {self.id_column}
        want.update([c for c in (self.messages, self.prompt) if c] or SHAPES)
        return [c for c in available if c in want]

    def missing(self, available: Iterable[str]) -> str | None:
        """Why a table with ``available`` columns cannot give prompts (naming the flag), or None."""
        have = set(available)
        named = [
            (flag, column)
            for flag, column in (
                ("--messages-column", self.messages),
                ("--prompt-column", self.prompt),
                ("--id-column", self.id),
            )
            if column
        ]
        for flag, column in named:
            if column not in have:
                return f"no column {column!r} ({flag})"
        if not (self.messages or self.prompt) and not have.intersection(SHAPES):
            return (
                "none of the columns 'messages', 'conversations' or 'prompt': name the prompt's "
                "column with --prompt-column or --messages-column"
            )
        return None


def parse_row(obj: dict[str, Any], columns: ColumnMap) -> tuple[str | None, list[dict[str, str]]]:
    """Return (explicit id or None, messages), or raise :class:`RowInvalid`."""
    ident = _id_of(obj, columns.id_column)
    if columns.messages:
        messages = _turns(columns.messages, _column(obj, columns.messages))
    elif columns.prompt:
        messages = [{"role": "user", "content": _text(_column(obj, columns.prompt), columns.prompt)}]
    else:
        messages = _messages_of(obj)
    if columns.system and (not messages or messages[0]["role"] != "system"):
        messages.insert(0, {"role": "system", "content": columns.system})
    return ident, _trim(messages)


def _column(obj: dict[str, Any], name: str) -> Any:
    if name not in obj:
        raise RowInvalid(f"missing column {quote(name)} (found keys: {_keys(obj)})")
    return obj[name]


def _id_of(obj: dict[str, Any], column: str) -> str | None:
    value = obj.get(column)
    if value is None:
        return None
    if type(value) is str:
        if not value:
            raise RowInvalid(f"{column}: expected a non-empty string")
        return value
    if type(value) is int:
        return str(value)
    raise RowInvalid(f"{column}: expected a string or integer, got {type_name(value)}")


def _messages_of(obj: dict[str, Any]) -> list[dict[str, str]]:
    if "messages" in obj:
        return _turns("messages", obj["messages"])
    if "conversations" in obj:
        return _turns("conversations", obj["conversations"])
    if "prompt" in obj:
        return [{"role": "user", "content": _text(obj["prompt"], "prompt")}]
    raise RowInvalid(unknown_shape(obj))


def _turns(key: str, turns: Any) -> list[dict[str, str]]:
    if type(turns) is not list:
        raise RowInvalid(f"{key}: expected a list, got {type_name(turns)}")
    return [_turn(turn, key, i) for i, turn in enumerate(turns)]


def _turn(turn: Any, key: str, i: int) -> dict[str, str]:
    if type(turn) is not dict:
        raise RowInvalid(f"{key}[{i}]: expected an object, got {type_name(turn)}")
    if "role" in turn:
        role_key, text_key = "role", "content"
    elif "from" in turn:
        role_key, text_key = "from", "value"
    else:
        raise RowInvalid(f"{key}[{i}]: missing 'role' (or ShareGPT 'from')")
    role = _role(turn[role_key], key, i, role_key)
    if text_key not in turn:
        raise RowInvalid(f"{key}[{i}]: missing {text_key!r}")
    return {"role": role, "content": _text(turn[text_key], f"{key}[{i}].{text_key}")}


def _role(value: Any, key: str, i: int, role_key: str) -> str:
    if type(value) is not str:
        raise RowInvalid(f"{key}[{i}].{role_key}: expected a string, got {type_name(value)}")
    role = _ROLES.get(value) or _ROLES.get(value.strip().lower())
    if role is None:
        raise RowInvalid(f"{key}[{i}].{role_key}: unknown role {quote(value)}")
    return role


def _text(value: Any, where: str) -> str:
    """Content as text: a string as-is, or text parts joined with newlines."""
    if type(value) is str:
        return value
    if type(value) is list:
        return "\n".join([_part(part, where, j) for j, part in enumerate(value)])
    raise RowInvalid(f"{where}: expected a string or a list of text parts, got {type_name(value)}")


def _part(part: Any, where: str, j: int) -> str:
    if type(part) is not dict:
        raise RowInvalid(f"{where}[{j}]: expected a text part object, got {type_name(part)}")
    kind = part.get("type")
    if kind != "text":
        found = quote(kind) if type(kind) is str else type_name(kind)
        raise RowInvalid(f"{where}[{j}]: unsupported part type {found} (only 'text' parts are accepted)")
    text = part.get("text")
    if type(text) is not str:
        raise RowInvalid(f"{where}[{j}].text: expected a string, got {type_name(text)}")
    return text


def _trim(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Drop trailing assistant turns; require user text and a user or tool turn last."""
    end = len(messages)
    while end and messages[end - 1]["role"] == "assistant":
        end -= 1
    del messages[end:]
    if not any(m["role"] == "user" and _has_text(m["content"]) for m in messages):
        raise RowInvalid("empty prompt: no user message with text")
    last = messages[-1]["role"]
    if last != "user" and last != "tool":
        raise RowInvalid(f"empty prompt: the conversation ends with a {last} turn, not a user or tool turn")
    return messages


def _has_text(content: str) -> bool:
    return bool(content) and not content.isspace()


def check_encodable(ident: str | None, messages: list[dict[str, str]]) -> None:
    """Reject lone surrogates (from ``\\ud800``-style escapes): they cannot be sent as UTF-8."""
    if ident is not None and _SURROGATE.search(ident):
        raise RowInvalid("id: contains a lone surrogate escape, not encodable as UTF-8")
    for i, message in enumerate(messages):
        if _SURROGATE.search(message["content"]):
            raise RowInvalid(f"message {i}: text contains a lone surrogate escape, not encodable as UTF-8")


# --- ids ---------------------------------------------------------------------------------------


class RowIds:
    """Ids claimed so far. Generated ids ("L<row>") cost one byte per row, not a dict entry."""

    __slots__ = ("_explicit", "_generated", "_unit")

    def __init__(self, unit: str = "line") -> None:
        self._explicit: dict[str, int] = {}
        self._generated = bytearray()
        self._unit = unit

    def claim(self, ident: str | None, lineno: int) -> str:
        """Return the sample's id, or raise RowInvalid if an earlier row already has it."""
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

    def _refuse_if_seen(self, ident: str, first: int | None) -> None:
        if first is not None:
            raise RowInvalid(f"duplicate id {quote(ident)} (first seen on {self._unit} {first})")


# --- wording -----------------------------------------------------------------------------------


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def quote(text: str, limit: int = 40) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


def unknown_shape(obj: dict[str, Any]) -> str:
    expected = ", ".join(repr(s) for s in SHAPES)
    return f"unknown shape: expected one of {expected} (found keys: {_keys(obj)})"


def _keys(obj: dict[str, Any]) -> str:
    keys = [quote(k) for k in list(obj)[:8]]
    if len(obj) > 8:
        keys.append("...")
    return ", ".join(keys) or "none"
