"""The simulator's ``continue_final_message``, as SGLang 0.5.23's: the final assistant message is a
prefix the answer continues (the same answer the uninterrupted request gets), billed for the new
tokens only; its reasoning parser reads the prefix first."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from dflash_tasks.sim import RunningSimulator, SimConfig, start_simulator

QUESTION = [{"role": "user", "content": "What is 17 * 23? Think it through."}]


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningSimulator]:
    with start_simulator(SimConfig(port=0, time_scale=0.0, mean_output_tokens=300)) as running:
        yield running


def answer(sim: RunningSimulator, messages: list[dict[str, str]], max_tokens: int, **more: Any) -> Any:
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "return_meta_info": True, **more}
    resp = requests.post(f"{sim.url}/v1/chat/completions", json=body, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.json()


def message(doc: Any) -> tuple[str, str]:
    m = doc["choices"][0]["message"]
    return m["reasoning_content"] or "", m["content"] or ""


@pytest.mark.parametrize("cut", [1, 2, 40, 150])
def test_a_continued_thought_joins_into_the_uninterrupted_answer(sim: RunningSimulator, cut: int) -> None:
    whole = answer(sim, QUESTION, 30000)
    first = answer(sim, QUESTION, cut)
    assert first["choices"][0]["finish_reason"] == "length" and message(first)[1] == ""
    thought = message(first)[0].strip()
    prefixed = [*QUESTION, {"role": "assistant", "content": "<think>\n" + thought}]

    more = answer(sim, prefixed, 30000, continue_final_message=True)

    # the prefix holds the tokens generated, and the opener's newline a one-token cut had not reached
    new = whole["usage"]["completion_tokens"] - max(cut, 2)
    assert more["usage"]["completion_tokens"] == more["choices"][0]["meta_info"]["completion_tokens"] == new
    assert more["usage"]["prompt_tokens"] > whole["usage"]["prompt_tokens"]  # the prefix is prompt
    reasoning, content = message(more)
    assert (thought + reasoning).strip() == message(whole)[0].strip()  # whitespace included where it joins
    assert content == message(whole)[1] and more["choices"][0]["finish_reason"] == "stop"


def test_a_continuation_is_cut_by_its_own_budget(sim: RunningSimulator) -> None:
    first = answer(sim, QUESTION, 40)
    prefixed = [*QUESTION, {"role": "assistant", "content": "<think>\n" + message(first)[0].strip()}]
    more = answer(sim, prefixed, 30, continue_final_message=True)
    assert (more["choices"][0]["finish_reason"], more["usage"]["completion_tokens"]) == ("length", 30)
    assert message(more)[1] == ""  # still inside the thought


def test_a_prefix_past_the_thought_continues_the_answer_as_content(sim: RunningSimulator) -> None:
    whole = answer(sim, QUESTION, 30000)
    reasoning, content = message(whole)
    opening = content.split(" ")[0]
    prefixed = [*QUESTION, {"role": "assistant", "content": f"<think>\n{reasoning}\n</think>\n\n{opening}"}]
    more = answer(sim, prefixed, 30000, continue_final_message=True)
    assert message(more)[0] == "" and content.startswith(opening) and message(more)[1]


def test_without_the_flag_the_final_assistant_message_is_just_more_prompt(sim: RunningSimulator) -> None:
    whole = answer(sim, QUESTION, 30000)
    prefixed = [*QUESTION, {"role": "assistant", "content": "<think>\nOkay"}]
    fresh = answer(sim, prefixed, 30000)
    assert fresh["choices"][0]["finish_reason"] == "stop"
    assert message(fresh) != message(whole)  # another prompt, another answer
