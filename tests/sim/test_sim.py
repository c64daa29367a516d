"""The SGLang simulator: wire format, reasoning behaviour, errors, scheduling, faults, CLI."""

from __future__ import annotations

import http.client
import json
import math
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from dflash_tasks.sim import RunningSimulator, SimConfig, start_simulator

REPO = Path(__file__).resolve().parents[2]
QUESTION = [{"role": "user", "content": "What is 6*7? Explain."}]

# The 0.5.23 response body without meta_info / sglext (docs/sglang.md).
TOP_KEYS = {"id", "object", "created", "model", "choices", "usage", "metadata"}
CHOICE_KEYS = {"index", "message", "logprobs", "finish_reason", "matched_stop"}
MESSAGE_KEYS = {"role", "content", "reasoning_content"}
USAGE_KEYS = {
    "prompt_tokens",
    "total_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "reasoning_tokens",
    "completion_tokens_details",
}

StartSim = Callable[..., RunningSimulator]


@pytest.fixture
def start_sim() -> Iterator[StartSim]:
    """Start in-process simulators (free port, instant generation unless overridden); stop them after."""
    started: list[RunningSimulator] = []

    def _start(**overrides: Any) -> RunningSimulator:
        settings: dict[str, Any] = {"port": 0, "time_scale": 0.0, **overrides}
        sim = start_simulator(SimConfig(**settings))
        started.append(sim)
        return sim

    yield _start
    for sim in started:
        sim.stop()


@pytest.fixture
def sim(start_sim: StartSim) -> RunningSimulator:
    return start_sim()


def chat(url: str, messages: list[dict[str, Any]] | None = None, timeout: float = 10, **fields: Any) -> Any:
    body = {"model": "test-model", "messages": QUESTION if messages is None else messages, **fields}
    return requests.post(f"{url}/v1/chat/completions", json=body, timeout=timeout)


def chat_ok(url: str, **fields: Any) -> dict[str, Any]:
    resp = chat(url, **fields)
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def user(text: object) -> list[dict[str, Any]]:
    return [{"role": "user", "content": str(text)}]


def metric_values(text: str, model: str = "Qwen/Qwen3-8B") -> dict[str, float]:
    """``{metric name: value}`` for the samples labelled with ``model_name=model``."""
    pattern = rf'^(sglang:\w+)\{{[^}}]*model_name="{re.escape(model)}"[^}}]*\}} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.MULTILINE)}


def stats(url: str) -> dict[str, Any]:
    body: dict[str, Any] = requests.get(f"{url}/sim/stats", timeout=5).json()
    return body


def add_fault(url: str, **fault: Any) -> None:
    resp = requests.post(f"{url}/sim/faults", json=fault, timeout=5)
    assert resp.status_code == 200, resp.text


def assert_error(resp: requests.Response, code: int, message: str, type_: str = "BadRequestError") -> None:
    assert resp.status_code == code
    assert resp.json() == {"object": "error", "message": message, "type": type_, "param": None, "code": code}


# --------------------------------------------------------------------------- response shape


