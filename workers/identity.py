"""What the bound SGLang server serves, and the guard that keeps other models' chunks off it.

SGLang ignores a request's ``model`` field, so a worker bound to a server of model B would
happily generate a job of model A. The worker therefore reads its server's identity
(``/model_info``: ``model_path``, ``served_model_name``; ``/server_info``: ``version``) at start,
whenever its server recovers, and every ``identity_seconds``; it consumes only the queues of the
models its server serves (docs/routing.md), and :meth:`ServerModel.check` refuses a chunk of any
other model before a single request is sent, and again before its records are stored (the
server may have been restarted with another model meanwhile).

:func:`fetch_identity` is a small local reader, to be merged with ``SGLangClient.identity()``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import requests

from dflash_tasks.core.errors import DflashError, RetryableError, ServerUnavailable, WrongModel
from dflash_tasks.core.model_name import serves

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """The model a server serves, as it reports it, and its SGLang version ("" if not reported)."""

    model_path: str
    served_model_name: str
    version: str = ""

    def describe(self) -> str:
        if self.served_model_name != self.model_path:
            return f"{self.served_model_name!r} ({self.model_path})"
        return repr(self.model_path)


def fetch_identity(endpoint: str, api_key: str = "", timeout: float = 10.0) -> ServerIdentity:
    """Read the server's identity: ``/model_info`` (``/get_model_info`` on old releases), then
    ``/server_info`` (``/get_server_info``) for the version. Raises :class:`RetryableError`."""
    base = endpoint.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    info = _get_json(base, ("/model_info", "/get_model_info"), headers, timeout)
    model_path = str(info.get("model_path") or "")
    if not model_path:
        raise RetryableError(f"{base}/model_info reported no model_path")
    served = str(info.get("served_model_name") or model_path)
    try:
        version = str(
            _get_json(base, ("/server_info", "/get_server_info"), headers, timeout).get("version") or ""
        )
    except RetryableError as exc:  # the version is for the records only
        log.debug("no SGLang version from %s: %s", base, exc)
        version = ""
    return ServerIdentity(model_path, served, version)


def _get_json(base: str, paths: Sequence[str], headers: dict[str, str], timeout: float) -> dict[str, Any]:
    """GET the first of ``paths`` the server has (404: try the next)."""
    for path in paths:
        try:
            resp = requests.get(base + path, headers=headers, timeout=(5.0, timeout))
        except requests.RequestException as exc:
            raise RetryableError(f"cannot reach {base}{path}: {type(exc).__name__}") from None
        if resp.status_code == 404:
            continue
        if resp.status_code in (401, 403):
            raise RetryableError(
                f"{base}{path}: HTTP {resp.status_code}: the server was started with --api-key; "
                "give the worker the same key (DFLASH_SGLANG_API_KEY)"
            )
        if resp.status_code != 200:
            raise RetryableError(f"{base}{path}: HTTP {resp.status_code}")
        try:
            doc = resp.json()
        except ValueError:
            raise RetryableError(f"{base}{path}: the answer is not JSON") from None
        if not isinstance(doc, dict):
            raise RetryableError(f"{base}{path}: the answer is not a JSON object")
        return doc
    raise RetryableError(f"{base} serves none of {', '.join(paths)}")


class ServerModel:
    """The bound server's identity as last read; tells ``on_change`` when it changes."""

    def __init__(
        self,
        fetch: Callable[[], ServerIdentity],
        on_change: Callable[[ServerIdentity | None, ServerIdentity], None] | None = None,
    ) -> None:
        self._fetch = fetch
        self._on_change = on_change
        self._current: ServerIdentity | None = None
        self._lock = threading.Lock()
        self._last_error = ""
        self._stop = threading.Event()

    @property
    def current(self) -> ServerIdentity | None:
        return self._current

    def refresh(self) -> ServerIdentity:
        """Read the identity now; raises :class:`RetryableError` when the server does not say."""
        identity = self._fetch()
        with self._lock:
            old, self._current = self._current, identity
            self._last_error = ""
        if identity != old:
            if old is None:
                log.info("server serves model %s (SGLang %s)", identity.describe(), identity.version or "?")
            else:
                log.warning("server now serves model %s (was %s)", identity.describe(), old.describe())
            if self._on_change is not None:
                self._on_change(old, identity)
        return identity

    def try_refresh(self) -> ServerIdentity | None:
        """:meth:`refresh`, or None (logged once per distinct error) when the server does not say."""
        try:
            return self.refresh()
        except DflashError as exc:
            if str(exc) != self._last_error:
                self._last_error = str(exc)
                log.warning("cannot read the server's model: %s", exc)
            return None

    def check(self, job_model: str) -> None:
        """Raise :class:`WrongModel` unless the server serves ``job_model`` (the rule in
        :mod:`dflash_tasks.core.model_name`), :class:`ServerUnavailable` while its model is unknown."""
        identity = self._current
        if identity is None:
            raise ServerUnavailable("the server's model is not known yet (no answer from /model_info)")
        if not serves(job_model, identity.served_model_name, identity.model_path):
            raise WrongModel(
                f"the job is for model {job_model!r}, this worker's server serves {identity.describe()}"
            )

    def confirm(self, job_model: str) -> None:
        """:meth:`check` against a fresh reading (the last one when the server does not answer)."""
        self.try_refresh()
        self.check(job_model)

    def start(self, interval: float, when: Callable[[], bool]) -> None:
        """Re-read the identity every ``interval`` seconds while ``when()`` (e.g. the server is healthy)."""

        def run() -> None:
            while not self._stop.wait(interval):
                try:
                    if when():
                        self.try_refresh()
                except Exception:
                    log.exception("server identity poll crashed; continuing")

        threading.Thread(target=run, name="dflash-identity", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
