"""An input source: where its rows live (local or ``s3://``), how to read them, its share of the job.

``--input LOCATION[,key=value ...]``, repeated for several sources. LOCATION is a file, a folder
or a glob, local or ``s3://bucket/key``; the keys are ``name``, ``weight``, ``limit``, ``format``
(``jsonl``, ``parquet``, ``arrow``) and the column mapping ``messages``, ``prompt``, ``id``
(per source, over ``--messages-column``, ``--prompt-column``, ``--id-column``).

A source's fingerprint names its content: the SHA-256 of each local file's bytes, or each S3
object's key, size and ETag (read from the listing, so a re-run checks it without downloading).
An ``s3://`` source is downloaded into a temporary folder (streamed to disk, one object at a
time) when it is staged, and read from there.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

from dflash_tasks.core.errors import ConfigError, InputError
from dflash_tasks.core.settings import CommonSettings
from dflash_tasks.producer.input_formats import FORMATS, InputFiles, list_local
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
    name = options.get("name") or _default_name(location)
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


def _default_name(location: str) -> str:
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
    """A source's files: listed (and fingerprinted) first, downloaded only when read."""

    def __init__(self, spec: SourceSpec, settings: CommonSettings | None = None) -> None:
        self.spec = spec
        self._settings = settings
        self._s3_objects: list[tuple[str, int, str]] | None = None
        self._local: InputFiles | None = None

    def fingerprint(self) -> str:
        """``sha256:<hex>`` of the content (see the module docstring)."""
        digest = hashlib.sha256()
        if self.spec.is_s3:
            for key, size, etag in self._objects():
                digest.update(f"{key}\0{size}\0{etag}\n".encode())
            return "s3:sha256:" + digest.hexdigest()
        files = self.local_files().files
        if len(files) == 1:  # one file: the SHA-256 of its bytes, as jobs of one JSONL file always had
            return input_fingerprint(files[0])
        root = os.path.commonpath(files)
        for name in files:
            digest.update(f"{os.path.relpath(name, root)}\0{input_fingerprint(name)}\n".encode())
        return "sha256:" + digest.hexdigest()

    def local_files(self) -> InputFiles:
        """The local files (a local source only)."""
        if self._local is None:
            self._local = list_local(self.spec.location, self.spec.format, self.spec.option())
        return self._local

    @contextmanager
    def files(self) -> Iterator[InputFiles]:
        """The files to read: a local source's own, or an ``s3://`` source's downloaded copies."""
        if not self.spec.is_s3:
            yield self.local_files()
            return
        folder = tempfile.mkdtemp(prefix=f"dflash-input-{self.spec.name}-")
        try:
            yield self._download(folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _download(self, folder: str) -> InputFiles:
        store, objects = self._store(), self._objects()
        _, key = _split_s3(self.spec.location)
        if len(objects) == 1 and objects[0][0] == key:  # one object named in full
            local = os.path.join(folder, key.rsplit("/", 1)[-1])
            store.download(key, local)
            return list_local(local, self.spec.format, self.spec.option())
        base = _static_prefix(key) if _is_glob(key) else (key.rstrip("/") + "/" if key else "")
        for name, _, _ in objects:
            local = os.path.join(folder, *name[len(base) :].split("/"))
            os.makedirs(os.path.dirname(local), exist_ok=True)
            store.download(name, local)
        return list_local(folder, self.spec.format, self.spec.option())

    def _objects(self) -> list[tuple[str, int, str]]:
        if self._s3_objects is None:
            _, key = _split_s3(self.spec.location)
            store = self._store()
            if _is_glob(key):
                found = [o for o in store.objects(_static_prefix(key)) if fnmatch.fnmatchcase(o[0], key)]
            else:
                found = [o for o in store.objects(key) if o[0] == key]
                if not found:
                    folder = key.rstrip("/") + "/" if key else ""
                    found = [o for o in store.objects(folder) if not _hidden(o[0][len(folder) :])]
            if not found:
                raise InputError(f"{self.spec.location}: no S3 object there")
            self._s3_objects = sorted(found)
        return self._s3_objects

    def _store(self) -> Any:
        from dflash_tasks.store.s3 import S3Store  # boto3 only where S3 is used

        bucket, _ = _split_s3(self.spec.location)
        endpoint = self._settings.s3_endpoint_url if self._settings is not None else ""
        return S3Store(f"s3://{bucket}", endpoint_url=endpoint or None)


def _split_s3(location: str) -> tuple[str, str]:
    bucket, _, key = location[len("s3://") :].partition("/")
    if not bucket:
        raise ConfigError(f"--input {location}: no bucket")
    return bucket, key


def _is_glob(key: str) -> bool:
    return any(ch in key for ch in "*?[")


def _static_prefix(key: str) -> str:
    """The part of ``key`` before its first wildcard, up to a ``/``."""
    cut = min((key.index(ch) for ch in "*?[" if ch in key), default=len(key))
    head = key[:cut]
    return head if cut == len(key) else head[: head.rfind("/") + 1]


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/"))
