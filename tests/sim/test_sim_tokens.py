"""The simulator counts its tokens as SGLang 0.5.23 does for a Qwen3 thinking model: every generated
token is a completion token (``<think>`` and its newline, the newline, ``</think>`` and blank line
closing the thought, the answer, and the ``<|im_end|>`` a finished answer stops on), the thought's
tokens through ``</think>`` are reasoning tokens, and the reasoning parser strips the markers from
the texts but not from the counts. Each count is the trainer's tokenizer's count of the text
(:func:`dflash_tasks.sim.tokenizer.build_model_dir`), in the plain answer and in the stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from tokenizers import Tokenizer

from dflash_tasks.sim import RunningSimulator, SimConfig, start_simulator
from dflash_tasks.sim.textgen import prefix_tokens
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir

PROMPTS = [f"Question {i}: explain step {i} in detail." for i in range(8)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = build_model_dir(tmp_path_factory.mktemp("model"), QWEN3_TEMPLATE)
    return Tokenizer.from_file(str(path / "tokenizer.json"))


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningSimulator]:
    with start_simulator(SimConfig(port=0, time_scale=0.0, mean_output_tokens=200)) as running:
        yield running


def count(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def post(sim: RunningSimulator, prompt: str, max_tokens: int, **fields: Any) -> requests.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    resp = requests.post(f"{sim.url}/v1/chat/completions", json={**body, **fields}, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp


def ask(sim: RunningSimulator, prompt: str, max_tokens: int = 5000, **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = post(sim, prompt, max_tokens, **fields).json()
    return doc


def streamed(sim: RunningSimulator, prompt: str, max_tokens: int = 5000, **fields: Any) -> dict[str, Any]:
    """The stream as the plain answer's fields: the joined texts, the finish and the last usage."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    doc = ask_stream(sim, prompt, max_tokens, stream=True, stream_options=options, **fields)
    chunks = [c for c in doc if c["choices"]]
    text = {
        key: "".join(c["choices"][0]["delta"].get(key) or "" for c in chunks)
        for key in ("reasoning_content", "content")
    }
    finish = next(c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"])
    # a text chunk's running usage counts the tokens so far (the stop token, without text, in none)
    running = [c["usage"]["completion_tokens"] for c in chunks if "usage" in c]
    assert running == sorted(running) and all(n <= doc[-1]["usage"]["completion_tokens"] for n in running)
    return {
        "choices": [{"message": text, "finish_reason": finish}],
        "usage": doc[-1]["usage"],
    }


def ask_stream(sim: RunningSimulator, prompt: str, max_tokens: int, **fields: Any) -> list[Any]:
    resp = post(sim, prompt, max_tokens, **fields)
    lines = [line[len(b"data: ") :] for line in resp.iter_lines() if line]
    assert lines[-1] == b"[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def thought_and_answer(doc: dict[str, Any]) -> tuple[str, str, str]:
    message = doc["choices"][0]["message"]
    return message["reasoning_content"] or "", message["content"] or "", doc["choices"][0]["finish_reason"]


ANSWERS = {"plain": ask, "streamed": streamed}


@pytest.mark.parametrize("how", ANSWERS)
def test_a_finished_thinking_answer_counts_its_markers_and_its_stop_token(
    sim: RunningSimulator, tokenizer: Tokenizer, how: str
) -> None:
    for prompt in PROMPTS:
        doc = ANSWERS[how](sim, prompt)
        reasoning, content, finish = thought_and_answer(doc)
        assert finish == "stop" and reasoning and content
        assert "<think>" not in reasoning + content and "</think>" not in reasoning + content
        thought = "<think>\n" + reasoning.strip("\n") + "\n</think>"
        generated = thought + "\n\n" + content.lstrip("\n")
        usage = doc["usage"]
        assert usage["completion_tokens"] == count(tokenizer, generated) + 1, prompt  # + <|im_end|>
        assert usage["reasoning_tokens"] == count(tokenizer, thought), prompt
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("how", ANSWERS)
def test_an_answer_without_thinking_counts_its_words_and_its_stop_token(
    sim: RunningSimulator, tokenizer: Tokenizer, how: str
) -> None:
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    for prompt in PROMPTS:
        doc = ANSWERS[how](sim, prompt, **off)
        reasoning, content, finish = thought_and_answer(doc)
        assert (finish, reasoning) == ("stop", "") and content
        assert doc["usage"]["completion_tokens"] == count(tokenizer, content) + 1, prompt
        assert doc["usage"]["reasoning_tokens"] == 0


@pytest.mark.parametrize("how", ANSWERS)
def test_a_length_finish_has_max_tokens_tokens_of_text_markers_included(
    sim: RunningSimulator, tokenizer: Tokenizer, how: str
) -> None:
    prompt = PROMPTS[0]
    whole = ask(sim, prompt, separate_reasoning=False)["choices"][0]["message"]["content"]
    reasoning_tokens = ask(sim, prompt)["usage"]["reasoning_tokens"]
    # inside the opener, the thought, the closer; past it into the answer; one short of the stop
    stop_at = ask(sim, prompt)["usage"]["completion_tokens"]
    cuts = [1, 2, 3, 10, reasoning_tokens - 1, reasoning_tokens, reasoning_tokens + 1, stop_at - 1]
    for cut in cuts:
        raw = ANSWERS[how](sim, prompt, max_tokens=cut, separate_reasoning=False)
        text, finish = raw["choices"][0]["message"]["content"], raw["choices"][0]["finish_reason"]
        assert (finish, raw["usage"]["completion_tokens"]) == ("length", cut)
        assert whole.startswith(text) and count(tokenizer, text) == cut, (cut, text[-40:])
        assert raw["usage"]["reasoning_tokens"] == min(cut, reasoning_tokens)
        split = ANSWERS[how](sim, prompt, max_tokens=cut)
        assert split["usage"] == raw["usage"]
    exact = ANSWERS[how](sim, prompt, max_tokens=stop_at)  # room for the stop token: it stops
    assert (exact["choices"][0]["finish_reason"], exact["usage"]["completion_tokens"]) == ("stop", stop_at)


def test_a_continued_prefix_holds_the_tokens_it_was_generated_in(
    sim: RunningSimulator, tokenizer: Tokenizer
) -> None:
    prompt = PROMPTS[1]
    whole = ask(sim, prompt, separate_reasoning=False)["choices"][0]["message"]["content"]
    for cut in (2, 3, 30, 120):
        text = ask(sim, prompt, max_tokens=cut, separate_reasoning=False)["choices"][0]["message"]["content"]
        assert whole.startswith(text) and prefix_tokens(text) == count(tokenizer, text) == cut, cut


def test_the_tokenizer_counts_a_whole_answer_as_the_simulator_does(
    sim: RunningSimulator, tokenizer: Tokenizer
) -> None:
    """Its words one token each, ``\\n\\n`` one token (as Qwen3's): the loss counts of rows built
    from the simulator's text are the tokens it generated, the template's own apart."""
    for prompt in PROMPTS:
        doc = ask(sim, prompt, separate_reasoning=False)
        raw = doc["choices"][0]["message"]["content"]
        assert count(tokenizer, raw) + 1 == doc["usage"]["completion_tokens"], prompt
