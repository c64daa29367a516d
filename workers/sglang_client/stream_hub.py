"""One thread reads every streamed answer of the process: :class:`StreamHub`.

A streamed answer read by its own thread through requests' ``iter_content`` costs a wake-up, a
blocking ``recv`` and several layers of generators per chunk, in each of the hundreds of threads
a worker keeps in flight: the GIL hands over for every chunk. The hub takes the answer's socket
over once its headers are read (:meth:`StreamHub.read`), watches all of them with one selector,
reads what arrived every few milliseconds (:data:`GATHER_SECONDS`: a round gathers many chunks),
decodes the chunked coding (:mod:`~workers.sglang_client.chunked`) and feeds each
:class:`~workers.sglang_client.stream.StreamReader` there. The caller's thread sleeps until its
answer ended, looped, broke or timed out; it then gives the connection back to its pool (read to
its end) or closes it (stopped early: the server aborts the request). A caller that leaves its wait
early (an exception: a time limit, an interrupt) has the hub let go of its socket before closing
it; one closed under the hub all the same is dropped at the next scan, or when the next connection
gets its descriptor's number.

Only a plain HTTP/1.1 chunked body whose bytes nobody read yet is taken over; anything else
(TLS, a compressed or sized body) is read the usual way (:meth:`StreamHub.read` answers None).
The hub belongs to the process that made it: a forked child (a Celery prefork worker) gets its own.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import selectors
import socket
import ssl
import threading
import time
from typing import Any

import requests

from dflash_tasks.core.errors import DflashError, RetryableError
from dflash_tasks.core.states import ErrorKind
from workers.sglang_client.chunked import ChunkedBody, ChunkedError
from workers.sglang_client.stream import StreamReader

#: Pause after each read round, so the next one gathers the chunks that arrived meanwhile.
GATHER_SECONDS = 0.002
#: How often the deadlines of the answers are looked at (s).
TIMEOUT_SCAN_SECONDS = 0.2
#: How long a caller leaving early waits for the hub to let its socket go (s).
LEAVE_SECONDS = 1.0
_READ_SIZE = 256 * 1024


class _Answer:
    """One streamed answer the hub reads for a waiting caller."""

    __slots__ = ("body", "deadline", "done", "error", "fd", "reader", "sock", "timeout", "whole")

    def __init__(self, sock: socket.socket, reader: StreamReader, timeout: float) -> None:
        self.sock, self.reader, self.timeout = sock, reader, timeout
        self.body = ChunkedBody()
        self.deadline = time.monotonic() + timeout
        self.done = threading.Event()  # set once the hub no longer watches the socket
        self.error: DflashError | None = None
        self.fd = -1  # the descriptor the hub registered (the socket's own is -1 once closed)
        self.whole = False  # the body was read to its end: the connection can be used again

    def take(self, data: bytes) -> bool:
        """Feed bytes of the body; True once the answer needs no more (ended, looped or broken)."""
        self.deadline = time.monotonic() + self.timeout
        try:
            for piece in self.body.feed(data):
                if self.reader.feed(piece):
                    return True  # a loop: the caller closes the connection
        except ChunkedError as exc:
            self.error = RetryableError(f"invalid chunked stream: {exc}", ErrorKind.BAD_RESPONSE)
            return True
        except DflashError as exc:
            self.error = exc
            return True
        except Exception as exc:  # the reader's own failure must not end the hub
            self.error = RetryableError(f"reading the stream failed: {type(exc).__name__}: {exc}")
            return True
        self.whole = self.body.ended
        return self.whole

    def cut(self) -> None:
        """The server closed the connection before the body's end."""
        self.error = RetryableError(
            "connection error: the server closed the stream before its end", ErrorKind.CONNECTION
        )


