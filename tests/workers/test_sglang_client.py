"""Tests for workers.sglang_client and workers.generation against the in-process simulator."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from dflash_tasks.core.errors import RetryableError, SampleRejected, ServerUnavailable
from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.sample import Sample
from dflash_tasks.sim import RunningSimulator, SimConfig, start_simulator
from workers.conversation import generate_sample
from workers.generation import RetryPolicy, WorkerIdentity, build_request
from workers.sglang_client import Completion, SGLangClient, error_message, parse_completion

SPEC = GenerationSpec(model="Qwen/Qwen3-8B", max_tokens=2000)
SAMPLE = Sample(id="q7", messages=[{"role": "user", "content": "What is 6*7? Explain."}], line=8)
WHO = WorkerIdentity(worker="gpu0@test", endpoint="http://sim")
PREFIX = "0123456789abcdef-3"  # what chunk_runner passes: f"{job_id}-{chunk}"


class Sleeps:
    """A no-op sleep that records the delays it was asked for."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


class RecordingClient(SGLangClient):
    """The real client over real HTTP, remembering every request body it sent."""

    def __init__(self, endpoint: str, timeout: float = 30.0) -> None:
        super().__init__(endpoint, timeout=timeout)
        self.payloads: list[dict[str, Any]] = []

    def chat(self, payload: dict[str, Any]) -> Completion:
        self.payloads.append(payload)
        return super().chat(payload)


def fast_policy(attempts: int = 3) -> RetryPolicy:
    return RetryPolicy(attempts=attempts, backoff=0.001, backoff_max=0.002)


def start(**overrides: Any) -> RunningSimulator:
    settings: dict[str, Any] = {"port": 0, "time_scale": 0.0, "mean_output_tokens": 300, **overrides}
    return start_simulator(SimConfig(**settings))


@pytest.fixture
def sim() -> Iterator[RunningSimulator]:
    running = start()
    yield running
    running.stop()


def fault(sim: RunningSimulator, **body: Any) -> None:
    resp = requests.post(f"{sim.url}/sim/faults", json=body, timeout=5)
    assert resp.status_code == 200, resp.text


def sim_stats(sim: RunningSimulator) -> dict[str, Any]:
    stats: dict[str, Any] = requests.get(f"{sim.url}/sim/stats", timeout=5).json()
    return stats


def generate(
    client: SGLangClient,
    policy: RetryPolicy | None = None,
    sample: Sample = SAMPLE,
    spec: GenerationSpec = SPEC,
) -> tuple[dict[str, Any], Sleeps]:
    sleeps = Sleeps()
    record = generate_sample(client, spec, sample, WHO, policy or fast_policy(), PREFIX, sleep=sleeps)
    return record, sleeps


# -- the request body ------------------------------------------------------------------------------


def test_build_request_follows_the_sglang_contract() -> None:
    spec = GenerationSpec(
        "Qwen/Qwen3-32B", max_tokens=1234, temperature=0.7, top_p=0.8, top_k=5, thinking=True
    )
    body = build_request(spec, SAMPLE.messages, "rid-1")
    assert body == {
        "model": "Qwen/Qwen3-32B",
        "messages": SAMPLE.messages,
        "max_tokens": 1234,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 5,
        "n": 1,
        "stream": False,
        "chat_template_kwargs": {"enable_thinking": True},
        "separate_reasoning": True,
        "rid": "rid-1",
    }
    json.dumps(body)  # JSON-serialisable as sent


def test_build_request_thinking_off() -> None:
    body = build_request(GenerationSpec("m", thinking=False), SAMPLE.messages, "r")
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


# -- successful completions over HTTP ------------------------------------------------------------------


