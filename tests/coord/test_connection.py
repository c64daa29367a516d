"""Tests for dflash_tasks.coord.connection: the only place a Redis client is made, and its errors."""

from __future__ import annotations

import pytest
import redis

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.connection import connect, ping, redis_errors
from dflash_tasks.core.errors import ConfigError, RetryableError
from dflash_tasks.demo import DemoError, check_redis
from tests.helpers import free_port, redis_url
from workers.node.main import broker_reachable


def test_ping_reaches_redis(rclient: redis.Redis) -> None:
    ping(redis_url(rclient))
    check_redis(redis_url(rclient))
    assert broker_reachable(redis_url(rclient))


def test_ping_of_a_closed_port_is_retryable_and_hides_the_password() -> None:
    port = free_port()  # nothing listens there
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    with pytest.raises(RetryableError, match="connecting to the broker") as info:
        ping(url, timeout=1)
    assert str(port) in str(info.value) and "hunter2" not in str(info.value)
    assert isinstance(info.value.__cause__, redis.ConnectionError)
    with pytest.raises(DemoError, match="no Redis at") as demo:
        check_redis(url)
    assert "hunter2" not in str(demo.value)
    assert not broker_reachable(url)


def test_a_url_that_is_not_redis_is_a_config_error() -> None:
    for bad in ("http://:hunter2@127.0.0.1:6379/0", "redis://127.0.0.1:notaport/0"):
        with pytest.raises(ConfigError, match="not a Redis URL") as info:
            connect(bad)
        assert "hunter2" not in str(info.value)
        with pytest.raises(ConfigError):
            Bookkeeping.from_url(bad)
        assert not broker_reachable(bad)


def test_connect_sets_the_timeouts() -> None:
    client = connect("redis://127.0.0.1:1/0", timeout=5, connect_timeout=3, health_check_interval=0)
    kw = client.connection_pool.connection_kwargs
    assert (kw["socket_timeout"], kw["socket_connect_timeout"], kw["health_check_interval"]) == (5, 3, 0)
    default = Bookkeeping.from_url("redis://127.0.0.1:1/0").client.connection_pool.connection_kwargs
    assert (default["socket_timeout"], default["socket_connect_timeout"]) == (30, 10)
    assert default["health_check_interval"] == 25


def test_redis_errors_translates_only_redis_errors() -> None:
    with (
        pytest.raises(RetryableError, match=r"^Redis error while reading x: boom$"),
        redis_errors("reading x"),
    ):
        raise redis.TimeoutError("boom")
    with pytest.raises(KeyError), redis_errors("reading x"):
        raise KeyError("not ours to translate")
