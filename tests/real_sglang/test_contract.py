"""The SGLang HTTP contract (docs/sglang.md), held against the pinned release's real server and the
simulator with the same assertions, so that the simulator cannot drift from the release.

``target`` runs each test twice: ``[sim]`` (``dflash_tasks.sim``) and ``[real]`` (SGLang 0.5.23 on
its CPU engine, serving the tiny checkpoint; marked ``real_sglang``). Requests are built by our own
``ChatRequest`` and read by our own ``SGLangClient`` (or, for a body the workers never send, by its
reply reader) wherever the workers do so.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
import requests

from dflash_tasks.core.errors import ConfigError, RetryableError, SampleRejected
from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.states import ErrorKind
from tests.real_sglang.checkpoint import ANSWER, THOUGHT
from tests.real_sglang.conftest import SETUP_TIMEOUT, Target
from workers.node.sglang_release import SGLANG_VERSION
from workers.sglang_client import ChatRequest, Completion, SGLangClient, parse_completion, read_chat_reply

pytestmark = pytest.mark.timeout(SETUP_TIMEOUT)

QUESTION = [{"role": "user", "content": "Question 7: what is 6 * 7?"}]
SPEC_KEYS = ("spec_verify_ct", "spec_accept_length", "spec_accept_rate")
SPEC_KEYS += ("spec_num_correct_drafts", "spec_num_proposed_drafts")
#: Routes the workers and the router call with the key, and those SGLang leaves open.
KEYED_GET = ("/model_info", "/server_info", "/get_model_info", "/get_server_info", "/v1/models")
OPEN_GET = ("/health", "/health_generate", "/metrics", "/ready")
#: The ``sglang:*`` names our monitoring and docs read (docs/monitoring.md, the simulator's set).
METRIC_NAMES = (
    "num_running_reqs",
    "num_queue_reqs",
    "gen_throughput",
    "token_usage",
    "cache_hit_rate",
    "max_total_num_tokens",
    "spec_accept_length",
    "spec_accept_rate",
    "prompt_tokens_total",
    "generation_tokens_total",
    "num_requests_total",
)


def rid() -> str:
    return f"contract-{uuid.uuid4().hex[:12]}"


def spec(target: Target, **kw: Any) -> GenerationSpec:
    return GenerationSpec(model=target.served_name, **{"max_tokens": 512, **kw})


def request(target: Target, messages: list[dict[str, str]] = QUESTION, **sampling: Any) -> ChatRequest:
    """What a worker sends: ``messages`` with the job's sampling (``sampling`` overriding it)."""
    return ChatRequest(spec(target, **sampling), messages, rid())


def body(target: Target, messages: list[dict[str, str]] = QUESTION, **kw: Any) -> dict[str, Any]:
    """Our own request body (``ChatRequest.body``), with ``kw`` overriding fields."""
    sampling = {k: kw.pop(k) for k in ("max_tokens", "thinking", "temperature") if k in kw}
    return {**request(target, messages, **sampling).body(), **kw}