def test_completion_splits_and_strips_reasoning_and_content(sim: RunningSimulator) -> None:
    raw = requests.post(
        f"{sim.url}/v1/chat/completions", json=build_request(SPEC, SAMPLE.messages, "raw-1"), timeout=10
    ).json()
    message = raw["choices"][0]["message"]
    # SGLang 0.5.23 does not strip: the answer starts with blank lines, the reasoning with "\n".
    assert message["content"] != message["content"].strip()
    assert message["reasoning_content"] != message["reasoning_content"].strip()

    completion = SGLangClient(sim.url).chat(build_request(SPEC, SAMPLE.messages, "client-1"))
    assert completion.reasoning == message["reasoning_content"].strip()
    assert completion.content == message["content"].strip()
    assert completion.reasoning and completion.content
    assert "<think>" not in completion.content and "</think>" not in completion.content
    assert completion.finish_reason == "stop"
    usage = raw["usage"]
    assert (
        completion.prompt_tokens == usage["prompt_tokens"] == math.ceil(len("What is 6*7? Explain.") / 4) + 4
    )
    assert completion.completion_tokens == usage["completion_tokens"]
    assert 0 < completion.reasoning_tokens == usage["reasoning_tokens"] < completion.completion_tokens


def test_thinking_off_gives_empty_reasoning(sim: RunningSimulator) -> None:
    spec = GenerationSpec("m", max_tokens=100, thinking=False)
    completion = SGLangClient(sim.url).chat(build_request(spec, SAMPLE.messages, "off-1"))
    assert completion.reasoning == ""
    assert completion.content and completion.content == completion.content.strip()
    assert completion.reasoning_tokens == 0
    assert 4 <= completion.completion_tokens <= 8


def test_length_limit_reports_finish_reason(sim: RunningSimulator) -> None:
    spec = GenerationSpec("m", max_tokens=10)
    completion = SGLangClient(sim.url).chat(build_request(spec, SAMPLE.messages, "len-1"))
    assert completion.finish_reason == "length"
    assert completion.completion_tokens == 10
    assert completion.content == "" and completion.reasoning


def test_generate_sample_ok_record(sim: RunningSimulator) -> None:
    record, sleeps = generate(SGLangClient(sim.url))
    assert sleeps.calls == []
    assert record["status"] == "ok" and record["error"] is None
    assert record["attempts"] == 1
    (turn,) = record["turns"]
    assert (record["id"], record["line"], turn["input"]) == (SAMPLE.id, SAMPLE.line, SAMPLE.messages)
    assert turn["reasoning"] and turn["content"] and turn["status"] == "ok"
    assert (record["user_turns"], record["outcome"], record["failed_turn"]) == (1, "complete", None)
    assert record["finish_reason"] == "stop"
    assert record["usage"]["completion_tokens"] > record["usage"]["reasoning_tokens"] > 0
    assert record["model"] == SPEC.model
    assert record["sampling"] == SPEC.sampling()
    assert (record["worker"], record["endpoint"]) == (WHO.worker, WHO.endpoint)
    assert record["latency_s"] >= 0
    json.dumps(record)


def test_health_and_server_info(sim: RunningSimulator) -> None:
    client = SGLangClient(sim.url + "/")
    assert client.endpoint == sim.url
    assert client.healthy()
    info = client.server_info()
    assert info["max_running_requests"] == 48
    fault(sim, kind="unhealthy", count=1)
    assert not client.healthy()
    assert client.healthy()


def test_health_and_server_info_of_a_dead_server() -> None:
    sim = start()
    url = sim.url
    sim.stop()
    client = SGLangClient(url)
    assert not client.healthy(timeout=2)
    assert client.server_info(timeout=2) == {}


# -- rejected samples --------------------------------------------------------------------------------


