"""Conversations: how a staged sample splits into turns, and the turns of an output record.

A sample's messages are the source conversation up to its last user (or tool) turn. With
``turns: all`` every assistant message in it marks the end of a turn: the messages between two
assistant messages are one turn's *input*, and each turn is one request::

    [system, user1, assistant, user2, assistant, user3]  ->  inputs [[system, user1], [user2], [user3]]

Turn ``j`` is sent as the inputs of turns ``1..j`` with the model's own answers (text only; with
``history_reasoning: keep`` their reasoning too) to turns ``1..j-1`` between them: the source's old
answers are never sent (staging already blanks them).
Assistant messages before the first input, and runs of several assistant messages, mark nothing
more. With ``turns: last`` the whole conversation, old answers included, is one turn's input.

An output record (:class:`~dflash_tasks.core.record.Record`) holds its turns in ``record.turns``:
each with its ``input`` messages and the model's ``reasoning``, ``content``, ``finish_reason``,
``usage``, ``status`` and ``checks``. Records written before multi-turn support have one turn
spread over the record itself; :meth:`Record.from_json <dflash_tasks.core.record.Record.from_json>`
reads them as one turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from dflash_tasks.core.record import Turn

Message = dict[str, str]


def turn_inputs(messages: Sequence[Message], mode: str) -> list[list[Message]]:
    """The input messages of each turn of a conversation (see the module docstring)."""
    if mode == "last":
        return [list(messages)]
    inputs: list[list[Message]] = []
    current: list[Message] = []
    for message in messages:
        if message["role"] == "assistant":
            if current:
                inputs.append(current)
                current = []
            continue
        current.append(message)
    if current:
        inputs.append(current)
    return inputs


def count_turns(messages: Sequence[Message], mode: str) -> int:
    """How many requests a conversation needs: its user turns (1 with ``turns: last``)."""
    return len(turn_inputs(messages, mode))


def blank_answers(messages: Sequence[Message]) -> list[Message]:
    """The messages with every assistant text removed: they only mark where a turn ends."""
    return [{"role": "assistant", "content": ""} if m["role"] == "assistant" else m for m in messages]


def request_messages(
    inputs: Sequence[Sequence[Message]], answers: Sequence[str], reasonings: Sequence[str] | None = None
) -> list[Message]:
    """The messages of the request for turn ``len(answers) + 1``: inputs with the model's answers
    between; with ``reasonings`` (``history_reasoning: keep``), each answer carries its reasoning."""
    messages: list[Message] = []
    for index, (turn_input, answer) in enumerate(zip(inputs, answers, strict=False)):
        messages += turn_input
        message = {"role": "assistant", "content": answer}
        if reasonings is not None:
            message["reasoning_content"] = reasonings[index]
        messages.append(message)
    messages += inputs[len(answers)]
    return messages


def can_continue(turn: Turn) -> bool:
    """Whether a turn's answer can be the history of the next turn: it finished and has text.

    A turn that failed, hit ``max_tokens`` (``finish_reason: length``), was stopped in a loop
    (``repetition``) or has no answer text ends its conversation.
    """
    return turn.ok and not turn.cut_short and bool(turn.content.strip())
