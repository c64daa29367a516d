"""Abuse: a pickled task message, hostile message arguments, path-like sample ids, credentials.

One worker on a password-protected Redis, with AWS credentials in its environment, gets two jobs
(one on a local directory, one on S3 via moto) and, between them, hand-published messages: a
pickle whose payload would run a shell command when unpickled, chunks ``"../x"``, ``-1`` and
``1000000``, a job id ``"../../x"``. It refuses or drops each of them, stays up, finishes both
jobs, writes nothing outside the output roots, and no credential reaches a message, a log, an
output object, ``job.json`` or ``progress.json``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from kombu.connection import Connection

from dflash_tasks.coord.celery_app import TASK_NAME
from dflash_tasks.core.settings import MonitorSettings, WorkerSettings
from dflash_tasks.monitoring import flower
from tests.helpers import free_port, processes, wait_until
from tests.reliability.support import (
    Collector,
    PasswordRedis,
    Row,
    enqueue_ok,
    files_under,
    logs,
    outputs,
    settle,
    start_worker,
    write_questions,
)
from tests.s3_support import SECRET_KEY, MotoServer, aws_env
from tests.store.test_s3_e2e import objects, records

pytestmark = pytest.mark.reliability

PASSWORD = "redis-pw-" + uuid.uuid4().hex  # distinctive: grepped for everywhere afterwards
TRAVERSAL_IDS = ["../../etc/x", "/etc/passwd-dflash", "..", "outputs/../../x", "C:\\x"]


class Canary:
    """Unpickling this runs ``touch PATH``: the worker must never unpickle anything."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.path}",)


_TEMP = re.compile(r"^\.(?P<name>.+)\.tmp-[0-9a-f]{12}$")  # LocalStore's atomic-write temp file


def settled_name(name: str) -> str:
    """The file an atomic write's temp file is about to become (``.x.tmp-…`` -> ``x``), else ``name``."""
    found = _TEMP.match(name)
    return found["name"] if found else name


