"""The server's load right now, from ``GET /metrics``: :class:`ServerLoad`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from dflash_tasks.core.errors import RetryableError


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """What the server's scheduler reports right now (SGLang's ``sglang:*`` names, summed over ranks)."""

    running: float = 0.0  # sglang:num_running_reqs
    queued: float = 0.0  # sglang:num_queue_reqs
    retracted: float = 0.0  # sglang:num_retracted_reqs
    token_usage: float = 0.0  # sglang:token_usage (the highest rank's)
    gen_throughput: float = 0.0  # sglang:gen_throughput, tokens/s over the last log interval
    generation_tokens: float = 0.0  # sglang:generation_tokens_total
    accept_length: float = 0.0  # sglang:spec_accept_length (0 without speculative decoding)


_LOAD_FIELDS = {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "queued",
    "sglang:num_retracted_reqs": "retracted",
    "sglang:token_usage": "token_usage",
    "sglang:gen_throughput": "gen_throughput",
    "sglang:generation_tokens_total": "generation_tokens",
    "sglang:spec_accept_length": "accept_length",
}
_MAX_FIELDS = frozenset({"token_usage", "accept_length"})


def parse_metrics(text: str) -> ServerLoad:
    """A :class:`ServerLoad` from Prometheus exposition text; unknown and missing names are skipped."""
    values: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise RetryableError(f"/metrics is not Prometheus text: {exc}") from exc
    for family in families:
        for sample in family.samples:
            name = _LOAD_FIELDS.get(sample.name)
            if name is None or not math.isfinite(sample.value):
                continue
            if name in _MAX_FIELDS:
                values[name] = max(values.get(name, 0.0), sample.value)
            else:
                values[name] = values.get(name, 0.0) + sample.value
    return ServerLoad(**values)
