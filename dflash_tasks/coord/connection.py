"""Connecting to Redis, and turning redis-py's errors into the project's (``core/errors.py``).

Every Redis client of the project is made here (:func:`connect`); code outside ``coord`` holds
a :class:`~dflash_tasks.coord.bookkeeping.Bookkeeping` or a
:class:`~dflash_tasks.coord.live_progress.LiveProgress`, never a client, and catches
:class:`RetryableError`, never a redis-py error.
"""

from __future__ import annotations

from collections.abc import Callable

import redis
from kombu.exceptions import OperationalError

from dflash_tasks.core.errors import ConfigError, RetryableError
from dflash_tasks.core.setting_values import redact_url


def connect(
    url: str, *, timeout: float = 30, connect_timeout: float = 10, health_check_interval: int = 25
) -> redis.Redis:
    """A client of the Redis at ``url`` (it connects lazily, on its first command).

    Raises :class:`ConfigError` when ``url`` is not a Redis URL.
    """
    try:
        return redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=connect_timeout,
            health_check_interval=health_check_interval,
        )
    except ValueError as exc:
        raise ConfigError(f"not a Redis URL: {redact_url(url)} ({exc})") from None


def ping(url: str, timeout: float = 3.0) -> None:
    """Raise :class:`RetryableError` unless Redis answers at ``url`` within ``timeout`` seconds.

    Raises :class:`ConfigError` when ``url`` is not a Redis URL.
    """
    client = connect(url, timeout=timeout, connect_timeout=timeout, health_check_interval=0)
    try:
        with redis_errors("connecting to the broker"):
            client.ping()
    finally:
        client.close()


class redis_errors:
    """Context manager translating redis-py errors into :class:`RetryableError`.

    The message names what we were doing and redis-py's reason (which names the host, never
    the password).
    """

    #: The errors translated.
    ERRORS: tuple[type[BaseException], ...] = (redis.RedisError,)

    def __init__(self, doing: str | Callable[[], str]) -> None:
        self._doing = doing

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, self.ERRORS):
            doing = self._doing if isinstance(self._doing, str) else self._doing()
            raise RetryableError(f"{self.WHAT} error while {doing}: {exc}") from exc

    WHAT = "Redis"


class broker_errors(redis_errors):
    """:class:`redis_errors` for Celery's side of the broker: also the socket errors and kombu's
    ``OperationalError`` (its wrapper of a lost connection) that publishing raises.

    ``doing`` may be a function, called only on an error (a message naming how far it got).
    """

    ERRORS = (redis.RedisError, OSError, OperationalError)
    WHAT = "broker"
