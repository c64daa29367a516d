"""Queue names: one Celery queue per model, so a worker only ever takes its own model's chunks.

A job's chunks go to ``<base>.<model key>`` (``dflash.qwen3-8b``), where ``<base>`` is
``CommonSettings.queue`` and the key is :func:`dflash_tasks.core.model_name.model_key`. A worker
consumes the queues of the keys its server serves, plus the bare base queue: nothing publishes
there, but a message that lands there (an older producer, a hand-made message) is forwarded to
its model's queue by the worker that takes it. See docs/routing.md.
"""

from __future__ import annotations

from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.model_name import model_key, server_keys


def model_queue(base: str, model: str) -> str:
    """The queue of ``model``'s chunks under the base queue ``base``: the one mapping used everywhere."""
    key = model_key(model)
    if not key:
        raise ConfigError(f"model {model!r} has no routing key (see docs/routing.md)")
    return f"{base}.{key}"


def server_queues(base: str, served_model_name: str, model_path: str) -> list[str]:
    """The queues a worker consumes: its server's model queues (sorted), then the base queue."""
    return [f"{base}.{key}" for key in sorted(server_keys(served_model_name, model_path))] + [base]
