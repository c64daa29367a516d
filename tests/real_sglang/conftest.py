"""Fixtures of the real-server tests: the SGLang environment, the tiny checkpoint, and one shared
server per session (the contract tests), beside a simulator configured alike.

Nothing here skips: an environment or checkpoint that cannot be built fails the test with the
reason (``pytest.fail``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from dflash_tasks.sim import start_simulator
from tests.helpers import free_port
from tests.real_sglang.checkpoint import CheckpointUnavailable, ensure_checkpoint
from tests.real_sglang.env import EnvUnavailable, cache_root, ensure_env
from tests.real_sglang.server import CONTEXT_LENGTH, RealServer, start_ready

API_KEY = "contract-key-0123"
SERVED_NAME = "tiny-qwen3"
#: The simulator's stand-in for the checkpoint's path (it loads nothing).
SIM_MODEL_PATH = "/models/tiny-qwen3"
#: The marker's tests may need a build on a cold cache: far more than the suite's 300 s default.
SETUP_TIMEOUT = 3600
#: Requests the looping servers run at once (a second one waits in the queue).
LOOPING_RUNNING = 1


@dataclass
class Target:
    """One server the contract runs against: the real release or the simulator."""

    kind: str
    url: str
    model_path: str
    #: ``(seconds since start, /health status, /health_generate status)`` each time they changed;
    #: 0 = the connection was refused.
    startup: list[tuple[float, int, int]] = field(default_factory=list)
    api_key: str = API_KEY
    served_name: str = SERVED_NAME
    context_length: int = CONTEXT_LENGTH

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


def _status(url: str) -> int:
    try:
        return requests.get(url, timeout=30).status_code
    except requests.RequestException:
        return 0


def watch_startup(url: str, timeout: float, alive: object = None) -> list[tuple[float, int, int]]:
    """Poll ``/health`` and ``/health_generate`` until both answer 200; the changes seen (the two
    probes are a moment apart, so one poll may straddle the end of the warmup)."""
    seen: list[tuple[float, int, int]] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if isinstance(alive, RealServer) and alive.proc.poll() is not None:
            raise AssertionError(f"SGLang exited with {alive.proc.returncode}:\n{alive.log_text()[-4000:]}")
        state = (_status(f"{url}/health"), _status(f"{url}/health_generate"))
        if not seen or seen[-1][1:] != state:
            seen.append((round(time.monotonic() - t0, 2), *state))
        if state == (200, 200):
            return seen
        time.sleep(0.2)
    raise AssertionError(f"{url} not healthy after {timeout:.0f} s; seen {seen}")


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    """The SGLang environment's interpreter (built on first use, then cached)."""
    problem = ""
    try:
        return ensure_env()
    except EnvUnavailable as exc:
        problem = f"the real-SGLang tests need the pinned release's CPU environment: {exc}"
    pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def tiny_model(sglang_python: Path) -> Path:
    """The tiny Qwen3 checkpoint (built by the tests, cached by its recipe's hash)."""
    problem = ""
    try:
        return ensure_checkpoint(cache_root(), sglang_python)
    except CheckpointUnavailable as exc:
        problem = str(exc)
    pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def tiny_looping_model(sglang_python: Path) -> Path:
    """The tiny checkpoint whose thought loops for ever (the same recipe, ``looping=True``)."""
    problem = ""
    try:
        return ensure_checkpoint(cache_root(), sglang_python, looping=True)
    except CheckpointUnavailable as exc:
        problem = str(exc)
    pytest.fail(problem, pytrace=False)


def _real_server(python: Path, model: Path, factory: pytest.TempPathFactory, *extra: str) -> Iterator[Target]:
    log = factory.mktemp("real-sglang") / "sglang.log"
    server, startup = start_ready(
        python,
        model,
        free_port(),
        log,
        lambda started: watch_startup(started.url, 600, alive=started),
        api_key=API_KEY,
        extra=("--served-model-name", SERVED_NAME, *extra),
    )
    try:
        yield Target("real", server.url, str(model), startup)
        server.check_no_standin_calls()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def real_target(
    sglang_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    """One real server for a module's tests (stopped at its end), with an API key and a served name."""
    yield from _real_server(sglang_python, tiny_model, tmp_path_factory)


@pytest.fixture(scope="module")
def real_looping_target(
    sglang_python: Path, tiny_looping_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    """A real server of the looping checkpoint: every thought loops until ``max_tokens``; one
    request runs at a time (a second one waits)."""
    yield from _real_server(
        sglang_python, tiny_looping_model, tmp_path_factory, "--max-running-requests", str(LOOPING_RUNNING)
    )


@pytest.fixture(scope="module")
def sim_target() -> Iterator[Target]:
    """A simulator set up like the real server: same key, names and context, a short start-up."""
    sim = start_simulator(
        model=SIM_MODEL_PATH,
        served_model_name=SERVED_NAME,
        context_length=CONTEXT_LENGTH,
        api_key=API_KEY,
        load_seconds=0.5,
        startup_seconds=0.5,
        mean_output_tokens=40,
        time_scale=0.02,
    )
    with sim:
        yield Target("sim", sim.url, SIM_MODEL_PATH, watch_startup(sim.url, 30))


@pytest.fixture(scope="module")
def sim_looping_target() -> Iterator[Target]:
    """A simulator whose every sample loops, decoding at about the CPU engine's pace, one request
    running at a time."""
    sim = start_simulator(
        model=SIM_MODEL_PATH,
        served_model_name=SERVED_NAME,
        context_length=CONTEXT_LENGTH,
        api_key=API_KEY,
        loop_share=1.0,
        time_scale=0.5,
        max_running_requests=LOOPING_RUNNING,
    )
    with sim:
        yield Target("sim", sim.url, SIM_MODEL_PATH, watch_startup(sim.url, 30))


@pytest.fixture(params=["sim", pytest.param("real", marks=pytest.mark.real_sglang)])
def target(request: pytest.FixtureRequest) -> Target:
    """Each contract test runs against the simulator and against the real release."""
    return request.getfixturevalue(f"{request.param}_target")  # type: ignore[no-any-return]


@pytest.fixture(params=["sim", pytest.param("real", marks=pytest.mark.real_sglang)])
def looping_target(request: pytest.FixtureRequest) -> Target:
    """A server whose every thought loops: the simulator (``--loop-share 1``) and the release
    serving the looping checkpoint."""
    return request.getfixturevalue(f"{request.param}_looping_target")  # type: ignore[no-any-return]