def test_response_shape_matches_reference(sim: RunningSimulator) -> None:
    body = chat_ok(sim.url, rid="req-1", max_tokens=30000)
    assert set(body) == TOP_KEYS
    assert body["id"] == "req-1"
    assert body["object"] == "chat.completion"
    assert body["model"] == "test-model"
    assert abs(body["created"] - time.time()) < 60
    assert body["metadata"] == {"weight_version": "default"}
    [choice] = body["choices"]
    assert set(choice) == CHOICE_KEYS
    assert choice["index"] == 0 and choice["logprobs"] is None
    assert (choice["finish_reason"], choice["matched_stop"]) == ("stop", 151645)
    assert set(choice["message"]) == MESSAGE_KEYS
    assert choice["message"]["role"] == "assistant"
    usage = body["usage"]
    assert set(usage) == USAGE_KEYS
    assert usage["prompt_tokens_details"] is None
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_random_id_and_keep_alive_with_content_length(sim: RunningSimulator) -> None:
    conn = http.client.HTTPConnection(sim.host, sim.port, timeout=5)
    payload = json.dumps({"messages": QUESTION, "max_tokens": 30000})
    ids = []
    for _ in range(2):  # the same connection serves both requests
        conn.request("POST", "/v1/chat/completions", payload, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        assert resp.status == 200 and int(resp.getheader("Content-Length", "-1")) == len(raw)
        ids.append(json.loads(raw)["id"])
    conn.request("GET", "/health")
    health = conn.getresponse()
    assert health.status == 200 and health.read() == b"" and health.getheader("Content-Length") == "0"
    conn.close()
    assert ids[0] != ids[1] and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


def test_prompt_tokens_are_chars_over_four_plus_four_per_message(sim: RunningSimulator) -> None:
    messages = [{"role": "system", "content": "abcd" * 10}, {"role": "user", "content": "x" * 5}]
    body = chat_ok(sim.url, messages=messages, max_tokens=100)
    assert body["usage"]["prompt_tokens"] == math.ceil(45 / 4) + 2 * 4
    parts = [{"role": "user", "content": [{"type": "text", "text": "y" * 8}]}]
    assert chat_ok(sim.url, messages=parts, max_tokens=100)["usage"]["prompt_tokens"] == 2 + 4


# --------------------------------------------------------------------------- reasoning behaviour


def test_thinking_on_splits_reasoning_and_answer(sim: RunningSimulator) -> None:
    body = chat_ok(sim.url, max_tokens=30000, chat_template_kwargs={"enable_thinking": True})
    msg, usage = body["choices"][0]["message"], body["usage"]
    assert msg["reasoning_content"].strip() and msg["content"].startswith("\n\n") and msg["content"].strip()
    assert "<think>" not in msg["content"] and "</think>" not in msg["content"]
    assert 0.85 <= usage["reasoning_tokens"] / usage["completion_tokens"] <= 0.95
    assert usage["completion_tokens_details"] == {"reasoning_tokens": usage["reasoning_tokens"]}
    assert chat_ok(sim.url, max_tokens=30000)["usage"] == usage  # thinking is the default


def test_thinking_off_gives_short_answer_without_reasoning(sim: RunningSimulator) -> None:
    body = chat_ok(sim.url, max_tokens=30000, chat_template_kwargs={"enable_thinking": False})
    msg, usage = body["choices"][0]["message"], body["usage"]
    assert msg["reasoning_content"] is None and msg["content"].strip()
    assert 4 <= usage["completion_tokens"] <= 8
    assert usage["reasoning_tokens"] == 0 and usage["completion_tokens_details"] is None
    assert body["choices"][0]["finish_reason"] == "stop"


def test_ignore_thinking_flag_never_reasons(start_sim: StartSim) -> None:
    sim = start_sim(ignore_thinking_flag=True)
    body = chat_ok(sim.url, max_tokens=30000, chat_template_kwargs={"enable_thinking": True})
    assert body["choices"][0]["message"]["reasoning_content"] is None
    assert body["usage"]["reasoning_tokens"] == 0 and body["usage"]["completion_tokens"] <= 8


def test_reasoning_parser_none_returns_raw_think_block(start_sim: StartSim) -> None:
    sim = start_sim(reasoning_parser="none")
    body = chat_ok(sim.url, max_tokens=30000)
    msg = body["choices"][0]["message"]
    assert msg["reasoning_content"] is None
    assert msg["content"].startswith("<think>\n") and "\n</think>\n\n" in msg["content"]
    assert body["usage"]["reasoning_tokens"] == 0 and body["usage"]["completion_tokens_details"] is None
    info = requests.get(f"{sim.url}/get_server_info", timeout=5).json()
    assert info["reasoning_parser"] is None


def test_separate_reasoning_false_keeps_raw_text(sim: RunningSimulator) -> None:
    body = chat_ok(sim.url, max_tokens=30000, separate_reasoning=False)
    msg = body["choices"][0]["message"]
    assert msg["reasoning_content"] is None and "</think>" in msg["content"]
    assert body["usage"]["reasoning_tokens"] > 0


def test_truncated_while_reasoning_puts_everything_in_reasoning(sim: RunningSimulator) -> None:
    body = chat_ok(sim.url, max_completion_tokens=50, max_tokens=30000)  # max_completion_tokens wins
    choice, usage = body["choices"][0], body["usage"]
    assert (choice["finish_reason"], choice["matched_stop"]) == ("length", None)
    assert choice["message"]["content"] == "" and choice["message"]["reasoning_content"].strip()
    assert usage["completion_tokens"] == usage["reasoning_tokens"] == 50


def test_output_length_is_deterministic_and_lognormal(start_sim: StartSim) -> None:
    sim = start_sim(mean_output_tokens=1000, seed=7)
    other = start_sim(mean_output_tokens=1000, seed=8)
    lengths = []
    for i in range(150):
        messages = user(f"question {i}")
        first = chat_ok(sim.url, messages=messages, max_tokens=30000)["usage"]
        assert chat_ok(sim.url, messages=messages, max_tokens=30000)["usage"] == first
        lengths.append(first["completion_tokens"])
    assert 800 <= sum(lengths) / len(lengths) <= 1200
    assert max(lengths) > 1.5 * min(lengths)  # spread, not a constant
    other_lengths = [chat_ok(other.url, messages=user(f"question {i}"), max_tokens=30000) for i in range(5)]
    assert [o["usage"]["completion_tokens"] for o in other_lengths] != lengths[:5]


def test_meta_info_and_spec_details_follow_accept_length(start_sim: StartSim) -> None:
    sim = start_sim(accept_length=3.0, accept_length_sd=0.0)
    body = chat_ok(sim.url, max_tokens=30000, return_meta_info=True, return_spec_tokens_details=True)
    meta, usage = body["choices"][0]["meta_info"], body["usage"]
    assert meta["completion_tokens"] == usage["completion_tokens"]
    assert meta["finish_reason"] == {"type": "stop", "matched": 151645}
    assert meta["spec_verify_ct"] == math.ceil(usage["completion_tokens"] / 3.0)
    assert meta["spec_accept_length"] == usage["completion_tokens"] / meta["spec_verify_ct"]
    correct, proposed = meta["spec_num_correct_drafts"], meta["spec_num_proposed_drafts"]
    assert (
        correct == usage["completion_tokens"] - meta["spec_verify_ct"]
        and proposed == 3 * meta["spec_verify_ct"]
    )
    assert meta["spec_accept_rate"] == correct / proposed
    assert (meta["num_retractions"], meta["cached_tokens"]) == (0, 0)
    assert body["sglext"]["spec_tokens_details"]["spec_accept_length"] == pytest.approx(3.0, abs=0.01)
    assert "meta_info" not in chat_ok(sim.url, max_tokens=30000)["choices"][0]  # only when asked


def per_request_accept(url: str, n: int, offset: int = 0) -> list[tuple[int, int, float]]:
    """``(completion tokens, verify passes, accept length)`` of ``n`` distinct prompts."""
    rows = []
    for i in range(offset, offset + n):
        body = chat_ok(url, messages=user(f"prompt {i}"), max_tokens=30000, return_meta_info=True)
        meta = body["choices"][0]["meta_info"]
        rows.append((meta["completion_tokens"], meta["spec_verify_ct"], meta["spec_accept_length"]))
    return rows


def test_accept_length_varies_by_request_deterministically_per_seed(start_sim: StartSim) -> None:
    sim = start_sim(accept_length=3.0, accept_length_sd=0.4, mean_output_tokens=400, seed=3)
    rows = per_request_accept(sim.url, 80)
    lengths = [a for _, _, a in rows]
    assert all(1.0 <= a <= 4.0 for a in lengths)
    assert len({round(a, 3) for a in lengths}) > 40  # a distribution, not one value
    assert 0.25 <= statistics.pstdev(lengths) <= 0.55
    assert sum(t for t, _, _ in rows) / sum(v for _, v, _ in rows) == pytest.approx(3.0, abs=0.15)
    assert per_request_accept(sim.url, 5) == rows[:5]  # the same prompt, the same numbers
    same_seed = start_sim(accept_length=3.0, accept_length_sd=0.4, mean_output_tokens=400, seed=3)
    assert per_request_accept(same_seed.url, 5) == rows[:5]
    other_seed = start_sim(accept_length=3.0, accept_length_sd=0.4, mean_output_tokens=400, seed=4)
    assert [a for _, _, a in per_request_accept(other_seed.url, 5)] != lengths[:5]


def test_no_spec_keys_without_a_verify_pass(sim: RunningSimulator) -> None:
    body = chat_ok(sim.url, max_tokens=0, return_meta_info=True)
    meta = body["choices"][0]["meta_info"]
    assert meta["completion_tokens"] == 0 and not any(k.startswith("spec_") for k in meta)


def test_a_repeated_prompt_hits_the_prefix_cache(sim: RunningSimulator) -> None:
    first = chat_ok(sim.url, messages=user("cache me"), max_tokens=100, return_meta_info=True)
    again = chat_ok(sim.url, messages=user("cache me"), max_tokens=100, return_meta_info=True)
    assert first["choices"][0]["meta_info"]["cached_tokens"] == 0
    prompt_tokens = again["usage"]["prompt_tokens"]
    assert again["choices"][0]["meta_info"]["cached_tokens"] == prompt_tokens - 1 > 0


# --------------------------------------------------------------------------- validation errors


def test_prompt_longer_than_context_is_rejected(start_sim: StartSim) -> None:
    sim = start_sim(context_length=64)
    resp = chat(sim.url, messages=[{"role": "user", "content": "x" * 400}], max_tokens=10)
    assert_error(resp, 400, "The input (104 tokens) is longer than the model's context length (64 tokens).")


def test_prompt_plus_completion_over_context_is_rejected(start_sim: StartSim) -> None:
    sim = start_sim(context_length=64)
    resp = chat(sim.url, messages=[{"role": "user", "content": "x" * 40}], max_tokens=60)
    assert_error(
        resp,
        400,
        "Requested token count exceeds the model's maximum context length of 64 tokens. You requested a "
        "total of 74 tokens: 14 tokens from the input messages and 60 tokens for the completion. Please "
        "reduce the number of tokens in the input messages or the completion to fit within the limit.",
    )
    resp = chat(sim.url, max_tokens=100)
    assert_error(
        resp, 400, "max_completion_tokens is too large: 100.This model supports at most 64 completion tokens."
    )
    # Without a limit the request may use the rest of the context (64 - 14 - 1 = 49 tokens).
    body = chat_ok(sim.url, messages=[{"role": "user", "content": "x" * 40}])
    assert body["usage"]["completion_tokens"] == 49 and body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"messages": []}, "Messages cannot be empty."),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0."),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5."),
        ({"temperature": -0.5}, "temperature must be a non-negative finite number, got -0.5."),
        ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0."),
    ],
)
def test_invalid_requests_get_the_error_envelope(
    sim: RunningSimulator, fields: dict[str, Any], message: str
) -> None:
    assert_error(chat(sim.url, **{"max_tokens": 100, **fields}), 400, message)


