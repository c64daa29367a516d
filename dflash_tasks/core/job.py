"""A job: one input file (by fingerprint) and one generation spec, living at one output root.

Layout of the output root::

    job.json                      the spec and input fingerprint, written once
    manifest.json                 written when staging finished: counts and chunk sizes
    invalid.jsonl                 every input line kept out of the job, with its reason
    inputs/chunk-000000.jsonl     staged prompts of chunk 0 (id, line, messages; see core/sample.py)
    outputs/chunk-000000.jsonl    completions of chunk 0; its existence means the chunk is done
    outputs/chunk-000000.repair-1.jsonl
                                  the records of chunk 0 that repair round 1 regenerated (write-once,
                                  like the chunk file; the latest record of an id is its current one)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from dflash_tasks.core.errors import JobMismatch, StoreError
from dflash_tasks.core.quality import QualitySettings

JOB_KEY = "job.json"
MANIFEST_KEY = "manifest.json"
INVALID_KEY = "invalid.jsonl"
INPUTS_PREFIX = "inputs/"
OUTPUTS_PREFIX = "outputs/"
SPEC_VERSION = 1
#: How a conversation is generated: ``all`` regenerates every assistant turn in order from the
#: model's own history; ``last`` sends the source's history as is and regenerates the last turn.
TURNS_MODES = ("all", "last")


@dataclass(frozen=True, slots=True)
class GenerationSpec:
    """What to generate. Defaults follow Qwen3's thinking-mode recommendation."""

    model: str
    max_tokens: int = 4096
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    thinking: bool = True
    chunk_size: int = 64
    turns: str = "all"

    def __post_init__(self) -> None:
        if self.turns not in TURNS_MODES:
            raise ValueError(f"turns must be one of {', '.join(TURNS_MODES)}, got {self.turns!r}")

    def identity(self) -> dict[str, Any]:
        """The fields that name the job. ``turns: last`` is left out: jobs made before the field
        existed generated the last turn only, and keep their ids."""
        doc = asdict(self)
        if doc["turns"] == "last":
            del doc["turns"]
        return doc

    def sampling(self) -> dict[str, Any]:
        """Sampling parameters as recorded on every output record."""
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "enable_thinking": self.thinking,
        }


