"""Which chat requests the simulator received and generated, per sample (``GET /sim/requests``).

Tests count generation with it, not only stored records: a sample generated twice is GPU time
wasted even when its second record replaced the first. A *sample key* is a digest of the
request's message texts (the same prompt is the same sample); :func:`sample_key` computes it
from a sample's messages, so a test can map its input to the keys.

* ``received``: requests that passed validation (a fault injected before that is not counted);
* ``generated``: requests whose generation ran to its end (an injected ``abort`` or
  ``bad_json`` answer included: the work was done), i.e. GPU time spent;
* ``recent``: the newest request bodies, ``messages`` left out, as the simulator received them.

Memory stays bounded: at most ``max_keys`` samples are counted (``truncated`` says when more
were seen) and the newest ``keep`` bodies are kept.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any

PROMPT_SEPARATOR = "\x1e"


def prompt_key(prompt: str) -> str:
    """The key of a prompt as the simulator joins it (message texts joined by ``\\x1e``)."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def sample_key(messages: Iterable[dict[str, Any]]) -> str:
    """The key of a sample from its chat messages (string contents)."""
    return prompt_key(PROMPT_SEPARATOR.join(str(m.get("content", "")) for m in messages))


class RequestLog:
    """Thread-safe per-sample request counts and the newest request bodies."""

    def __init__(self, keep: int = 10_000, max_keys: int = 1_000_000) -> None:
        self._lock = threading.Lock()
        self._max_keys = max_keys
        self._received: dict[str, int] = {}
        self._generated: dict[str, int] = {}
        self._recent: deque[tuple[str, bytes]] = deque(maxlen=keep)
        self._truncated = False

    def received(self, prompt: str, raw: bytes) -> str:
        """Count a validated request; ``raw`` is its body. Returns the sample key."""
        key = prompt_key(prompt)
        with self._lock:
            self._bump(self._received, key)
            self._recent.append((key, raw))
        return key

    def generated(self, prompt: str) -> None:
        """Count a request for ``prompt`` whose generation ran to its end."""
        key = prompt_key(prompt)
        with self._lock:
            self._bump(self._generated, key)

    def _bump(self, counts: dict[str, int], key: str) -> None:
        if key in counts or len(counts) < self._max_keys:
            counts[key] = counts.get(key, 0) + 1
        else:
            self._truncated = True

    def reset(self) -> None:
        with self._lock:
            self._received.clear()
            self._generated.clear()
            self._recent.clear()
            self._truncated = False

    def snapshot(self) -> dict[str, Any]:
        """The ``GET /sim/requests`` document."""
        with self._lock:
            received, generated = dict(self._received), dict(self._generated)
            recent, truncated = list(self._recent), self._truncated
        per_sample = {
            key: {"received": received.get(key, 0), "generated": generated.get(key, 0)}
            for key in received.keys() | generated.keys()
        }
        return {
            "samples": len(per_sample),
            "received": sum(received.values()),
            "generated": sum(generated.values()),
            "wasted": sum(n - 1 for n in generated.values() if n > 1),
            "truncated": truncated,
            "per_sample": per_sample,
            "recent": [_summary(key, raw) for key, raw in recent],
        }


def _summary(key: str, raw: bytes) -> dict[str, Any]:
    body = json.loads(raw)  # validated when it was received
    return {"sample": key, **{k: v for k, v in body.items() if k != "messages"}}
