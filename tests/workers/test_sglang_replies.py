"""The SGLang boundary's pure parts: the chat body, the replies, the info endpoints' fields and the
error translation, from known bodies (no server; the same over HTTP: test_sglang_client.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from dflash_tasks.core.errors import ConfigError, DflashError, RetryableError, SampleRejected
from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.sample import Sample
from dflash_tasks.core.states import ErrorKind
from workers.sglang_client import (
    ChatRequest,
    Completion,
    MetaInfo,
    ServerInfo,
    error_message,
    parse_completion,
    parse_model_info,
    parse_server_info,
    read_chat_reply,
)
from workers.sglang_client.http_errors import KEY_HINT, stream_error, transport_error

SPEC = GenerationSpec(model="Qwen/Qwen3-8B", max_tokens=2000)
SAMPLE = Sample(id="q7", messages=[{"role": "user", "content": "What is 6*7? Explain."}], line=8)


# -- the request body ------------------------------------------------------------------------------


def test_the_chat_body_follows_the_sglang_contract() -> None:
    spec = GenerationSpec(
        "Qwen/Qwen3-32B", max_tokens=1234, temperature=0.7, top_p=0.8, top_k=5, thinking=True
    )
    body = ChatRequest(spec, SAMPLE.messages, "rid-1").body()
    assert body == {
        "model": "Qwen/Qwen3-32B",
        "messages": SAMPLE.messages,
        "max_completion_tokens": 1234,  # what 0.5.23 reads first
        "max_tokens": 1234,  # what releases before max_completion_tokens read
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 5,
        "n": 1,
        "stream": False,
        "chat_template_kwargs": {"enable_thinking": True},
        "separate_reasoning": True,
        "return_meta_info": True,
        "rid": "rid-1",
    }
    json.dumps(body)  # JSON-serialisable as sent


def test_the_chat_body_thinking_off() -> None:
    body = ChatRequest(GenerationSpec("m", thinking=False), SAMPLE.messages, "r").body()
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_a_continuation_asks_to_continue_the_final_message_and_keeps_its_leading_whitespace() -> None:
    request = ChatRequest(SPEC, [*SAMPLE.messages, {"role": "assistant", "content": "So far"}], "c", True)
    body = request.body()
    assert list(body)[-1] == "continue_final_message" and body["continue_final_message"] is True
    assert "continue_final_message" not in ChatRequest(SPEC, SAMPLE.messages, "r").body()
    reply = response(200, completion_body({"content": "42", "reasoning_content": " and on.\n"}))
    assert read_chat_reply(reply, joins=request.continues).reasoning == " and on."


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


# -- parse_completion --------------------------------------------------------------------------------


def completion_body(
    message: Any = None, usage: Any = None, finish: Any = "stop", meta_info: Any = None, **extra: Any
) -> bytes:
    choice = {"index": 0, "message": message, "finish_reason": finish}
    if meta_info is not None:
        choice["meta_info"] = meta_info
    return json.dumps({"choices": [choice], "usage": usage, **extra}).encode()


def test_parse_completion_null_fields() -> None:
    c = parse_completion(completion_body({"role": "assistant", "content": None, "reasoning_content": None}))
    assert c == Completion("", "", "stop", 0, 0, 0)
    c = parse_completion(completion_body(None, None, None))
    assert c == Completion("", "", "", 0, 0, 0)


def test_parse_completion_strips_and_reads_usage() -> None:
    usage = {
        "prompt_tokens": 31,
        "completion_tokens": 1259,
        "reasoning_tokens": 1180,
        "completion_tokens_details": {"reasoning_tokens": 1180},
    }
    c = parse_completion(
        completion_body({"content": "\n\nThe answer is 42. ", "reasoning_content": "\nLet me think\n"}, usage)
    )
    assert c == Completion("Let me think", "The answer is 42.", "stop", 31, 1259, 1180)


def test_parse_completion_reasoning_tokens_from_details_only() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": 7}}
    assert parse_completion(completion_body({"content": "a"}, usage)).reasoning_tokens == 7
    usage = {
        "prompt_tokens": 1,
        "completion_tokens": 9,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }
    assert parse_completion(completion_body({"content": "a"}, usage)).reasoning_tokens == 0


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
        parse_completion(completion_body({"content": "partial", "reasoning_content": "half"}, finish="abort"))


def test_meta_info_absent_or_partial() -> None:
    assert parse_completion(completion_body({"content": "a"})).meta is None  # an old release: no meta_info
    partial = {"id": "x", "completion_tokens": 3, "cached_tokens": 2, "num_retractions": 1}
    assert parse_completion(completion_body({"content": "a"}, meta_info=partial)).meta == MetaInfo(
        cached_tokens=2, num_retractions=1
    )  # no speculative decoding: no spec_* keys
    odd = {"spec_verify_ct": "7", "spec_accept_length": -1.0, "cached_tokens": 2.5, "num_retractions": True}
    assert parse_completion(completion_body({"content": "a"}, meta_info=odd)).meta == MetaInfo()


@pytest.mark.parametrize(
    ("message", "usage"),
    [
        ("an answer", None),  # a message that is not an object
        ({"content": ["a", "b"]}, None),  # a text that is not a string
        ({"content": "a", "reasoning_content": 7}, None),
        ({"content": "a"}, ["not", "an", "object"]),
        ({"content": "a"}, {"prompt_tokens": "many"}),
        ({"content": "a"}, {"completion_tokens": 1e400}),  # JSON's Infinity: no integer
        ({"content": "a"}, {"completion_tokens": 3, "completion_tokens_details": "x"}),
    ],
)
def test_a_malformed_field_is_a_bad_response_never_a_crash(message: Any, usage: Any) -> None:
    raw = completion_body(message, usage)
    with pytest.raises(RetryableError, match=rf"invalid response body \({len(raw)} bytes\)") as bad:
        parse_completion(raw)
    assert bad.value.kind is ErrorKind.BAD_RESPONSE


def test_a_chat_reply_status_becomes_the_error_it_means() -> None:
    rejected = response(400, json.dumps({"object": "error", "message": "too long", "code": 400}))
    with pytest.raises(SampleRejected, match=r"^HTTP 400: too long$"):
        read_chat_reply(rejected)
    for status, kind in ((503, ErrorKind.HTTP_503), (500, ErrorKind.HTTP_5XX), (404, ErrorKind.HTTP_4XX)):
        with pytest.raises(RetryableError) as failed:
            read_chat_reply(response(status, json.dumps({"message": "no"})))
        assert not isinstance(failed.value, SampleRejected) and failed.value.kind is kind
    with pytest.raises(RetryableError, match=r"^HTTP 401: Unauthorized \(.*DFLASH_SGLANG_API_KEY"):
        read_chat_reply(response(401, json.dumps({"error": "Unauthorized"})))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 429, 500, 503])
def test_a_streamed_error_event_is_the_status_its_code_names(status: int) -> None:
    """A stream's ``{"error": {"code": ...}}`` is classified, and hinted, as that chat status is."""
    with pytest.raises(DflashError) as plain:
        read_chat_reply(response(status, json.dumps({"message": "no"})))
    streamed = stream_error({"message": "no", "code": status})
    assert type(streamed) is type(plain.value) and streamed.kind is plain.value.kind
    assert str(streamed) == str(plain.value).replace(f"HTTP {status}:", f"HTTP {status} (stream):")
    assert (KEY_HINT in str(streamed)) is (status in (401, 403))


