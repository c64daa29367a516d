"""What the info endpoints say, parsed: ``/model_info``, ``/server_info`` and the server's identity
(``docs/sglang.md``, "Server identity").

``/server_info`` holds every server argument, the ``api_key`` in plain text among them: only the
fields below are kept, the body itself never leaves :func:`parse_server_info`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dflash_tasks.core.errors import RetryableError

#: The info endpoints: the current name first, then the deprecated alias old releases have.
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
MODEL_INFO_PATHS = ("/model_info", "/get_model_info")


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """``/model_info``: the ``--model-path`` the server loaded and its ``--served-model-name``
    (``""`` where the server does not say)."""

    model_path: str = ""
    served_model_name: str = ""


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """``/server_info``: the fields we read (None or ``""`` where the server does not say).

    ``decode_graph_ceiling`` is the largest decode batch with a captured graph
    (``cuda_graph_max_bs_decode``, else ``cuda_graph_max_bs``). ``lifetime_accept_length`` is the
    mean of ``avg_spec_accept_length`` over the DP ranks (``internal_states``; some releases put
    it at the top level): the server's figure over its whole life, absent before its first decode
    log interval, the fallback when samples carry no per-request stats.
    """

    model_path: str = ""
    served_model_name: str = ""
    version: str = ""
    max_running_requests: int | None = None
    decode_graph_ceiling: int | None = None
    lifetime_accept_length: float | None = None


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """What a server says it serves: from ``/model_info`` and ``/server_info``.

    ``model_path`` is the ``--model-path`` the server loaded (a local directory or a hub id),
    ``served_model_name`` its ``--served-model-name`` (SGLang defaults it to the model path), and
    ``version`` the SGLang release (``""`` when the server does not say). SGLang ignores the
    ``model`` field of a request, so this is the only trustworthy answer to "which model
    generated this sample".
    """

    model_path: str
    served_model_name: str
    version: str

    def as_record(self) -> dict[str, str]:
        """The fields as stored on an output record (its ``server``), in field order."""
        return {name: getattr(self, name) for name in self.__slots__}


def parse_model_info(doc: Mapping[str, Any]) -> ModelInfo:
    return ModelInfo(_text(doc.get("model_path")), _text(doc.get("served_model_name")))


def parse_server_info(doc: Mapping[str, Any]) -> ServerInfo:
    return ServerInfo(
        model_path=_text(doc.get("model_path")),
        served_model_name=_text(doc.get("served_model_name")),
        version=_text(doc.get("version")),
        max_running_requests=_positive_int(doc.get("max_running_requests")),
        decode_graph_ceiling=_positive_int(doc.get("cuda_graph_max_bs_decode"))
        or _positive_int(doc.get("cuda_graph_max_bs")),
        lifetime_accept_length=_mean_accept_length(doc),
    )


def identity_of(model: ModelInfo, server: ServerInfo | None, endpoint: str) -> ServerIdentity:
    """The identity ``model`` states (the version from ``server``; with ``server``, its fields fill
    what ``model`` leaves out). :class:`RetryableError` when neither names a model path."""
    fallback = server or ServerInfo()
    model_path = model.model_path or fallback.model_path
    if not model_path:
        asked = "/model_info or /server_info" if server is not None else "/model_info"
        raise RetryableError(f"{endpoint} reports no model_path in {asked}")
    served = model.served_model_name or fallback.served_model_name or model_path
    return ServerIdentity(model_path, served, fallback.version)


def _mean_accept_length(doc: Mapping[str, Any]) -> float | None:
    states = doc.get("internal_states")
    values: list[float] = []
    if isinstance(states, list):
        for state in states:
            value = _positive_real(state.get("avg_spec_accept_length")) if isinstance(state, dict) else None
            if value is not None:
                values.append(value)
    top = _positive_real(doc.get("avg_spec_accept_length"))
    if not values and top is not None:
        values.append(top)
    return sum(values) / len(values) if values else None


def _text(value: Any) -> str:
    return str(value) if value else ""


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _positive_real(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value) if value > 0 else None
