"""Streamed chat completions (``stream: true``), held against the pinned release and the simulator
with the same assertions: the chunks' kinds, order and keys (docs/sglang.md, "Streaming").

A plain HTTP client here (``requests``), and the worker's own (``SGLangClient``), whose stream hub
reads the release's chunked body. What a closed stream does to the server: ``test_loop_abort.py``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import requests

from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.repetition import RepetitionSettings
from tests.real_sglang.conftest import SETUP_TIMEOUT, Target
from workers.sglang_client import ChatRequest, SGLangClient, StreamReader
from workers.sglang_client.stream_hub import StreamHub

pytestmark = pytest.mark.timeout(SETUP_TIMEOUT)

QUESTION = [{"role": "user", "content": "Question 7: what is 6 * 7?"}]
#: The keys of each kind of chunk, as SGLang 0.5.23 sends them.
TOP = {"id", "object", "created", "model", "choices"}
CHOICE = {"index", "delta", "logprobs", "finish_reason", "matched_stop"}
DELTA = {
    "role": {"reasoning_content", "role", "content"},
    "reasoning": {"reasoning_content"},
    "content": {"reasoning_content", "content"},
    "finish": {"reasoning_content"},
}


def payload(target: Target, **fields: Any) -> dict[str, Any]:
    return {
        "model": target.served_name,
        "messages": QUESTION,
        "max_completion_tokens": 512,
        "chat_template_kwargs": {"enable_thinking": True},
        "separate_reasoning": True,
        "rid": f"stream-{uuid.uuid4().hex[:12]}",
        **fields,
    }


def post(target: Target, body: dict[str, Any]) -> requests.Response:
    headers = {"Authorization": f"Bearer {target.api_key}"}
    return requests.post(f"{target.url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def streamed(target: Target, **fields: Any) -> tuple[requests.Response, list[Any]]:
    resp = post(target, payload(target, stream=True, **fields))
    assert resp.status_code == 200, resp.text
    chunks: list[Any] = []
    for line in resp.iter_lines():
        if line:
            assert line.startswith(b"data: "), line
            data = line[len(b"data: ") :]
            chunks.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return resp, chunks


def kind(chunk: Any) -> str:
    """What a chunk is: role, reasoning, content, finish:<reason>, usage, error or [DONE]."""
    if chunk == "[DONE]" or "error" in chunk:
        return "[DONE]" if chunk == "[DONE]" else "error"
    if not chunk["choices"]:
        return "usage" if "usage" in chunk else "sglext"
    choice = chunk["choices"][0]
    if choice["finish_reason"] is not None:
        return f"finish:{choice['finish_reason']}"
    delta = choice["delta"]
    if "role" in delta:
        return "role"
    return "reasoning" if delta.get("reasoning_content") is not None else "content"


def pattern(chunks: list[Any]) -> list[str]:
    """The kinds in order, each run of one kind once."""
    kinds = [kind(c) for c in chunks]
    return [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]


def joined(chunks: list[Any], key: str) -> str:
    return "".join(
        c["choices"][0]["delta"].get(key) or "" for c in chunks if isinstance(c, dict) and c.get("choices")
    )


def check_shapes(chunks: list[Any]) -> None:
    """Every chunk's keys are the release's, by kind."""
    for chunk in chunks[:-1]:
        name = kind(chunk).split(":")[0]
        if name in ("usage", "sglext"):
            assert set(chunk) == TOP | {name} and chunk["choices"] == [], chunk
            continue
        has_usage = "usage" in chunk
        assert set(chunk) == TOP | ({"usage"} if has_usage else set()), chunk
        assert chunk["object"] == "chat.completion.chunk"
        (choice,) = chunk["choices"]
        assert set(choice) == CHOICE and choice["index"] == 0 and choice["logprobs"] is None
        assert set(choice["delta"]) == DELTA[name], chunk


# --- the contract ------------------------------------------------------------------------------------


def test_a_streamed_answer_is_the_plain_answer_in_chunks(target: Target) -> None:
    plain = post(target, payload(target)).json()
    resp, chunks = streamed(target, stream_options={"include_usage": True})
    assert resp.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert pattern(chunks) == ["role", "reasoning", "content", "finish:stop", "usage", "[DONE]"]
    check_shapes(chunks)
    assert len({c["id"] for c in chunks[:-1]}) == 1
    message = plain["choices"][0]["message"]
    assert joined(chunks, "reasoning_content") == message["reasoning_content"]
    assert joined(chunks, "content") == message["content"]
    assert chunks[0]["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    finish = chunks[-3]["choices"][0]
    assert (finish["finish_reason"], finish["matched_stop"]) == ("stop", plain["choices"][0]["matched_stop"])
    assert chunks[-2]["usage"] == plain["usage"]


def test_the_workers_client_reads_the_stream_on_its_hub(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's client hands the release's body to its stream hub (a chunked body it can take:
    the hub answers True or False, None only for a body it cannot take) and gets the plain answer's
    texts. Which thread feeds the reader is not asserted: a body the server sent whole before the
    take-over is fed from the bytes already waiting, in the caller's thread."""
    taken: list[bool | None] = []
    read = StreamHub.read

    def noting(hub: StreamHub, resp: requests.Response, reader: StreamReader, timeout: float) -> bool | None:
        taken.append(read(hub, resp, reader, timeout))
        return taken[-1]

    monkeypatch.setattr(StreamHub, "read", noting)
    plain = post(target, payload(target)).json()["choices"][0]["message"]
    client = SGLangClient(target.url, timeout=120, api_key=target.api_key)
    spec = GenerationSpec(model=target.served_name, max_tokens=512)
    done = client.chat(ChatRequest(spec, QUESTION, f"hub-{uuid.uuid4().hex[:8]}", watch=RepetitionSettings()))
    assert taken == [True]  # taken, read to its end, the connection back in its pool
    assert (done.reasoning, done.content) == (plain["reasoning_content"].strip(), plain["content"].strip())


