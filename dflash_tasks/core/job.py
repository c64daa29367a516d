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

from dflash_tasks.core.budget import BUDGET_POLICIES, DEFAULT_MAX_TOKENS, FIXED, HORIZON
from dflash_tasks.core.errors import JobMismatch, StoreError
from dflash_tasks.core.quality import QualitySettings
from dflash_tasks.core.trainer_view import TrainerView

JOB_KEY = "job.json"
MANIFEST_KEY = "manifest.json"
INVALID_KEY = "invalid.jsonl"
INPUTS_PREFIX = "inputs/"
OUTPUTS_PREFIX = "outputs/"
SPEC_VERSION = 1
#: How a conversation is generated: ``all`` regenerates every assistant turn in order from the
#: model's own history; ``last`` sends the source's history as is and regenerates the last turn.
TURNS_MODES = ("all", "last")
#: What a multi-turn request carries of the earlier turns' reasoning: ``drop`` sends their answers
#: only (as Qwen3's chat template renders history); ``keep`` sends their reasoning too and asks the
#: template to render it (``preserve_thinking``, Qwen3.6), and the loss-token count renders it so.
HISTORY_REASONING = ("drop", "keep")


@dataclass(frozen=True, slots=True)
class GenerationSpec:
    """What to generate. Defaults follow Qwen3's thinking-mode recommendation.

    ``budget_policy``: ``fixed``, every request gets ``max_tokens``; ``horizon`` (``--max-tokens
    horizon``), each request gets the trainer's horizon (:mod:`dflash_tasks.core.budget`) and
    ``max_tokens`` is the trainer's ``max_length``, the budget where no tokenizer is at hand.
    ``seed``: a request's sampling seed, set only on the requests of a repair round that
    regenerates a looped sample (never a job's: None leaves the server to draw one).
    """

    model: str
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    thinking: bool = True
    chunk_size: int = 64
    turns: str = "all"
    history_reasoning: str = "drop"
    budget_policy: str = FIXED
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.budget_policy not in BUDGET_POLICIES:
            raise ValueError(
                f"budget_policy must be one of {', '.join(BUDGET_POLICIES)}, got {self.budget_policy!r}"
            )
        if self.turns not in TURNS_MODES:
            raise ValueError(f"turns must be one of {', '.join(TURNS_MODES)}, got {self.turns!r}")
        if self.history_reasoning not in HISTORY_REASONING:
            raise ValueError(
                f"history_reasoning must be one of {', '.join(HISTORY_REASONING)}, "
                f"got {self.history_reasoning!r}"
            )

    @property
    def keeps_history_reasoning(self) -> bool:
        return self.history_reasoning == "keep"

    @property
    def at_horizon(self) -> bool:
        """Whether each request's budget is the trainer's horizon (``--max-tokens horizon``)."""
        return self.budget_policy == HORIZON

    def identity(self) -> dict[str, Any]:
        """The fields that name the job. ``turns: last``, ``history_reasoning: drop`` and
        ``budget_policy: fixed`` are left out: jobs made before those fields existed behaved so,
        and keep their ids."""
        doc = asdict(self)
        if doc["turns"] == "last":
            del doc["turns"]
        if doc["history_reasoning"] == "drop":
            del doc["history_reasoning"]
        if doc["budget_policy"] == FIXED:
            del doc["budget_policy"]
        if doc["seed"] is None:
            del doc["seed"]
        return doc

    def sampling(self) -> dict[str, Any]:
        """Sampling parameters as recorded on every output record (``budget_policy`` only for
        ``horizon``: a fixed budget's records are written as before)."""
        doc: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "enable_thinking": self.thinking,
        }
        if self.at_horizon:
            doc["budget_policy"] = HORIZON
        if self.seed is not None:
            doc["seed"] = self.seed
        return doc


@dataclass(frozen=True, slots=True)
class Amendment:
    """A change a job took after it was defined, not part of its identity (``amendments`` of job.json).

    ``repair_truncated``: samples truncated at ``max_tokens`` (``finish_reason: length``) with a
    smaller budget are regenerated by repair rounds with this one (``enqueue --repair-truncated
    --max-tokens N``); each record's ``sampling.max_tokens`` names the budget that produced it.
    """

    max_tokens: int
    at: float  # unix time it was recorded
    kind: str = "repair_truncated"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "max_tokens": self.max_tokens, "at": self.at}


