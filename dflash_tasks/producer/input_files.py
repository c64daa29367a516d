"""An input's files, local or in S3, behind one interface: a name for messages, and a stream.

A :class:`FileTree` answers what a location names (one file, a folder's files, a glob's matches),
locally (:class:`LocalTree`) or in a bucket (:class:`S3Tree`, from one listing of keys, sizes and
ETags); :func:`dflash_tasks.producer.input_formats.list_files` decides from those answers which
files a source reads, the same way for both. An S3 file is read through the store's S3 boundary
(:meth:`dflash_tasks.store.s3.S3Store.open_object`): streamed, retried, and pinned to the version
the listing saw.
"""

from __future__ import annotations

import fnmatch
import glob
import io
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from dflash_tasks.core.errors import ConfigError, DflashError, InputError
from dflash_tasks.core.settings import CommonSettings

_WILDCARDS: Final = "*?["


class InputFile(Protocol):
    """One file of an input."""

    @property
    def name(self) -> str:
        """What messages call it: the local path as given, or ``s3://bucket/key``."""

    @property
    def path(self) -> str | None:
        """The local path (readers may map it), or None."""

    def open(self) -> io.RawIOBase:
        """A seekable binary stream of its bytes (unbuffered: the reader buffers)."""


@dataclass(frozen=True, slots=True)
class LocalFile:
    name: str

    @property
    def path(self) -> str:
        return self.name

    def open(self) -> io.RawIOBase:
        try:
            return open(self.name, "rb", buffering=0)
        except OSError as exc:
            raise InputError(f"{self.name}: cannot open input file: {exc}") from exc


@dataclass(frozen=True, slots=True)
class S3File:
    store: Any = field(repr=False)  # an S3Store
    key: str
    size: int
    etag: str

    @property
    def name(self) -> str:
        return f"s3://{self.store.bucket}/{self.key}"

    @property
    def path(self) -> None:
        return None

    def open(self) -> io.RawIOBase:
        stream: io.RawIOBase = self.store.open_object(self.key, self.etag, self.size)
        return stream


def head(file: InputFile, size: int = 8) -> bytes:
    """The first ``size`` bytes of ``file`` (fewer if it is shorter)."""
    try:
        with file.open() as fh:
            return fh.read(size) or b""
    except InputError:
        raise
    except DflashError as exc:  # from the store, whose messages name the object
        raise InputError(str(exc)) from exc


def is_local_folder(location: str) -> bool:
    """Whether a local ``location`` is a folder; InputError when there is nothing to read there."""
    try:
        mode = os.stat(location).st_mode
    except FileNotFoundError:
        raise InputError(f"{location}: input file not found") from None
    except OSError as exc:
        raise InputError(f"{location}: cannot access input file: {exc}") from exc
    return stat.S_ISDIR(mode)


def is_glob(location: str) -> bool:
    return any(ch in location for ch in _WILDCARDS)


class FileTree(Protocol):
    """What a location names, in one place (a local disk, a bucket)."""

    def file(self, location: str) -> InputFile | None:
        """The file ``location`` names, or None for a folder; InputError when nothing is there."""

    def under(self, location: str) -> list[tuple[str, InputFile]]:
        """(name relative to ``location``, file) of the files in the folder, recursively, sorted;
        hidden files and folders skipped."""

    def matching(self, pattern: str) -> list[InputFile]:
        """The files a glob matches, sorted."""


class LocalTree:
    """The local disk (symlinks followed: a Hub snapshot links its files to blobs)."""

    def file(self, location: str) -> InputFile | None:
        return None if is_local_folder(location) else LocalFile(location)

    def under(self, location: str) -> list[tuple[str, InputFile]]:
        out: list[tuple[str, InputFile]] = []
        for folder, dirs, names in os.walk(location, followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(n for n in names if not n.startswith(".")):
                path = os.path.join(folder, name)
                out.append((os.path.relpath(path, location).replace(os.sep, "/"), LocalFile(path)))
        return sorted(out, key=lambda pair: pair[0])

    def matching(self, pattern: str) -> list[InputFile]:
        return [LocalFile(f) for f in sorted(glob.glob(pattern, recursive=True)) if os.path.isfile(f)]


class S3Tree:
    """The objects of one ``s3://`` location, listed once (key, size, ETag) when first asked; its
    answers are about that location (the one ``list_files`` is given with it)."""

    def __init__(self, location: str, settings: CommonSettings | None = None) -> None:
        self.location = location
        self.bucket, self.key = split_s3(location)
        self._settings = settings
        self._store: Any = None
        self._objects: list[tuple[str, int, str]] | None = None

    def objects(self) -> list[tuple[str, int, str]]:
        """(key, size, ETag) of the location's objects: the one it names, a glob's, or a folder's."""
        if self._objects is None:
            store, key = self.store(), self.key
            if is_glob(key):
                found = [o for o in store.objects(_static_prefix(key)) if fnmatch.fnmatchcase(o[0], key)]
            else:
                found = [o for o in store.objects(key) if o[0] == key]
                if not found:
                    folder = _folder(key)
                    found = [o for o in store.objects(folder) if not _hidden(o[0][len(folder) :])]
            if not found:
                raise InputError(f"{self.location}: no S3 object there")
            self._objects = sorted(found)
        return self._objects

    def store(self) -> Any:
        if self._store is None:
            from dflash_tasks.store.s3 import S3Store  # boto3 only where S3 is used

            endpoint = self._settings.s3_endpoint_url if self._settings is not None else ""
            self._store = S3Store(f"s3://{self.bucket}", endpoint_url=endpoint or None)
        return self._store

    def file(self, location: str) -> InputFile | None:
        found = self.objects()
        if len(found) == 1 and found[0][0] == self.key:
            return S3File(self.store(), *found[0])
        return None

    def under(self, location: str) -> list[tuple[str, InputFile]]:
        folder = _folder(self.key)
        return [
            (key[len(folder) :], S3File(self.store(), key, size, etag)) for key, size, etag in self.objects()
        ]

    def matching(self, pattern: str) -> list[InputFile]:
        return [S3File(self.store(), *o) for o in self.objects()]


def split_s3(location: str) -> tuple[str, str]:
    """``s3://bucket/key`` → (bucket, key)."""
    bucket, _, key = location[len("s3://") :].partition("/")
    if not bucket:
        raise ConfigError(f"--input {location}: no bucket")
    return bucket, key


def _folder(key: str) -> str:
    return key.rstrip("/") + "/" if key else ""


def _static_prefix(key: str) -> str:
    """The part of ``key`` before its first wildcard, up to a ``/``."""
    cut = min((key.index(ch) for ch in _WILDCARDS if ch in key), default=len(key))
    head = key[:cut]
    return head if cut == len(key) else head[: head.rfind("/") + 1]


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/"))
