"""Read-only endpoints: ``/server_info``, ``/model_info`` (and their deprecated ``/get_*`` aliases),
``/v1/models`` and ``/metrics``."""

from __future__ import annotations

from typing import Any

from dflash_tasks.sim.config import SPEC_NUM_DRAFT_TOKENS
from dflash_tasks.sim.engine import SimEngine

SGLANG_VERSION = "0.5.23"
KV_TOKENS_PER_SLOT = 8192


def _spec_accept_rate(accept_length: float) -> float:
    return max(0.0, (accept_length - 1.0) / (SPEC_NUM_DRAFT_TOKENS - 1))


def server_info(engine: SimEngine, port: int) -> dict[str, Any]:
    """The flat server-args dict plus scheduler info and one ``internal_states`` entry.

    As in SGLang, ``api_key`` is among the server arguments in plain text, and
    ``avg_spec_accept_length`` is absent until the first decode log interval completed.
    """
    cfg = engine.config
    max_total = cfg.max_running_requests * KV_TOKENS_PER_SLOT
    curve = engine.batch.curve if engine.batch is not None else None
    if curve is not None and curve.kv_capacity:
        max_total = curve.kv_capacity
    graph = curve.graph_max_bs if curve is not None and curve.graph_max_bs else cfg.max_running_requests
    args: dict[str, Any] = {
        "model_path": cfg.model,
        "tokenizer_path": cfg.model,
        "served_model_name": cfg.served_name,
        "host": cfg.host,
        "port": port,
        "tp_size": 1,
        "dp_size": 1,
        "context_length": cfg.context_length,
        "mem_fraction_static": 0.85,
        "max_running_requests": cfg.max_running_requests,
        "max_queued_requests": cfg.max_queued_requests,
        "chunked_prefill_size": 8192,
        "cuda_graph_max_bs_decode": graph,
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": SPEC_NUM_DRAFT_TOKENS - 1,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": SPEC_NUM_DRAFT_TOKENS,
        "reasoning_parser": cfg.reasoning_parser if cfg.has_reasoning_parser else None,
        "enable_metrics": True,
        "random_seed": cfg.seed,
        "decode_log_interval": cfg.decode_log_interval,
        "api_key": cfg.api_key or None,
    }
    state: dict[str, Any] = {
        **args,
        "last_gen_throughput": engine.gen_throughput(),
        "memory_usage": {"weight": 16.0, "kvcache": 40.0, "token_capacity": max_total, "graph": 1.0},
        "effective_max_running_requests_per_dp": cfg.max_running_requests,
        "world_size": 1,
    }
    accept = engine.avg_spec_accept_length()
    if accept is not None:
        state["avg_spec_accept_length"] = accept
    return {
        **args,
        "status": "ready",  # the scheduler's init info: HTTP answers only once every scheduler is ready
        "max_total_num_tokens": max_total,
        "max_req_input_len": cfg.context_length - 6,
        "startup_time": engine.started_at,
        "internal_states": [state],
        "version": SGLANG_VERSION,
        "frontend": "python",
        "simulator": True,
    }


def model_info(engine: SimEngine) -> dict[str, Any]:
    """``/model_info`` in its 0.5.23 shape."""
    cfg = engine.config
    return {
        "model_path": cfg.model,
        "tokenizer_path": cfg.model,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "served_model_name": cfg.served_name,
        "load_format": "auto",
        "reasoning_parser": cfg.reasoning_parser if cfg.has_reasoning_parser else None,
        "tool_call_parser": None,
        "disaggregation_mode": "null",
    }


def models(engine: SimEngine) -> dict[str, Any]:
    """``/v1/models`` with ``max_model_len``."""
    cfg = engine.config
    card = {
        "id": cfg.served_name,
        "object": "model",
        "created": int(engine.started_at),
        "owned_by": "sglang",
        "root": cfg.served_name,  # as 0.5.23: the served name, not the path
        "parent": None,
        "max_model_len": cfg.context_length,
    }
    return {"object": "list", "data": [card]}


