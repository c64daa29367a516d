"""What a SpecForge-style drafter trainer accepts: the rules of its data validator, per row.

SpecForge checks regenerated data before training (``scripts/validate_regenerated_data.py
--expect-reasoning --strict-think-markers``) and refuses the whole file at the first bad row.
:func:`row_problem` applies the same rules to one export row and names the first one it breaks,
so ``export`` can leave such rows out (and count them) instead of writing a file the trainer
rejects. The rules:

* ``id`` is a non-empty string; ``status`` is ``"success"``;
* ``conversations`` is a non-empty list of objects, every ``content`` a non-blank string;
* optional ``system`` messages first, then strictly ``user``, ``assistant``, ``user``, ... (any
  other role, or a system message after the first user message, is refused), ending with an
  assistant message; at least one user and one assistant message;
* every assistant ``reasoning_content`` is a string or null; non-blank when reasoning is expected,
  blank when it is not;
* no ``<think>`` or ``</think>`` (any case) in assistant content or reasoning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Why a row breaks the rules, with what it means.
REASONS: dict[str, str] = {
    "bad_id": "the id is not a non-empty string",
    "bad_status": "the status is not 'success'",
    "empty_message": "a message has no text",
    "unsupported_role": "a role the trainer does not take (tool, or system after the first user turn)",
    "role_order": "roles do not alternate user, assistant, user, ...",
    "no_assistant": "no assistant message, or the conversation does not end with one",
    "no_reasoning": "an assistant message has no reasoning_content (reasoning is expected)",
    "unexpected_reasoning": "an assistant message has reasoning_content (thinking is off)",
    "think_marker": "<think> or </think> in an assistant message",
}


@dataclass(frozen=True, slots=True)
class RowProblem:
    reason: str  # a key of REASONS
    detail: str  # the validator's wording, e.g. "assistant message 3 has empty reasoning_content"


def has_think_marker(text: str) -> bool:
    lowered = text.lower()
    return "<think>" in lowered or "</think>" in lowered


def row_problem(
    row: Mapping[str, Any], expect_reasoning: bool, exempt: frozenset[int] = frozenset()
) -> RowProblem | None:
    """The first rule ``row`` breaks, or None when the trainer accepts it.

    ``expect_reasoning`` True requires reasoning on every assistant message, False forbids it;
    assistant messages at the indexes in ``exempt`` are not held to it.
    """
    ident = row.get("id")
    if not isinstance(ident, str) or not ident.strip():
        return RowProblem("bad_id", "id must be a non-empty string")
    if row.get("status") != "success":
        return RowProblem("bad_status", "status must be 'success'")
    messages = row.get("conversations")
    problem = _structure(messages)
    if problem is not None:
        return problem
    assert isinstance(messages, list)
    for index, message in enumerate(messages):
        if message.get("role") == "assistant":
            problem = _assistant(index, message, expect_reasoning, index in exempt)
            if problem is not None:
                return problem
    if messages[-1].get("role") != "assistant":
        return RowProblem("no_assistant", "conversation must end with an assistant message")
    return None


def _structure(messages: Any) -> RowProblem | None:
    if not isinstance(messages, list) or not messages:
        return RowProblem("empty_message", "conversations must be a non-empty list")
    expected = "user"
    saw_user = False
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            return RowProblem("empty_message", f"message {index} must be an object")
        role, content = message.get("role"), message.get("content")
        if not isinstance(content, str) or not content.strip():
            return RowProblem("empty_message", f"message {index} content must be a non-empty string")
        if role == "system" and not saw_user:
            continue
        if role not in ("user", "assistant"):
            return RowProblem("unsupported_role", f"message {index} has unsupported role {role!r}")
        if role != expected:
            return RowProblem("role_order", f"message {index} expected role {expected!r}, got {role!r}")
        saw_user = True
        expected = "assistant" if role == "user" else "user"
    if not saw_user:
        return RowProblem("role_order", "conversation has no user message")
    return None


def _assistant(
    index: int, message: Mapping[str, Any], expect_reasoning: bool, exempt: bool
) -> RowProblem | None:
    reasoning = message.get("reasoning_content")
    where = f"assistant message {index}"
    if reasoning is not None and not isinstance(reasoning, str):
        return RowProblem("no_reasoning", f"{where} reasoning_content must be a string or null")
    has_reasoning = isinstance(reasoning, str) and bool(reasoning.strip())
    if expect_reasoning and not has_reasoning and not exempt:
        return RowProblem("no_reasoning", f"{where} has empty reasoning_content")
    if not expect_reasoning and has_reasoning and not exempt:
        return RowProblem("unexpected_reasoning", f"{where} has non-empty reasoning_content")
    if has_think_marker(message["content"]):
        return RowProblem("think_marker", f"{where} contains a thinking marker")
    if isinstance(reasoning, str) and has_think_marker(reasoning):
        return RowProblem("think_marker", f"{where} reasoning_content contains a thinking marker")
    return None