def test_too_long_prompt_is_rejected_with_the_server_message() -> None:
    sim = start(context_length=64)
    try:
        long_sample = Sample(id="long", messages=[{"role": "user", "content": "word " * 200}], line=3)
        spec = GenerationSpec("m", max_tokens=16)
        client = SGLangClient(sim.url)
        with pytest.raises(SampleRejected) as info:
            client.chat(build_request(spec, long_sample.messages, "long-1"))
        assert str(info.value) == (
            "HTTP 400: The input (254 tokens) is longer than the model's context length (64 tokens)."
        )
        record, sleeps = generate(client, sample=long_sample, spec=spec)
        assert record["status"] == "failed"
        assert record["attempts"] == 1
        assert sleeps.calls == []
        assert record["error"] == str(info.value)
        assert record["turns"][0]["reasoning"] == record["turns"][0]["content"] == ""
        assert (
            record["finish_reason"] is None and record["outcome"] == "failed" and record["failed_turn"] == 1
        )
        assert record["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0}
        assert sim_stats(sim)["requests_total"] == 2  # one request per rejected sample: no retries
    finally:
        sim.stop()


def test_invalid_sampling_value_is_rejected(sim: RunningSimulator) -> None:
    spec = GenerationSpec("m", top_p=0.0)
    record, _ = generate(SGLangClient(sim.url), spec=spec)
    assert record["status"] == "failed" and record["attempts"] == 1
    assert record["error"] == "HTTP 400: top_p must be in (0, 1], got 0.0."


# -- retries -------------------------------------------------------------------------------------------


def test_two_500s_then_success(sim: RunningSimulator) -> None:
    fault(sim, kind="http_500", count=2)
    client = RecordingClient(sim.url)
    record, sleeps = generate(client, fast_policy(attempts=5))
    assert record["status"] == "ok" and record["error"] is None
    assert record["attempts"] == 3
    assert len(sleeps.calls) == 2 and all(0 <= s <= 0.002 for s in sleeps.calls)
    assert sim_stats(sim)["requests_total"] == 3
    rids = [p["rid"] for p in client.payloads]
    assert rids == [f"{PREFIX}-L{SAMPLE.line}-T1-{n}" for n in (1, 2, 3)]


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("http_500", "HTTP 500: Internal server error (simulated fault)."),
        ("http_503", "HTTP 503: The request queue is full."),
        ("bad_json", "invalid response body"),
        ("abort", "finish_reason 'abort'"),
        ("reset", "connection error"),
    ],
)
def test_transient_faults_are_retried(sim: RunningSimulator, kind: str, error: str) -> None:
    client = SGLangClient(sim.url)
    fault(sim, kind=kind, count=1)
    with pytest.raises(RetryableError) as info:
        client.chat(build_request(SPEC, SAMPLE.messages, f"{kind}-direct"))
    assert not isinstance(info.value, ServerUnavailable)
    assert error in str(info.value)

    fault(sim, kind=kind, count=1)
    record, sleeps = generate(client)
    assert record["status"] == "ok"
    assert record["attempts"] == 2
    assert len(sleeps.calls) == 1


def test_client_timeout_is_retried(sim: RunningSimulator) -> None:
    fault(sim, kind="hang", count=1, hang_seconds=5)
    client = SGLangClient(sim.url, timeout=0.15)
    with pytest.raises(RetryableError, match="timed out"):
        client.chat(build_request(SPEC, SAMPLE.messages, "hang-1"))
    fault(sim, kind="hang", count=1, hang_seconds=5)
    record, _ = generate(client)
    assert record["status"] == "ok" and record["attempts"] == 2


def test_500s_forever_with_a_healthy_server_fail_the_sample(sim: RunningSimulator) -> None:
    fault(sim, kind="http_500")
    record, sleeps = generate(SGLangClient(sim.url), fast_policy(attempts=4))
    assert record["status"] == "failed"
    assert record["attempts"] == 4
    assert record["error"] == "gave up after 4 attempts: HTTP 500: Internal server error (simulated fault)."
    assert len(sleeps.calls) == 3
    assert record["turns"][0]["reasoning"] == "" and record["usage"]["completion_tokens"] == 0
    assert sim_stats(sim)["requests_total"] == 4