# -- the info endpoints' fields -----------------------------------------------------------------------


def test_server_info_keeps_only_the_fields_we_read() -> None:
    doc = {
        "model_path": "/models/q",
        "served_model_name": "q",
        "version": "0.5.23",
        "max_running_requests": 48,
        "cuda_graph_max_bs_decode": 64,
        "cuda_graph_max_bs": 160,
        "api_key": "sk-secret",
        "internal_states": [{"avg_spec_accept_length": 3.0}, {"avg_spec_accept_length": 3.5}],
    }
    info = parse_server_info(doc)
    assert info == ServerInfo("/models/q", "q", "0.5.23", 48, 64, 3.25)  # the mean over the DP ranks
    assert "sk-secret" not in repr(info)
    assert parse_server_info({"cuda_graph_max_bs": 160}).decode_graph_ceiling == 160  # the older name
    assert parse_server_info({}) == ServerInfo()


@pytest.mark.parametrize(
    ("doc", "accept"),
    [
        ({"internal_states": [{"last_gen_throughput": 1.0}]}, None),  # before the first log interval
        ({"avg_spec_accept_length": 2.5}, 2.5),  # some releases: at the top level
        ({"internal_states": [{"avg_spec_accept_length": 3.0}], "avg_spec_accept_length": 2.5}, 3.0),
        ({"internal_states": [{"avg_spec_accept_length": 0}, "x", None]}, None),
        ({"internal_states": "x", "avg_spec_accept_length": True}, None),
        ({}, None),
    ],
)
def test_the_servers_lifetime_accept_length(doc: dict[str, Any], accept: float | None) -> None:
    assert parse_server_info(doc).lifetime_accept_length == accept


@pytest.mark.parametrize("value", [0, -4, True, 8.0, "64", None])
def test_a_count_the_server_does_not_state_plainly_is_not_known(value: Any) -> None:
    info = parse_server_info({"max_running_requests": value, "cuda_graph_max_bs_decode": value})
    assert (info.max_running_requests, info.decode_graph_ceiling) == (None, None)


def test_model_info_reads_the_path_and_the_served_name() -> None:
    model = parse_model_info({"model_path": "/m", "served_model_name": None, "is_generation": True})
    assert (model.model_path, model.served_model_name) == ("/m", "")


# -- a call that got no answer -----------------------------------------------------------------------


def test_no_answer_is_retryable_and_a_bad_url_or_key_is_permanent() -> None:
    where = "http://h:1/server_info"
    refused = transport_error(requests.ConnectionError("refused"), where, 5)
    assert type(refused) is RetryableError and refused.kind is ErrorKind.CONNECTION
    assert str(refused) == f"{where}: connection error: refused"
    slow = transport_error(requests.ReadTimeout("read timed out"), "", 1800)
    assert (str(slow), slow.kind) == ("request timed out after 1800s", ErrorKind.TIMEOUT)
    assert isinstance(transport_error(requests.exceptions.InvalidURL("no host"), where, 5), ConfigError)
    key = transport_error(requests.exceptions.InvalidHeader("header value 'Bearer sk-1\\n'"), where, 5)
    assert isinstance(key, ConfigError) and "sk-1" not in str(key) and "DFLASH_SGLANG_API_KEY" in str(key)