@dataclass(frozen=True, slots=True)
class JobDefinition:
    """The contents of ``job.json``."""

    job_id: str
    input_fingerprint: str
    input_name: str
    spec: GenerationSpec
    #: Quality checks and gates; recorded with the job but not part of its identity.
    quality: QualitySettings = field(default_factory=QualitySettings)
    #: How the trainer reads the rows (loss tokens); recorded, not part of the identity.
    trainer: TrainerView = field(default_factory=TrainerView)
    #: Changes taken after the job was defined, oldest first; not part of its identity either.
    amendments: tuple[Amendment, ...] = ()
    #: The input sources (``{"sources": [{name, fingerprint, weight, limit, format, columns}], "seed"}``)
    #: whose digest is ``input_fingerprint``; None for a job of one file read as it is.
    inputs: dict[str, Any] | None = None

    @property
    def repair_max_tokens(self) -> int | None:
        """The budget repair rounds regenerate truncated samples with (the latest amendment's), or None."""
        budgets = [a.max_tokens for a in self.amendments if a.kind == "repair_truncated"]
        return budgets[-1] if budgets else None

    @classmethod
    def create(
        cls,
        input_fingerprint: str,
        input_name: str,
        spec: GenerationSpec,
        quality: QualitySettings | None = None,
        trainer: TrainerView | None = None,
        inputs: dict[str, Any] | None = None,
    ) -> JobDefinition:
        identity = json.dumps({"input": input_fingerprint, "spec": spec.identity()}, sort_keys=True)
        job_id = hashlib.sha256(identity.encode()).hexdigest()[:16]
        return cls(
            job_id,
            input_fingerprint,
            input_name,
            spec,
            quality or QualitySettings(),
            trainer or TrainerView(),
            inputs=inputs,
        )

    def to_json(self) -> bytes:
        doc = {
            "version": SPEC_VERSION,
            "job_id": self.job_id,
            "input_fingerprint": self.input_fingerprint,
            "input_name": self.input_name,
            "spec": _spec_doc(self.spec),
            "quality": self.quality.to_dict(),
            "trainer": self.trainer.to_dict(),
        }
        if self.amendments:  # a job without any writes the job.json it always did
            doc["amendments"] = [a.to_dict() for a in self.amendments]
        if self.inputs is not None:
            doc["inputs"] = self.inputs
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
                trainer=TrainerView.from_dict(doc.get("trainer")),
                amendments=tuple(
                    Amendment(int(a["max_tokens"]), float(a["at"]), str(a.get("kind", "repair_truncated")))
                    for a in doc.get("amendments") or ()
                ),
                inputs=doc.get("inputs"),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"{where} is not a valid dflash job file: {exc}") from None


def _spec_doc(spec: GenerationSpec) -> dict[str, Any]:
    """``job.json``'s ``spec`` (``budget_policy`` only for ``horizon``: others as before it existed)."""
    doc = asdict(spec)
    if doc["budget_policy"] == FIXED:
        del doc["budget_policy"]
    if doc["seed"] is None:
        del doc["seed"]
    return doc


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
    #: Per input source of a job of several: name, rows, selected, samples, invalid, first_chunk,
    #: last_chunk (the chunks its samples span); None for a job of one source.
    sources: list[dict[str, Any]] | None = None

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
    if existing.inputs is not None or wanted.inputs is not None:
        diffs += source_differences(existing, wanted)
    elif existing.input_fingerprint != wanted.input_fingerprint:
        diffs.append(
            f"input: the output holds {existing.input_name or '?'} ({existing.input_fingerprint[:19]}), "
            f"this run reads {wanted.input_name} ({wanted.input_fingerprint[:19]})"
        )
    old, new = asdict(existing.spec), asdict(wanted.spec)
    for name in old:
        if old[name] != new.get(name):
            diffs.append(f"{name}: the output has {old[name]!r}, this run asks for {new.get(name)!r}")
    if existing.spec.at_horizon and wanted.spec.at_horizon and old["max_tokens"] != new["max_tokens"]:
        diffs.append("(under --max-tokens horizon, max_tokens is the trainer's --train-max-length)")
    raise JobMismatch(
        f"{output_uri} already holds job {existing.job_id}, which differs from this run:\n  - "
        + "\n  - ".join(diffs)
        + "\nRe-run with the original settings to resume it, or choose another --output."
    )


def source_differences(existing: JobDefinition, wanted: JobDefinition) -> list[str]:
    """Each way the input sources of two jobs differ, worded for a person."""
    old = _sources_by_name(existing)
    new = _sources_by_name(wanted)
    diffs = [f"source {n!r}: the output has it, this run does not read it" for n in old if n not in new]
    diffs += [f"source {n!r}: this run reads it, the output does not have it" for n in new if n not in old]
    for name in [n for n in old if n in new]:
        before, after = old[name], new[name]
        for key in sorted(set(before) | set(after)):
            if key != "name" and before.get(key) != after.get(key):
                diffs.append(
                    f"source {name!r} {key}: the output has {_short(before.get(key))}, "
                    f"this run asks for {_short(after.get(key))}"
                )
    seeds = [(j.inputs or {}).get("seed") for j in (existing, wanted)]
    if seeds[0] != seeds[1]:
        diffs.append(f"sampling seed: the output has {seeds[0]!r}, this run asks for {seeds[1]!r}")
    if not diffs and list(old) != list(new):
        diffs.append(f"source order: the output has {', '.join(old)}, this run reads {', '.join(new)}")
    return diffs


def _sources_by_name(job: JobDefinition) -> dict[str, dict[str, Any]]:
    if job.inputs is None:  # a job of one file: its one source, named after the file
        return {job.input_name or "input": {"fingerprint": job.input_fingerprint}}
    return {str(s["name"]): dict(s) for s in job.inputs.get("sources", ())}


def _short(value: Any) -> str:
    if isinstance(value, str) and value.startswith(("sha256:", "s3:sha256:")):
        return value[: value.rindex(":") + 13]
    return repr(value)