class StreamHub:
    """The selector thread reading streamed answers; :func:`shared_hub` gives the process's one."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._incoming: list[_Answer] = []
        self._leaving: list[_Answer] = []  # answers whose callers left before their end
        self._answers: dict[int, _Answer] = {}  # registered fd -> answer being read
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sglang-streams", daemon=True)
        self._thread.start()

    def read(self, resp: requests.Response, reader: StreamReader, timeout: float) -> bool | None:
        """Read the streamed body of ``resp`` into ``reader`` until it ends or ``reader`` sees a
        loop; ``timeout``: the longest silence (s). True when the connection went back to its pool,
        False when it was closed; None when the hub cannot take the body (nothing was read then).
        Raises what the reader raises, :class:`RetryableError` for a broken or silent stream."""
        try:
            taken = _take_over(resp)
        except OSError as exc:  # reset while the bytes already waiting were read
            raise RetryableError(f"connection error: {exc}", ErrorKind.CONNECTION) from exc
        if taken is None:
            return None
        sock, buffered, sock_timeout = taken
        answer = _Answer(sock, reader, timeout)
        if not (buffered and answer.take(buffered)):
            with self._lock:
                failed = self._failed
                if failed is None:
                    self._incoming.append(answer)
            if failed is not None:
                answer.error = RetryableError(f"the stream reader failed: {failed}")
            else:
                self._wake()
                try:
                    answer.done.wait()
                except BaseException:  # a signal's exception (a time limit): the socket is closed next
                    self._leave(answer)
                    raise
        if answer.error is None and answer.whole:
            _give_back(resp, sock, sock_timeout)
            return True
        resp.close()
        if answer.error is not None:
            raise answer.error
        return False

    def _leave(self, answer: _Answer) -> None:
        """Take ``answer`` back from the hub before its caller closes the socket."""
        with self._lock:
            if answer in self._incoming:
                self._incoming.remove(answer)
                return
            if self._failed is not None or answer.done.is_set():
                return
            self._leaving.append(answer)
        self._wake()
        answer.done.wait(LEAVE_SECONDS)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a wake-up is already pending, or the hub failed
            self._wake_w.send(b"\0")

    def _run(self) -> None:
        try:
            last_scan = time.monotonic()
            while True:
                for key, _ in self._selector.select(TIMEOUT_SCAN_SECONDS):
                    if key.data is None:
                        self._adopt()
                    else:
                        self._read_ready(key.data)
                now = time.monotonic()
                if now - last_scan >= TIMEOUT_SCAN_SECONDS:
                    last_scan = now
                    self._expire(now)
                time.sleep(GATHER_SECONDS)
        except BaseException as exc:  # every waiting caller must hear of it
            with self._lock:
                self._failed = exc
                waiting = [*self._answers.values(), *self._incoming, *self._leaving]
                self._answers.clear()
                self._incoming.clear()
                self._leaving.clear()
            for answer in waiting:
                answer.error = RetryableError(f"the stream reader failed: {type(exc).__name__}: {exc}")
                answer.done.set()
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _adopt(self) -> None:
        """Register the answers handed in since the last round, let go of those left."""
        while True:
            try:
                if not self._wake_r.recv(4096):
                    break
            except BlockingIOError:
                break
        with self._lock:
            incoming, self._incoming = self._incoming, []
            leaving, self._leaving = self._leaving, []
        for answer in leaving:
            self._finish(answer)
        for answer in incoming:
            self._register(answer)

    def _register(self, answer: _Answer) -> None:
        fd = answer.sock.fileno()
        stale = self._answers.get(fd)
        if stale is not None:  # its caller closed the socket under the hub: the number is reused
            self._finish(stale)
        try:
            self._selector.register(answer.sock, selectors.EVENT_READ, answer)
        except (KeyError, ValueError, OSError) as exc:
            answer.error = RetryableError(f"connection error: {exc}", ErrorKind.CONNECTION)
            answer.done.set()
            return
        answer.fd = fd
        self._answers[fd] = answer

    def _read_ready(self, answer: _Answer) -> None:
        if self._answers.get(answer.fd) is not answer:  # let go of earlier in this round
            return
        try:
            data = answer.sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            answer.error = RetryableError(f"connection error: {exc}", ErrorKind.CONNECTION)
            self._finish(answer)
            return
        if not data:
            answer.cut()
            self._finish(answer)
        elif answer.take(data):
            self._finish(answer)

    def _expire(self, now: float) -> None:
        """Fail the answers silent past their timeout; drop those whose socket was closed."""
        for answer in list(self._answers.values()):
            if answer.sock.fileno() < 0:  # its caller left and closed it under the hub
                self._finish(answer)
            elif answer.deadline <= now:
                answer.error = RetryableError(
                    f"request timed out after {answer.timeout:.0f}s (no data)", ErrorKind.TIMEOUT
                )
                self._finish(answer)

    def _finish(self, answer: _Answer) -> None:
        """Stop watching ``answer`` (by the descriptor it was registered with) and wake its caller."""
        if self._answers.get(answer.fd) is answer:
            del self._answers[answer.fd]
            self._selector.unregister(answer.fd)  # a closed descriptor's epoll entry is gone: no error
        answer.done.set()


def _take_over(resp: requests.Response) -> tuple[socket.socket, bytes, float | None] | None:
    """The socket of ``resp`` made non-blocking, the body bytes already buffered and the socket's
    timeout before, when the body is plain chunked HTTP/1.1 nobody read yet; None otherwise
    (``resp`` untouched). Raises ``OSError`` when the connection broke."""
    raw: Any = resp.raw
    original = getattr(raw, "_fp", None)
    conn = getattr(raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    if (
        not isinstance(original, http.client.HTTPResponse)
        or not original.chunked
        or original.chunk_left is not None
        or original.fp is None
        or getattr(raw, "_fp_bytes_read", 1) != 0
        or resp.headers.get("Content-Encoding", "identity").lower() != "identity"
        or not isinstance(sock, socket.socket)
        or isinstance(sock, ssl.SSLSocket)
    ):
        return None
    sock_timeout = sock.gettimeout()
    sock.setblocking(False)
    pieces = []
    # the bytes read with the headers, then what waits on the socket; b"" (or None) when nothing
    # waits now, or at the end: the selector sees that
    while piece := original.fp.read1(_READ_SIZE):
        pieces.append(piece)
    return sock, b"".join(pieces), sock_timeout


def _give_back(resp: requests.Response, sock: socket.socket, sock_timeout: float | None) -> None:
    """Return the connection of a body read to its end to its pool, as a finished read would."""
    raw: Any = resp.raw
    sock.settimeout(sock_timeout)
    raw._fp._close_conn()  # http.client's end of a body: the connection may send the next request
    resp._content_consumed = True  # type: ignore[attr-defined]
    raw.release_conn()


_shared: StreamHub | None = None
_shared_lock = threading.Lock()


def _forget_after_fork() -> None:
    """A forked child has no hub thread, and another thread of the parent may have held the lock."""
    global _shared, _shared_lock
    _shared, _shared_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def shared_hub() -> StreamHub:
    """This process's hub (a new one after a fork, or after the last one failed)."""
    global _shared
    with _shared_lock:
        hub = _shared
        if hub is None or hub._failed is not None:
            hub = _shared = StreamHub()
        return hub