@dataclass(frozen=True, slots=True)
class JobDefinition:
    """The contents of ``job.json``."""

    job_id: str
    input_fingerprint: str
    input_name: str
    spec: GenerationSpec
    #: Quality checks and gates; recorded with the job but not part of its identity.
    quality: QualitySettings = field(default_factory=QualitySettings)

    @classmethod
    def create(
        cls,
        input_fingerprint: str,
        input_name: str,
        spec: GenerationSpec,
        quality: QualitySettings | None = None,
    ) -> JobDefinition:
        identity = json.dumps({"input": input_fingerprint, "spec": spec.identity()}, sort_keys=True)
        job_id = hashlib.sha256(identity.encode()).hexdigest()[:16]
        return cls(job_id, input_fingerprint, input_name, spec, quality or QualitySettings())

    def to_json(self) -> bytes:
        doc = {
            "version": SPEC_VERSION,
            "job_id": self.job_id,
            "input_fingerprint": self.input_fingerprint,
            "input_name": self.input_name,
            "spec": asdict(self.spec),
            "quality": self.quality.to_dict(),
        }
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> JobDefinition:
        try:
            doc = json.loads(data)
            # A job.json without "turns" predates multi-turn generation: it regenerated the last turn.
            spec = {"turns": "last", **doc["spec"]}
            return cls(
                job_id=str(doc["job_id"]),
                input_fingerprint=str(doc["input_fingerprint"]),
                input_name=str(doc.get("input_name", "")),
                spec=GenerationSpec(**spec),
                quality=QualitySettings.from_dict(doc.get("quality")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"{where} is not a valid dflash job file: {exc}") from None


@dataclass(frozen=True, slots=True)
class Manifest:
    """The staged job: counts and chunk sizes, written once staging completed.

    ``turns`` and ``chunk_turns`` count the requests (one per user turn) the job and each chunk
    send when no conversation ends early; both are None when every sample has one turn.
    """

    job_id: str
    lines: int
    samples: int
    invalid: int
    chunk_size: int
    chunks: int
    turns: int | None = None
    chunk_turns: list[int] | None = None

    def chunk_samples(self, chunk: int) -> int:
        """How many samples chunk ``chunk`` holds."""
        if chunk < self.chunks - 1:
            return self.chunk_size
        return self.samples - self.chunk_size * (self.chunks - 1)

    @property
    def total_turns(self) -> int:
        """Generations the whole job sends (a three-turn conversation counts three)."""
        return self.samples if self.turns is None else self.turns

    def turns_of(self, chunk: int) -> int:
        """Generations chunk ``chunk`` sends."""
        if self.chunk_turns is None:
            return self.chunk_samples(chunk)
        return self.chunk_turns[chunk]

    def to_json(self) -> bytes:
        doc = {k: v for k, v in asdict(self).items() if v is not None}
        per_chunk = doc.pop("chunk_turns", None)
        text = json.dumps(doc, indent=2, sort_keys=True)
        if per_chunk is not None:  # one line, not one line per chunk
            text = text[: text.rindex("}")].rstrip() + f',\n  "chunk_turns": {json.dumps(per_chunk)}\n}}'
        return (text + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        try:
            manifest = cls(**json.loads(data))
        except (ValueError, TypeError) as exc:
            raise StoreError(f"{where} is not a valid dflash manifest: {exc}") from None
        if manifest.chunk_turns is not None and len(manifest.chunk_turns) != manifest.chunks:
            problem = "chunk_turns must have one entry per chunk"
            raise StoreError(f"{where} is not a valid dflash manifest: {problem}")
        return manifest


def chunk_name(chunk: int) -> str:
    return f"chunk-{chunk:06d}.jsonl"


def input_key(chunk: int) -> str:
    return INPUTS_PREFIX + chunk_name(chunk)


def output_key(chunk: int) -> str:
    return OUTPUTS_PREFIX + chunk_name(chunk)


def repair_key(chunk: int, round_: int) -> str:
    """The write-once file of the records repair round ``round_`` (1-based) regenerated in ``chunk``."""
    return f"{OUTPUTS_PREFIX}chunk-{chunk:06d}.repair-{round_}.jsonl"


def parse_repair_key(key: str) -> tuple[int, int] | None:
    """(chunk, round) of ``outputs/chunk-N.repair-R.jsonl``, else None."""
    name = key.rsplit("/", 1)[-1]
    if not (name.startswith("chunk-") and name.endswith(".jsonl")):
        return None
    digits, sep, round_ = name[len("chunk-") : -len(".jsonl")].partition(".repair-")
    if sep and digits.isascii() and digits.isdigit() and round_.isascii() and round_.isdigit():
        return int(digits), int(round_)
    return None


def parse_chunk_key(key: str) -> int | None:
    """The chunk number of ``inputs/chunk-N.jsonl`` or ``outputs/chunk-N.jsonl``, else None
    (a repair file is not a chunk file: see :func:`parse_repair_key`)."""
    name = key.rsplit("/", 1)[-1]
    if name.startswith("chunk-") and name.endswith(".jsonl"):
        digits = name[len("chunk-") : -len(".jsonl")]
        if digits.isascii() and digits.isdigit():
            return int(digits)
    return None


def check_same_job(existing: JobDefinition, wanted: JobDefinition, output_uri: str) -> None:
    """Refuse to mix two datasets in one output root: raise :class:`JobMismatch` naming the differences."""
    if existing.job_id == wanted.job_id:
        return
    diffs: list[str] = []
    if existing.input_fingerprint != wanted.input_fingerprint:
        diffs.append(
            f"input: the output holds {existing.input_name or '?'} ({existing.input_fingerprint[:19]}), "
            f"this run reads {wanted.input_name} ({wanted.input_fingerprint[:19]})"
        )
    old, new = asdict(existing.spec), asdict(wanted.spec)
    for name in old:
        if old[name] != new.get(name):
            diffs.append(f"{name}: the output has {old[name]!r}, this run asks for {new.get(name)!r}")
    raise JobMismatch(
        f"{output_uri} already holds job {existing.job_id}, which differs from this run:\n  - "
        + "\n  - ".join(diffs)
        + "\nRe-run with the original settings to resume it, or choose another --output."
    )
