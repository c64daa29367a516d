"""The reliability suite's fixtures; its table's hooks are in ``tests/reliability/plugin.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.reliability.support import Collector, ScenarioRows
from tests.s3_support import MotoServer


@pytest.fixture
def reliability(request: pytest.FixtureRequest) -> Collector:
    """Where a scenario records its rows (see :func:`tests.reliability.support.settle`)."""
    return ScenarioRows(request.node.user_properties)


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()
