"""The shared services of a chaos run: Redis, and the output store (a tmpfs, or moto behind proxies).

Redis listens on loopback and on the host end of every namespaced node's ``redis`` path; with
AOF on (``appendfsync everysec``, the production setting) it can be killed and restarted with
its data, or restarted empty (its AOF deleted), or flushed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tests.chaos.rounds import current_records, load
from tests.helpers import free_port, wait_until
from tests.s3_support import FaultProxy, MotoServer, aws_env


class RedisProc:
    """A private redis-server bound to ``addresses`` (all must exist when it starts)."""

    def __init__(self, folder: Path, addresses: list[str], env: dict[str, str]) -> None:
        self.dir = folder
        self.addresses = addresses
        self.port = free_port()
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()  # one restart at a time

    def url(self, address: str = "127.0.0.1") -> str:
        return f"redis://{address}:{self.port}/0"

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "redis.conf"
        conf.write_text(
            f'port {self.port}\nbind {" ".join(self.addresses)}\nprotected-mode no\nsave ""\n'
            f"appendonly yes\nappendfsync everysec\ndir {self.dir}\nmaxmemory-policy noeviction\n"
            f"logfile {self.dir / 'redis.log'}\n"
        )
        self.proc = subprocess.Popen(
            ["redis-server", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env
        )
        wait_until(self.ping, 20, "redis-server to answer")

    def ping(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=0.5, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=5)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def restart(self, keep_data: bool, down_s: float = 1.0) -> None:
        """SIGKILL, wait ``down_s``, start again: with its AOF, or empty (the AOF deleted)."""
        import time

        with self.lock:
            self.kill()
            if not keep_data:
                for path in self.dir.iterdir():
                    if path.name.startswith("appendonly") or path.suffix == ".rdb":
                        if path.is_dir():
                            shutil.rmtree(path)
                        else:
                            path.unlink()
            time.sleep(down_s)
            self.start()

    def flushall(self) -> None:
        with self.lock:
            self.client().flushall()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@dataclass(frozen=True, slots=True)
class Blob:
    """What the history keeps of one chunk output: its content hash, records and failed records."""

    digest: str
    records: int
    failed: int


class Output:
    """The job's output store as the run sees it (not through the code under test)."""

    uri: str
    kind: str

    def env(self, address: str | None) -> dict[str, str]:
        """Environment for a process reaching the store from ``address``'s side (None: the host)."""
        return {}

    def fail(self) -> str:
        """Make chunk writes fail; returns how."""
        raise NotImplementedError

    def unfail(self) -> None:
        raise NotImplementedError

    def chunk_versions(self) -> dict[str, str]:
        """Chunk output name -> a version token that changes whenever its bytes may have."""
        raise NotImplementedError

    def read(self, key: str) -> bytes | None:
        raise NotImplementedError

    def count(self, prefix: str) -> int:
        """Objects under ``prefix`` (e.g. ``inputs/``)."""
        raise NotImplementedError

    def records(self) -> Iterator[dict[str, Any]]:
        """The current record of every sample: a chunk file's, or the latest repair round's for its id
        (:mod:`tests.chaos.rounds`)."""
        return current_records(load(self))

    def close(self) -> list[str]:
        return []


def blob(data: bytes) -> Blob:
    rows = [json.loads(line) for line in data.splitlines() if line.strip()]
    failed = sum(1 for r in rows if r.get("status") != "ok")
    return Blob(hashlib.sha256(data).hexdigest()[:16], len(rows), failed)


