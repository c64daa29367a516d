"""Reading a stored record's fields back: each reader checks one value's type and raises
:class:`InvalidField` naming the field (:mod:`dflash_tasks.core.record` turns it into
:class:`~dflash_tasks.core.errors.BadRecord`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dflash_tasks.core.repetition import TEXTS, Loop
from dflash_tasks.core.states import FailureKind, RecordStatus


class InvalidField(Exception):
    """A field of a stored record holds a value of the wrong type; ``cause`` says which and why."""

    def __init__(self, field: str, cause: str) -> None:
        self.field = field
        self.cause = cause


def wrong(field: str, expected: str, value: Any) -> InvalidField:
    return InvalidField(field, f"{field}: expected {expected}, got {show(value)}")


def show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_str(doc: Mapping[str, Any], key: str, path: str) -> str | None:
    value = doc.get(key)
    if value is None or isinstance(value, str):
        return value
    raise wrong(path + key, "a string or null", value)


def read_text(doc: Mapping[str, Any], key: str, path: str) -> str:
    return read_str(doc, key, path) or ""


def read_int(doc: Mapping[str, Any], key: str, path: str) -> int | None:
    value = doc.get(key)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise wrong(path + key, "an integer or null", value)


def read_float(doc: Mapping[str, Any], key: str, path: str) -> float:
    value = doc.get(key)
    if value is None:
        return 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise wrong(path + key, "a number or null", value)


def read_mapping(doc: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any] | None:
    value = doc.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise wrong(path + key, "an object or null", value)


def read_status(doc: Mapping[str, Any], path: str) -> RecordStatus:
    value = doc.get("status")
    if value is None:
        return RecordStatus.FAILED
    try:
        return RecordStatus(value)
    except ValueError:
        raise wrong(path + "status", "'ok' or 'failed'", value) from None


def read_failure(doc: Mapping[str, Any], path: str) -> FailureKind | None:
    value = doc.get("failure")
    if value is None:
        return None
    try:
        return FailureKind(value)
    except ValueError:
        raise wrong(path + "failure", "'permanent' or 'transient'", value) from None


def read_checks(doc: Mapping[str, Any], path: str) -> tuple[str, ...] | None:
    value = doc.get("checks")
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(c, str) for c in value):
        return tuple(value)
    raise wrong(path + "checks", "a list of strings", value)


def read_messages(value: Any, field: str) -> tuple[dict[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise wrong(field, "a list of messages", value)
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise wrong(f"{field}[{i}]", "a message object", m)
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                raise wrong(f"{field}[{i}].{key}", "a string", m.get(key))
    return tuple(value)


def extra_of(doc: Mapping[str, Any], known: frozenset[str]) -> Mapping[str, Any]:
    if known.issuperset(doc):
        return {}
    return {k: v for k, v in doc.items() if k not in known}


def read_count(doc: Mapping[str, Any], key: str, path: str) -> int:
    value = doc.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise wrong(path + key, "a non-negative integer", value)


def read_loop(doc: Mapping[str, Any], path: str) -> Loop | None:
    """A turn's stored ``loop``; an error names the bad field (``turns[0].loop.start_token``)."""
    value = read_mapping(doc, "loop", path)
    if value is None:
        return None
    where = path + "loop."
    counts = {key: read_count(value, key, where) for key in _LOOP_COUNTS}
    copies = value.get("copies")
    if not isinstance(copies, (int, float)) or isinstance(copies, bool):
        raise wrong(where + "copies", "a number", copies)
    text = value.get("text", "reasoning")
    if text not in TEXTS:
        raise wrong(where + "text", " or ".join(map(repr, TEXTS)), text)
    return Loop(**counts, copies=float(copies), text=text)


_LOOP_COUNTS = ("start_char", "start_token", "period_chars", "detected_char", "detected_token")
