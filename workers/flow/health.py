"""The health gate: a worker whose server is down stops taking chunks until it is healthy again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class HealthGate:
    """Tracks whether the bound server is usable; pauses and resumes consumption around outages."""

    def __init__(
        self,
        probe: Callable[[], bool],
        poll_seconds: float,
        on_down: Callable[[], None],
        on_up: Callable[[], None],
    ) -> None:
        self._probe = probe
        self._poll = poll_seconds
        self._on_down = on_down
        self._on_up = on_up
        self._healthy = True
        self._lock = threading.Lock()
        self._stop = threading.Event()

    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def poll_seconds(self) -> float:
        """How often a server that is down is probed (s)."""
        return self._poll

    def check_now(self) -> bool:
        """Probe once; a failed probe marks the server down."""
        if self._probe():
            return True
        self.mark_down("health probe failed")
        return False

    def mark_down(self, reason: str) -> None:
        """Stop consuming and poll the server until it answers again."""
        with self._lock:
            if not self._healthy:
                return
            self._healthy = False
        log.warning("server unhealthy (%s): pausing this worker's consumption", reason)
        try:
            self._on_down()
        finally:
            threading.Thread(target=self._wait_for_recovery, name="dflash-health", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _wait_for_recovery(self) -> None:
        while not self._stop.wait(self._poll):
            try:
                if not self._probe():
                    continue
                self._on_up()  # healthy only once consumption really resumed
            except Exception:
                log.exception("resuming consumption failed; retrying")
                continue
            with self._lock:
                self._healthy = True
            log.warning("server healthy again: resuming consumption")
            return
