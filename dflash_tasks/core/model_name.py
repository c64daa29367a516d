"""Model names: which job a server may generate for, and which names a job may use.

SGLang ignores a request's ``model`` field (it only parses ``base:adapter`` out of it), so a
worker must itself make sure that its server serves the job's model. The rule (docs/routing.md):

* ``model_key(name)`` is the last ``/``-separated component of ``name`` (trailing slashes
  ignored), lowercased, with every character other than ``a-z 0-9 . _ -`` replaced by ``-``:
  ``Qwen/Qwen3-8B``, ``Qwen3-8B`` and ``/dev/shm/models/Qwen3-8B/`` all have the key ``qwen3-8b``.
* A server serves the keys of its ``served_model_name`` and of its ``model_path``.
* A job's model matches a server when the job model's key is one of the server's keys.

Jobs are routed by the same key (:func:`dflash_tasks.coord.routing.model_queue`), so a worker
consumes exactly the queues of the models its server matches.
"""

from __future__ import annotations

import re

from dflash_tasks.core.errors import ConfigError

_UNSAFE = re.compile(r"[^a-z0-9._-]")


def model_key(name: str) -> str:
    """The routing and matching key of a model name or path (see the module docstring); may be empty."""
    last = name.strip().rstrip("/").rsplit("/", 1)[-1]
    return _UNSAFE.sub("-", last.lower())


def server_keys(served_model_name: str, model_path: str) -> frozenset[str]:
    """The keys a server with this served name and model path serves (empty names count for nothing)."""
    return frozenset(k for k in (model_key(served_model_name), model_key(model_path)) if k)


def serves(job_model: str, served_model_name: str, model_path: str) -> bool:
    """Whether a server (served name, model path) may generate for a job of ``job_model``."""
    key = model_key(job_model)
    return bool(key) and key in server_keys(served_model_name, model_path)


def check_model_name(model: str) -> None:
    """Refuse a job model name that SGLang or the routing cannot use; raise :class:`ConfigError`."""
    if not model or not model.strip():
        raise ConfigError("--model is required (the model name the SGLang servers serve)")
    if ":" in model:
        raise ConfigError(
            f"--model {model!r} contains ':': SGLang reads a request's model 'base:adapter' as a LoRA "
            "adapter name, so every request would fail with HTTP 400. Give the model's name without "
            "':' (its served name, or the last part of its path, e.g. Qwen3-8B)"
        )
    if not model_key(model):
        raise ConfigError(f"--model {model!r} names no model (its last part is empty)")
