"""An independent check of SpecForge's rules for regenerated training data, for the export tests.

SpecForge validates regenerated data before training with ``scripts/validate_regenerated_data.py``
and ``scripts/conversation_validation.py`` (sgl-project/SpecForge, commit 69e18e6). Those scripts
are not in SpecForge's PyPI package and CI cannot fetch them, so this module restates their rules
(written from their source, independently of ``dflash_tasks.core.trainer_rules``, which the
export itself uses) with the same error messages. It is the oracle the tests hold the export to.

Rules, in the order SpecForge checks them (a failure raises ``ValueError("line N: ...")``):

1. every non-blank line is valid JSON and a JSON object;
2. ``id`` is a non-empty (non-blank) string;
3. ``status`` is exactly ``"success"``;
4. ``conversations`` is a non-empty list; each message is an object whose ``content`` is a
   non-blank string (system messages included); ``system`` messages are allowed only before the
   first user message; other roles are ``user``/``assistant`` only, strictly alternating from
   ``user``; there is at least one user message;
5. each assistant message: ``reasoning_content`` is a string or null; with
   ``expect_reasoning`` it is non-blank, with ``expect_non_reasoning`` it is blank; with
   ``strict_think_markers`` neither ``content`` nor ``reasoning_content`` contains ``<think>`` or
   ``</think>`` (case-insensitive);
6. there is an assistant message and the conversation ends with one;
7. the file has at least one row. Duplicate ids are allowed (counted).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Summary:
    rows: int
    assistant_messages: int
    duplicate_rows: int


def _marker(text: str) -> bool:
    return "<think>" in text.lower() or "</think>" in text.lower()


def _conversation_error(messages: Any) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "conversations must be a non-empty list"
    expected, saw_user = "user", False
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"message {i} must be an object"
        role, content = message.get("role"), message.get("content")
        if not isinstance(content, str) or not content.strip():
            return f"message {i} content must be a non-empty string"
        if role == "system" and not saw_user:
            continue
        if role not in {"user", "assistant"}:
            return f"message {i} has unsupported role {role!r}"
        if role != expected:
            return f"message {i} expected role {expected!r}, got {role!r}"
        saw_user = True
        expected = "assistant" if role == "user" else "user"
    return None if saw_user else "conversation has no user message"


def check_row(
    row: dict[str, Any], *, expect_reasoning: bool, expect_non_reasoning: bool, strict_think_markers: bool
) -> int:
    """Raise ValueError at the first broken rule; return the row's assistant messages."""
    if not isinstance(row.get("id"), str) or not row["id"].strip():
        raise ValueError("id must be a non-empty string")
    if row.get("status") != "success":
        raise ValueError("status must be 'success'")
    messages = row.get("conversations")
    error = _conversation_error(messages)
    if error is not None:
        raise ValueError(error)
    assistants = 0
    for i, message in enumerate(messages):  # type: ignore[arg-type]
        if message.get("role") != "assistant":
            continue
        assistants += 1
        reasoning = message.get("reasoning_content")
        if reasoning is not None and not isinstance(reasoning, str):
            raise ValueError(f"assistant message {i} reasoning_content must be a string or null")
        if expect_non_reasoning and reasoning and reasoning.strip():
            raise ValueError(f"assistant message {i} has non-empty reasoning_content")
        if expect_reasoning and (not isinstance(reasoning, str) or not reasoning.strip()):
            raise ValueError(f"assistant message {i} has empty reasoning_content")
        if strict_think_markers and _marker(message["content"]):
            raise ValueError(f"assistant message {i} contains a thinking marker")
        if strict_think_markers and isinstance(reasoning, str) and _marker(reasoning):
            raise ValueError(f"assistant message {i} reasoning_content contains a thinking marker")
    if assistants == 0:
        raise ValueError("conversation has no assistant message")
    if messages[-1].get("role") != "assistant":  # type: ignore[index]
        raise ValueError("conversation must end with an assistant message")
    return assistants


def validate_file(
    path: Path,
    *,
    expect_reasoning: bool = False,
    expect_non_reasoning: bool = False,
    strict_think_markers: bool = False,
) -> Summary:
    """Validate a JSONL file like ``validate_regenerated_data.py``: ValueError at the first bad row."""
    if expect_reasoning and expect_non_reasoning:
        raise ValueError("expect_non_reasoning and expect_reasoning are mutually exclusive")
    rows = assistants = duplicates = 0
    seen: set[str] = set()
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"line {number}: invalid JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise ValueError(f"line {number}: expected a JSON object")
            try:
                assistants += check_row(
                    row,
                    expect_reasoning=expect_reasoning,
                    expect_non_reasoning=expect_non_reasoning,
                    strict_think_markers=strict_think_markers,
                )
            except ValueError as exc:
                raise ValueError(f"line {number}: {exc}") from exc
            duplicates += row["id"] in seen
            seen.add(row["id"])
            rows += 1
    if rows == 0:
        raise ValueError(f"{path} contains no data rows")
    return Summary(rows, assistants, duplicates)
