"""The output store on a local directory (or a shared filesystem mounted on every node)."""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from dflash_tasks.core.errors import RetryableError, StoreError
from dflash_tasks.store.base import check_key


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
        tmp = self._durable_temp(path, data)
        try:
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        except OSError as exc:
            raise _translate(exc, f"writing {path}") from exc
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _durable_temp(self, path: Path, data: bytes) -> Path:
        """``data`` in a temp file beside ``path``, fsynced: renamed or linked into place next."""
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:12]}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise _translate(exc, f"writing {path}") from exc
        return tmp

    def write_new(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        tmp = self._durable_temp(path, data)
        try:
            try:
                os.link(tmp, path)  # atomic, and fails if the key exists: a rename would replace it
            except FileExistsError:
                return path.read_bytes() == data
            except OSError as exc:
                if exc.errno not in _NO_LINKS:
                    raise
                if path.exists():  # a filesystem without hard links: check, then rename (best effort)
                    return path.read_bytes() == data
                os.replace(tmp, path)
            _fsync_dir(path.parent)
            return True
        except OSError as exc:
            raise _translate(exc, f"writing {path}") from exc
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

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


#: link() refused by the filesystem itself (FAT, some FUSE mounts), not by the key existing
_NO_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK)


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
