"""The ``/v1/chat/completions`` wire format: request validation and response bodies (SGLang 0.5.23)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from dflash_tasks.sim.config import SPEC_NUM_DRAFT_TOKENS, SimConfig
from dflash_tasks.sim.sse import usage
from dflash_tasks.sim.textgen import IM_END_TOKEN_ID, Plan


class ApiError(Exception):
    """An error answered with the OpenAI-style envelope ``{"object": "error", ...}``."""

    def __init__(self, status: int, message: str, type_: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_

    def body(self) -> dict[str, Any]:
        """The JSON error envelope."""
        return error_body(self.status, self.message, self.type)


def error_body(status: int, message: str, type_: str) -> dict[str, Any]:
    """``{"object":"error","message":...,"type":...,"param":null,"code":status}``."""
    return {"object": "error", "message": message, "type": type_, "param": None, "code": status}


def queue_full_error() -> ApiError:
    """The 503 SGLang answers when ``--max-queued-requests`` is exceeded."""
    return ApiError(503, "The request queue is full.", "503")


@dataclass(frozen=True)
class ChatRequest:
    """The fields of a chat request the simulator acts on."""

    model: str
    prompt: str
    num_messages: int
    prompt_tokens: int
    max_new_tokens: int
    thinking: bool
    separate_reasoning: bool
    rid: str | None
    return_meta_info: bool
    return_spec_tokens_details: bool
    #: ``continue_final_message`` with a final assistant message: its text, which the answer
    #: continues (SGLang appends its tokens to the prompt); None otherwise.
    prefix: str | None = None
    stream: bool = False
    #: ``stream_options``: a last chunk with the usage; the usage so far in every chunk.
    include_usage: bool = False
    continuous_usage: bool = False
    #: The request's sampling ``seed``, if any (another seed may escape a loop).
    seed: int | None = None

    @property
    def plan_prompt(self) -> str:
        """The prompt the output is planned from: without a continued prefix, so that a
        continuation goes on with the same answer the uninterrupted request gets."""
        if self.prefix is None:
            return self.prompt
        return self.prompt.rpartition("\x1e")[0]


def _bad_field(name: str, expected: str) -> ApiError:
    return ApiError(400, f"1 validation error for ChatCompletionRequest\n{name}\n  {expected}", "Bad Request")


def _number(body: dict[str, Any], name: str, integer: bool = False) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    fractional = isinstance(value, float) and not value.is_integer()
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and fractional):
        raise _bad_field(name, "Input should be a valid " + ("integer" if integer else "number"))
    return float(value)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def count_prompt_tokens(texts: list[str]) -> int:
    """Approximate tokenizer: ``ceil(chars / 4) + 4`` per message."""
    return math.ceil(sum(len(t) for t in texts) / 4) + 4 * len(texts)


def _messages(body: dict[str, Any]) -> list[str]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _bad_field("messages", "Field required" if messages is None else "Input should be a valid list")
    if not messages:
        raise ApiError(400, "Messages cannot be empty.")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise _bad_field("messages", "Each message must be an object with a string 'role'")
    return [_content_text(m.get("content")) for m in messages]


def _check_sampling(body: dict[str, Any]) -> None:
    temperature = _number(body, "temperature")
    top_p = _number(body, "top_p")
    top_k = _number(body, "top_k", integer=True)
    if temperature is not None and temperature < 0:
        raise ApiError(400, f"temperature must be a non-negative finite number, got {temperature}.")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ApiError(400, f"top_p must be in (0, 1], got {top_p}.")
    if top_k is not None and top_k != -1 and top_k < 1:
        raise ApiError(400, f"top_k must be -1 (disable) or at least 1, got {body['top_k']}.")


def _max_new_tokens(body: dict[str, Any], prompt_tokens: int, context: int) -> int:
    requested = _number(body, "max_completion_tokens", integer=True) or _number(
        body, "max_tokens", integer=True
    )
    if requested is not None and requested > context:
        raise ApiError(
            400,
            f"max_completion_tokens is too large: {int(requested)}."
            f"This model supports at most {context} completion tokens.",
        )
    if prompt_tokens >= context:
        raise ApiError(
            400,
            f"The input ({prompt_tokens} tokens) is longer than the model's context length "
            f"({context} tokens).",
        )
    if requested is None:
        return context - prompt_tokens - 1
    wanted = int(requested)
    if wanted < 0:
        raise ApiError(400, f"max_new_tokens must be at least 0, got {wanted}.")
    if prompt_tokens + wanted > context:
        raise ApiError(
            400,
            f"Requested token count exceeds the model's maximum context length of {context} tokens. "
            f"You requested a total of {prompt_tokens + wanted} tokens: {prompt_tokens} tokens from the "
            f"input messages and {wanted} tokens for the completion. Please reduce the number of tokens "
            "in the input messages or the completion to fit within the limit.",
        )
    return wanted


def parse_chat_request(content_type: str, raw: bytes, config: SimConfig) -> ChatRequest:
    """Validate a request in SGLang's order; raises :class:`ApiError` (400) on the first problem."""
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        raise ApiError(400, "Unsupported Media Type: Only 'application/json' is allowed", "Bad Request")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"JSON decode error: {exc}", "Bad Request") from None
    if not isinstance(body, dict):
        raise ApiError(400, "Input should be a valid dictionary or object", "Bad Request")
    texts = _messages(body)
    model = str(body.get("model") or "default")
    if ":" in model:  # SGLang reads `base:adapter` as a LoRA adapter, and LoRA is off
        adapter = model.split(":", 1)[1]
        raise ApiError(
            400,
            f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled. Please launch the server "
            "with --enable-lora flag and preload adapters using --lora-paths or /load_lora_adapter endpoint.",
        )
    if body.get("n", 1) not in (1, None):
        raise ApiError(400, "n > 1 not supported by the simulator")
    prompt_tokens = count_prompt_tokens(texts)
    max_new = _max_new_tokens(body, prompt_tokens, config.context_length)
    _check_sampling(body)
    stream = bool(body.get("stream"))
    if stream and body.get("return_meta_info"):
        raise ApiError(
            400,
            "return_meta_info is not supported with streaming. "
            "Please set stream=false when using return_meta_info=true.",
            "BadRequest",
        )
    options = body.get("stream_options") or {}
    options = options if isinstance(options, dict) else {}
    seed = _number(body, "seed", integer=True)
    kwargs = body.get("chat_template_kwargs") or {}
    rid = body.get("rid")
    return ChatRequest(
        model=model,
        prompt="\x1e".join(texts),
        num_messages=len(texts),
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new,
        # Qwen3's template turns thinking off only for an explicit false (`enable_thinking is
        # defined and enable_thinking is false`); SGLang's qwen3 parser agrees. Missing = on.
        thinking=not (isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False),
        separate_reasoning=body.get("separate_reasoning", True) is not False,
        rid=None if rid is None else str(rid),
        return_meta_info=bool(body.get("return_meta_info")),
        return_spec_tokens_details=bool(body.get("return_spec_tokens_details")),
        prefix=_continued_prefix(body),
        stream=stream,
        include_usage=stream and bool(options.get("include_usage")),
        continuous_usage=stream and bool(options.get("continuous_usage_stats")),
        seed=None if seed is None else int(seed),
    )


