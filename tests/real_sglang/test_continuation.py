"""A cut thought continued with ``continue_final_message`` equals the uninterrupted answer.

Held against the pinned release's real server (its CPU engine, the tiny checkpoint whose every
answer is a fixed chain of tokens, so equality is exact) and the simulator, with the same
assertions: the worker's own :func:`~workers.generation.continue_turn` joins the continuation to
the cut turn, and the server generates (and bills) only the new tokens.
"""

from __future__ import annotations

from typing import Any

import pytest

from dflash_tasks.core.continuation import prefix_message
from dflash_tasks.core.record import Turn
from dflash_tasks.core.states import RecordStatus
from tests.real_sglang.checkpoint import ANSWER, THINKING_COMPLETION_TOKENS, THOUGHT
from tests.real_sglang.conftest import SETUP_TIMEOUT, Target
from tests.real_sglang.test_contract import QUESTION, body, chat, client, post, request, spec
from workers.generate.thought_opener import thought_opener
from workers.generation import Continuation, RetryPolicy, continue_turn, make_turn

pytestmark = pytest.mark.timeout(SETUP_TIMEOUT)

CUT = 12  # the thought's first tokens: <think> and eleven words
BUDGET = 512


def _answer(target: Target, payload: dict[str, Any]) -> dict[str, Any]:
    resp = post(target, payload)
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = resp.json()
    return doc


def test_a_cut_thought_continued_by_the_worker_equals_the_uninterrupted_answer(target: Target) -> None:
    whole = chat(target, request(target, max_tokens=BUDGET))
    assert whole.finish_reason == "stop" and whole.reasoning and whole.content
    cut_answer = chat(target, request(target, max_tokens=CUT))
    assert (cut_answer.finish_reason, cut_answer.completion_tokens, cut_answer.content) == ("length", CUT, "")
    cut = make_turn(QUESTION, cut_answer, None, 0.1, 1)
    opener = thought_opener(target.model_path)
    how = Continuation(opener, BUDGET - CUT)

    turn = continue_turn(
        client(target), spec(target), list(QUESTION), cut, how, RetryPolicy(attempts=1), "cont-test"
    )

    assert (turn.reasoning, turn.content, turn.finish_reason) == (whole.reasoning, whole.content, "stop")
    assert turn.usage.completion_tokens == whole.completion_tokens
    first, rest = turn.parts
    assert first.usage.completion_tokens == CUT
    assert rest.usage.completion_tokens == whole.completion_tokens - CUT  # only the new tokens
    assert rest.usage.prompt_tokens > whole.prompt_tokens  # the prefix is prompt
    assert turn.part_texts() == [(cut.reasoning, ""), (turn.reasoning[len(cut.reasoning) :], turn.content)]
    if target.kind == "real":  # the checkpoint's chain, word for word
        assert opener == "<think>\n"  # its template's generation prompt does not open the thought
        assert (turn.reasoning, turn.content) == (THOUGHT, ANSWER)
        assert turn.usage.completion_tokens == THINKING_COMPLETION_TOKENS


def test_the_continuation_generates_only_the_new_tokens_token_for_token(target: Target) -> None:
    """Raw bodies: the continuation's output tokens are the uninterrupted answer's after the cut,
    and ``usage`` and ``meta_info`` count only them."""
    whole = _answer(target, body(target, max_tokens=BUDGET, logprobs=True))
    cut = _answer(target, body(target, max_tokens=CUT, logprobs=True))
    reasoning = (cut["choices"][0]["message"]["reasoning_content"] or "").strip()
    prefixed = [*QUESTION, prefix_message_of(reasoning, thought_opener(target.model_path))]
    more = _answer(
        target,
        body(target, prefixed, max_tokens=BUDGET - CUT, logprobs=True) | {"continue_final_message": True},
    )

    new = whole["usage"]["completion_tokens"] - CUT
    assert more["usage"]["completion_tokens"] == new
    assert more["choices"][0]["meta_info"]["completion_tokens"] == new
    assert more["choices"][0]["finish_reason"] == "stop"
    assert (
        more["choices"][0]["message"]["content"].strip() == whole["choices"][0]["message"]["content"].strip()
    )
    if target.kind == "real":  # the simulator sends no logprobs
        tokens = [
            [t["token"] for t in doc["choices"][0]["logprobs"]["content"]] for doc in (whole, cut, more)
        ]
        assert len(tokens[0]) == THINKING_COMPLETION_TOKENS
        assert tokens[1] + tokens[2] == tokens[0]  # token for token


def prefix_message_of(reasoning: str, opener: str) -> dict[str, str]:
    """The worker's own prefix message (``core.continuation.prefix_message``) for a cut thought."""
    return prefix_message(Turn(reasoning=reasoning, status=RecordStatus.OK), opener)


def test_without_the_flag_a_final_assistant_message_is_not_continued(target: Target) -> None:
    """SGLang reads it as the user's (``_handle_last_assistant_message``): a fresh answer."""
    cut = chat(target, request(target, max_tokens=CUT))
    prefixed = [*QUESTION, prefix_message_of(cut.reasoning, "<think>\n")]
    fresh = chat(target, request(target, prefixed, max_tokens=BUDGET))
    assert fresh.finish_reason == "stop" and fresh.content
    if target.kind == "real":
        assert (fresh.reasoning, fresh.completion_tokens) == (THOUGHT, THINKING_COMPLETION_TOKENS)
