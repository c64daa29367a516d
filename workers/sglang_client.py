"""The boundary to one SGLang server: chat completions, health and the info endpoints.

The HTTP contract we rely on is written down in ``docs/sglang.md``. Errors are translated here:

* connection errors, timeouts, 5xx, 503 "queue full", invalid JSON, graceful aborts
  → :class:`RetryableError`
* HTTP 400 (prompt longer than the context, invalid sampling values) → :class:`SampleRejected`
* HTTP 401/403 on the info endpoints (a missing or wrong API key) → :class:`ConfigError`

The API key (``Authorization: Bearer``) goes with every call except ``/health*``, which SGLang
leaves open so that probes need no secret.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from dflash_tasks.core.errors import ConfigError, RetryableError, SampleRejected
from dflash_tasks.core.states import ErrorKind

#: The info endpoints: the current name first, then the deprecated alias old releases have.
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
MODEL_INFO_PATHS = ("/model_info", "/get_model_info")

_KEY_HINT = "the server was started with --api-key: set DFLASH_SGLANG_API_KEY to that key"


@dataclass(frozen=True, slots=True)
class MetaInfo:
    """Per-request numbers from ``choices[0].meta_info`` (sent with ``return_meta_info``).

    Field names are SGLang's. Every field is None where the server did not report it: releases
    before 0.5.15 send no ``meta_info``, and the ``spec_*`` keys appear only when speculative
    decoding ran at least one verify pass for the request.
    """

    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None
    spec_accept_rate: float | None = None
    spec_num_correct_drafts: int | None = None
    spec_num_proposed_drafts: int | None = None
    cached_tokens: int | None = None
    num_retractions: int | None = None

    def as_record(self) -> dict[str, int | float | None]:
        """The fields as stored on an output record (each turn's ``meta_info``), in field order."""
        return {name: getattr(self, name) for name in self.__slots__}  # flat: no deep copy as asdict


@dataclass(frozen=True, slots=True)
class Completion:
    """One successful chat completion, with both text fields stripped."""

    reasoning: str
    content: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    meta: MetaInfo | None = None


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


class SGLangClient:
    """A thread-safe client (one HTTP session per thread) for one SGLang endpoint."""

    def __init__(self, endpoint: str, timeout: float = 1800.0, api_key: str = "") -> None:
        self.endpoint = endpoint.rstrip("/")
        self._timeout = timeout
        self._headers = {"Content-Type": "application/json"}
        self._auth: dict[str, str] = {}
        if api_key:
            self._auth["Authorization"] = f"Bearer {api_key}"
            self._headers.update(self._auth)
        self._local = threading.local()
        self._info_path: dict[str, str] = {}  # preferred path -> the one this server answers

    def __repr__(self) -> str:  # never show the key
        return f"SGLangClient({self.endpoint!r}, api_key={'set' if self._auth else 'unset'})"

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            # Proxy and CA settings from the environment, read once: with trust_env on, requests
            # re-reads os.environ and ~/.netrc on every request (a fifth of a request's CPU).
            env = session.merge_environment_settings(self.endpoint, {}, None, None, None)
            session.proxies.update(env["proxies"])
            session.verify = env["verify"]
            session.trust_env = False
            self._local.session = session
        return session

    def chat(self, payload: dict[str, Any]) -> Completion:
        """POST ``/v1/chat/completions`` (non-streaming) and parse the first choice.

        A continuation (``continue_final_message``) keeps the whitespace its reasoning starts with:
        it joins the thought where the prefix stopped."""
        try:
            resp = self._session().post(
                f"{self.endpoint}/v1/chat/completions",
                data=json.dumps(payload, ensure_ascii=False).encode(),
                headers=self._headers,
                timeout=(10.0, self._timeout),
            )
        except requests.Timeout as exc:
            raise RetryableError(f"request timed out after {self._timeout:.0f}s", ErrorKind.TIMEOUT) from exc
        except requests.RequestException as exc:
            raise RetryableError(f"connection error: {_short(exc)}", ErrorKind.CONNECTION) from exc
        if resp.status_code != 200:
            message = error_message(resp)
            if resp.status_code == 400:
                raise SampleRejected(f"HTTP 400: {message}")
            if resp.status_code in (401, 403):
                message += f" ({_KEY_HINT})"
            raise RetryableError(f"HTTP {resp.status_code}: {message}", ErrorKind.of_status(resp.status_code))
        return parse_completion(resp.content, joins=bool(payload.get("continue_final_message")))

    def healthy(self, timeout: float = 30.0) -> bool:
        """Whether ``/health_generate`` answers 200 (a real one-token generation); sent without the key."""
        try:
            resp = self._session().get(f"{self.endpoint}/health_generate", timeout=(5.0, timeout))
        except requests.RequestException:
            return False
        return resp.status_code == 200

    def load(self, timeout: float = 10.0) -> ServerLoad:
        """The scheduler's gauges from ``GET /metrics`` (needs ``--enable-metrics``; sent without
        the key, as SGLang leaves it open). Raises :class:`RetryableError` when it cannot be read."""
        resp = self._get("/metrics", timeout)
        if resp.status_code != 200:
            raise RetryableError(
                f"{self.endpoint}/metrics: HTTP {resp.status_code} (is --enable-metrics on?)"
            )
        return parse_metrics(resp.text)

    def decode_graph_ceiling(self, timeout: float = 10.0) -> int | None:
        """The largest decode batch with a captured graph (``cuda_graph_max_bs_decode``, else
        ``cuda_graph_max_bs``, from ``/server_info``); None when the server does not say."""
        info = self.server_info(timeout)
        for key in ("cuda_graph_max_bs_decode", "cuda_graph_max_bs"):
            value = info.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    def max_running_requests(self, timeout: float = 10.0) -> int | None:
        """The server's ``max_running_requests`` from ``/server_info``; None when it does not say."""
        value = self.server_info(timeout).get("max_running_requests")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        return None

    def server_info(self, timeout: float = 10.0) -> dict[str, Any]:
        """``GET /server_info`` (``/get_server_info`` on releases without it).

        Raises :class:`RetryableError` when the server cannot answer and :class:`ConfigError`
        when it refuses the API key. The body holds the server's arguments, its ``api_key``
        included: never log or store it whole.
        """
        return self._info(SERVER_INFO_PATHS, timeout)

    def model_info(self, timeout: float = 10.0) -> dict[str, Any]:
        """``GET /model_info`` (``/get_model_info`` on releases without it); errors as :meth:`server_info`."""
        return self._info(MODEL_INFO_PATHS, timeout)

    def model_identity(self, timeout: float = 10.0) -> ServerIdentity:
        """What ``/model_info`` alone says the server serves (no version): one cheap call."""
        model = self.model_info(timeout)
        model_path = str(model.get("model_path") or "")
        if not model_path:
            raise RetryableError(f"{self.endpoint} reports no model_path in /model_info")
        return ServerIdentity(model_path, str(model.get("served_model_name") or model_path), "")

    def identity(self, timeout: float = 10.0) -> ServerIdentity:
        """The server's :class:`ServerIdentity`, from ``/model_info`` and ``/server_info``.

        Raises :class:`RetryableError` while the server cannot answer (still loading, down) and
        :class:`ConfigError` when it refuses the API key.
        """
        model = self.model_info(timeout)
        server = self.server_info(timeout)
        model_path = str(model.get("model_path") or server.get("model_path") or "")
        if not model_path:
            raise RetryableError(f"{self.endpoint} reports no model_path in /model_info or /server_info")
        served = str(model.get("served_model_name") or server.get("served_model_name") or model_path)
        return ServerIdentity(model_path, served, str(server.get("version") or ""))

    def _info(self, paths: tuple[str, str], timeout: float) -> dict[str, Any]:
        preferred, fallback = paths
        path = self._info_path.get(preferred, preferred)
        resp = self._get(path, timeout)
        if resp.status_code == 404 and path == preferred:  # an old release: only the alias exists
            resp = self._get(fallback, timeout)
            if resp.status_code == 200:
                self._info_path[preferred] = path = fallback
        where = f"{self.endpoint}{path}"
        if resp.status_code in (401, 403):
            raise ConfigError(f"{where}: HTTP {resp.status_code} {error_message(resp)}; {_KEY_HINT}")
        if resp.status_code != 200:
            raise RetryableError(f"{where}: HTTP {resp.status_code}: {error_message(resp)}")
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise RetryableError(f"{where}: the answer is not a JSON object")
        return body

    def _get(self, path: str, timeout: float) -> requests.Response:
        try:
            return self._session().get(f"{self.endpoint}{path}", headers=self._auth, timeout=(5.0, timeout))
        except requests.RequestException as exc:
            raise RetryableError(f"{self.endpoint}{path}: connection error: {_short(exc)}") from exc


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


def parse_completion(body: bytes, joins: bool = False) -> Completion:
    """Parse a chat completion body; malformed or aborted answers are retryable. ``joins``: the
    answer continues a prefix, so its reasoning keeps its leading whitespace."""
    try:
        doc = json.loads(body)
        choice = doc["choices"][0]
        message = choice.get("message") or {}
        usage = doc.get("usage") or {}
        finish = str(choice.get("finish_reason") or "")
        meta = choice.get("meta_info")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise RetryableError(
            f"invalid response body ({len(body)} bytes): {type(exc).__name__}", ErrorKind.BAD_RESPONSE
        ) from None
    if finish == "abort":
        raise RetryableError("the server aborted the request (finish_reason 'abort')", ErrorKind.ABORT)
    details = usage.get("completion_tokens_details") or {}
    reasoning = message.get("reasoning_content") or ""
    return Completion(
        reasoning=reasoning.rstrip() if joins else reasoning.strip(),
        content=(message.get("content") or "").strip(),
        finish_reason=finish,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        reasoning_tokens=int(usage.get("reasoning_tokens") or details.get("reasoning_tokens") or 0),
        meta=parse_meta_info(meta) if isinstance(meta, dict) else None,
    )


def parse_meta_info(meta: dict[str, Any]) -> MetaInfo:
    """The fields of :class:`MetaInfo` from a ``meta_info`` dict; absent or malformed values are None."""
    return MetaInfo(
        spec_verify_ct=_count(meta.get("spec_verify_ct")),
        spec_accept_length=_real(meta.get("spec_accept_length")),
        spec_accept_rate=_real(meta.get("spec_accept_rate")),
        spec_num_correct_drafts=_count(meta.get("spec_num_correct_drafts")),
        spec_num_proposed_drafts=_count(meta.get("spec_num_proposed_drafts")),
        cached_tokens=_count(meta.get("cached_tokens")),
        num_retractions=_count(meta.get("num_retractions")),
    )


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return int(value) if value >= 0 and float(value).is_integer() else None


def _real(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value) if value >= 0 else None


def error_message(resp: requests.Response) -> str:
    """The server's error message from any of SGLang's error envelopes, else the raw text."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500] or resp.reason or "no message"
    if isinstance(body, dict):
        err = body.get("error")
        if body.get("message"):
            return str(body["message"])
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if err:
            return str(err)
    return str(body)[:500]


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) < 300 else text[:300] + "..."