def _continued_prefix(body: dict[str, Any]) -> str | None:
    """SGLang's ``_handle_last_assistant_message``: with ``continue_final_message`` a final
    assistant message with text content is the prefix the answer continues (a list content is
    left alone); without it, such a message is read as the user's."""
    last = body["messages"][-1]
    if body.get("continue_final_message") is True and last.get("role") == "assistant":
        content = last.get("content")
        return content if isinstance(content, str) else None
    return None


def verify_passes(completion_tokens: int, accept_length: float) -> int:
    """Verify passes that produce ``completion_tokens`` at ``accept_length`` tokens per pass."""
    return math.ceil(completion_tokens / accept_length) if completion_tokens > 0 else 0


def spec_details(completion_tokens: int, verify_ct: int) -> dict[str, Any]:
    """SGLang's per-request ``spec_*`` keys; none without a verify pass (as SGLang omits them)."""
    if verify_ct <= 0:
        return {}
    proposed = verify_ct * (SPEC_NUM_DRAFT_TOKENS - 1)
    correct = max(0, completion_tokens - verify_ct)  # each pass adds one bonus token
    return {
        "spec_accept_rate": correct / proposed,
        "spec_accept_length": completion_tokens / verify_ct,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": verify_ct,
    }


def _finish_info(plan: Plan) -> dict[str, Any]:
    if plan.finish_reason == "stop":
        return {"type": "stop", "matched": IM_END_TOKEN_ID}
    if plan.finish_reason == "length":
        return {"type": "length", "length": plan.completion_tokens}
    return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


@dataclass(frozen=True)
class Outcome:
    """What generation produced, ready to be serialised."""

    request_id: str
    plan: Plan
    reasoning_content: str | None
    content: str
    reasoning_tokens: int
    created: int
    e2e_latency: float
    verify_ct: int = 0
    cached_tokens: int = 0
    retractions: int = 0


def chat_response(req: ChatRequest, out: Outcome, config: SimConfig) -> dict[str, Any]:
    """The ``ChatCompletionResponse`` JSON, key for key as SGLang 0.5.23 emits it."""
    completion = out.plan.completion_tokens
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": out.content, "reasoning_content": out.reasoning_content},
        "logprobs": None,
        "finish_reason": out.plan.finish_reason,
        "matched_stop": IM_END_TOKEN_ID if out.plan.finish_reason == "stop" else None,
    }
    spec = spec_details(completion, out.verify_ct)
    if req.return_meta_info:
        choice["meta_info"] = {
            "id": out.request_id,
            "finish_reason": _finish_info(out.plan),
            "prompt_tokens": req.prompt_tokens,
            "weight_version": "default",
            "num_retractions": out.retractions,
            "reasoning_tokens": out.reasoning_tokens,
            "completion_tokens": completion,
            "cached_tokens": out.cached_tokens,
            "e2e_latency": out.e2e_latency,
            **spec,
        }
    response: dict[str, Any] = {
        "id": out.request_id,
        "object": "chat.completion",
        "created": out.created,
        "model": req.model,
        "choices": [choice],
        "usage": usage(req.prompt_tokens, completion, out.reasoning_tokens),
        "metadata": {"weight_version": "default"},
    }
    if req.return_spec_tokens_details:
        response["sglext"] = {"spec_tokens_details": spec}
    return response