def test_valid_sampling_edge_values_pass(sim: RunningSimulator) -> None:
    chat_ok(sim.url, max_tokens=100, top_p=1.0, temperature=0.0, top_k=-1)
    chat_ok(sim.url, max_tokens=100, top_p=0.95, temperature=0.6, top_k=20)


def test_content_type_and_body_errors(sim: RunningSimulator) -> None:
    url = f"{sim.url}/v1/chat/completions"
    resp = requests.post(url, data=json.dumps({"messages": QUESTION}), headers={"Content-Type": "text/plain"})
    assert_error(resp, 400, "Unsupported Media Type: Only 'application/json' is allowed", "Bad Request")
    resp = requests.post(url, data=b"{not json", headers={"Content-Type": "application/json"})
    assert resp.status_code == 400 and resp.json()["type"] == "Bad Request"
    resp = requests.post(url, json={"model": "m"}, timeout=5)
    assert resp.status_code == 400 and resp.json()["type"] == "Bad Request"
    assert requests.get(f"{sim.url}/nope", timeout=5).status_code == 404
    assert stats(sim.url)["bad_requests"] == 3


def test_duplicate_in_flight_rid_is_rejected(start_sim: StartSim) -> None:
    sim = start_sim(time_scale=1.0, tokens_per_second=1000, mean_output_tokens=400, output_tokens_sigma=0)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(chat, sim.url, rid="dup", max_tokens=1000)
        time.sleep(0.15)
        assert_error(chat(sim.url, rid="dup", max_tokens=1000), 400, "Duplicate request ID detected: dup")
        assert first.result().status_code == 200
    assert chat(sim.url, rid="dup", max_tokens=1000).status_code == 200  # free again once finished


