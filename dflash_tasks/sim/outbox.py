"""A streamed body on its way to the client, never blocking the pump: :class:`Outbox`.

The pump (:mod:`~dflash_tasks.sim.pump`) writes every stream's chunks from one thread, so no write
may wait for a client: what the connection's socket does not take at once waits in the stream's
outbox and goes out at its next tries. A client that takes no byte for ``stall_seconds`` while
some wait, or lets more than ``limit`` bytes wait, has stopped reading (:class:`ClientStalled`):
the stream treats it as gone.
"""

from __future__ import annotations

import select
import socket
import time

#: The most bytes a stream's client may leave waiting before it is dropped.
BACKLOG_BYTES = 4 * 1024 * 1024


class ClientStalled(ConnectionError):
    """The client stopped reading its stream."""


class Outbox:
    """The bytes of one streamed body still to send on ``sock`` (a socket without a timeout).

    Once a send failed (the client is gone or stalled) every later call raises that error."""

    def __init__(self, sock: socket.socket, stall_seconds: float, limit: int = BACKLOG_BYTES) -> None:
        self._sock, self._stall, self._limit = sock, stall_seconds, limit
        self._waiting = bytearray()
        self._moved = time.monotonic()  # when the client last took bytes, or bytes began to wait
        self._failed: OSError | None = None

    def put(self, data: bytes) -> bool:
        """Send ``data`` after what waits, as far as the socket takes it now; True once nothing
        waits. Raises ``OSError`` when the client is gone, :class:`ClientStalled` when it stopped
        reading."""
        if self._waiting or self._failed is not None:
            self._waiting += data
            return self.flush()
        sent = self._send(data)
        if sent < len(data):
            self._waiting += memoryview(data)[sent:]
            self._moved = time.monotonic()
            return False
        return True

    def flush(self) -> bool:
        """Send what waits, as far as the socket takes it now; True once nothing waits. Raises as
        :meth:`put`."""
        while self._waiting:
            sent = self._send(self._waiting)
            if not sent:
                break
            del self._waiting[:sent]
            self._moved = time.monotonic()
        if not self._waiting:
            return True
        if len(self._waiting) > self._limit:
            self._failed = ClientStalled(f"{len(self._waiting)} bytes wait for the client")
        elif time.monotonic() - self._moved > self._stall:
            self._failed = ClientStalled(f"the client took no byte in {self._stall:g} s")
        if self._failed is not None:
            raise self._failed
        return False

    def drain(self) -> None:
        """Send all that waits, waiting for the socket (a request's own thread, not the pump's);
        raises as :meth:`put`."""
        while not self.flush():
            select.select([], [self._sock], [], self._stall)

    def _send(self, data: bytes | bytearray) -> int:
        """The bytes of ``data`` the socket took now (0 when its buffer is full)."""
        if self._failed is not None:
            raise self._failed
        try:
            return self._sock.send(data, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            self._failed = exc
            raise
