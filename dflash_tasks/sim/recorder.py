"""Recording the chat requests the simulator receives, for tests that check what was sent.

``--record-requests PATH`` (``SimConfig.record_requests``) appends every ``POST
/v1/chat/completions`` body to ``PATH`` as one JSON line, in arrival order, before the request
is validated or any fault applies, so retries and rejected requests are recorded too.
:func:`read_requests` reads them back.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any


class RequestRecorder:
    """Appends request bodies to a JSONL file; thread-safe, flushed after every line."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def record(self, raw: bytes) -> None:
        """Append one body: as parsed JSON, or ``{"raw": text}`` when it is not JSON."""
        try:
            body: Any = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            body = {"raw": raw.decode("utf-8", errors="replace")}
        line = json.dumps(body, ensure_ascii=False) + "\n"
        with self._lock:
            if not self._fh.closed:
                self._fh.write(line)
                self._fh.flush()

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def read_requests(path: str | Path) -> list[dict[str, Any]]:
    """The recorded request bodies, in arrival order."""
    text = Path(path).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
