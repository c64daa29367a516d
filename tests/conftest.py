"""Shared fixtures: a private Redis per test module, and process managers; the xdist groups."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.helpers import Processes, RedisServer, processes
from tests.s3_support import FaultProxy, MotoServer

#: The reliability table's hooks: here, because the xdist controller loads only this conftest.
pytest_plugins = ("tests.reliability.plugin",)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def procs(tmp_path: Path, redis_server: RedisServer) -> Iterator[Processes]:
    with processes(tmp_path, redis_server.url, f"q{uuid.uuid4().hex[:8]}") as p:
        yield p


@pytest.fixture
def rclient(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the module's private Redis: a missing Redis fails the test, it never skips."""
    client = redis.Redis.from_url(redis_server.url, socket_connect_timeout=2)
    yield client
    client.close()


@pytest.fixture
def prefix(rclient: redis.Redis) -> Iterator[str]:
    """A unique key prefix; its keys are deleted afterwards."""
    name = f"ut-{uuid.uuid4().hex}"
    yield name
    keys = list(rclient.scan_iter(match=f"{name}*", count=1000))
    if keys:
        rclient.delete(*keys)


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """moto's standalone S3 server on a free port (real HTTP, not an in-process mock)."""
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def proxy(moto: MotoServer) -> Iterator[FaultProxy]:
    """A fault-injecting HTTP proxy in front of ``moto``."""
    p = FaultProxy(moto.port)
    yield p
    p.close()


#: Tests that must share one process under ``pytest -n`` (``--dist loadgroup``, as ``make test``
#: runs): the real SGLang servers (a start costs most of a minute, and two at once on 2 cores
#: would starve each other) and the chaos runs (their network namespaces take subnets by number).
_GROUPS = (("tests/real_sglang/", "real_sglang"), ("tests/chaos/", "chaos"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for folder, group in _GROUPS:
            if item.nodeid.startswith(folder):
                item.add_marker(pytest.mark.xdist_group(group))
