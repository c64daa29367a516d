"""A sample (one prompt: a chat ending in a user or tool turn) and the staged chunk file format.

A staged line is ``{"id", "line", "messages"}`` (and ``"source"`` in a job of several input
sources): the source conversation up to its last user (or
tool) turn. Its assistant messages mark where each turn ends (:mod:`dflash_tasks.core.conversation`);
a job generating every turn (``turns: all``) stages them with empty text, since the source's old
answers are never sent, while ``turns: last`` stages them as they are. Chunk files staged before
multi-turn support have the same shape and stay readable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from dflash_tasks.core.errors import StoreError


@dataclass(frozen=True, slots=True)
class Sample:
    """One usable prompt: a chat ending in a user or tool turn."""

    id: str
    messages: list[dict[str, str]]
    line: int  # its place in the job's input: the line of a single JSONL file
    source: str | None = None  # the source's name, in a job of several sources


_ENCODER = json.JSONEncoder(ensure_ascii=False)


def encode_sample(sample: Sample) -> bytes:
    """One staged line: the sample's id, input line and prompt messages."""
    return _encode(sample).encode()


def _encode(sample: Sample) -> str:
    if sample.source is None:
        return _ENCODER.encode({"id": sample.id, "line": sample.line, "messages": sample.messages})
    doc = {"id": sample.id, "line": sample.line, "source": sample.source, "messages": sample.messages}
    return _ENCODER.encode(doc)


def encode_chunk(samples: list[Sample]) -> bytes:
    """A staged chunk file: one :func:`encode_sample` line per sample."""
    return ("\n".join([_encode(s) for s in samples]) + "\n").encode()


def decode_chunk(data: bytes, where: str = "staged chunk") -> list[Sample]:
    """The samples of a staged chunk file; a damaged file raises :class:`StoreError` (permanent:
    retrying cannot repair it, so the worker parks the chunk after a few tries)."""
    out: list[Sample] = []
    for number, raw in enumerate(data.splitlines(), 1):
        if raw.strip():
            try:
                doc = json.loads(raw)
                out.append(Sample(doc["id"], doc["messages"], doc["line"], doc.get("source")))
            except (ValueError, KeyError, TypeError) as exc:
                raise StoreError(
                    f"{where}:{number} is not a staged sample ({type(exc).__name__}: {exc})"
                ) from None
    return out
