"""A sample (one prompt: a chat ending in a user or tool turn) and the staged chunk file format."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    """One usable prompt: a chat ending in a user or tool turn."""

    id: str
    messages: list[dict[str, str]]
    line: int


_ENCODER = json.JSONEncoder(ensure_ascii=False)


def encode_sample(sample: Sample) -> bytes:
    """One staged line: the sample's id, input line and prompt messages."""
    return _encode(sample).encode()


def _encode(sample: Sample) -> str:
    return _ENCODER.encode({"id": sample.id, "line": sample.line, "messages": sample.messages})


def encode_chunk(samples: list[Sample]) -> bytes:
    """A staged chunk file: one :func:`encode_sample` line per sample."""
    return ("\n".join([_encode(s) for s in samples]) + "\n").encode()


def decode_chunk(data: bytes) -> list[Sample]:
    """The samples of a staged chunk file."""
    out: list[Sample] = []
    for raw in data.splitlines():
        if raw.strip():
            doc = json.loads(raw)
            out.append(Sample(id=doc["id"], messages=doc["messages"], line=doc["line"]))
    return out
