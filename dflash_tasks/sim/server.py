"""The HTTP layer: a keep-alive ``ThreadingHTTPServer`` routing to :class:`SimEngine`.

Start-up follows SGLang's order: the port is bound at once but refuses connections while the
"weights load" (``load_seconds``), then HTTP is up and every route answers, with ``/health*`` and
``/ready`` at 503 until the warmup (``startup_seconds``) is over. With an ``api_key`` every route
needs ``Authorization: Bearer <key>`` except ``/health*``, ``/ready*`` and ``/metrics*`` (as in
SGLang) and the simulator's own ``/sim/*``; others get 401 ``{"error": "Unauthorized"}``.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import select
import socket
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from dflash_tasks.sim import info
from dflash_tasks.sim.config import FaultSpec, SimConfig
from dflash_tasks.sim.engine import Reply, SimEngine, json_reply
from dflash_tasks.sim.outbox import Outbox

_NOT_FOUND = json_reply(404, {"detail": "Not Found"})
_NOT_ALLOWED = json_reply(405, {"detail": "Method Not Allowed"})
_UNAUTHORIZED = json_reply(401, {"error": "Unauthorized"})
#: Path prefixes SGLang serves without the API key (probes and scrapers), plus the simulator's own.
OPEN_PREFIXES = ("/health", "/ready", "/metrics", "/sim/")


class SimHTTPServer(ThreadingHTTPServer):
    """A threading server that knows its engine and can cut its open connections on shutdown."""

    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, config: SimConfig, engine: SimEngine) -> None:
        self.engine = engine
        self._connections: set[socket.socket] = set()
        self._conn_lock = threading.Lock()
        super().__init__((config.host, config.port), SimHandler, bind_and_activate=False)
        try:
            self.server_bind()  # the port is ours (and known); it refuses connections until activated
        except BaseException:
            self.server_close()
            raise

    def track(self, conn: socket.socket, open_: bool) -> None:
        """Remember (or forget) a client connection."""
        with self._conn_lock:
            if open_:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def close_connections(self) -> None:
        """Shut down every open client connection (idle keep-alive ones included)."""
        with self._conn_lock:
            conns = list(self._connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class SimHandler(BaseHTTPRequestHandler):
    """Routes one request at a time on a keep-alive HTTP/1.1 connection."""

    protocol_version = "HTTP/1.1"
    server_version = "sglang-sim"
    # Headers and body are two writes: with Nagle's algorithm on, the body would wait for the
    # client's delayed ACK (~40 ms a request). Real servers (uvicorn) set TCP_NODELAY too.
    disable_nagle_algorithm = True
    server: SimHTTPServer
    #: The running stream's outbox: its status line and headers go there too.
    _outbox: Outbox | None = None

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        self.server.track(self.connection, False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.engine.config.verbose:
            sys.stderr.write(f"[sim] {self.address_string()} {format % args}\n")

    def do_GET(self) -> None:
        self._read_body()
        path = urlsplit(self.path).path
        self._send(self._route_get(path) if self._authorized(path) else _UNAUTHORIZED)

    def do_POST(self) -> None:
        body = self._read_body()
        path = urlsplit(self.path).path
        self._send(self._route_post(path, body) if self._authorized(path) else _UNAUTHORIZED)

    def _authorized(self, path: str) -> bool:
        """SGLang's rule: open prefixes pass; else a configured key needs ``Bearer <key>``."""
        key = self.server.engine.config.api_key
        if not key or path.startswith(OPEN_PREFIXES):
            return True
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), key.encode())

    def _route_get(self, path: str) -> Reply:
        engine = self.server.engine
        routes: dict[str, Callable[[], Any]] = {
            "/get_server_info": lambda: info.server_info(engine, self.server.server_address[1]),
            "/server_info": lambda: info.server_info(engine, self.server.server_address[1]),
            "/get_model_info": lambda: info.model_info(engine),
            "/model_info": lambda: info.model_info(engine),
            "/v1/models": lambda: info.models(engine),
            "/sim/stats": engine.stats,
            "/sim/faults": lambda: {"faults": engine.faults.snapshot()},
            "/sim/requests": engine.requests.snapshot,
        }
        if path in ("/health", "/health_generate"):
            return Reply(engine.health_status(), b"", "text/plain; charset=utf-8")
        if path == "/ready":
            return Reply(engine.ready_status(), b"", "text/plain; charset=utf-8")
        if path == "/metrics":
            return Reply(200, info.metrics_text(engine).encode(), "text/plain; version=0.0.4; charset=utf-8")
        if path in routes:
            return json_reply(200, routes[path]())
        return _NOT_ALLOWED if path in _POST_PATHS else _NOT_FOUND

    def _route_post(self, path: str, body: bytes) -> Reply:
        engine = self.server.engine
        if path == "/v1/chat/completions":
            return engine.chat(self.headers.get("Content-Type", ""), body)
        if path == "/sim/faults":
            return _post_fault(engine, body)
        if path == "/sim/stats/reset":
            engine.reset_stats()
            return json_reply(200, engine.stats())
        return _NOT_FOUND if path not in _GET_PATHS else _NOT_ALLOWED

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, reply: Reply) -> None:
        if reply.reset:
            self._reset()
            return
        if reply.stream is not None:
            self._send_stream(reply)
            return
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def _send_stream(self, reply: Reply) -> None:
        """A streamed body, chunked (as uvicorn sends one): the status line and headers go with
        the first piece, so a request still waiting for a slot has had no answer yet. The pump
        writes through an :class:`Outbox` (never blocking); what still waits at the stream's end
        is sent from this thread."""
        assert reply.stream is not None
        out = self._outbox = Outbox(self.connection, self.server.engine.config.stream_stall_seconds)
        started = False

        def write(piece: bytes) -> bool:
            nonlocal started
            if not started:
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                started = True
            return out.put(b"%x\r\n%s\r\n" % (len(piece), piece))

        try:
            close = reply.stream(write, self._client_gone, out.flush)
            if started and not close:
                out.put(b"0\r\n\r\n")
            out.drain()
        except OSError:
            close = True
        finally:
            self._outbox = None
        if close or not started:
            self.close_connection = True

    def flush_headers(self) -> None:
        """The headers buffered, sent (through the running stream's outbox, if any)."""
        if self._outbox is None:
            super().flush_headers()
            return
        head: list[bytes] = getattr(self, "_headers_buffer", [])
        self._headers_buffer: list[bytes] = []
        self._outbox.put(b"".join(head))

    def _client_gone(self) -> bool:
        """Has the client closed its end (end of stream waiting on the socket)?"""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _reset(self) -> None:
        """Close the socket abortively (RST), with no response at all."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass


_GET_PATHS = frozenset(
    {"/health", "/health_generate", "/ready", "/get_server_info", "/server_info", "/get_model_info"}
    | {"/model_info"}
    | {"/v1/models", "/metrics", "/sim/stats", "/sim/faults", "/sim/requests"}
)
_POST_PATHS = frozenset({"/v1/chat/completions", "/sim/faults", "/sim/stats/reset"})


def _post_fault(engine: SimEngine, raw: bytes) -> Reply:
    try:
        body = json.loads(raw or b"{}")
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object")
        if body.get("kind") == "clear":
            engine.faults.clear()
        else:
            engine.faults.add(FaultSpec.from_json(body))
    except ValueError as exc:
        return json_reply(400, {"error": str(exc)})
    return json_reply(200, {"faults": engine.faults.snapshot()})


class RunningSimulator:
    """A simulator serving in a background thread; ``with start_simulator(...) as sim:`` stops it.

    The port is known at once; :attr:`listening` is set once it accepts connections (after
    ``load_seconds``).
    """

    def __init__(self, config: SimConfig) -> None:
        self.engine = SimEngine(config)
        self.httpd = SimHTTPServer(config, self.engine)
        self.host = config.host
        self.port: int = self.httpd.server_address[1]
        self.listening = threading.Event()
        self._load_seconds = config.load_seconds
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="sim-http", daemon=True)

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:30000``."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> RunningSimulator:
        """Start serving (returns self); without a load delay the port accepts connections on return."""
        if self._load_seconds == 0:
            self._listen()
        self._thread.start()
        return self

    def _listen(self) -> bool:
        with self._lock:
            if self._stopped.is_set():
                return False
            if not self.listening.is_set():
                self.httpd.server_activate()
                self.engine.http_up()
                self.listening.set()
        return True

    def _serve(self) -> None:
        if self._stopped.wait(self._load_seconds) or not self._listen():
            return
        self.httpd.serve_forever(poll_interval=0.05)

    def stop(self) -> None:
        """Stop serving: pending requests end without an answer; open connections are closed."""
        with self._lock:
            self._stopped.set()
            serving = self.listening.is_set()
        self.engine.stop()
        if serving and self._thread.is_alive():
            self.httpd.shutdown()  # also fine before serve_forever runs: it then returns at once
        self.httpd.close_connections()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> RunningSimulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_simulator(config: SimConfig | None = None, **overrides: Any) -> RunningSimulator:
    """Start a simulator in this process; ``port=0`` (the default here) picks a free port."""
    base = config or SimConfig(port=0)
    if overrides:
        base = replace(base, **overrides)
    return RunningSimulator(base).start()