def post(target: Target, payload: dict[str, Any], key: str | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {target.api_key if key is None else key}"}
    return requests.post(f"{target.url}/v1/chat/completions", json=payload, headers=headers, timeout=120)


def client(target: Target, key: str | None = None) -> SGLangClient:
    return SGLangClient(target.url, timeout=120, api_key=target.api_key if key is None else key)


def chat(target: Target, sent: ChatRequest) -> Completion:
    return client(target).chat(sent)


def read(target: Target, payload: dict[str, Any]) -> Completion:
    """``payload`` sent as is, the reply read as the client reads it: for bodies that change fields
    no :class:`ChatRequest` changes."""
    return read_chat_reply(post(target, payload))


# --- start-up ---------------------------------------------------------------------------------------


def test_health_says_ready_only_once_the_server_generates(target: Target) -> None:
    states = target.startup
    assert states[-1][1:] == (200, 200), states
    first_generation = next(i for i, (_, _, generate) in enumerate(states) if generate == 200)
    before = states[:first_generation]
    assert before and all(health in (0, 503) for _, health, _ in before), states  # not ahead of it
    # Once up, a generation works at once (the probe is a real one-token generation).
    assert chat(target, request(target)).finish_reason == "stop"


# --- what we send, what we read -------------------------------------------------------------------------


def test_a_thinking_answer_through_our_client(target: Target) -> None:
    done = chat(target, request(target))
    assert done.finish_reason == "stop"
    assert done.reasoning and done.content
    for text in (done.reasoning, done.content):
        assert "<think>" not in text and "</think>" not in text
    assert done.prompt_tokens > 0 and 0 < done.reasoning_tokens < done.completion_tokens
    assert done.meta is not None and done.meta.cached_tokens is not None and done.meta.num_retractions == 0
    spec_values = [getattr(done.meta, k) for k in SPEC_KEYS]
    assert all(v is None for v in spec_values) or all(v is not None for v in spec_values), done.meta


@pytest.mark.real_sglang
def test_the_real_answer_is_the_checkpoints_chain(real_target: Target) -> None:
    done = chat(real_target, request(real_target, temperature=1.5))
    assert (done.reasoning, done.content, done.finish_reason) == (THOUGHT, ANSWER, "stop")
    assert (done.reasoning_tokens, done.completion_tokens) == (28, 35)  # <think> … </think>, then 7 more
    assert done.meta is not None and all(getattr(done.meta, k) is None for k in SPEC_KEYS)


def test_the_response_fields_we_read(target: Target) -> None:
    sent = body(target)
    resp = post(target, sent)
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["id"] == sent["rid"] and doc["object"] == "chat.completion" and len(doc["choices"]) == 1
    choice = doc["choices"][0]
    assert {"index", "message", "logprobs", "finish_reason", "matched_stop", "meta_info"} <= set(choice)
    assert set(choice["message"]) >= {"role", "content", "reasoning_content"}
    assert choice["message"]["role"] == "assistant"
    usage, meta = doc["usage"], choice["meta_info"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": usage["reasoning_tokens"]}
    assert meta["id"] == sent["rid"]
    assert meta["finish_reason"] == {"type": "stop", "matched": choice["matched_stop"]}
    for key in ("prompt_tokens", "completion_tokens", "reasoning_tokens"):
        assert meta[key] == usage[key], key
    assert meta["cached_tokens"] >= 0 and meta["num_retractions"] == 0 and meta["e2e_latency"] > 0
    assert meta["weight_version"] == doc["metadata"]["weight_version"] == "default"
    assert doc["model"] == sent["model"]  # echoed, never checked: the identity is /model_info's


def test_thinking_off_gives_an_answer_without_reasoning(target: Target) -> None:
    resp = post(target, body(target, thinking=False))
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    message = doc["choices"][0]["message"]
    assert message["reasoning_content"] is None and message["content"].strip()
    assert doc["usage"]["reasoning_tokens"] == 0 and doc["usage"]["completion_tokens_details"] is None


@pytest.mark.parametrize("kwargs", [{"chat_template_kwargs": None}, {"chat_template_kwargs": {}}])
def test_a_missing_thinking_flag_means_thinking(target: Target, kwargs: dict[str, Any]) -> None:
    done = read(target, body(target, **kwargs))
    assert done.reasoning and done.reasoning_tokens > 0


def test_max_completion_tokens_wins_and_max_tokens_alone_works(target: Target) -> None:
    both = read(target, body(target, max_completion_tokens=10, max_tokens=400))
    alone = body(target, max_tokens=10)
    del alone["max_completion_tokens"]
    for done in (both, read(target, alone)):
        assert (done.finish_reason, done.completion_tokens) == ("length", 10)


def test_a_small_budget_cuts_the_thought_and_leaves_no_answer(target: Target) -> None:
    done = chat(target, request(target, max_tokens=10))
    assert (done.finish_reason, done.completion_tokens, done.reasoning_tokens) == ("length", 10, 10)
    assert done.reasoning and done.content == ""


def test_the_stop_token_is_a_completion_token_without_text(target: Target) -> None:
    """A finished answer's count includes the ``<|im_end|>`` it stopped on: one token less is the same
    text cut by the length, and exactly the count has room for the stop (checked before the length)."""
    whole = chat(target, request(target))
    tokens = whole.completion_tokens
    short = chat(target, request(target, max_tokens=tokens - 1))
    assert (short.finish_reason, short.completion_tokens) == ("length", tokens - 1)
    assert (short.reasoning, short.content, short.reasoning_tokens) == (
        whole.reasoning,
        whole.content,
        whole.reasoning_tokens,
    )
    exact = chat(target, request(target, max_tokens=tokens))
    assert (exact.finish_reason, exact.completion_tokens) == ("stop", tokens)


def test_a_multi_turn_history_is_rendered(target: Target) -> None:
    first = chat(target, request(target))
    history = [
        {"role": "system", "content": "Be brief."},
        *QUESTION,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": "And 7 * 7?"},
    ]
    second = chat(target, request(target, history))
    assert second.finish_reason == "stop" and second.reasoning and second.content
    assert second.prompt_tokens > first.prompt_tokens + 5


# --- the 400s our client isolates to one sample ------------------------------------------------------------

BAD_FIELDS = [
    ({"temperature": -1.0}, "temperature must be a non-negative finite number"),
    ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
    ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0"),
    ({"top_k": 1.5}, "top_k"),
    ({"model": "tiny:adapter"}, "LoRA adapter 'adapter' was requested, but LoRA is not enabled"),
    ({"messages": []}, "Messages cannot be empty."),
    ({"max_completion_tokens": 5000}, "max_completion_tokens is too large: 5000"),
    (
        {"messages": [{"role": "user", "content": "x " * 1000}], "max_completion_tokens": 1900},
        "Requested token count exceeds the model's maximum context length of 2048 tokens",
    ),
    (
        {"messages": [{"role": "user", "content": "x " * 5000}]},
        "is longer than the model's context length (2048 tokens)",
    ),
]


@pytest.mark.parametrize(("fields", "message"), BAD_FIELDS, ids=[m[:24] for _, m in BAD_FIELDS])
def test_a_bad_sample_gets_a_400_that_fails_only_it(
    target: Target, fields: dict[str, Any], message: str
) -> None:
    payload = body(target, **fields)
    resp = post(target, payload)
    assert resp.status_code == 400, resp.text
    assert resp.json()["object"] == "error" and message in resp.json()["message"]
    with pytest.raises(SampleRejected, match="HTTP 400"):
        read(target, payload)


# --- the API key, route by route ---------------------------------------------------------------------------


def test_the_api_key_on_each_route(target: Target) -> None:
    for key in ("", "wrong-key"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        for path in (*KEYED_GET, "/no_such_route"):
            resp = requests.get(target.url + path, headers=headers, timeout=30)
            assert (resp.status_code, resp.json()) == (401, {"error": "Unauthorized"}), (path, key)
        resp = post(target, body(target), key=key)
        assert (resp.status_code, resp.json()) == (401, {"error": "Unauthorized"}), key
        for path in OPEN_GET:
            assert requests.get(target.url + path, headers=headers, timeout=60).status_code == 200, path
    for path in KEYED_GET:
        assert requests.get(target.url + path, headers=target.auth, timeout=30).status_code == 200, path
    assert requests.get(target.url + "/no_such_route", headers=target.auth, timeout=30).status_code == 404


def test_our_client_without_the_key(target: Target) -> None:
    keyless = client(target, key="")
    with pytest.raises(ConfigError, match="HTTP 401"):
        keyless.identity()
    with pytest.raises(RetryableError, match="set DFLASH_SGLANG_API_KEY"):
        keyless.chat(request(target))
    assert keyless.healthy()


# --- identity: what the router relies on -------------------------------------------------------------------


def test_identity_served_name_path_and_version(target: Target) -> None:
    who = client(target).identity()
    assert (who.model_path, who.served_model_name, who.version) == (
        target.model_path,
        target.served_name,
        SGLANG_VERSION,
    )
    info = requests.get(f"{target.url}/server_info", headers=target.auth, timeout=30).json()
    assert info["api_key"] == target.api_key  # in plain text: never stored or logged whole
    kept = client(target).server_info()  # what the workers keep of it: the fields, never the key
    assert (kept.model_path, kept.served_model_name, kept.version) == (
        who.model_path,
        who.served_model_name,
        who.version,
    )
    assert target.api_key not in repr(kept)
    # Unset, the real server states no cap (null; the simulator states its default): no tuner cap.
    assert kept.max_running_requests == info["max_running_requests"]
    assert info["context_length"] == target.context_length and info["max_total_num_tokens"] > 0
    assert info["reasoning_parser"] == "qwen3" and isinstance(info["internal_states"], list)
    model = requests.get(f"{target.url}/model_info", headers=target.auth, timeout=30).json()
    assert model["model_type"] == "qwen3" and model["architectures"] == ["Qwen3ForCausalLM"]
    assert model["is_generation"] is True and model["tokenizer_path"] == target.model_path
    models = requests.get(f"{target.url}/v1/models", headers=target.auth, timeout=30).json()
    (card,) = models["data"]
    assert (card["id"], card["root"], card["max_model_len"]) == (
        target.served_name,
        target.served_name,
        target.context_length,
    )


# --- an abort ---------------------------------------------------------------------------------------------


def _aborted_reply(target: Target) -> requests.Response:
    """One aborted request's reply: the real server aborts a long one by its rid; the simulator by
    its injected ``abort`` fault (it has no ``/abort_request``)."""
    if target.kind == "sim":
        requests.post(f"{target.url}/sim/faults", json={"kind": "abort", "count": 1}, timeout=10)
        return post(target, body(target))
    payload = body(target, max_tokens=1500, ignore_eos=True)  # the chain's end token, 1,500 times
    replies: list[requests.Response] = []
    sender = threading.Thread(target=lambda: replies.append(post(target, payload)))
    sender.start()
    time.sleep(1.0)
    aborted = requests.post(
        f"{target.url}/abort_request", json={"rid": payload["rid"]}, headers=target.auth, timeout=30
    )
    assert aborted.status_code == 200, aborted.text
    sender.join(120)
    return replies[0]


def test_an_aborted_request_is_retried_not_stored(target: Target) -> None:
    resp = _aborted_reply(target)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "abort"
    assert choice["meta_info"]["finish_reason"]["type"] == "abort"
    assert choice["meta_info"]["finish_reason"]["message"] == "Aborted"
    with pytest.raises(RetryableError) as raised:
        parse_completion(resp.content)
    assert raised.value.kind is ErrorKind.ABORT


# --- /metrics -----------------------------------------------------------------------------------------------


def _metric_names(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_the_metrics_we_read(target: Target) -> None:
    chat(target, request(target))
    text = requests.get(f"{target.url}/metrics", timeout=30).text
    assert {f"sglang:{n}" for n in METRIC_NAMES} <= _metric_names(text)
    running = [line for line in text.splitlines() if line.startswith("sglang:num_running_reqs{")]
    assert running and all(f'model_name="{target.served_name}"' in line for line in running)


@pytest.mark.real_sglang
def test_every_simulator_metric_is_a_real_one(sim_target: Target, real_target: Target) -> None:
    for target in (sim_target, real_target):
        chat(target, request(target))
        assert _aborted_reply(target).json()["choices"][0]["finish_reason"] == "abort"  # its counter too
    sim = _metric_names(requests.get(f"{sim_target.url}/metrics", timeout=30).text)
    real = _metric_names(requests.get(f"{real_target.url}/metrics", timeout=30).text)
    assert sim <= real, sorted(sim - real)
