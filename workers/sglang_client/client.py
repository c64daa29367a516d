"""The HTTP calls to one SGLang server: :class:`SGLangClient`.

Every call's failures leave as the project's exceptions (:mod:`workers.sglang_client.http_errors`).
The API key (``Authorization: Bearer``) goes with every call except ``/health*``, which SGLang
leaves open so that probes need no secret.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import requests

from dflash_tasks.core.errors import RetryableError
from workers.sglang_client.http_errors import chat_status_error, info_status_error, transport_error
from workers.sglang_client.info import (
    MODEL_INFO_PATHS,
    SERVER_INFO_PATHS,
    ModelInfo,
    ServerIdentity,
    ServerInfo,
    identity_of,
    parse_model_info,
    parse_server_info,
)
from workers.sglang_client.load import ServerLoad, parse_metrics
from workers.sglang_client.replies import Completion, read_chat_reply
from workers.sglang_client.request import CHAT_PATH, ChatRequest
from workers.sglang_client.stream import StreamReader, read_stream
from workers.sglang_client.stream_hub import shared_hub

#: Seconds to wait for a connection (a server that is up accepts at once).
CONNECT_TIMEOUT = 10.0


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

    def chat(self, request: ChatRequest) -> Completion:
        """Send ``request`` and parse the first choice of the answer.

        A continuation (``request.continues``) keeps the whitespace its reasoning starts with: it
        joins the thought where the prefix stopped. With loop detection on (``request.streams``)
        the answer is streamed, and a loop stops it: the connection is closed, which makes the
        server abort the request (:mod:`~workers.sglang_client.stream`); a continuation's
        detector is primed with the thought it continues (``request.primer``). The process's
        :class:`~workers.sglang_client.stream_hub.StreamHub` reads the stream while this thread
        waits (requests' own reading when the hub cannot take the body)."""
        watch = request.watch
        if watch is None or not watch.enabled:
            return read_chat_reply(self._post_chat(request.body()), joins=request.continues)
        resp = self._post_chat(request.body(), stream=True)
        try:
            if resp.status_code != 200:
                raise chat_status_error(resp)
            reader = StreamReader(watch, request.primer, request.primer_tokens)
            if shared_hub().read(resp, reader, self._timeout) is None:
                return read_stream(resp.iter_content(chunk_size=None), reader, request.continues)
            return reader.completion(request.continues)
        except requests.RequestException as exc:  # the connection failed mid-stream
            raise transport_error(exc, "", self._timeout) from exc
        finally:
            resp.close()  # read to its end: back to the pool; stopped early: closed

    def _post_chat(self, body: dict[str, Any], stream: bool = False) -> requests.Response:
        """POST ``body`` to the chat route, whatever the status: the transport's errors translated,
        the status left to the reader; ``stream``: the body is left unread."""
        try:
            return self._session().post(
                f"{self.endpoint}{CHAT_PATH}",
                data=json.dumps(body, ensure_ascii=False).encode(),
                headers=self._headers,
                timeout=(CONNECT_TIMEOUT, self._timeout),
                stream=stream,
            )
        except requests.exceptions.InvalidHeader as exc:
            raise transport_error(exc, "", self._timeout) from None  # its message quotes the key
        except requests.RequestException as exc:
            raise transport_error(exc, "", self._timeout) from exc

    def healthy(self, timeout: float = 30.0) -> bool:
        """Whether ``/health_generate`` answers 200 (a real one-token generation); sent without the key."""
        try:
            resp = self._session().get(f"{self.endpoint}/health_generate", timeout=(5.0, timeout))
        except requests.RequestException:
            return False
        return resp.status_code == 200

    def load(self, timeout: float = 10.0) -> ServerLoad:
        """The scheduler's gauges from ``GET /metrics`` (needs ``--enable-metrics``). Raises
        :class:`RetryableError` when it cannot be read."""
        resp = self._get("/metrics", timeout)
        if resp.status_code != 200:
            raise RetryableError(
                f"{self.endpoint}/metrics: HTTP {resp.status_code} (is --enable-metrics on?)"
            )
        return parse_metrics(resp.text)

    def decode_graph_ceiling(self, timeout: float = 10.0) -> int | None:
        """:attr:`ServerInfo.decode_graph_ceiling`, from ``/server_info``."""
        return self.server_info(timeout).decode_graph_ceiling

    def max_running_requests(self, timeout: float = 10.0) -> int | None:
        """The server's ``max_running_requests`` from ``/server_info``; None when it does not say."""
        return self.server_info(timeout).max_running_requests

    def server_info(self, timeout: float = 10.0) -> ServerInfo:
        """``GET /server_info`` (``/get_server_info`` on releases without it), parsed.

        Raises :class:`RetryableError` when the server cannot answer and :class:`ConfigError`
        when it refuses the API key.
        """
        return parse_server_info(self._info(SERVER_INFO_PATHS, timeout))

    def model_info(self, timeout: float = 10.0) -> ModelInfo:
        """``GET /model_info`` (``/get_model_info`` on releases without it); errors as :meth:`server_info`."""
        return parse_model_info(self._info(MODEL_INFO_PATHS, timeout))

    def model_identity(self, timeout: float = 10.0) -> ServerIdentity:
        """What ``/model_info`` alone says the server serves (no version): one cheap call."""
        return identity_of(self.model_info(timeout), None, self.endpoint)

    def identity(self, timeout: float = 10.0) -> ServerIdentity:
        """The server's :class:`ServerIdentity`, from ``/model_info`` and ``/server_info``.

        Raises :class:`RetryableError` while the server cannot answer (still loading, down) and
        :class:`ConfigError` when it refuses the API key.
        """
        model = self.model_info(timeout)
        return identity_of(model, self.server_info(timeout), self.endpoint)

    def _info(self, paths: tuple[str, str], timeout: float) -> dict[str, Any]:
        """The JSON object an info endpoint answers (its alias once the new path answered 404)."""
        preferred, fallback = paths
        path = self._info_path.get(preferred, preferred)
        resp = self._get(path, timeout)
        if resp.status_code == 404 and path == preferred:  # an old release: only the alias exists
            resp = self._get(fallback, timeout)
            if resp.status_code == 200:
                self._info_path[preferred] = path = fallback
        where = f"{self.endpoint}{path}"
        if resp.status_code != 200:
            raise info_status_error(resp, where)
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise RetryableError(f"{where}: the answer is not a JSON object")
        return body

    def _get(self, path: str, timeout: float) -> requests.Response:
        where = f"{self.endpoint}{path}"
        try:
            return self._session().get(where, headers=self._auth, timeout=(5.0, timeout))
        except requests.exceptions.InvalidHeader as exc:
            raise transport_error(exc, where, timeout) from None  # its message quotes the key
        except requests.RequestException as exc:
            raise transport_error(exc, where, timeout) from exc