def test_stopped_server_raises_server_unavailable() -> None:
    sim = start()
    url = sim.url
    client = SGLangClient(url)
    assert generate(client)[0]["status"] == "ok"  # keep-alive connection open, then the server dies
    sim.stop()
    with pytest.raises(RetryableError, match="connection error"):
        client.chat(build_request(SPEC, SAMPLE.messages, "dead-1"))
    sleeps = Sleeps()
    with pytest.raises(ServerUnavailable) as info:
        generate_sample(client, SPEC, SAMPLE, WHO, fast_policy(attempts=3), PREFIX, sleep=sleeps)
    assert url in str(info.value)
    assert "unhealthy" in str(info.value) and "connection error" in str(info.value)
    assert len(sleeps.calls) == 2


def test_unhealthy_server_that_resets_raises_server_unavailable(sim: RunningSimulator) -> None:
    fault(sim, kind="unhealthy")
    fault(sim, kind="reset")
    with pytest.raises(ServerUnavailable, match="last error: connection error"):
        generate(SGLangClient(sim.url))
    assert sim_stats(sim)["requests_total"] == 3


def test_retry_policy_delay_is_full_jitter_capped() -> None:
    policy = RetryPolicy(attempts=10, backoff=1.0, backoff_max=5.0)
    for attempt, cap in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (9, 5.0)]:
        delays = [policy.delay(attempt) for _ in range(200)]
        assert all(0 <= d <= cap for d in delays)
        assert max(delays) > cap / 2  # jitter spreads over the whole range


def test_each_attempt_has_its_own_rid_even_for_long_ids(sim: RunningSimulator) -> None:
    fault(sim, kind="http_500", count=2)
    client = RecordingClient(sim.url)
    long_id = "dataset/" + "x" * 240
    record, _ = generate(client, sample=Sample(id=long_id, messages=SAMPLE.messages, line=1))
    assert record["status"] == "ok"
    rids = [p["rid"] for p in client.payloads]
    assert len(rids) == 3
    assert len(set(rids)) == 3


def test_samples_with_long_common_id_prefix_do_not_collide() -> None:
    # Each generation holds its rid for 0.5 s; the second sample is sent while the first one runs.
    sim = start(time_scale=1.0, tokens_per_second=1000, mean_output_tokens=500, output_tokens_sigma=0)
    try:
        client = SGLangClient(sim.url)
        first, second = (
            Sample(id="x" * 190 + tag, messages=SAMPLE.messages, line=i) for i, tag in enumerate("AB")
        )
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(generate_sample, client, SPEC, first, WHO, fast_policy(), PREFIX, Sleeps())
            while sim_stats(sim)["running"] < 1 and not running.done():
                time.sleep(0.005)
            assert not running.done()
            other = generate_sample(SGLangClient(sim.url), SPEC, second, WHO, fast_policy(), PREFIX, Sleeps())
            records = [running.result(), other]
        assert [r["status"] for r in records] == ["ok", "ok"], [r["error"] for r in records]
    finally:
        sim.stop()


# -- error_message over SGLang's error envelopes (reference §4.1) ---------------------------------------


def response(status: int, body: bytes | str, reason: str = "") -> requests.Response:
    resp = requests.Response()
    resp.status_code = status
    resp._content = body.encode() if isinstance(body, str) else body
    resp.reason = reason
    resp.encoding = "utf-8"
    return resp


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            400,
            {
                "object": "error",
                "message": "The input (9 tokens) is longer",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            },
            "The input (9 tokens) is longer",
        ),
        (
            400,
            {
                "object": "error",
                "message": "1 validation error [{'loc': 'temperature'}]",
                "type": "Bad Request",
                "param": None,
                "code": 400,
            },
            "1 validation error [{'loc': 'temperature'}]",
        ),
        (
            503,
            {
                "object": "error",
                "message": "The request queue is full.",
                "type": "503",
                "param": None,
                "code": 503,
            },
            "The request queue is full.",
        ),
        (400, {"error": {"message": "sampling_params invalid"}}, "sampling_params invalid"),
        (400, {"error": "unknown key 'foo' in sampling_params"}, "unknown key 'foo' in sampling_params"),
        (
            404,
            {
                "error": {
                    "message": "The model 'x' does not exist",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            },
            "The model 'x' does not exist",
        ),
    ],
)
def test_error_message_envelopes(status: int, body: dict[str, Any], expected: str) -> None:
    assert error_message(response(status, json.dumps(body))) == expected