class LocalOutput(Output):
    """A small tmpfs: filled to the last few KiB ("disk full"), then freed."""

    kind = "local"

    def __init__(self, mount: Path, size_mb: int = 256) -> None:
        self.mount = mount
        mount.mkdir(parents=True, exist_ok=True)
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(mount)],
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            raise RuntimeError(f"cannot mount a tmpfs for the output (needs root): {res.stderr.strip()}")
        self.root = mount / "out"
        self.uri = str(self.root)
        self.filler = mount / "filler"

    def fail(self) -> str:
        import errno
        import os

        st = os.statvfs(self.mount)
        free = st.f_bavail * st.f_frsize
        target, written = max(0, free - 4096), 0  # leave 4 KiB: less than any chunk file
        # Workers write into the same tmpfs meanwhile: the space can run out before the target
        # does, and that is the fault we want, not an error of the run.
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while written < target:
                written += os.write(fd, b"\0" * min(1 << 20, target - written))
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        finally:
            os.close(fd)
        return f"tmpfs filled ({written // 1024} KiB taken, about 4 KiB left)"

    def unfail(self) -> None:
        self.filler.unlink(missing_ok=True)

    def chunk_versions(self) -> dict[str, str]:
        folder = self.root / "outputs"
        out: dict[str, str] = {}
        try:
            entries = list(folder.iterdir())
        except FileNotFoundError:
            return out
        for path in entries:
            if path.name.startswith("chunk-"):
                with contextlib.suppress(FileNotFoundError):
                    st = path.stat()
                    out[path.name] = f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"
        return out

    def read(self, key: str) -> bytes | None:
        try:
            return (self.root / key).read_bytes()
        except FileNotFoundError:
            return None

    def count(self, prefix: str) -> int:
        try:
            return sum(1 for p in (self.root / prefix).iterdir() if not p.name.startswith("."))
        except FileNotFoundError:
            return 0

    def close(self) -> list[str]:
        self.unfail()
        res = subprocess.run(["umount", str(self.mount)], capture_output=True, text=True)
        if res.returncode != 0:
            subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)
            return [f"umount {self.mount}: {res.stderr.strip()} (detached lazily)"]
        return []


class S3Output(Output):
    """moto's S3 server behind one fault proxy per path: loopback, and each namespaced node's link."""

    kind = "s3"

    def __init__(self, folder: Path, addresses: list[str]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.moto = MotoServer(folder / "moto.log")
        self.bucket = self.moto.new_bucket("chaos")
        self.uri = f"s3://{self.bucket}/job"
        self.proxies = {a: FaultProxy(self.moto.port, host=a) for a in ["127.0.0.1", *addresses]}
        for proxy in self.proxies.values():  # a killed client resets its connection: no traceback
            proxy.server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self._client = self.moto.client()

    def endpoint(self, address: str) -> str:
        return f"http://{address}:{self.proxies[address].server.server_address[1]}"

    def env(self, address: str | None) -> dict[str, str]:
        return aws_env(self.endpoint(address or "127.0.0.1"))

    def fail(self) -> str:
        for proxy in self.proxies.values():  # botocore retries these; past its retries a write fails
            proxy.inject("slowdown", 1_000_000, method="PUT", path_contains="/outputs/", every=1)
        return "S3 PUT of outputs: 503 SlowDown on every request"

    def unfail(self) -> None:
        for proxy in self.proxies.values():
            proxy.clear()

    def chunk_versions(self) -> dict[str, str]:
        out: dict[str, str] = {}
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix="job/outputs/"
        )
        for page in pages:
            for obj in page.get("Contents", []):
                name = obj["Key"].rsplit("/", 1)[1]
                if name.startswith("chunk-"):
                    out[name] = f"{obj['ETag']}:{obj['LastModified'].timestamp()}"
        return out

    def read(self, key: str) -> bytes | None:
        try:
            return bytes(self._client.get_object(Bucket=self.bucket, Key=f"job/{key}")["Body"].read())
        except self._client.exceptions.NoSuchKey:
            return None

    def count(self, prefix: str) -> int:
        page = self._client.list_objects_v2(Bucket=self.bucket, Prefix=f"job/{prefix}")
        return int(page.get("KeyCount", 0))

    def close(self) -> list[str]:
        for proxy in self.proxies.values():
            proxy.close()
        self.moto.stop()
        return []


def new_run_id() -> str:
    return uuid.uuid4().hex[:4]
