"""S3 sources read through the store's S3 boundary (moto over HTTP, behind a fault proxy): streamed,
resumed where a body broke off, and pinned to the listed version, so that an object replaced before
or during the read is an error naming it, never a silent mix of two versions."""

from __future__ import annotations

import gzip
import json
import random
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dflash_tasks.core.errors import InputError
from dflash_tasks.core.job import MANIFEST_KEY
from dflash_tasks.core.settings import CommonSettings
from dflash_tasks.producer.mix import InputMix
from dflash_tasks.producer.prompt_row import ColumnMap
from dflash_tasks.producer.sources import parse_sources
from dflash_tasks.producer.staging import stage_input
from dflash_tasks.store import LocalStore
from tests.producer.test_sources import rows
from tests.s3_support import FaultProxy, MotoServer, aws_env

LINES = 3000


def big_rows(n: int = LINES, tag: str = "") -> list[dict[str, Any]]:
    """:func:`rows` with ~1.4 KB of incompressible text each: a file of several MiB, even gzipped,
    so that a read breaks off after the first MiB has been read."""
    pad = random.Random(tag)
    return [
        {**r, "messages": [*r["messages"], {"role": "user", "content": pad.randbytes(700).hex()}]}
        for r in rows(n, tag)
    ]


def encode(items: list[dict[str, Any]], fmt: str) -> bytes:
    """``items`` as the bytes of a file of format ``fmt`` (jsonl, gz, zst, parquet)."""
    text = "".join(json.dumps(r) + "\n" for r in items).encode()
    if fmt == "gz":
        return gzip.compress(text)
    sink = pa.BufferOutputStream()
    if fmt == "zst":
        with pa.CompressedOutputStream(sink, "zstd") as fh:
            fh.write(text)
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(items), sink, row_group_size=500)
    else:
        return text
    return bytes(sink.getvalue().to_pybytes())


SUFFIX = {"jsonl": "jsonl", "gz": "jsonl.gz", "zst": "jsonl.zst", "parquet": "parquet"}


@pytest.fixture
def env(moto: MotoServer, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> FaultProxy:
    """Credentials for the code under test, its endpoint the proxy in front of moto."""
    for key, value in aws_env().items():
        monkeypatch.setenv(key, value)
    return proxy


def settings(proxy: FaultProxy) -> CommonSettings:
    return CommonSettings.load(s3_endpoint_url=proxy.url)


def staged(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "inputs").iterdir())}


def stage_local(tmp_path: Path, data: bytes, name: str) -> dict[str, bytes]:
    local = tmp_path / name
    local.write_bytes(data)
    stage_input(local, LocalStore(tmp_path / "o-local"), "job", 64)
    return staged(tmp_path / "o-local")


def mix_of(location: str, proxy: FaultProxy) -> InputMix:
    return InputMix(parse_sources([location], ColumnMap()), 0, settings(proxy))


@pytest.mark.parametrize("fmt", ["jsonl", "gz", "zst", "parquet"])
def test_a_body_broken_off_is_resumed_where_it_stopped_at_the_same_version(
    tmp_path: Path, moto: MotoServer, env: FaultProxy, fmt: str
) -> None:
    data = encode(big_rows(), fmt)
    bucket, key = moto.new_bucket("in"), f"data/prompts.{SUFFIX[fmt]}"
    moto.client().put_object(Bucket=bucket, Key=key, Body=data)
    etag = moto.client().head_object(Bucket=bucket, Key=key)["ETag"]
    env.inject("slowdown", 2, method="GET", path_contains=key)  # S3 asks to slow down (botocore retries)
    env.inject("cut", 3, method="GET", path_contains=key)  # then bodies break off halfway

    stage_input(mix_of(f"s3://{bucket}/{key}", env), LocalStore(tmp_path / "o"), "job", 64)

    assert staged(tmp_path / "o") == stage_local(tmp_path, data, f"prompts.{SUFFIX[fmt]}")
    assert env.fired == {"cut": 3, "slowdown": 2}
    gets = [s for s in env.seen if s.method == "GET" and key in s.path]
    assert all(s.headers.get("if-match") == etag.strip('"') for s in gets), gets
    resumed = [s.headers["range"] for s in gets if s.headers.get("range", "bytes=0-") != "bytes=0-"]
    assert resumed, "a broken body is resumed from where it stopped, not read again from the start"


