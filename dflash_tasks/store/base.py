"""The output store: where staged chunk inputs, completions and the job files live.

The store is the source of truth. A chunk is done iff its completions object exists, and
objects are written atomically (whole or not at all). :class:`Store` is the small interface
everything above it uses; :class:`LocalStore` implements it on a directory and
:class:`~dflash_tasks.store.s3.S3Store` on an S3-compatible bucket. Keys are relative,
``/``-separated and validated, so nothing can be written outside the output root.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Protocol

from dflash_tasks.core.errors import StoreError

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

    def write_new(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` atomically unless it exists; never replace it.

        True when ``key`` now holds ``data`` (this call wrote it, or it held these very bytes),
        False when it holds other bytes (another writer got there first; they are kept).
        """
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