def test_without_include_usage_no_usage_chunk(target: Target) -> None:
    _, chunks = streamed(target)
    assert pattern(chunks) == ["role", "reasoning", "content", "finish:stop", "[DONE]"]


def test_continuous_usage_in_every_text_chunk(target: Target) -> None:
    _, chunks = streamed(target, stream_options={"include_usage": True, "continuous_usage_stats": True})
    check_shapes(chunks)
    texts = [c for c in chunks if kind(c) in ("reasoning", "content")]
    counted = [c["usage"]["completion_tokens"] for c in texts]
    assert all("usage" in c for c in texts) and counted == sorted(counted) and counted[0] >= 1
    assert counted[-1] <= chunks[-2]["usage"]["completion_tokens"]
    assert "usage" not in chunks[0] and "usage" not in chunks[-3]  # the role and finish chunks


def test_a_cut_thought_streams_length(target: Target) -> None:
    _, chunks = streamed(target, max_completion_tokens=10, stream_options={"include_usage": True})
    assert pattern(chunks) == ["role", "reasoning", "finish:length", "usage", "[DONE]"]
    assert chunks[-3]["choices"][0]["matched_stop"] is None
    assert chunks[-2]["usage"]["completion_tokens"] == 10


def test_thinking_off_streams_the_answer_only(target: Target) -> None:
    _, chunks = streamed(target, chat_template_kwargs={"enable_thinking": False})
    assert pattern(chunks) == ["role", "content", "finish:stop", "[DONE]"]


def test_meta_info_is_refused_with_streaming(target: Target) -> None:
    resp = post(target, payload(target, stream=True, return_meta_info=True))
    assert resp.status_code == 400
    assert resp.json()["message"] == (
        "return_meta_info is not supported with streaming. "
        "Please set stream=false when using return_meta_info=true."
    )


@pytest.mark.real_sglang
def test_the_sim_streams_the_chunks_the_release_streams(sim_target: Target, real_target: Target) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    seen = {t.kind: streamed(t, stream_options=options)[1] for t in (sim_target, real_target)}
    assert pattern(seen["sim"]) == pattern(seen["real"])
    for chunks in seen.values():
        check_shapes(chunks)
    shapes = {
        name: {
            (kind(c), tuple(sorted(c)), tuple(sorted(c["choices"][0]["delta"])))
            for c in chunks[:-1]
            if c["choices"]
        }
        for name, chunks in seen.items()
    }
    assert shapes["sim"] == shapes["real"]
