"""An input source: where its rows live (local or ``s3://``), how to read them, its share of the job.

``--input LOCATION[,key=value ...]``, repeated for several sources. LOCATION is a file, a folder
or a glob, local or ``s3://bucket/key``; the keys are ``name``, ``weight``, ``limit``, ``format``
(``jsonl``, ``parquet``, ``arrow``) and the column mapping ``messages``, ``prompt``, ``id``
(per source, over ``--messages-column``, ``--prompt-column``, ``--id-column``).

A source's fingerprint names its content: the SHA-256 of each local file's bytes, or each S3
object's key, size and ETag (read from the listing, so a re-run checks it without reading them).
An ``s3://`` source is streamed from the bucket, each object pinned to the ETag its listing gave
(:mod:`dflash_tasks.producer.input_files`): one replaced since is an error naming it.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Any, Final

from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.settings import CommonSettings
from dflash_tasks.producer.input_files import LocalTree, S3Tree
from dflash_tasks.producer.input_formats import FORMATS, InputFiles, list_files
from dflash_tasks.producer.inputs import input_fingerprint
from dflash_tasks.producer.prompt_row import ColumnMap

_KEYS: Final = ("name", "weight", "limit", "format", "messages", "prompt", "id")
_OPTION: Final = re.compile(r",(" + "|".join(_KEYS) + r")=([^,]*)$")
_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One ``--input``: where, how to read it, and how much of it the job takes."""

    location: str
    name: str
    format: str | None = None
    weight: float | None = None
    limit: int | None = None
    columns: ColumnMap = field(default_factory=ColumnMap)
    named: bool = False  # the name was given (``name=``), not derived from the location

    @property
    def is_s3(self) -> bool:
        return self.location.startswith("s3://")

    def option(self) -> str:
        """How the user names this source's format option in a message."""
        return f"--input {self.location},format"

    def identity(self, fingerprint: str) -> dict[str, Any]:
        """What of this source names the job (its location's spelling does not)."""
        doc: dict[str, Any] = {"name": self.name, "fingerprint": fingerprint}
        if self.weight is not None:
            doc["weight"] = self.weight
        if self.limit is not None:
            doc["limit"] = self.limit
        if self.format is not None:
            doc["format"] = self.format
        if cols := self.columns.to_dict():
            doc["columns"] = cols
        return doc


def parse_source(text: str, defaults: ColumnMap) -> SourceSpec:
    """One ``--input`` value: ``LOCATION[,key=value ...]`` (see the module docstring)."""
    options: dict[str, str] = {}
    location = text
    while match := _OPTION.search(location):
        options.setdefault(match[1], match[2])
        location = location[: match.start()]
    if not location:
        raise ConfigError(f"--input {text!r}: no location before the options")
    where = f"--input {text}"
    fmt = options.get("format")
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"{where}: format={fmt!r}: expected one of {', '.join(FORMATS)}")
    name = options.get("name") or default_name(location)
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{where}: name={name!r}: use letters, digits, '.', '_' or '-' (at most 64)")
    try:
        columns = ColumnMap(
            messages=options.get("messages", defaults.messages if "prompt" not in options else None),
            prompt=options.get("prompt", defaults.prompt if "messages" not in options else None),
            id=options.get("id", defaults.id),
            system=defaults.system,
        )
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return SourceSpec(
        location=location,
        name=name,
        format=fmt,
        weight=_number(options, "weight", where, float),
        limit=_number(options, "limit", where, int),
        columns=columns,
        named="name" in options,
    )


def parse_sources(texts: list[str], defaults: ColumnMap) -> list[SourceSpec]:
    """Every ``--input``; names must differ, and weights are given to all sources or none."""
    specs = [parse_source(t, defaults) for t in texts]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"--input: several sources are named {', '.join(dup)}: give each a name=")
    weighted = [s.weight is not None for s in specs]
    if any(weighted) and not all(weighted):
        raise ConfigError("--input: give every source a weight=, or none")
    return specs


def default_name(location: str) -> str:
    """A source's name from its location: the last part, without the format's suffixes."""
    base = location.rstrip("/").rsplit("/", 1)[-1]
    for suffix in (".gz", ".zst", ".jsonl", ".ndjson", ".json", ".parquet", ".arrow"):
        base = base.removesuffix(suffix)
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base).strip("._-")[:64]
    return base or "input"


def _number(options: dict[str, str], key: str, where: str, kind: type[float] | type[int]) -> Any:
    if key not in options:
        return None
    try:
        value = kind(options[key])
    except ValueError:
        raise ConfigError(f"{where}: {key}={options[key]!r} is not a number") from None
    if not value > 0:
        raise ConfigError(f"{where}: {key} must be > 0, got {value}")
    return value


# --- where the files are -----------------------------------------------------------------------


class Located:
    """A source's files: listed (and fingerprinted) once, read from where they are."""

    def __init__(self, spec: SourceSpec, settings: CommonSettings | None = None) -> None:
        self.spec = spec
        self._tree: LocalTree | S3Tree = S3Tree(spec.location, settings) if spec.is_s3 else LocalTree()
        self._files: InputFiles | None = None

    def fingerprint(self) -> str:
        """``sha256:<hex>`` of the content (see the module docstring)."""
        digest = hashlib.sha256()
        if isinstance(self._tree, S3Tree):
            for key, size, etag in self._tree.objects():
                digest.update(f"{key}\0{size}\0{etag}\n".encode())
            return "s3:sha256:" + digest.hexdigest()
        files = [f.name for f in self.files().files]
        if len(files) == 1:  # one file: the SHA-256 of its bytes, as jobs of one JSONL file always had
            return input_fingerprint(files[0])
        root = os.path.commonpath(files)
        for name in files:
            digest.update(f"{os.path.relpath(name, root)}\0{input_fingerprint(name)}\n".encode())
        return "sha256:" + digest.hexdigest()

    def files(self) -> InputFiles:
        """The files to read, in order, and their format."""
        if self._files is None:
            self._files = list_files(self._tree, self.spec.location, self.spec.format, self.spec.option())
        return self._files
