"""The chat requests the simulator receives: one log behind ``GET /sim/requests`` and ``--record-requests``.

Each ``POST /v1/chat/completions`` becomes one :class:`RequestRecord` (its body, parsed once, and
its sample key once validated), which the log serves two ways:

* ``GET /sim/requests`` (:meth:`RequestLog.snapshot`): per sample, the requests *received*
  (passed validation: a fault injected before that is not counted) and *generated* (generation
  ran to its end, an injected ``abort`` or ``bad_json`` answer included: the work was done, i.e.
  GPU time spent), the *wasted* ones (generated beyond one per sample), and the newest records
  without their ``messages``. Tests count generation with it, not only stored records: a sample
  generated twice is GPU time wasted even when its second record replaced the first.
* ``--record-requests PATH`` (``SimConfig.record_requests``): every record's body appended to
  ``PATH`` as one JSON line, in arrival order, before the request is validated or any fault
  applies, so retries and rejected requests are recorded too; :func:`read_requests` reads them.

A *sample key* is a digest of the request's message texts (the same prompt is the same sample);
:func:`sample_key` computes it from a sample's messages, so a test can map its input to the keys.
Memory stays bounded: at most ``max_keys`` samples are counted (``truncated`` says when more were
seen) and the newest ``keep`` records are kept; the file is never cleared (nor by a reset).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

PROMPT_SEPARATOR = "\x1e"


def prompt_key(prompt: str) -> str:
    """The key of a prompt as the simulator joins it (message texts joined by ``\\x1e``)."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def sample_key(messages: Iterable[dict[str, Any]]) -> str:
    """The key of a sample from its chat messages (string contents)."""
    return prompt_key(PROMPT_SEPARATOR.join(str(m.get("content", "")) for m in messages))


@dataclass(frozen=True)
class RequestRecord:
    """One chat request as it arrived."""

    #: The body as parsed JSON, or ``{"raw": text}`` when it is not JSON.
    body: Any
    #: The sample key, once the request passed validation.
    sample: str | None = None

    @classmethod
    def parse(cls, raw: bytes) -> RequestRecord:
        """The record of a request body, as it arrived."""
        try:
            body: Any = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            body = {"raw": raw.decode("utf-8", errors="replace")}
        return cls(body)

    def summary(self) -> dict[str, Any]:
        """The record as ``GET /sim/requests`` lists it: its sample key and body, without ``messages``."""
        fields = self.body.items() if isinstance(self.body, dict) else ()
        return {"sample": self.sample, **{k: v for k, v in fields if k != "messages"}}


class RequestLog:
    """Thread-safe per-sample request counts, the newest records, and an optional JSONL file."""

    def __init__(self, path: str | Path | None = None, keep: int = 10_000, max_keys: int = 1_000_000) -> None:
        self._lock = threading.Lock()
        self._max_keys = max_keys
        self._received: dict[str, int] = {}
        self._generated: dict[str, int] = {}
        self._recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self._truncated = False
        self._file = None if path is None else open(path, "a", encoding="utf-8")  # noqa: SIM115 - close()

    def arrived(self, raw: bytes) -> RequestRecord:
        """A request arrived (not yet validated): its record, appended to the file when recording."""
        record = RequestRecord.parse(raw)
        if self._file is not None:
            line = json.dumps(record.body, ensure_ascii=False) + "\n"
            with self._lock:
                if not self._file.closed:
                    self._file.write(line)
                    self._file.flush()
        return record

    def received(self, prompt: str, record: RequestRecord) -> RequestRecord:
        """Count a validated request for ``prompt``; returns its record with the sample key."""
        key = prompt_key(prompt)
        record = replace(record, sample=key)
        summary = record.summary()  # the messages are dropped now, not kept until a snapshot
        with self._lock:
            self._bump(self._received, key)
            self._recent.append(summary)
        return record

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
        """Forget the counts and records (``POST /sim/stats/reset``); the file keeps its lines."""
        with self._lock:
            self._received.clear()
            self._generated.clear()
            self._recent.clear()
            self._truncated = False

    def close(self) -> None:
        """Close the file (later requests are no longer written to it)."""
        with self._lock:
            if self._file is not None:
                self._file.close()

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
            "recent": recent,
        }


def read_requests(path: str | Path) -> list[dict[str, Any]]:
    """The request bodies recorded by ``--record-requests``, in arrival order."""
    text = Path(path).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