_GAUGE_HELP = {
    "num_running_reqs": "The number of running requests.",
    "num_queue_reqs": "The number of requests in the waiting queue.",
    "gen_throughput": "The generation throughput (token/s).",
    "spec_accept_length": "The average acceptance length of speculative decoding.",
    "spec_accept_rate": "The acceptance rate of speculative decoding.",
    "token_usage": "The token usage.",
    "cache_hit_rate": "The prefix cache hit rate.",
    "max_total_num_tokens": "Maximum total number of tokens.",
    "num_used_tokens": "The number of used tokens.",
    "num_retracted_reqs": "The number of retracted requests.",
}
_COUNTER_HELP = {
    "prompt_tokens_total": ("prompt_tokens", "Number of prefill tokens processed."),
    "generation_tokens_total": ("generation_tokens", "Number of generation tokens processed."),
    "num_requests_total": ("completed", "Number of requests processed."),
    "num_aborted_requests_total": ("aborted", "Number of requests aborted."),
}


#: The labels 0.5.23 adds to the scheduler's gauges, and the counters it splits by streaming
#: (``is_streaming``), with the engine's total of the streamed requests.
_SCHEDULER_LABELS = ',moe_ep_rank="0",pp_rank="0",tp_rank="0"'
_PER_STREAMING = {
    "prompt_tokens_total": "stream_prompt_tokens",
    "generation_tokens_total": "stream_generation_tokens",
    "num_requests_total": "streamed",
}


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _metric(lines: list[str], name: str, kind: str, help_: str, labels: str, value: float) -> None:
    name = "sglang:" + name
    lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {float(value)}"]


def metrics_text(engine: SimEngine) -> str:
    """Prometheus exposition text with the core ``sglang:*`` gauges and counters."""
    cfg = engine.config
    running, waiting = engine.scheduler.counts()
    max_total = cfg.max_running_requests * KV_TOKENS_PER_SLOT
    usage, used, retracted = running / cfg.max_running_requests, 0.0, 0.0
    if engine.batch is not None:  # the slots held by requests still waiting for the cache are queued
        batch = engine.batch.gauges()
        waiting += running - int(batch["running"])
        running = int(batch["running"])
        retracted = batch["retracted_waiting"]
        used = batch["kv_used_tokens"]
        if engine.batch.curve.kv_capacity:
            max_total, usage = engine.batch.curve.kv_capacity, batch["token_usage"]
        else:  # the cache the info endpoints report: max_running_requests x KV_TOKENS_PER_SLOT
            usage = used / max_total
    totals = engine.totals()
    labels = f'engine_type="unified",model_name="{_label_value(cfg.served_name)}"'
    gauges = {
        "num_running_reqs": running,
        "num_queue_reqs": waiting,
        "gen_throughput": engine.gen_throughput(),
        "spec_accept_length": engine.last_spec_accept_length(),
        "spec_accept_rate": _spec_accept_rate(engine.last_spec_accept_length()),
        "token_usage": usage,
        "cache_hit_rate": 0.0,
        "max_total_num_tokens": max_total,
        "num_used_tokens": used,
        "num_retracted_reqs": retracted,
    }
    lines: list[str] = []
    for name, value in gauges.items():
        _metric(lines, name, "gauge", _GAUGE_HELP[name], labels + _SCHEDULER_LABELS, value)
    for name, (key, help_) in _COUNTER_HELP.items():
        if name == "num_aborted_requests_total" and not totals.get(key):
            continue  # SGLang's multiprocess registry shows a counter only once it counted something
        if name not in _PER_STREAMING:
            _metric(lines, name, "counter", help_, labels, totals.get(key, 0))
            continue
        streamed = totals.get(_PER_STREAMING[name], 0)
        values = {"false": totals.get(key, 0) - streamed}
        if totals.get("streamed"):  # a label set shows once something was counted under it
            values["true"] = streamed
        lines += [f"# HELP sglang:{name} {help_}", f"# TYPE sglang:{name} counter"]
        for flag, value in values.items():
            lines.append(f'sglang:{name}{{{labels},is_streaming="{flag}"}} {float(value)}')
    return "\n".join(lines) + "\n"
