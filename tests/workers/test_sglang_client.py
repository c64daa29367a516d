"""Tests for workers.sglang_client and workers.generation against the in-process simulator (the
pure parsing, from known bodies: test_sglang_replies.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from dflash_tasks.core.errors import ConfigError, RetryableError, SampleRejected, ServerUnavailable
from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.record import Record
from dflash_tasks.core.sample import Sample
from dflash_tasks.core.spec_stats import spec_counts
from dflash_tasks.sim import RunningSimulator, SimConfig, start_simulator
from tests.workers.conversation_support import generate_sample
from workers.generation import RetryPolicy, WorkerIdentity, make_record, make_turn
from workers.sglang_client import ChatRequest, Completion, MetaInfo, ServerIdentity, SGLangClient

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

    def chat(self, request: ChatRequest) -> Completion:
        self.payloads.append(request.body())
        return super().chat(request)


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
    """The sample's record as stored (its JSON line, decoded), and the sleeps between attempts."""
    sleeps = Sleeps()
    record = generate_sample(client, spec, sample, WHO, policy or fast_policy(), PREFIX, sleep=sleeps)
    return stored(record), sleeps


def stored(record: Record) -> dict[str, Any]:
    """A record as its chunk file line holds it."""
    return dict(json.loads(record.to_json()))


# -- successful completions over HTTP ------------------------------------------------------------------


def test_completion_splits_and_strips_reasoning_and_content(sim: RunningSimulator) -> None:
    raw = requests.post(
        f"{sim.url}/v1/chat/completions", json=ChatRequest(SPEC, SAMPLE.messages, "raw-1").body(), timeout=10
    ).json()
    message = raw["choices"][0]["message"]
    # SGLang 0.5.23 does not strip: the answer starts with blank lines, the reasoning with "\n".
    assert message["content"] != message["content"].strip()
    assert message["reasoning_content"] != message["reasoning_content"].strip()

    completion = SGLangClient(sim.url).chat(ChatRequest(SPEC, SAMPLE.messages, "client-1"))
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
    completion = SGLangClient(sim.url).chat(ChatRequest(spec, SAMPLE.messages, "off-1"))
    assert completion.reasoning == ""
    assert completion.content and completion.content == completion.content.strip()
    assert completion.reasoning_tokens == 0
    assert 4 <= completion.completion_tokens <= 8


def test_length_limit_reports_finish_reason(sim: RunningSimulator) -> None:
    spec = GenerationSpec("m", max_tokens=10)
    completion = SGLangClient(sim.url).chat(ChatRequest(spec, SAMPLE.messages, "len-1"))
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
    assert record["server"] is None  # the worker did not learn its server's identity here
    assert record["latency_s"] >= 0
    meta = turn["meta_info"]  # per turn: each request has its own numbers
    assert meta["spec_verify_ct"] > 0 and meta["cached_tokens"] == 0 and meta["num_retractions"] == 0
    assert meta["spec_accept_length"] == turn["usage"]["completion_tokens"] / meta["spec_verify_ct"]
    json.dumps(record)


def test_health_and_server_info(sim: RunningSimulator) -> None:
    client = SGLangClient(sim.url + "/")
    assert client.endpoint == sim.url
    assert client.healthy()
    info = client.server_info()
    assert (info.max_running_requests, info.decode_graph_ceiling, info.version) == (48, 48, "0.5.23")
    assert client.max_running_requests() == client.decode_graph_ceiling() == 48
    fault(sim, kind="unhealthy", count=1)
    assert not client.healthy()
    assert client.healthy()


def test_health_and_server_info_of_a_dead_server() -> None:
    sim = start()
    url = sim.url
    sim.stop()
    client = SGLangClient(url)
    assert not client.healthy(timeout=2)
    for call in (client.server_info, client.model_info, client.identity):
        with pytest.raises(RetryableError, match=f"{url}/(server|model)_info: connection error"):
            call(2)


# -- rejected samples --------------------------------------------------------------------------------


def test_too_long_prompt_is_rejected_with_the_server_message() -> None:
    sim = start(context_length=64)
    try:
        long_sample = Sample(id="long", messages=[{"role": "user", "content": "word " * 200}], line=3)
        spec = GenerationSpec("m", max_tokens=16)
        client = SGLangClient(sim.url)
        with pytest.raises(SampleRejected) as info:
            client.chat(ChatRequest(spec, long_sample.messages, "long-1"))
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
    assert record["failure"] == record["turns"][0]["failure"] == "permanent"  # never repaired


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
        client.chat(ChatRequest(SPEC, SAMPLE.messages, f"{kind}-direct"))
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
        client.chat(ChatRequest(SPEC, SAMPLE.messages, "hang-1"))
    fault(sim, kind="hang", count=1, hang_seconds=5)
    record, _ = generate(client)
    assert record["status"] == "ok" and record["attempts"] == 2