def read_present(path: Path) -> bytes:
    """The file's bytes; empty if it vanished since it was listed (a temp file renamed into place)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def publish_raw(url: str, queue: str, task_id: str, args: tuple[Any, ...], serializer: str = "json") -> None:
    """A task message (Celery protocol 2) published with kombu, as anyone with Redis access could."""
    headers = {
        "lang": "py",
        "task": TASK_NAME,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "retries": 0,
        "eta": None,
        "expires": None,
        "timelimit": [None, None],
        "argsrepr": "hostile",
        "kwargsrepr": "{}",
        "origin": "attacker@host",
    }
    body: tuple[Any, ...] = (args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None})
    with Connection(url) as conn:  # type: ignore[no-untyped-call]
        conn.Producer(serializer=serializer).publish(
            body, exchange=queue, routing_key=queue, headers=headers, delivery_mode=2
        )


def redis_dump(client: redis.Redis) -> bytes:
    """Every key and value in the Redis database, as one blob to search."""
    r = cast(Any, client)  # redis-py's stubs type replies as bytes | str
    parts: list[bytes] = []
    for key in r.scan_iter(count=1000):
        kind = r.type(key)
        parts.append(key)
        if kind == b"string":
            parts.append(r.get(key) or b"")
        elif kind == b"list":
            parts += r.lrange(key, 0, -1)
        elif kind == b"hash":
            for k, v in r.hgetall(key).items():
                parts += [k, v]
        elif kind == b"set":
            parts += list(r.smembers(key))
        elif kind == b"zset":
            parts += [m for m, _ in r.zrange(key, 0, -1, withscores=True)]
    return b"\n".join(parts)


@pytest.fixture(scope="module")
def secure_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PasswordRedis]:
    server = PasswordRedis(tmp_path_factory.mktemp("redis-pw"), PASSWORD)
    yield server
    server.stop()


def test_hostile_messages_and_credentials(
    tmp_path: Path, secure_redis: PasswordRedis, moto: MotoServer, reliability: Collector
) -> None:
    queue = f"q{uuid.uuid4().hex[:8]}"
    canary = tmp_path / "CANARY-pickle-was-loaded"
    with processes(tmp_path, secure_redis.url, queue) as procs:
        procs.env.update(aws_env(moto.url))  # every process holds the AWS secret
        procs.env["DFLASH_PROGRESS_SECONDS"] = "0.5"
        r = secure_redis.client()

        # A local job whose sample ids look like paths, queued before any worker runs.
        local_in, local_out = tmp_path / "local.jsonl", tmp_path / "out"
        with open(local_in, "w") as fh:
            for i, sid in enumerate(TRAVERSAL_IDS * 4):
                unique = sid if i < len(TRAVERSAL_IDS) else f"{sid}#{i}"
                fh.write(json.dumps({"id": unique, "prompt": f"question {i}"}) + "\n")
        local = enqueue_ok(procs, local_in, local_out, "--chunk-size", "8")
        job_id = str(local["job_id"])

        # Hostile messages on the job model's queue (where workers listen), then a second job (on
        # S3) queued after them.
        queue = procs.model_queue()
        publish_raw(secure_redis.url, queue, "pickled-0001", (Canary(canary), 0), serializer="pickle")
        hostile = {"../x": "chunk-dotdot", -1: "chunk-negative", 1_000_000: "chunk-huge"}
        for chunk, tid in hostile.items():
            publish_raw(secure_redis.url, queue, tid, (job_id, chunk))
        publish_raw(secure_redis.url, queue, "job-dotdot", ("../../x", 0))
        bucket = moto.new_bucket("sec")
        s3_in, s3_out = write_questions(tmp_path / "s3.jsonl", 40, "sec"), f"s3://{bucket}/secure"
        s3 = enqueue_ok(procs, s3_in, s3_out, "--chunk-size", "8")

        # Only JSON with (job id, chunk) in our own messages: no credential, no prompt.
        queued = r.lrange(queue, 0, -1)
        assert not any(PASSWORD.encode() in m or SECRET_KEY.encode() in m for m in queued)
        ours = [json.loads(m) for m in queued]
        ours = [m for m in ours if m["headers"]["argsrepr"] != "hostile"]
        assert len(ours) == int(local["chunks"]) + int(s3["chunks"])
        for message in ours:
            assert message["content-type"] == "application/json"
            args = json.loads(base64.b64decode(message["body"]))[0]
            assert len(args) == 2 and args[0] in (job_id, s3["job_id"]) and isinstance(args[1], int)

        metrics_port = free_port()
        sim = procs.simulator("--time-scale", "0.001")
        worker = start_worker(procs, sim, "sec-gpu0", env={"DFLASH_METRICS_PORT": str(metrics_port)})
        wait_until(lambda: len(outputs(local_out)) == int(local["chunks"]), 60, "the local job")
        wait_until(
            lambda: len(objects(moto, bucket, "secure/outputs/")) == int(s3["chunks"]), 60, "the S3 job"
        )
        wait_until(lambda: r.llen(queue) == 0, 30, "every message consumed")
        wait_until(lambda: (local_out / "progress.json").exists(), 30, "progress.json")
        wait_until(lambda: objects(moto, bucket, "secure/progress.json"), 30, "progress.json on S3")
        log = logs(procs, "sec-gpu0.log")

        # 1. the pickle was refused, never loaded; the worker stayed up and did the next job
        assert "ContentDisallowed" in log or "Refusing to deserialize untrusted content" in log, log[-3000:]
        assert not canary.exists(), "the pickled payload ran"
        assert worker.poll() is None
        s3_blobs = objects(moto, bucket)
        settle(
            reliability,
            procs,
            family="10",
            fault="pickle-serialized task message (payload runs `touch` if unpickled)",
            inp=s3_in,
            out=s3_out,
            runs=1,
            recover_s=None,
            records=records(s3_blobs),
            notes="refused (ContentDisallowed: JSON only), payload never ran; worker up, finished the "
            "job queued after it (S3)",
            sims=[sim],
        )

        # 2. hostile arguments dropped; path-like ids are just ids; nothing outside the roots
        # (a negative chunk is refused with the message's other arguments, before any lookup)
        for reason in ("chunk '../x'", "chunk -1, repair round 0", "has no chunk 1000000 "):
            assert reason in log, reason
        assert "job ../../x is not registered" in log
        assert "re-queued" not in log  # dropped once, not retried forever
        expected_files = {"job.json", "manifest.json", "invalid.jsonl", "progress.json"}
        # The worker keeps rewriting progress.json (atomically, through a temp file beside it).
        top = {settled_name(p.name) for p in local_out.iterdir() if p.is_file()}
        assert top <= expected_files, top
        assert {p.name for p in (local_out / "outputs").iterdir()} == {
            f"chunk-{c:06d}.jsonl" for c in range(int(local["chunks"]))
        }
        strays = [
            p
            for p in files_under(tmp_path)
            if not p.is_relative_to(local_out) and (p.name in ("x", "passwd-dflash") or "chunk-" in p.name)
        ]
        assert strays == [], strays
        assert not Path("/etc/x").exists() and not Path("/etc/passwd-dflash").exists()
        settle(
            reliability,
            procs,
            family="10",
            fault="path traversal: sample ids '../../etc/x', '/etc/passwd-dflash', '..'; hand-published "
            "chunks '../x', -1, 1000000 and job '../../x'",
            inp=local_in,
            out=local_out,
            runs=len(hostile) + 1,
            recover_s=None,
            notes="ids stay record fields (files are named by chunk number only); each hostile message "
            "dropped with an error, none retried; nothing written outside the output root",
            sims=[sim],
        )

        # 3. no credential anywhere: files (logs, outputs, progress.json, job.json), objects, Redis
        secrets = {"Redis password": PASSWORD.encode(), "AWS secret": SECRET_KEY.encode()}
        searched = [p for p in files_under(tmp_path) if "redis-pw" not in str(p)]
        leaks = [(name, str(p)) for p in searched for name, s in secrets.items() if s in read_present(p)]
        leaks += [(name, key) for key, data in s3_blobs.items() for name, s in secrets.items() if s in data]
        dump = redis_dump(r)
        leaks += [(name, "redis") for name, s in secrets.items() if s in dump]
        assert f"redis://:**@127.0.0.1:{secure_redis.port}" in log  # the worker did connect with it
        assert leaks == [], leaks
        assert "secure/progress.json" in s3_blobs and "secure/job.json" in s3_blobs
        reliability.add(
            Row(
                family="10",
                fault="credentials: Redis requirepass in the broker URL, AWS secret in the environment",
                runs=2,
                expected=None,
                stored_once=None,
                lost=None,
                duplicated=None,
                recover_s=None,
                notes=f"found in none of {len(searched)} files (logs, outputs, job.json, progress.json), "
                f"{len(s3_blobs)} S3 objects, {r.dbsize()} Redis keys incl. queued messages",
                test="tests/reliability/test_security.py::test_hostile_messages_and_credentials",
            )
        )

        # 4. loopback by default: the worker's metrics socket and Flower's default address
        listening = listening_addresses(metrics_port)
        assert listening == {"127.0.0.1"}, listening
        assert WorkerSettings().metrics_address == "127.0.0.1"
        args = flower.build_parser().parse_args([])
        monitor = MonitorSettings.load(broker_url=secure_redis.url)
        argv, env, password, _ = flower.flower_command(args, monitor, {})
        assert "--address=127.0.0.1" in argv and password not in " ".join(argv)
        assert PASSWORD not in " ".join(argv) and env["FLOWER_BASIC_AUTH"].endswith(password)
        reliability.add(
            Row(
                family="10",
                fault="network exposure: worker metrics and Flower bind addresses",
                runs=1,
                expected=None,
                stored_once=None,
                lost=None,
                duplicated=None,
                recover_s=None,
                notes=f"worker /metrics listens on {', '.join(sorted(listening))} only; Flower defaults to "
                "--address=127.0.0.1, password and broker URL via the environment, not argv",
                test="tests/reliability/test_security.py::test_hostile_messages_and_credentials",
            )
        )


def listening_addresses(port: int) -> set[str]:
    """Local addresses of the TCP sockets listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found: set[str] = set()
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, hexport = local.split(":")
                if state != "0A" or int(hexport, 16) != port:  # 0A = LISTEN
                    continue
                if v6:
                    found.add("::" if set(addr) == {"0"} else addr)
                else:
                    found.add(".".join(str(b) for b in reversed(bytes.fromhex(addr))))
    return found
