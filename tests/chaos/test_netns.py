"""The partition helper: a namespaced node reaches the host over its link; a cut is silent and heals."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest

from tests.chaos.netns import NetLab, available

pytestmark = pytest.mark.skipif(bool(available()), reason=available() or "ok")


@pytest.fixture
def lab() -> Iterator[NetLab]:
    net = NetLab(uuid.uuid4().hex[:4])
    try:
        yield net
    finally:
        problems = net.remove()
        assert problems == [] and net.leftovers() == []


def echo_server(address: str) -> int:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((address, 0))
    srv.listen()

    def serve() -> None:
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=lambda c=conn: _echo(c), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return int(srv.getsockname()[1])


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(100):
            conn.sendall(data)


def in_namespace(lab: NetLab, node: str, code: str, timeout: float = 30) -> str:
    argv = [*lab.links[node].exec_prefix(), sys.executable, "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True).stdout


def test_a_cut_drops_one_path_silently_and_heals(lab: NetLab) -> None:
    link = lab.add("n2")
    redis_port = echo_server(link.host_ip("redis"))
    store_port = echo_server(link.host_ip("store"))
    probe = (
        "import socket\n"
        "def ask(ip, port):\n"
        "    try:\n"
        "        s = socket.create_connection((ip, port), timeout=1.5); s.sendall(b'x')\n"
        "        return 'ok' if s.recv(1) == b'x' else 'bad'\n"
        "    except OSError as e:\n"
        "        return type(e).__name__\n"
        f"print(ask({link.host_ip('redis')!r}, {redis_port}), ask({link.host_ip('store')!r}, {store_port}))\n"
    )
    assert in_namespace(lab, "n2", probe).split() == ["ok", "ok"]
    lab.cut_path("n2", "redis")  # split brain: Redis gone, the store still there
    assert in_namespace(lab, "n2", probe).split() == ["TimeoutError", "ok"]  # silence, not a reset
    lab.cut_path("n2", "store")
    assert in_namespace(lab, "n2", probe).split() == ["TimeoutError", "TimeoutError"]
    lab.heal_all()
    assert in_namespace(lab, "n2", probe).split() == ["ok", "ok"]


def test_the_host_reaches_a_namespaced_server_on_the_control_path_during_a_cut(lab: NetLab) -> None:
    link = lab.add("n3")
    serve = (
        "import socket\n"
        "s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(); print(s.getsockname()[1], flush=True)\n"
        "c, _ = s.accept(); c.sendall(c.recv(1))\n"
    )
    argv = [*link.exec_prefix(), sys.executable, "-c", serve]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        lab.cut_path("n3", "redis")
        lab.cut_path("n3", "store")
        with socket.create_connection((link.ns_ip("ctl"), port), timeout=5) as s:
            s.sendall(b"y")
            assert s.recv(1) == b"y"
    finally:
        proc.kill()
        proc.wait(10)
