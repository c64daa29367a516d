"""One thread sends every running stream's chunks: :class:`StreamPump`.

SGLang streams from one event loop (the tokenizer manager's): a stream costs its server a write
per chunk, not a thread waking up per decode step. So does the simulator: each streamed request's
handler thread hands its stream to the pump and sleeps until it ends; the pump wakes when the
next stream has a step due (or a connection is to be looked at), sends what each due stream
generated since its last write (all of it in one write), and sleeps again.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

#: The shortest sleep between two rounds (s): a round sends every step that came due meanwhile.
ROUND_FLOOR_SECONDS = 0.002
#: The longest sleep between two rounds (s).
ROUND_CEILING_SECONDS = 0.05


class Pumped(Protocol):
    """A stream the pump serves."""

    #: When the stream next needs a turn (``time.monotonic()``).
    wake_at: float

    def turn(self) -> bool:
        """Send what is due; True once the stream is over (then it is dropped)."""
        ...


class _Entry:
    __slots__ = ("done", "error", "stream")

    def __init__(self, stream: Pumped) -> None:
        self.stream = stream
        self.done = threading.Event()
        self.error: BaseException | None = None


class StreamPump:
    """The simulator's streaming thread, started at the first stream; ends when ``stopping`` is set."""

    def __init__(self, stopping: threading.Event) -> None:
        self._stopping = stopping
        self._lock = threading.Lock()
        self._incoming: list[_Entry] = []
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def serve(self, stream: Pumped) -> bool:
        """Serve ``stream`` until it is over (True) or the simulator stops (False). Raises what its
        :meth:`Pumped.turn` raised."""
        entry = _Entry(stream)
        with self._lock:
            if self._stopping.is_set():
                return False
            self._incoming.append(entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sim-stream-pump", daemon=True)
                self._thread.start()
        self._wake.set()
        entry.done.wait()
        if entry.error is not None:
            raise entry.error
        return not self._stopping.is_set()

    def _run(self) -> None:
        active: list[_Entry] = []
        try:
            while not self._stopping.is_set():
                with self._lock:
                    active += self._incoming
                    self._incoming = []
                now = time.monotonic()
                next_round = now + ROUND_CEILING_SECONDS
                still: list[_Entry] = []
                for entry in active:
                    if entry.stream.wake_at <= now and self._turn(entry):
                        continue
                    still.append(entry)
                    next_round = min(next_round, entry.stream.wake_at)
                active = still
                pause = max(next_round - time.monotonic(), ROUND_FLOOR_SECONDS)
                if self._wake.wait(pause):
                    self._wake.clear()
        finally:
            with self._lock:
                active += self._incoming
                self._incoming = []
            for entry in active:
                entry.done.set()

    @staticmethod
    def _turn(entry: _Entry) -> bool:
        """Give the stream its turn; True when it is over (its waiting thread is woken)."""
        try:
            over = entry.stream.turn()
        except BaseException as exc:  # the stream's thread raises it
            entry.error, over = exc, True
        if over:
            entry.done.set()
        return over
