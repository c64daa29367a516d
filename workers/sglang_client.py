"""The boundary to one SGLang server: chat completions and health, per the HTTP contract.

Errors are translated here (see ../shared/reference/sglang-http-api.md §4):

* connection errors, timeouts, 5xx, 503 "queue full", invalid JSON, graceful aborts
  → :class:`RetryableError`
* HTTP 400 (prompt longer than the context, invalid sampling values) → :class:`SampleRejected`
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import requests

from dflash_tasks.core.errors import RetryableError, SampleRejected


@dataclass(frozen=True, slots=True)
class Completion:
    """One successful chat completion, with both text fields stripped."""

    reasoning: str
    content: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int


class SGLangClient:
    """A thread-safe client (one HTTP session per thread) for one SGLang endpoint."""

    def __init__(self, endpoint: str, timeout: float = 1800.0, api_key: str = "") -> None:
        self.endpoint = endpoint.rstrip("/")
        self._timeout = timeout
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._local = threading.local()

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
        """POST ``/v1/chat/completions`` (non-streaming) and parse the first choice."""
        try:
            resp = self._session().post(
                f"{self.endpoint}/v1/chat/completions",
                data=json.dumps(payload, ensure_ascii=False).encode(),
                headers=self._headers,
                timeout=(10.0, self._timeout),
            )
        except requests.Timeout as exc:
            raise RetryableError(f"request timed out after {self._timeout:.0f}s") from exc
        except requests.RequestException as exc:
            raise RetryableError(f"connection error: {_short(exc)}") from exc
        if resp.status_code != 200:
            message = error_message(resp)
            if resp.status_code == 400:
                raise SampleRejected(f"HTTP 400: {message}")
            raise RetryableError(f"HTTP {resp.status_code}: {message}")
        return parse_completion(resp.content)

    def healthy(self, timeout: float = 30.0) -> bool:
        """Whether ``/health_generate`` answers 200 (a real one-token generation)."""
        try:
            resp = self._session().get(f"{self.endpoint}/health_generate", timeout=(5.0, timeout))
        except requests.RequestException:
            return False
        return resp.status_code == 200

    def server_info(self, timeout: float = 10.0) -> dict[str, Any]:
        """``/get_server_info`` (present in every SGLang version), or {} when unavailable."""
        try:
            resp = self._session().get(f"{self.endpoint}/get_server_info", timeout=(5.0, timeout))
            info = resp.json() if resp.status_code == 200 else {}
        except (requests.RequestException, ValueError):
            return {}
        return info if isinstance(info, dict) else {}


def parse_completion(body: bytes) -> Completion:
    """Parse a chat completion body; malformed or aborted answers are retryable."""
    try:
        doc = json.loads(body)
        choice = doc["choices"][0]
        message = choice.get("message") or {}
        usage = doc.get("usage") or {}
        finish = str(choice.get("finish_reason") or "")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise RetryableError(f"invalid response body ({len(body)} bytes): {type(exc).__name__}") from None
    if finish == "abort":
        raise RetryableError("the server aborted the request (finish_reason 'abort')")
    details = usage.get("completion_tokens_details") or {}
    return Completion(
        reasoning=(message.get("reasoning_content") or "").strip(),
        content=(message.get("content") or "").strip(),
        finish_reason=finish,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        reasoning_tokens=int(usage.get("reasoning_tokens") or details.get("reasoning_tokens") or 0),
    )


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
