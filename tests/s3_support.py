"""S3 test support: moto's standalone S3 server as a real process, and a fault-injecting HTTP proxy.

Both listen on loopback (a proxy may be given another local address: the chaos run puts one on
each network-namespace link). The proxy sits between boto3 and moto and, on request, answers
503 SlowDown / 500 InternalError, resets connections (before or after forwarding), truncates
response bodies (``truncate``: half, then a reset, which may discard what the client had not read
yet; ``cut``: half, then a clean close, so the client reads the half and then finds it short),
or refuses requests signed with a given access key (403 InvalidAccessKeyId,
as AWS does for unknown keys; moto itself does not check credentials).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import struct
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3

from tests.helpers import REPO, free_port, wait_until

ACCESS_KEY = "AKIADFLASHTEST000001"
#: A distinctive secret: tests assert it appears in no log, output object, job file or message.
SECRET_KEY = "dflashTESTsecret-" + uuid.uuid4().hex
REGION = "us-east-1"


def aws_env(endpoint: str | None = None, *, via: str = "AWS_ENDPOINT_URL") -> dict[str, str]:
    """Environment for a process using S3 at ``endpoint``: test credentials, no IMDS, no profiles."""
    env = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",  # never look for an instance role off this machine
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/dflash-test-credentials",
        "AWS_CONFIG_FILE": "/nonexistent/dflash-test-config",
    }
    if endpoint:
        env[via] = endpoint
    return env


class MotoServer:
    """``python -m moto.server`` on a free loopback port."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        wait_until(self._ready, 30, "moto server")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"moto server exited with {self.proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
            conn.request("GET", "/moto-api/")
            ok = conn.getresponse().status < 500
            conn.close()
            return ok
        except OSError:
            return False

    def client(self) -> Any:
        """A plain boto3 client on moto (test set-up and inspection, not the code under test)."""
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def new_bucket(self, stem: str = "dflash") -> str:
        name = f"{stem}-{uuid.uuid4().hex[:10]}"
        self.client().create_bucket(Bucket=name)
        return name

    def put_many(self, bucket: str, keys: list[str], body: bytes = b"x", threads: int = 4) -> None:
        """Create many small objects fast: plain keep-alive PUTs (moto does not check signatures)."""

        def put(part: list[str]) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                for key in part:
                    conn.request("PUT", f"/{bucket}/{key}", body=body)
                    resp = conn.getresponse()
                    resp.read()
                    assert resp.status == 200, (key, resp.status)
            finally:
                conn.close()

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(put, [keys[i::threads] for i in range(threads)]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@dataclass
class Rule:
    """Fire ``kind`` on every ``every``-th request matching method and path, ``count`` times."""

    kind: str  # slowdown | internal | forbidden | reset | reset_after_forward | truncate | cut
    count: int
    method: str = "PUT"
    path_contains: str = ""
    every: int = 1
    seen: int = 0
    then: Callable[[], None] | None = None  # truncate, cut: run before the half body is sent

    def take(self, method: str, path: str) -> bool:
        if self.count <= 0 or method != self.method or self.path_contains not in path:
            return False
        self.seen += 1
        if self.seen % self.every:
            return False
        self.count -= 1
        return True


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    fault: str = ""


@dataclass
class _State:
    rules: list[Rule] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    fired: Counter[str] = field(default_factory=Counter)
    then: dict[int, Callable[[], None]] = field(default_factory=dict)  # request thread -> its callback
    deny_access_key: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "expect", "upgrade"}


class FaultProxy:
    """A threaded HTTP/1.1 proxy in front of ``upstream`` (host, port) that injects S3 failures."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream_port = upstream_port
        self.state = _State()
        handler = type("Handler", (_Handler,), {"proxy": self})
        self.server = ThreadingHTTPServer((host, 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, args=(0.05,), name="s3-fault-proxy", daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def inject(
        self,
        kind: str,
        count: int,
        method: str = "PUT",
        path_contains: str = "",
        every: int = 1,
        then: Callable[[], None] | None = None,
    ) -> None:
        """Fire ``kind`` as :class:`Rule` says. With ``truncate`` or ``cut``, ``then`` runs once the
        response is read from upstream, before its half is sent: e.g. to replace the object
        between a read and its resumption."""
        with self.state.lock:
            self.state.rules.append(Rule(kind, count, method, path_contains, every, then=then))

    def deny(self, access_key: str) -> None:
        """Answer 403 InvalidAccessKeyId to every request signed with ``access_key``."""
        self.state.deny_access_key = access_key

    def clear(self) -> None:
        with self.state.lock:
            self.state.rules.clear()
            self.state.deny_access_key = ""

    @property
    def fired(self) -> Counter[str]:
        with self.state.lock:
            return Counter(self.state.fired)

    @property
    def seen(self) -> list[Seen]:
        with self.state.lock:
            return list(self.state.seen)

    def pending(self) -> int:
        with self.state.lock:
            return sum(r.count for r in self.state.rules)

    def _then(self) -> None:
        """Run the callback of the rule that fired on this thread's request, if any."""
        with self.state.lock:
            then = self.state.then.pop(threading.get_ident(), None)
        if then is not None:
            then()

    def _decide(self, method: str, path: str, headers: dict[str, str]) -> str:
        with self.state.lock:
            fault = ""
            deny = self.state.deny_access_key
            if deny and f"Credential={deny}/" in headers.get("authorization", ""):
                fault = "deny"
            else:
                for rule in self.state.rules:
                    if rule.take(method, path):
                        fault = rule.kind
                        if rule.then is not None:
                            self.state.then[threading.get_ident()] = rule.then
                        break
            self.state.seen.append(Seen(method, path, headers, fault))
            if fault:
                self.state.fired[fault] += 1
            return fault

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: FaultProxy

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        body = self._read_body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        fault = self.proxy._decide(self.command, self.path, headers)
        if fault == "slowdown":
            return self._error(503, "SlowDown", "Please reduce your request rate.")
        if fault == "internal":
            return self._error(500, "InternalError", "We encountered an internal error. Please try again.")
        if fault == "forbidden":
            return self._error(403, "AccessDenied", "Access Denied")
        if fault == "deny":
            return self._error(
                403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."
            )
        if fault == "reset":
            return self._reset()
        status, reason, out_headers, data = self._forward(body)
        if fault == "reset_after_forward":  # the request took effect, the client never hears of it
            return self._reset()
        self.send_response_only(status, reason)
        for name, value in out_headers:
            low = name.lower()
            if low in _HOP_BY_HOP or (low == "content-length" and self.command != "HEAD"):
                continue
            self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if fault in ("truncate", "cut") and self.command == "GET" and len(data) > 1:
            self.proxy._then()  # done before the client can see the body break off, or resume it
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            return self._reset() if fault == "truncate" else self._cut()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.proxy.upstream_port, timeout=30)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                    conn.putheader(name, value)
            if body or self.command in ("PUT", "POST"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.reason, resp.getheaders(), data
        finally:
            conn.close()

    def _error(self, status: int, code: str, message: str) -> None:
        data = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message><RequestId>dflash-fault</RequestId></Error>"
        ).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _cut(self) -> None:
        """End the connection cleanly (FIN) after a short body: what was sent arrives, then EOF."""
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)
        self.close_connection = True

    def _reset(self) -> None:
        """Close the connection with a TCP RST, no response."""
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            self.connection.close()
        self.close_connection = True
