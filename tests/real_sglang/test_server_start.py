"""Starting the real server: one exit on a port clash (SGLang's own pick of a free port, taken
before its child bound it) is retried once; any other exit fails with the log. A stand-in
interpreter plays the server (no SGLang needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.real_sglang.server import RealServer, start_ready

#: Run as ``<python> -m sglang.launch_server ... --port N``: exits as SGLang does on a clash while
#: ``clash`` holds a count, else answers ``/health_generate``.
FAKE = """#!{python}
import http.server, pathlib, sys
state = pathlib.Path({state!r})
left = int(state.read_text()) if state.exists() else 0
if left > 0:
    state.write_text(str(left - 1))
    print("torch.distributed.DistNetworkError: The server socket has failed to listen on any "
          "local network address. port: 28388, useIpv6: false, code: -98, name: EADDRINUSE")
    sys.exit(1)
if {fail!r}:
    print("ValueError: something else went wrong")
    sys.exit(1)
port = int(sys.argv[sys.argv.index("--port") + 1])
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", port), Ok).serve_forever()
"""


def fake_python(tmp_path: Path, clashes: int, fail: bool = False) -> Path:
    state = tmp_path / "clashes"
    state.write_text(str(clashes))
    exe = tmp_path / "python"
    exe.write_text(FAKE.format(python=sys.executable, state=str(state), fail=fail))
    exe.chmod(0o755)
    return exe


def test_one_port_clash_is_retried_and_its_log_kept(tmp_path: Path) -> None:
    log = tmp_path / "sglang.log"
    server, seconds = start_ready(
        fake_python(tmp_path, clashes=1), "/models/x", free_port(), log, RealServer.wait_ready
    )
    try:
        assert server.proc.poll() is None and seconds > 0
        assert "EADDRINUSE" in (tmp_path / "sglang.clash.log").read_text()
        assert "EADDRINUSE" not in log.read_text()
    finally:
        server.stop()


def test_a_second_clash_fails_with_the_log(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="EADDRINUSE"):
        start_ready(
            fake_python(tmp_path, clashes=2),
            "/models/x",
            free_port(),
            tmp_path / "sglang.log",
            RealServer.wait_ready,
        )


def test_another_exit_is_not_retried(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="something else"):
        start_ready(
            fake_python(tmp_path, clashes=0, fail=True),
            "/models/x",
            free_port(),
            tmp_path / "s.log",
            RealServer.wait_ready,
        )
    assert not (tmp_path / "s.clash.log").exists()


def test_a_server_not_ready_is_stopped_whatever_the_wait_raised(tmp_path: Path) -> None:
    started: list[RealServer] = []

    def interrupted(server: RealServer) -> float:
        started.append(server)
        server.wait_ready()  # it answers: then the wait is cut short all the same
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        start_ready(
            fake_python(tmp_path, clashes=0), "/models/x", free_port(), tmp_path / "s.log", interrupted
        )
    assert [s.proc.poll() is not None for s in started] == [True]