def test_500s_forever_with_a_healthy_server_fail_the_sample(sim: RunningSimulator) -> None:
    fault(sim, kind="http_500")
    record, sleeps = generate(SGLangClient(sim.url), fast_policy(attempts=4))
    assert record["status"] == "failed"
    assert record["attempts"] == 4
    assert record["error"] == "gave up after 4 attempts: HTTP 500: Internal server error (simulated fault)."
    assert record["failure"] == record["turns"][0]["failure"] == "transient"  # a repair round regenerates it
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
        client.chat(ChatRequest(SPEC, SAMPLE.messages, "dead-1"))
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
            records = [stored(running.result()), stored(other)]
        assert [r["status"] for r in records] == ["ok", "ok"], [r["error"] for r in records]
    finally:
        sim.stop()


def test_http_error_statuses_map_to_error_types(sim: RunningSimulator) -> None:
    client = SGLangClient(sim.url)
    # 400 from a real endpoint: empty messages.
    with pytest.raises(SampleRejected, match=r"^HTTP 400: Messages cannot be empty\.$"):
        client.chat(ChatRequest(GenerationSpec("m", max_tokens=10), [], "r400"))
    # 404 is not a sample problem: retryable.
    bad = SGLangClient(sim.url + "/nope")
    with pytest.raises(RetryableError, match="HTTP 404") as info:
        bad.chat(ChatRequest(SPEC, SAMPLE.messages, "r404"))
    assert not isinstance(info.value, SampleRejected)


# -- server identity, the info endpoints and the API key -------------------------------------------

KEY = "sk-" + "k3y" * 6


def test_identity_from_model_info_and_server_info() -> None:
    sim = start(model="/models/Qwen3.6-27B", served_model_name="qwen36")
    try:
        identity = SGLangClient(sim.url).identity()
    finally:
        sim.stop()
    assert identity == ServerIdentity("/models/Qwen3.6-27B", "qwen36", "0.5.23")
    assert identity.as_record() == {
        "model_path": "/models/Qwen3.6-27B",
        "served_model_name": "qwen36",
        "version": "0.5.23",
    }


def test_every_call_but_health_carries_the_api_key() -> None:
    sim = start(api_key=KEY, model="org/m")
    try:
        client = SGLangClient(sim.url, api_key=KEY)
        assert client.healthy()
        assert client.server_info().model_path == "org/m"
        assert client.model_info().served_model_name == "org/m"
        assert client.identity() == ServerIdentity("org/m", "org/m", "0.5.23")
        completion = client.chat(ChatRequest(SPEC, SAMPLE.messages, "key-1"))
        assert completion.completion_tokens > 0 and completion.meta is not None
        assert KEY not in repr(client)

        keyless = SGLangClient(sim.url)
        assert keyless.healthy()  # /health* is open: probes need no secret
        for call in (keyless.server_info, keyless.model_info, keyless.identity):
            with pytest.raises(ConfigError, match=r"HTTP 401 Unauthorized; .*DFLASH_SGLANG_API_KEY"):
                call()
        with pytest.raises(RetryableError, match=r"^HTTP 401: Unauthorized \(.*DFLASH_SGLANG_API_KEY"):
            keyless.chat(ChatRequest(SPEC, SAMPLE.messages, "nokey-1"))
        wrong = SGLangClient(sim.url, api_key="sk-wrong")
        with pytest.raises(ConfigError) as info:
            wrong.server_info()
        assert "sk-wrong" not in str(info.value)
        assert sim_stats(sim)["requests_total"] == 1  # only the keyed chat reached the engine
    finally:
        sim.stop()


def test_an_api_key_that_is_no_header_value_stops_the_worker_and_is_never_shown() -> None:
    key = "sk-" + "k3y" * 6 + "\n"  # read from a file with its line end
    client = SGLangClient("http://127.0.0.1:1", api_key=key)
    for call in (client.server_info, client.identity, client.load):
        with pytest.raises(ConfigError, match="DFLASH_SGLANG_API_KEY") as info:
            call()
        assert key.strip() not in str(info.value) and info.value.__cause__ is None
    with pytest.raises(ConfigError) as info:
        client.chat(ChatRequest(SPEC, SAMPLE.messages, "r"))
    assert key.strip() not in str(info.value) and info.value.__suppress_context__