@pytest.mark.parametrize("fmt", ["jsonl", "gz"])
def test_an_object_replaced_mid_read_is_an_error_naming_it_and_keeps_what_was_staged(
    tmp_path: Path, moto: MotoServer, env: FaultProxy, fmt: str
) -> None:
    data = encode(big_rows(), fmt)
    bucket, key = moto.new_bucket("in"), f"data/prompts.{SUFFIX[fmt]}"
    client = moto.client()
    client.put_object(Bucket=bucket, Key=key, Body=data)
    other = encode(big_rows(LINES, "new"), fmt)  # the same size of file, other prompts

    def replace() -> None:
        client.put_object(Bucket=bucket, Key=key, Body=other)

    # The object's second GET (the first reads its magic bytes) breaks off, and it is replaced.
    env.inject("cut", 1, method="GET", path_contains=key, every=2, then=replace)
    out = tmp_path / "o"
    with pytest.raises(InputError) as info:
        stage_input(mix_of(f"s3://{bucket}/{key}", env), LocalStore(out), "job", 64)
    message = str(info.value)
    assert message.startswith(f"s3://{bucket}/{key}: read stopped after line "), message
    assert f"s3://{bucket}/{key} was replaced while it was read (at byte " in message
    assert "its ETag is no longer" in message
    line = int(message.split("after line ")[1].split(":")[0])
    assert 0 < line < LINES
    chunks = staged(out)
    assert chunks and not (out / MANIFEST_KEY).exists()  # what was staged stays; nothing claims done
    first = stage_local(tmp_path, data, "old")["chunk-000000.jsonl"]
    assert chunks["chunk-000000.jsonl"] == first  # of the version listed, not the new one


def test_an_object_replaced_after_the_listing_is_refused_not_read(
    tmp_path: Path, moto: MotoServer, env: FaultProxy
) -> None:
    bucket, key = moto.new_bucket("in"), "prompts.jsonl"
    client = moto.client()
    client.put_object(Bucket=bucket, Key=key, Body=encode(rows(50), "jsonl"))
    mix = mix_of(f"s3://{bucket}/{key}", env)
    mix.identity()  # the job is defined by the version listed now
    client.put_object(Bucket=bucket, Key=key, Body=encode(rows(50, "new"), "jsonl"))
    with pytest.raises(
        InputError, match=rf"s3://{bucket}/{key} was replaced while it was read \(at byte 0\)"
    ):
        stage_input(mix, LocalStore(tmp_path / "o"), "job", 64)


def test_an_s3_source_is_streamed_never_written_to_disk(
    tmp_path: Path, moto: MotoServer, env: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = moto.new_bucket("in")
    client = moto.client()
    client.put_object(Bucket=bucket, Key="a.jsonl.gz", Body=encode(rows(LINES), "gz"))
    client.put_object(Bucket=bucket, Key="b.parquet", Body=encode(rows(300, "b"), "parquet"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where a download would go
    mix = InputMix(
        parse_sources([f"s3://{bucket}/a.jsonl.gz", f"s3://{bucket}/b.parquet"], ColumnMap()),
        0,
        settings(env),
    )
    items = mix.read()
    first = next(items)
    assert first.id == "a:p0"  # type: ignore[union-attr]
    assert list(scratch.iterdir()) == []
    assert sum(1 for _ in items) == LINES + 300 - 1
    assert list(scratch.iterdir()) == []