# --------------------------------------------------------------------------- scheduling


def fixed_duration(seconds: float) -> dict[str, Any]:
    """Settings under which every thinking request lasts ``seconds``: 100 tokens at 100 tokens/s."""
    return {
        "mean_output_tokens": 100,
        "output_tokens_sigma": 0.0,
        "tokens_per_second": 100,
        "time_scale": seconds,
    }


def test_queue_full_answers_503(start_sim: StartSim) -> None:
    sim = start_sim(max_running_requests=1, max_queued_requests=1, **fixed_duration(0.4))
    with ThreadPoolExecutor(3) as pool:
        futures = []
        for _ in range(3):
            futures.append(pool.submit(chat, sim.url, max_tokens=1000))
            time.sleep(0.05)
        responses = [f.result() for f in futures]
    assert [r.status_code for r in responses] == [200, 200, 503]
    assert_error(responses[2], 503, "The request queue is full.", "503")
    assert stats(sim.url)["rejected"] == 1


def test_concurrency_cap_is_respected(start_sim: StartSim) -> None:
    sim = start_sim(max_running_requests=4, **fixed_duration(0.15))
    seen_running: list[float] = []
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(chat, sim.url, messages=user(i)) for i in range(12)]
        time.sleep(0.05)
        for _ in range(3):
            metrics = requests.get(f"{sim.url}/metrics", timeout=5).text
            seen_running.append(metric_values(metrics)["sglang:num_running_reqs"])
            time.sleep(0.1)
        assert all(f.result().status_code == 200 for f in futures)
    snapshot = stats(sim.url)
    assert snapshot["peak_running"] == 4 and snapshot["peak_waiting"] >= 4
    assert snapshot["completed"] == 12 and snapshot["running"] == snapshot["waiting"] == 0
    assert max(seen_running) <= 4 and 4 in seen_running


