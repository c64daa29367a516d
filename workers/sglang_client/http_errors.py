"""Every way an SGLang call fails, as the project's exceptions (``core/errors.py``).

=====================================================  =================================================
what happened                                          raised
=====================================================  =================================================
connection refused or reset, a timeout (a streamed      :class:`RetryableError` (``CONNECTION``, ``TIMEOUT``)
body's read included)
a malformed endpoint URL, an API key that is not a     :class:`ConfigError`: retrying cannot help
valid header value
chat: HTTP 400 (a prompt past the context, a bad       :class:`SampleRejected`: this sample only
sampling value)
chat: any other status (5xx, 503 "queue full", 401)    :class:`RetryableError` (401/403 with the key hint)
a streamed chat's ``data: {"error": ...}`` event        as the chat status its ``code`` names (key hint too)
info endpoints: HTTP 401/403 (a missing or wrong key)  :class:`ConfigError`
info endpoints, ``/metrics``: any other status          :class:`RetryableError`
a body that is not what the route answers              :class:`RetryableError` (``BAD_RESPONSE`` on chat)
=====================================================  =================================================
"""

from __future__ import annotations

import requests
import urllib3

from dflash_tasks.core.errors import ConfigError, DflashError, RetryableError, SampleRejected
from dflash_tasks.core.states import ErrorKind

KEY_HINT = "the server was started with --api-key: set DFLASH_SGLANG_API_KEY to that key"

_BAD_URL = (
    requests.exceptions.InvalidURL,
    requests.exceptions.MissingSchema,
    requests.exceptions.InvalidSchema,
)


def transport_error(exc: requests.RequestException, where: str, timeout: float) -> DflashError:
    """The error for a call that got no HTTP answer; ``where`` prefixes the message when given.

    An invalid header can only be the API key: its value (which requests' message quotes) is
    never repeated, and the caller raises the result ``from None``.
    """
    prefix = f"{where}: " if where else ""
    if isinstance(exc, requests.exceptions.InvalidHeader):
        return ConfigError(
            f"{prefix}the API key is not a valid HTTP header value (check DFLASH_SGLANG_API_KEY)"
        )
    if isinstance(exc, _BAD_URL):
        return ConfigError(f"{prefix}not a usable URL: {_short(exc)}")
    if isinstance(exc, requests.Timeout) or _read_timeout(exc):
        return RetryableError(f"{prefix}request timed out after {timeout:.0f}s", ErrorKind.TIMEOUT)
    return RetryableError(f"{prefix}connection error: {_short(exc)}", ErrorKind.CONNECTION)


def chat_status_error(resp: requests.Response) -> DflashError:
    """The error for a chat answer whose status is not 200."""
    return status_error(resp.status_code, error_message(resp), streamed=False)


def stream_error(error: object) -> DflashError:
    """The error for a streamed chat's error event (``data: {"error": {...}}``, sent with status
    200 once the stream began): as the HTTP status its ``code`` names, retryable without one."""
    body = error if isinstance(error, dict) else {}
    message = str(body.get("message") or error)[:500]
    code = body.get("code")
    if not isinstance(code, int) or isinstance(code, bool) or not 400 <= code < 600:
        return RetryableError(f"stream error: {message}", ErrorKind.OTHER)
    return status_error(code, message, streamed=True)


def status_error(status: int, message: str, streamed: bool) -> DflashError:
    """The error for a chat that failed with HTTP ``status``, answered as such or named by a
    stream's error event (``streamed``): 400 rejects the sample, any other is retried, 401/403
    with the key hint."""
    what = f"HTTP {status}" + (" (stream)" if streamed else "")
    if status == 400:
        return SampleRejected(f"{what}: {message}")
    if status in (401, 403):
        message += f" ({KEY_HINT})"
    return RetryableError(f"{what}: {message}", ErrorKind.of_status(status))


def info_status_error(resp: requests.Response, where: str) -> DflashError:
    """The error for an info endpoint's answer whose status is not 200."""
    if resp.status_code in (401, 403):
        return ConfigError(f"{where}: HTTP {resp.status_code} {error_message(resp)}; {KEY_HINT}")
    return RetryableError(f"{where}: HTTP {resp.status_code}: {error_message(resp)}")


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


def _read_timeout(exc: requests.RequestException) -> bool:
    """Whether ``exc`` is a read that timed out while a streamed body was read: ``iter_content``
    raises urllib3's read timeout as a ``requests.ConnectionError``."""
    return isinstance(exc, requests.ConnectionError) and any(
        isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args
    )


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) < 300 else text[:300] + "..."
