"""Recovery events: one log line per chunk a live worker puts back in circulation, naming how.

Each ends in a JSON object, e.g.::

    re-queued chunk 3 of job 0123abcd: its lease expired (worker lost) \
{"event": "recovery", "mechanism": "lease_expired", "job": "0123abcd", "chunk": 3}

so an operator reads the sentence and a test (or a log pipeline) reads the object with
:func:`parse_events`, and can tell the three paths apart: ``lease_expired`` (the worker running
it died), ``unleased_delivery`` (delivered to a worker that died before leasing it) and
``replan`` (the periodic backstop found it neither done, running nor queued).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from workers.monitor.listener import WorkerListener

MECHANISMS = ("lease_expired", "unleased_delivery", "replan")
_MARK = '{"event": "recovery"'


@dataclass(frozen=True, slots=True)
class RecoveryEvent:
    mechanism: str
    job: str
    chunk: int


def emit(
    log: logging.Logger, listener: WorkerListener, mechanism: str, job_id: str, chunk: int, why: str
) -> None:
    """Count and log that ``chunk`` of ``job_id`` was re-queued by ``mechanism`` (see :data:`MECHANISMS`)."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown recovery mechanism {mechanism!r}")
    listener.chunk_requeued(mechanism)
    doc = {"event": "recovery", "mechanism": mechanism, "job": job_id, "chunk": chunk}
    log.warning("re-queued chunk %d of job %s: %s %s", chunk, job_id, why, json.dumps(doc))


def parse_events(text: str) -> list[RecoveryEvent]:
    """Every recovery event in a log's ``text``, in order."""
    found: list[RecoveryEvent] = []
    for line in text.splitlines():
        at = line.find(_MARK)
        if at < 0:
            continue
        try:
            doc = json.loads(line[at:])
            found.append(RecoveryEvent(str(doc["mechanism"]), str(doc["job"]), int(doc["chunk"])))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short (the process was killed mid-write)
    return found
