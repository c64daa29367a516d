"""The output store: where staged chunk inputs, completions and the job files live.

The store is the source of truth. A chunk is done iff its completions object exists, and
objects are written atomically (whole or not at all). :class:`Store` is the small interface
everything above it uses; :class:`LocalStore` implements it on a directory and
:class:`~dflash_tasks.store_s3.S3Store` on an S3-compatible bucket. Keys are relative,
``/``-separated and validated, so nothing can be written outside the output root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from dflash_tasks.errors import RetryableError, StoreError
from dflash_tasks.settings import Settings

_KEY_PART = re.compile(r"^[A-Za-z0-9._-]+$")


class Store(Protocol):
    """A flat key → bytes store with atomic writes."""

    @property
    def uri(self) -> str:
        """Where the store is, as the user wrote it (no credentials)."""
        ...

    def read(self, key: str) -> bytes:
        """The object's bytes; raises :class:`KeyError` when it does not exist."""
        ...

    def write(self, key: str, data: bytes) -> None:
        """Write ``data`` atomically: readers see the old object, or the whole new one."""
        ...

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""
        ...

    def list(self, prefix: str) -> Iterator[str]:
        """Every key under ``prefix`` (a folder such as ``"outputs/"``), in one listing pass."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""
        ...

    def check_writable(self) -> None:
        """Raise :class:`StoreError` naming the cause unless the store can be listed, written and read.

        Called by enqueue before anything is staged or queued; creates the root when needed.
        """
        ...


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key, else raise :class:`StoreError`."""
    parts = key.split("/")
    if not key or any(p in ("", ".", "..") or not _KEY_PART.fullmatch(p) for p in parts):
        raise StoreError(f"invalid store key {key!r}: keys are relative, '/'-separated, [A-Za-z0-9._-]")
    return key


class LocalStore:
    """A :class:`Store` on a local (or network-mounted) directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(root).expanduser().resolve()
        self._uri = str(root)

    @property
    def uri(self) -> str:
        return self._uri

    @property
    def root(self) -> Path:
        return self._root

    def _path(self, key: str) -> Path:
        return self._root / check_key(key)

    def read(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise KeyError(key) from None
        except OSError as exc:
            raise _translate(exc, f"reading {self._root / key}") from exc

    def write(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:12]}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise _translate(exc, f"writing {path}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise _translate(exc, f"deleting {self._root / key}") from exc

    def check_writable(self) -> None:
        probe = self._root / f".dflash-write-probe-{uuid.uuid4().hex[:12]}"
        try:
            self._root.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"probe\n")
            probe.unlink()
        except OSError as exc:
            with contextlib.suppress(OSError):
                probe.unlink()
            raise StoreError(f"output {self._root} is not writable: {exc.strerror or exc}") from None

    def list(self, prefix: str) -> Iterator[str]:
        folder = self._root / check_key(prefix.rstrip("/")) if prefix else self._root
        base = prefix.rstrip("/") + "/" if prefix else ""
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _translate(exc, f"listing {folder}") from exc
        for entry in entries:
            if entry.is_file() and not entry.name.startswith("."):
                yield base + entry.name


def open_store(uri: str, settings: Settings | None = None) -> Store:
    """Open the store at ``uri``: a local path (or ``file://`` URL), or ``s3://bucket/prefix``.

    ``settings`` supplies the S3 endpoint (``s3_endpoint_url``); without them, an ``s3://`` store
    loads :class:`Settings` from the environment.
    """
    if not uri:
        raise StoreError("no output location given (use --output PATH or s3://bucket/prefix)")
    if uri.startswith("s3://"):
        try:
            from dflash_tasks.store_s3 import S3Store  # boto3 only where S3 is used
        except ImportError as exc:
            raise StoreError(f"s3:// outputs need boto3 ({exc}): pip install boto3") from None
        settings = settings if settings is not None else Settings.load()
        return S3Store(uri, endpoint_url=settings.s3_endpoint_url or None)
    if uri.startswith("file://"):
        if not uri[len("file://") :]:
            raise StoreError(f"no path in output location {uri!r}")
        return LocalStore(uri[len("file://") :])
    if "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise StoreError(f"unsupported output location {uri!r}: scheme {scheme!r} is not supported")
    return LocalStore(uri)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _translate(exc: OSError, doing: str) -> Exception:
    """Map an OS error to retryable (disk full, I/O) or permanent (permissions, not a folder)."""
    if exc.errno in (errno.ENOSPC, errno.EIO, errno.EAGAIN, errno.EDQUOT, errno.ESTALE):
        return RetryableError(f"{doing}: {exc.strerror}")
    return StoreError(f"{doing}: {exc.strerror or exc}")