def test_error_message_non_json_and_empty_bodies() -> None:
    assert error_message(response(502, "<html>Bad Gateway</html>")) == "<html>Bad Gateway</html>"
    assert error_message(response(502, "x" * 2000)) == "x" * 500
    assert error_message(response(500, b"", reason="Internal Server Error")) == "Internal Server Error"
    assert error_message(response(500, b"")) == "no message"


def test_error_message_unknown_json_shapes() -> None:
    assert "Not Found" in error_message(response(404, json.dumps({"detail": "Not Found"})))
    assert error_message(response(500, json.dumps(["a", "b"]))) == "['a', 'b']"
    assert len(error_message(response(500, json.dumps({"detail": "y" * 2000})))) == 500


def test_http_error_statuses_map_to_error_types(sim: RunningSimulator) -> None:
    client = SGLangClient(sim.url)
    # 400 from a real endpoint: empty messages.
    with pytest.raises(SampleRejected, match=r"^HTTP 400: Messages cannot be empty\.$"):
        client.chat({"model": "m", "messages": [], "max_tokens": 10})
    # 404 is not a sample problem: retryable.
    bad = SGLangClient(sim.url + "/nope")
    with pytest.raises(RetryableError, match="HTTP 404") as info:
        bad.chat(build_request(SPEC, SAMPLE.messages, "r404"))
    assert not isinstance(info.value, SampleRejected)


# -- parse_completion --------------------------------------------------------------------------------


def body(message: Any = None, usage: Any = None, finish: Any = "stop", **extra: Any) -> bytes:
    choice = {"index": 0, "message": message, "finish_reason": finish}
    return json.dumps({"choices": [choice], "usage": usage, **extra}).encode()


def test_parse_completion_null_fields() -> None:
    c = parse_completion(body({"role": "assistant", "content": None, "reasoning_content": None}))
    assert c == Completion("", "", "stop", 0, 0, 0)
    c = parse_completion(body(None, None, None))
    assert c == Completion("", "", "", 0, 0, 0)


def test_parse_completion_strips_and_reads_usage() -> None:
    usage = {
        "prompt_tokens": 31,
        "completion_tokens": 1259,
        "reasoning_tokens": 1180,
        "completion_tokens_details": {"reasoning_tokens": 1180},
    }
    c = parse_completion(
        body({"content": "\n\nThe answer is 42. ", "reasoning_content": "\nLet me think\n"}, usage)
    )
    assert c == Completion("Let me think", "The answer is 42.", "stop", 31, 1259, 1180)


def test_parse_completion_reasoning_tokens_from_details_only() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": 7}}
    assert parse_completion(body({"content": "a"}, usage)).reasoning_tokens == 7
    usage = {
        "prompt_tokens": 1,
        "completion_tokens": 9,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }
    assert parse_completion(body({"content": "a"}, usage)).reasoning_tokens == 0


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b"[]",
        b"null",
        b'{"choices": []}',
        b'{"choices": null}',
        b'{"choices": [null]}',
        b'{"x": 1}',
    ],
)
def test_parse_completion_malformed_is_retryable(raw: bytes) -> None:
    with pytest.raises(RetryableError, match=rf"invalid response body \({len(raw)} bytes\)"):
        parse_completion(raw)


def test_parse_completion_abort_is_retryable() -> None:
    with pytest.raises(RetryableError, match="abort"):
        parse_completion(body({"content": "partial", "reasoning_content": "half"}, finish="abort"))
