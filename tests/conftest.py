"""Shared fixtures: a private Redis per test module, and process managers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Processes, RedisServer, processes


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def procs(tmp_path: Path, redis_server: RedisServer) -> Iterator[Processes]:
    with processes(tmp_path, redis_server.url, f"q{uuid.uuid4().hex[:8]}") as p:
        yield p
