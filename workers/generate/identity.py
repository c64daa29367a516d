"""What the bound SGLang server serves, and the guard that keeps other models' chunks off it.

SGLang ignores a request's ``model`` field, so a worker bound to a server of model B would
happily generate a job of model A. The worker therefore reads its server's identity
(``/model_info``: ``model_path``, ``served_model_name``; ``/server_info``: ``version``) at start,
whenever its server recovers, and every ``identity_seconds``; it consumes only the queues of the
models its server serves (docs/routing.md), and :meth:`ServerModel.check` refuses a chunk of any
other model before a single request is sent, and again before its records are stored (the
server may have been restarted with another model meanwhile).

The identity itself is read by :meth:`workers.sglang_client.SGLangClient.identity`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from dflash_tasks.core.errors import DflashError, ServerUnavailable, WrongModel
from dflash_tasks.core.model_name import serves
from workers.sglang_client import ServerIdentity

log = logging.getLogger(__name__)


def describe(identity: ServerIdentity) -> str:
    """The served name, with the model path when they differ."""
    if identity.served_model_name != identity.model_path:
        return f"{identity.served_model_name!r} ({identity.model_path})"
    return repr(identity.model_path)


class ServerModel:
    """The bound server's identity as last read; tells ``on_change`` when it changes."""

    def __init__(
        self,
        fetch: Callable[[], ServerIdentity],
        on_change: Callable[[ServerIdentity | None, ServerIdentity], None] | None = None,
        quick: Callable[[], ServerIdentity] | None = None,
    ) -> None:
        self._fetch = fetch
        self._quick = quick  # the model alone (``/model_info``), for the check before each store
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
                log.info("server serves model %s (SGLang %s)", describe(identity), identity.version or "?")
            else:
                log.warning("server now serves model %s (was %s)", describe(identity), describe(old))
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
                f"the job is for model {job_model!r}, this worker's server serves {describe(identity)}"
            )

    def confirm(self, job_model: str) -> None:
        """:meth:`check` against a fresh reading (the last one when the server does not answer).

        With ``quick`` (``/model_info`` alone), an unchanged model costs one cheap call; only a
        change reads the whole identity again (``/server_info`` asks SGLang's scheduler).
        """
        current = self._current
        if self._quick is not None and current is not None:
            try:
                seen = self._quick()
            except DflashError:
                seen = None
            if seen is not None and (seen.model_path, seen.served_model_name) == (
                current.model_path,
                current.served_model_name,
            ):
                self.check(job_model)
                return
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
