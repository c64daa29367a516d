"""``Store.write_new``: create a chunk output once, never replace it (local link, S3 conditional PUT).

A worker that ran past its lease (frozen, or cut off from Redis) finishes a chunk another worker
already stored; its write must leave the stored chunk as it is (found by the chaos run).
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from dflash_tasks.store.local import LocalStore
from dflash_tasks.store.s3 import S3Store
from tests.s3_support import FaultProxy, MotoServer, aws_env

KEY = "outputs/chunk-000007.jsonl"


@pytest.fixture(autouse=True)
def _aws(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in aws_env().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def test_local_write_new_creates_once_and_never_replaces(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "out")
    assert store.write_new(KEY, b"first\n") is True
    assert store.write_new(KEY, b"second\n") is False
    assert store.read(KEY) == b"first\n"
    assert store.write_new(KEY, b"first\n") is True  # the same bytes: already written
    assert sorted(p.name for p in (tmp_path / "out" / "outputs").iterdir()) == ["chunk-000007.jsonl"]


def test_local_write_new_races_have_one_winner(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "out")
    results: dict[int, bool] = {}
    barrier = threading.Barrier(8)

    def write(i: int) -> None:
        barrier.wait()
        results[i] = store.write_new(KEY, f"writer {i}\n".encode())

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, won in results.items() if won]
    assert len(winners) == 1 and store.read(KEY) == f"writer {winners[0]}\n".encode()
    assert [p.name for p in (tmp_path / "out" / "outputs").iterdir()] == ["chunk-000007.jsonl"]


def test_local_write_new_without_hard_links_still_keeps_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    store = LocalStore(tmp_path / "out")
    assert store.write_new(KEY, b"first\n") is True
    assert store.write_new(KEY, b"second\n") is False
    assert store.read(KEY) == b"first\n"
    assert [p.name for p in (tmp_path / "out" / "outputs").iterdir()] == ["chunk-000007.jsonl"]


def test_s3_write_new_is_a_conditional_put(moto: MotoServer, proxy: FaultProxy) -> None:
    bucket = moto.new_bucket()
    store = S3Store(f"s3://{bucket}/p", endpoint_url=proxy.url)
    assert store.write_new(KEY, b"first\n") is True
    assert store.write_new(KEY, b"second\n") is False
    assert store.read(KEY) == b"first\n"
    puts = [s for s in proxy.seen if s.method == "PUT"]
    assert len(puts) == 2 and all(s.headers.get("if-none-match") == "*" for s in puts)


def test_s3_write_new_retried_after_an_unseen_success_counts_as_written(
    moto: MotoServer, proxy: FaultProxy
) -> None:
    bucket = moto.new_bucket()
    store = S3Store(f"s3://{bucket}/p", endpoint_url=proxy.url)
    proxy.inject("reset_after_forward", 1)  # the PUT lands; the client hears nothing, botocore retries
    assert store.write_new(KEY, b"mine\n") is True  # the retry gets 412, but the bytes are ours
    assert proxy.fired["reset_after_forward"] == 1
    assert store.read(KEY) == b"mine\n"
