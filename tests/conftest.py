"""Shared fixtures: a private Redis per test module, and process managers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.helpers import Processes, RedisServer, processes
from tests.s3_support import FaultProxy, MotoServer


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
