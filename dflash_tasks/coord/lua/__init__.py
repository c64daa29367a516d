"""The Lua scripts Redis runs atomically for us, one ``.lua`` file each."""

from __future__ import annotations

from functools import cache
from importlib import resources

import redis
from redis.commands.core import Script


@cache
def script_source(name: str) -> str:
    """The text of ``<name>.lua``."""
    return resources.files(__name__).joinpath(f"{name}.lua").read_text()


def load_script(client: redis.Redis, name: str) -> Script:
    """``<name>.lua`` registered with ``client`` (sent once, then called by its SHA)."""
    return client.register_script(script_source(name))