def test_waiting_requests_are_served_in_arrival_order(start_sim: StartSim) -> None:
    sim = start_sim(max_running_requests=1, **fixed_duration(0.05))
    finished: list[int] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        chat_ok(sim.url, messages=user(i), max_tokens=1000)
        with lock:
            finished.append(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
        time.sleep(0.01)
    for t in threads:
        t.join()
    assert finished == [0, 1, 2, 3, 4]


def test_occupancy_is_time_weighted_mean_running_over_max(start_sim: StartSim) -> None:
    # Requests of 0.4 s: the client's own gaps between them (milliseconds, more on a loaded machine)
    # stay small beside the time the slots are busy.
    sim = start_sim(max_running_requests=4, **fixed_duration(0.4))
    for i in range(3):  # one at a time: mean 1 running out of 4
        chat_ok(sim.url, messages=user(i), max_tokens=1000)
    one = stats(sim.url)
    assert 0.85 <= one["mean_running"] <= 1.0 and one["occupancy"] == pytest.approx(one["mean_running"] / 4)
    assert one["window_seconds"] >= 0.3 and one["mean_running_since_start"] <= one["mean_running"]

    reset = requests.post(f"{sim.url}/sim/stats/reset", timeout=5).json()
    assert reset["completed"] == 0 and reset["mean_running"] == 0.0 and reset["requests_total"] == 0
    with ThreadPoolExecutor(4) as pool:  # four at once, twice: the slots stay full
        for _ in range(2):
            futures = [pool.submit(chat, sim.url, messages=user(i)) for i in range(4)]
            assert all(f.result().status_code == 200 for f in futures)
    full = stats(sim.url)
    assert full["occupancy"] >= 0.8 and full["completed"] == 8
    assert full["generation_tokens"] == 8 * 100 and full["prompt_tokens"] == 8 * 5


# --------------------------------------------------------------------------- faults


def test_http_500_fault_applies_to_next_n_requests(sim: RunningSimulator) -> None:
    add_fault(sim.url, kind="http_500", count=2)
    for _ in range(2):
        assert_error(
            chat(sim.url, max_tokens=100),
            500,
            "Internal server error (simulated fault).",
            "InternalServerError",
        )
    assert chat(sim.url, max_tokens=100).status_code == 200
    assert stats(sim.url)["faults_injected"] == 2


def test_http_503_fault_lasts_for_seconds(sim: RunningSimulator) -> None:
    add_fault(sim.url, kind="http_503", seconds=0.3)
    assert_error(chat(sim.url, max_tokens=100), 503, "The request queue is full.", "503")
    assert_error(chat(sim.url, max_tokens=100), 503, "The request queue is full.", "503")
    time.sleep(0.35)
    assert chat(sim.url, max_tokens=100).status_code == 200


def test_hang_fault_delays_the_answer(sim: RunningSimulator) -> None:
    add_fault(sim.url, kind="hang", count=2, hang_seconds=0.4)
    with pytest.raises(requests.Timeout):
        chat(sim.url, max_tokens=100, timeout=0.1)
    start = time.monotonic()
    assert chat(sim.url, max_tokens=100).status_code == 200
    assert time.monotonic() - start >= 0.4


def test_bad_json_fault_truncates_the_body(sim: RunningSimulator) -> None:
    add_fault(sim.url, kind="bad_json", count=1)
    resp = chat(sim.url, max_tokens=100)
    assert resp.status_code == 200 and int(resp.headers["Content-Length"]) == len(resp.content)
    with pytest.raises(ValueError):
        json.loads(resp.content)
    chat_ok(sim.url, max_tokens=100)


def test_abort_fault_returns_partial_output(sim: RunningSimulator) -> None:
    full = chat_ok(sim.url, max_tokens=30000)
    add_fault(sim.url, kind="abort", count=1)
    body = chat_ok(sim.url, max_tokens=30000)
    choice = body["choices"][0]
    assert (choice["finish_reason"], choice["matched_stop"]) == ("abort", None)
    assert body["usage"]["completion_tokens"] == full["usage"]["completion_tokens"] // 2
    assert choice["message"]["reasoning_content"]
    assert stats(sim.url)["aborted"] == 1


def test_reset_fault_closes_the_connection(sim: RunningSimulator) -> None:
    add_fault(sim.url, kind="reset", count=1)
    with pytest.raises(requests.ConnectionError):
        chat(sim.url, max_tokens=100)
    chat_ok(sim.url, max_tokens=100)


def test_unhealthy_fault_and_clear(sim: RunningSimulator) -> None:
    add_fault(sim.url, kind="unhealthy")
    assert requests.get(f"{sim.url}/health", timeout=5).status_code == 503
    assert requests.get(f"{sim.url}/health_generate", timeout=5).status_code == 503
    chat_ok(sim.url, max_tokens=100)  # chat requests are unaffected
    add_fault(sim.url, kind="http_500", count=5)
    faults = requests.get(f"{sim.url}/sim/faults", timeout=5).json()["faults"]
    assert [f["kind"] for f in faults] == ["unhealthy", "http_500"]
    add_fault(sim.url, kind="clear")
    assert requests.get(f"{sim.url}/health", timeout=5).status_code == 200
    chat_ok(sim.url, max_tokens=100)
    assert requests.get(f"{sim.url}/sim/faults", timeout=5).json() == {"faults": []}


def test_bad_fault_requests_are_rejected(sim: RunningSimulator) -> None:
    for fault in ({"kind": "explode"}, {"kind": "http_500", "count": 0}, {"kind": "hang", "seconds": "x"}):
        assert requests.post(f"{sim.url}/sim/faults", json=fault, timeout=5).status_code == 400


def refused(url: str) -> bool:
    try:
        requests.get(f"{url}/health", timeout=2)
    except requests.ConnectionError:
        return True
    return False


def test_loading_refuses_connections_then_health_is_503_until_warmed_up(start_sim: StartSim) -> None:
    sim = start_sim(load_seconds=0.5, startup_seconds=0.5)
    assert refused(sim.url) and not sim.listening.is_set()
    assert sim.listening.wait(5)
    assert requests.get(f"{sim.url}/health", timeout=5).status_code == 503
    assert requests.get(f"{sim.url}/health_generate", timeout=5).status_code == 503
    assert requests.get(f"{sim.url}/ready", timeout=5).status_code == 503
    # as in SGLang, only the probes wait for the warmup: everything else is served once HTTP is up
    assert requests.get(f"{sim.url}/server_info", timeout=5).json()["status"] == "ready"
    chat_ok(sim.url, max_tokens=100)
    deadline = time.monotonic() + 5
    while requests.get(f"{sim.url}/health", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "health never turned 200"
        time.sleep(0.05)
    assert requests.get(f"{sim.url}/ready", timeout=5).status_code == 200


def test_stop_while_loading(start_sim: StartSim) -> None:
    sim = start_sim(load_seconds=30)
    started = time.monotonic()
    sim.stop()
    assert time.monotonic() - started < 5 and refused(sim.url)


# --------------------------------------------------------------------------- info and metrics


def test_server_and_model_info(start_sim: StartSim) -> None:
    sim = start_sim(accept_length=2.5, max_running_requests=7, context_length=4096, model="org/qwen-sim")
    info = requests.get(f"{sim.url}/server_info", timeout=5).json()
    expected = {
        "model_path": "org/qwen-sim",
        "served_model_name": "org/qwen-sim",
        "max_running_requests": 7,
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "reasoning_parser": "qwen3",
        "context_length": 4096,
        "status": "ready",
        "version": "0.5.23",
        "api_key": None,
    }
    assert {k: info[k] for k in expected} == expected
    [state] = info["internal_states"]
    assert "avg_spec_accept_length" not in state and isinstance(state["last_gen_throughput"], float)
    model = requests.get(f"{sim.url}/model_info", timeout=5).json()
    assert model["model_path"] == "org/qwen-sim" and model["is_generation"] is True
    assert model["served_model_name"] == "org/qwen-sim"
    # the deprecated aliases answer the same body
    assert requests.get(f"{sim.url}/get_model_info", timeout=5).json() == model
    assert requests.get(f"{sim.url}/get_server_info", timeout=5).json() == info
    models = requests.get(f"{sim.url}/v1/models", timeout=5).json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "org/qwen-sim" and models["data"][0]["max_model_len"] == 4096


def test_served_model_name_and_model_path(start_sim: StartSim) -> None:
    sim = start_sim(model="/models/Qwen3.6-27B", served_model_name="qwen36")
    model = requests.get(f"{sim.url}/model_info", timeout=5).json()
    info = requests.get(f"{sim.url}/server_info", timeout=5).json()
    assert (model["model_path"], model["served_model_name"]) == ("/models/Qwen3.6-27B", "qwen36")
    assert (info["model_path"], info["served_model_name"]) == ("/models/Qwen3.6-27B", "qwen36")
    assert requests.get(f"{sim.url}/v1/models", timeout=5).json()["data"][0]["id"] == "qwen36"
    with pytest.raises(ValueError, match="colon"):
        SimConfig(model="org/model:v2")


def test_internal_states_accept_length_is_absent_until_a_log_interval_then_cumulative(
    start_sim: StartSim,
) -> None:
    sim = start_sim(decode_log_interval=100, accept_length=3.0, mean_output_tokens=600, output_tokens_sigma=0)

    def reported() -> float | None:
        [state] = requests.get(f"{sim.url}/server_info", timeout=5).json()["internal_states"]
        value = state.get("avg_spec_accept_length")
        return None if value is None else float(value)

    def verify(**fields: Any) -> tuple[int, int]:
        meta = chat_ok(sim.url, return_meta_info=True, **fields)["choices"][0]["meta_info"]
        return meta["completion_tokens"], meta["spec_verify_ct"]

    short = verify(max_tokens=30000, chat_template_kwargs={"enable_thinking": False})
    assert 0 < short[1] < 100 and reported() is None  # the key is absent, not 0
    first = verify(max_tokens=30000, messages=user("long one"))  # ~200 passes: the interval completes
    assert reported() == pytest.approx((short[0] + first[0]) / (short[1] + first[1]))
    tail = verify(max_tokens=60, messages=user("short tail"))  # < 100 passes: not logged yet
    assert reported() == pytest.approx((short[0] + first[0]) / (short[1] + first[1]))
    second = verify(max_tokens=30000, messages=user("another long one"))
    done = [short, first, tail, second]
    assert reported() == pytest.approx(sum(t for t, _ in done) / sum(v for _, v in done))


# --------------------------------------------------------------------------- api key

KEY = "sk-test-1234"
PROTECTED = ["/server_info", "/get_server_info", "/model_info", "/get_model_info", "/v1/models"]


def test_api_key_protects_everything_but_health_ready_and_metrics(start_sim: StartSim) -> None:
    sim = start_sim(api_key=KEY)
    for path in ("/health", "/health_generate", "/ready", "/metrics", "/sim/stats"):
        assert requests.get(f"{sim.url}{path}", timeout=5).status_code == 200, path
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"X-Api-Key": KEY}):
        for path in PROTECTED:
            resp = requests.get(f"{sim.url}{path}", headers=headers, timeout=5)
            assert (resp.status_code, resp.json()) == (401, {"error": "Unauthorized"}), (path, headers)
        resp = requests.post(f"{sim.url}/v1/chat/completions", json={"messages": QUESTION}, headers=headers)
        assert (resp.status_code, resp.json()) == (401, {"error": "Unauthorized"})
    assert requests.get(f"{sim.url}/nope", timeout=5).status_code == 401  # before routing, as in SGLang
    for scheme in ("Bearer", "bearer"):
        auth = {"Authorization": f"{scheme} {KEY}"}
        for path in PROTECTED:
            assert requests.get(f"{sim.url}{path}", headers=auth, timeout=5).status_code == 200, path
        resp = requests.post(
            f"{sim.url}/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 50}, headers=auth
        )
        assert resp.status_code == 200
    info = requests.get(f"{sim.url}/server_info", headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
    assert info.json()["api_key"] == KEY  # SGLang shows it too: clients must never store server_info
    assert stats(sim.url)["requests_total"] == 2  # refused requests never reach the engine


def test_metrics_names_labels_and_counters(start_sim: StartSim) -> None:
    sim = start_sim(served_model_name="served", accept_length=3.2, accept_length_sd=0.0)
    bodies = [chat_ok(sim.url, max_tokens=30000, messages=user(i), return_meta_info=True) for i in range(3)]
    text = requests.get(f"{sim.url}/metrics", timeout=5).text
    values = metric_values(text, "served")
    for name in (
        "num_running_reqs",
        "num_queue_reqs",
        "gen_throughput",
        "spec_accept_length",
        "generation_tokens_total",
        "prompt_tokens_total",
        "num_requests_total",
    ):
        assert f"sglang:{name}" in values, name
        assert f"# TYPE sglang:{name} " in text
    last = bodies[-1]["choices"][0]["meta_info"]  # each request completes a decode log interval
    assert values["sglang:spec_accept_length"] == last["spec_accept_length"] == pytest.approx(3.2, abs=0.02)
    assert values["sglang:num_requests_total"] == 3
    assert values["sglang:generation_tokens_total"] == sum(b["usage"]["completion_tokens"] for b in bodies)
    assert values["sglang:prompt_tokens_total"] == sum(b["usage"]["prompt_tokens"] for b in bodies)
    requests.post(f"{sim.url}/sim/stats/reset", timeout=5)  # Prometheus counters never go back
    assert "sglang:num_requests_total" in requests.get(f"{sim.url}/metrics", timeout=5).text
    assert stats(sim.url)["completed"] == 0


# --------------------------------------------------------------------------- command line


def test_cli_ready_line_fault_flag_and_sigterm() -> None:
    cmd = [
        sys.executable,
        "-m",
        "dflash_tasks.sim",
        "--port",
        "0",
        "--time-scale",
        "0",
        "--fault",
        "http_500:1",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        match = re.fullmatch(r"SIM READY (http://127\.0\.0\.1:\d+)", line)
        assert match, line
        url = match[1]
        assert chat(url, max_tokens=100).status_code == 500
        assert chat(url, max_tokens=100).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
        assert proc.stdout.read() == "" and proc.stderr is not None and proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()


def test_cli_rejects_bad_flags() -> None:
    cmd = [sys.executable, "-m", "dflash_tasks.sim", "--fault", "meltdown:3"]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=10)
    assert result.returncode == 2 and "unknown fault kind" in result.stderr


def test_cli_loading_line_model_names_and_api_key() -> None:
    cmd = [sys.executable, "-m", "dflash_tasks.sim", "--port", "0", "--time-scale", "0"]
    cmd += ["--load-seconds", "0.5", "--api-key", KEY, "--model-path", "/m/Qwen3.6-27B"]
    cmd += ["--served-model-name", "qwen36"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        loading = re.fullmatch(r"SIM LOADING (http://127\.0\.0\.1:\d+)", proc.stdout.readline().strip())
        assert loading, "no LOADING line"
        url = loading[1]
        assert refused(url)
        assert proc.stdout.readline().strip() == f"SIM READY {url}"
        assert requests.get(f"{url}/health", timeout=5).status_code == 200
        assert requests.get(f"{url}/model_info", timeout=5).status_code == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        model = requests.get(f"{url}/model_info", headers=auth, timeout=5).json()
        assert (model["model_path"], model["served_model_name"]) == ("/m/Qwen3.6-27B", "qwen36")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_record_requests_appends_every_chat_body_in_arrival_order(
    start_sim: StartSim, tmp_path: Path
) -> None:
    from dflash_tasks.sim.requestlog import read_requests

    path = tmp_path / "requests.jsonl"
    sim = start_sim(record_requests=str(path))
    chat_ok(sim.url, messages=user("first"), rid="r1", max_tokens=50)
    assert chat(sim.url, messages=user("too long"), max_tokens=10**6).status_code == 400  # recorded too
    requests.post(f"{sim.url}/v1/chat/completions", data=b"not json", timeout=5)
    bodies = read_requests(path)
    assert [b.get("rid") for b in bodies[:2]] == ["r1", None]
    assert bodies[0]["messages"] == user("first") and bodies[1]["max_tokens"] == 10**6
    assert bodies[2] == {"raw": "not json"}