class OldRelease(BaseHTTPRequestHandler):
    """An SGLang release that has only ``/get_server_info`` and ``/get_model_info`` (no meta_info)."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        bodies: dict[str, dict[str, Any]] = {
            "/get_server_info": {"model_path": "/m/old", "served_model_name": "old", "version": "0.4.6"},
            "/get_model_info": {"model_path": "/m/old", "tokenizer_path": "/m/old", "is_generation": True},
        }
        if self.path == "/health_generate":
            self._send(200, b"")
        elif self.path in bodies:
            self._send(200, json.dumps(bodies[self.path]).encode())
        else:
            self._send(404, b'{"detail":"Not Found"}')

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def old_release() -> Iterator[str]:
    OldRelease.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), OldRelease)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_old_release_falls_back_to_the_deprecated_info_endpoints(old_release: str) -> None:
    client = SGLangClient(old_release, api_key=KEY)
    assert client.identity() == ServerIdentity("/m/old", "old", "0.4.6")  # served name from server_info
    assert client.server_info().version == "0.4.6"  # straight to the alias once it is known
    assert client.healthy()
    bearer = f"Bearer {KEY}"
    assert OldRelease.seen == [
        ("/model_info", bearer),
        ("/get_model_info", bearer),
        ("/server_info", bearer),
        ("/get_server_info", bearer),
        ("/get_server_info", bearer),
        ("/health_generate", None),  # the health probe goes without the key
    ]


def test_a_server_still_loading_has_no_identity_yet() -> None:
    sim = start(load_seconds=30)
    try:
        with pytest.raises(RetryableError, match="connection error"):
            SGLangClient(sim.url).identity(timeout=2)
    finally:
        sim.stop()


def test_a_repair_rounds_seed_goes_out_and_the_simulator_plans_with_it() -> None:
    assert "seed" not in ChatRequest(SPEC, SAMPLE.messages, "s-0").body()
    assert ChatRequest(dataclasses.replace(SPEC, seed=7), SAMPLE.messages, "s-7").body()["seed"] == 7
    with start_simulator(SimConfig(port=0, time_scale=0.0, loop_share=0.5)) as looping:
        client = SGLangClient(looping.url)
        ends = {
            client.chat(
                ChatRequest(dataclasses.replace(SPEC, seed=seed), SAMPLE.messages, f"s-{seed}")
            ).finish_reason
            for seed in range(12)
        }
    assert ends == {"stop", "length"}  # some seeds fall into the loop (cut at max_tokens), some do not


# -- per-request meta_info ---------------------------------------------------------------------------


def test_meta_info_is_parsed_from_the_first_choice(sim: RunningSimulator) -> None:
    payload = ChatRequest(SPEC, SAMPLE.messages, "meta-1").body()
    raw = requests.post(f"{sim.url}/v1/chat/completions", json=payload, timeout=10).json()
    expected = raw["choices"][0]["meta_info"]
    meta = SGLangClient(sim.url).chat(ChatRequest(SPEC, SAMPLE.messages, "meta-2")).meta
    assert meta == MetaInfo(
        spec_verify_ct=expected["spec_verify_ct"],
        spec_accept_length=expected["spec_accept_length"],
        spec_accept_rate=expected["spec_accept_rate"],
        spec_num_correct_drafts=expected["spec_num_correct_drafts"],
        spec_num_proposed_drafts=expected["spec_num_proposed_drafts"],
        cached_tokens=raw["usage"]["prompt_tokens"] - 1,  # the same prompt again: a cache hit
        num_retractions=0,
    )
    assert expected["cached_tokens"] == 0 < raw["usage"]["prompt_tokens"] - 1


def test_records_store_meta_info_and_the_server_identity(sim: RunningSimulator) -> None:
    client = SGLangClient(sim.url)
    who = WorkerIdentity("gpu0@test", sim.url, client.identity())
    built = generate_sample(client, SPEC, SAMPLE, who, fast_policy(), PREFIX, sleep=Sleeps())
    record = stored(built)
    assert record["server"] == {
        "model_path": "Qwen/Qwen3-8B",
        "served_model_name": "Qwen/Qwen3-8B",
        "version": "0.5.23",
    }
    (turn,) = record["turns"]
    meta = turn["meta_info"]
    assert set(meta) == {f.name for f in dataclasses.fields(MetaInfo)}
    tokens = turn["usage"]["completion_tokens"]
    assert meta["spec_verify_ct"] == math.ceil(tokens / meta["spec_accept_length"] - 1e-9)
    assert spec_counts(built) == (tokens, meta["spec_verify_ct"])
    failed_turn = make_turn(SAMPLE.messages, None, "HTTP 400: no", 0.1, 1)
    failed = make_record(SPEC, SAMPLE, who, [failed_turn], 1, 0.1)
    assert failed_turn.meta_info is None and spec_counts(failed) == (0, 0)
    assert failed.server == record["server"]


def test_spec_counts_add_up_over_the_answered_turns() -> None:
    def turn(tokens: int, verify: int | None, status: str = "ok") -> dict[str, object]:
        meta = None if verify is None else {"spec_verify_ct": verify}
        return {"status": status, "usage": {"completion_tokens": tokens}, "meta_info": meta}

    record = {
        "id": "a",
        "turns": [turn(300, 100), turn(50, None), turn(90, 30), turn(40, 10, status="failed")],
    }
    assert spec_counts(Record.from_dict(record)) == (390, 130)  # no stats, or a failed turn: not counted
    assert spec_counts(
        Record.from_dict(
            {"id": "a", "status": "ok", "usage": {"completion_tokens": 8}, "meta_info": {"spec_verify_ct": 2}}
        )
    ) == (8, 2)
