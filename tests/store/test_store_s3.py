"""S3Store against a real S3 API over HTTP: moto's standalone server, with a fault proxy in front.

The Store contract (read, write, exists, list, delete, check_writable) as LocalStore keeps it,
plus what only S3 has: pagination, checksums, error translation and credential hygiene.
"""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.errors import CorruptObject, RetryableError, StoreError
from dflash_tasks.core.settings import CommonSettings
from dflash_tasks.store import open_store
from dflash_tasks.store.s3 import PROBE_KEY, S3Store, parse_s3_uri
from tests.helpers import free_port
from tests.s3_support import ACCESS_KEY, SECRET_KEY, FaultProxy, MotoServer, aws_env


@pytest.fixture(autouse=True)
def _aws(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in aws_env().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def bucket(moto: MotoServer) -> str:
    return moto.new_bucket()


@pytest.fixture
def store(moto: MotoServer, bucket: str) -> S3Store:
    return S3Store(f"s3://{bucket}/jobs/run1", endpoint_url=moto.url)


def raw_get(moto: MotoServer, bucket: str, key: str) -> dict[str, Any]:
    return dict(moto.client().get_object(Bucket=bucket, Key=key))


# -- URIs and open_store ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "bucket", "prefix"),
    [
        ("s3://my-bucket/jobs/run1", "my-bucket", "jobs/run1/"),
        ("s3://my-bucket/jobs/run1/", "my-bucket", "jobs/run1/"),
        ("s3://my-bucket", "my-bucket", ""),
        ("s3://my-bucket/", "my-bucket", ""),
        ("s3://my.bucket.eu/a", "my.bucket.eu", "a/"),
    ],
)
def test_parse_s3_uri(uri: str, bucket: str, prefix: str) -> None:
    assert parse_s3_uri(uri) == (bucket, prefix)


@pytest.mark.parametrize(
    "uri", ["s3://", "s3://x", "s3://bad_bucket!/p", "s3://b..b/p", "s3://bucket/../up", "s3://bucket/a//b"]
)
def test_bad_s3_uris_are_store_errors(uri: str) -> None:
    with pytest.raises(StoreError):
        parse_s3_uri(uri)


@pytest.mark.parametrize(
    "uri",
    [f"s3://{ACCESS_KEY}:{SECRET_KEY}@bucket/p", f"s3://bucket/p?secret={SECRET_KEY}"],
    ids=["userinfo", "query"],  # the secret is random per process: never in a test's name
)
def test_credentials_in_the_uri_are_refused_without_echoing_them(uri: str) -> None:
    with pytest.raises(StoreError) as info:
        open_store(uri)
    assert SECRET_KEY not in str(info.value) and "never the URI" in str(info.value)


def test_open_store_dispatches_s3_with_the_endpoint_from_settings(moto: MotoServer, bucket: str) -> None:
    store = open_store(f"s3://{bucket}/p/", CommonSettings.load({}, s3_endpoint_url=moto.url))
    assert isinstance(store, S3Store) and store.uri == f"s3://{bucket}/p"
    store.write("job.json", b"{}")
    assert raw_get(moto, bucket, "p/job.json")["Body"].read() == b"{}"


def test_open_store_takes_the_endpoint_from_the_settings(
    moto: MotoServer, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DFLASH_S3_ENDPOINT_URL", moto.url)
    store = open_store(f"s3://{bucket}/q", CommonSettings.load())  # the store itself reads no environment
    store.write("a.json", b"1")
    assert store.read("a.json") == b"1"


def test_open_store_uses_aws_endpoint_url(
    moto: MotoServer, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)  # boto3 reads it itself
    store = open_store(f"s3://{bucket}", CommonSettings.load({}))
    store.write("a.json", b"2")
    assert raw_get(moto, bucket, "a.json")["Body"].read() == b"2"


@pytest.mark.parametrize(
    "endpoint",
    ["minio:9000", "ftp://minio", f"http://{ACCESS_KEY}:{SECRET_KEY}@minio:9000"],
    ids=["no-scheme", "ftp", "userinfo"],
)
def test_a_bad_endpoint_is_a_store_error_without_credentials(endpoint: str) -> None:
    settings = CommonSettings.load({"DFLASH_S3_ENDPOINT_URL": endpoint})
    with pytest.raises(StoreError, match="invalid S3 endpoint URL") as info:
        open_store("s3://bucket/p", settings)
    assert SECRET_KEY not in str(info.value)


def test_endpoint_credentials_from_aws_env_never_reach_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://user:{SECRET_KEY}@127.0.0.1:{free_port()}")
    with pytest.raises(RetryableError) as info:
        S3Store("s3://bucket/p", retries=0).write("job.json", b"{}")
    assert SECRET_KEY not in str(info.value) and "://***@127.0.0.1" in str(info.value)


# -- the Store contract ---------------------------------------------------------------------------------


def test_write_then_read_round_trips_under_the_prefix(store: S3Store, moto: MotoServer, bucket: str) -> None:
    data = bytes(range(256)) * 3
    store.write("outputs/chunk-000001.jsonl", data)
    assert store.read("outputs/chunk-000001.jsonl") == data
    obj = raw_get(moto, bucket, "jobs/run1/outputs/chunk-000001.jsonl")
    assert obj["Body"].read() == data
    assert obj["Metadata"] == {"sha256": hashlib.sha256(data).hexdigest()}


def test_write_replaces_and_empty_objects_work(store: S3Store) -> None:
    store.write("job.json", b"old")
    store.write("job.json", b"new contents")
    assert store.read("job.json") == b"new contents"
    store.write("invalid.jsonl", b"")
    assert store.exists("invalid.jsonl") and store.read("invalid.jsonl") == b""


def test_missing_keys(store: S3Store) -> None:
    with pytest.raises(KeyError):
        store.read("outputs/chunk-000000.jsonl")
    assert not store.exists("outputs/chunk-000000.jsonl")
    store.delete("outputs/chunk-000000.jsonl")  # deleting a missing key is not an error


def test_exists_and_delete(store: S3Store) -> None:
    store.write("outputs/chunk-000000.jsonl", b"x")
    assert store.exists("outputs/chunk-000000.jsonl")
    assert not store.exists("outputs")  # a "folder" is not an object
    store.delete("outputs/chunk-000000.jsonl")
    assert not store.exists("outputs/chunk-000000.jsonl")


def test_list_matches_the_local_store(store: S3Store, moto: MotoServer, bucket: str) -> None:
    store.write("outputs/chunk-000000.jsonl", b"a")
    store.write("outputs/chunk-000002.jsonl", b"b")
    store.write("inputs/chunk-000000.jsonl", b"c")
    store.write("outputs/sub/deeper.jsonl", b"d")  # a "subfolder" is not listed
    store.write("outputs/.hidden", b"e")  # hidden names are not listed, as in LocalStore
    store.write("job.json", b"{}")
    moto.client().put_object(Bucket=bucket, Key="jobs/run1-other/outputs/chunk-000009.jsonl", Body=b"z")
    moto.client().put_object(Bucket=bucket, Key="jobs/outputs/chunk-000008.jsonl", Body=b"z")
    expected = ["outputs/chunk-000000.jsonl", "outputs/chunk-000002.jsonl"]
    assert sorted(store.list("outputs/")) == expected
    assert sorted(store.list("outputs")) == expected
    assert sorted(store.list("")) == ["job.json"]
    assert list(store.list("nothing/")) == []


def test_list_paginates_past_1000_keys_in_one_pass(moto: MotoServer, bucket: str, proxy: FaultProxy) -> None:
    store = S3Store(f"s3://{bucket}/big", endpoint_url=proxy.url)
    keys = [f"outputs/chunk-{i:06d}.jsonl" for i in range(1001)]
    moto.put_many(bucket, [f"big/{k}" for k in keys])  # set-up straight to moto
    started = time.perf_counter()
    listed = list(store.list("outputs/"))
    seconds = time.perf_counter() - started
    assert sorted(listed) == keys
    lists = [s for s in proxy.seen if s.method == "GET" and "list-type=2" in s.path]
    assert len(lists) == 2 and "continuation-token=" in lists[1].path  # 1000 + 1
    assert not [s for s in proxy.seen if s.method == "HEAD"]  # no HEAD per chunk
    print(f"\nlisted {len(listed)} keys in {len(lists)} pages in {seconds * 1000:.0f} ms")


@pytest.mark.parametrize(
    "key", ["../escape.jsonl", "/abs", "a//b", "outputs/../../x", "./job.json", "bad key", "", "a/"]
)
def test_invalid_keys_are_rejected_before_any_request(
    key: str, moto: MotoServer, bucket: str, proxy: FaultProxy
) -> None:
    store = S3Store(f"s3://{bucket}/p", endpoint_url=proxy.url)
    for op in (store.read, store.exists, store.delete, lambda k: store.write(k, b"x")):
        with pytest.raises(StoreError, match="invalid store key"):
            op(key)
    assert proxy.seen == []


def test_write_is_one_put_with_a_sha256_checksum(moto: MotoServer, bucket: str, proxy: FaultProxy) -> None:
    store = S3Store(f"s3://{bucket}/p", endpoint_url=proxy.url)
    data = b'{"id": "x", "reasoning": "' + b"y" * 2_000_000 + b'"}\n'  # 2 MB: still one PUT
    store.write("outputs/chunk-000000.jsonl", data)
    assert [(s.method, s.path.split("?")[0]) for s in proxy.seen] == [
        ("PUT", f"/{bucket}/p/outputs/chunk-000000.jsonl")
    ]
    headers = proxy.seen[0].headers
    digest = hashlib.sha256(data).digest()
    assert headers["x-amz-checksum-sha256"] == base64.b64encode(digest).decode()
    assert headers["x-amz-meta-sha256"] == digest.hex()
    assert "uploads" not in proxy.seen[0].path and SECRET_KEY not in repr(headers)


def test_readers_see_the_old_or_the_whole_new_object(store: S3Store) -> None:
    versions = [bytes([65 + i]) * (50_000 + 7919 * i) for i in range(6)]
    store.write("outputs/chunk-000000.jsonl", versions[0])
    stop = threading.Event()
    seen: set[bytes] = set()
    reads: list[int] = []
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                seen.add(store.read("outputs/chunk-000000.jsonl"))
                reads.append(1)
        except BaseException as exc:  # a reader that dies must fail the test, not just warn
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for _ in range(4):
        for v in versions:
            store.write("outputs/chunk-000000.jsonl", v)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert reads and seen <= set(versions)  # never a partial or mixed object


def test_a_failed_put_leaves_the_old_object(moto: MotoServer, bucket: str, proxy: FaultProxy) -> None:
    store = S3Store(f"s3://{bucket}/p", endpoint_url=proxy.url, retries=0)
    store.write("outputs/chunk-000000.jsonl", b"old\n")
    proxy.inject("reset", 1)
    with pytest.raises(RetryableError):
        store.write("outputs/chunk-000000.jsonl", b"new\n" * 1000)
    assert store.read("outputs/chunk-000000.jsonl") == b"old\n"
    proxy.inject("reset", 1)
    with pytest.raises(RetryableError):
        store.write("outputs/chunk-000001.jsonl", b"new\n")
    assert not store.exists("outputs/chunk-000001.jsonl")


# -- checksums ------------------------------------------------------------------------------------------


def test_a_corrupted_or_truncated_object_is_detected(store: S3Store, moto: MotoServer, bucket: str) -> None:
    data = b'{"id": "a"}\n{"id": "b"}\n'
    store.write("outputs/chunk-000003.jsonl", data)
    meta = raw_get(moto, bucket, "jobs/run1/outputs/chunk-000003.jsonl")["Metadata"]
    for bad in (data.replace(b"a", b"c"), data[:-5]):
        moto.client().put_object(
            Bucket=bucket, Key="jobs/run1/outputs/chunk-000003.jsonl", Body=bad, Metadata=meta
        )
        with pytest.raises(CorruptObject, match=r"outputs/chunk-000003\.jsonl is corrupted"):
            store.read("outputs/chunk-000003.jsonl")


def test_objects_without_a_recorded_checksum_are_read_as_they_are(
    store: S3Store, moto: MotoServer, bucket: str
) -> None:
    moto.client().put_object(Bucket=bucket, Key="jobs/run1/job.json", Body=b"{}")  # another tool
    assert store.read("job.json") == b"{}"


# -- transient errors -----------------------------------------------------------------------------------


def test_transient_errors_are_retried_by_botocore(moto: MotoServer, bucket: str, proxy: FaultProxy) -> None:
    store = S3Store(f"s3://{bucket}/p", endpoint_url=proxy.url)
    proxy.inject("internal", 3)
    proxy.inject("reset", 2, method="GET")
    proxy.inject("slowdown", 1, method="HEAD")
    proxy.inject("truncate", 2, method="GET")
    store.write("outputs/chunk-000000.jsonl", b"abc\n" * 100)
    assert store.exists("outputs/chunk-000000.jsonl")
    assert store.read("outputs/chunk-000000.jsonl") == b"abc\n" * 100
    assert proxy.fired == {"internal": 3, "reset": 2, "slowdown": 1, "truncate": 2}


@pytest.mark.parametrize("kind", ["slowdown", "internal", "reset"])
def test_persistent_transient_errors_become_retryable_errors(
    kind: str, moto: MotoServer, bucket: str, proxy: FaultProxy
) -> None:
    store = S3Store(f"s3://{bucket}/p", endpoint_url=proxy.url, retries=0)  # botocore's retries: above
    store.write("job.json", b"{}")
    messages = []
    ops: list[tuple[str, Callable[[], object]]] = [
        ("PUT", lambda: store.write("outputs/chunk-000000.jsonl", b"x")),
        ("GET", lambda: store.read("job.json")),
        ("HEAD", lambda: store.exists("job.json")),
        ("GET", lambda: list(store.list("outputs/"))),
    ]
    for method, op in ops:
        proxy.clear()
        proxy.inject(kind, 100, method=method)
        with pytest.raises(RetryableError) as info:
            op()
        messages.append(str(info.value))
    proxy.clear()
    assert not store.exists("outputs/chunk-000000.jsonl")
    assert all(SECRET_KEY not in m and ACCESS_KEY not in m for m in messages)
    if kind == "slowdown":
        assert "SlowDown (HTTP 503)" in messages[0]


def test_an_unreachable_endpoint_is_retryable() -> None:
    store = S3Store("s3://bucket/p", endpoint_url=f"http://127.0.0.1:{free_port()}", retries=0)
    with pytest.raises(RetryableError, match="EndpointConnectionError"):
        store.write("job.json", b"{}")


# -- configuration errors and the writability probe -----------------------------------------------------


def test_check_writable_passes_and_leaves_nothing(store: S3Store, moto: MotoServer, bucket: str) -> None:
    store.check_writable()
    assert moto.client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    assert PROBE_KEY.startswith(".")


def test_missing_bucket_is_a_store_error_naming_it(moto: MotoServer) -> None:
    store = S3Store("s3://no-such-bucket-dflash/p", endpoint_url=moto.url)
    with pytest.raises(StoreError, match=r"bucket 'no-such-bucket-dflash' does not exist") as info:
        store.check_writable()
    assert not isinstance(info.value, RetryableError)
    with pytest.raises(StoreError, match="does not exist"):
        store.read("job.json")
    with pytest.raises(StoreError, match="does not exist"):
        store.write("job.json", b"{}")


def test_bad_credentials_are_a_store_error(moto: MotoServer, bucket: str, proxy: FaultProxy) -> None:
    proxy.deny(ACCESS_KEY)
    store = S3Store(f"s3://{bucket}/p", endpoint_url=proxy.url)
    for op in (store.check_writable, lambda: store.read("job.json"), lambda: list(store.list("outputs/"))):
        with pytest.raises(StoreError, match=rf"access to S3 bucket '{bucket}' denied") as info:
            op()
        assert "InvalidAccessKeyId" in str(info.value) or "403" in str(info.value)
        assert SECRET_KEY not in str(info.value)


def test_no_credentials_is_a_store_error(
    moto: MotoServer, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store = S3Store(f"s3://{bucket}/p", endpoint_url=moto.url)
    with pytest.raises(StoreError, match="no usable AWS credentials for bucket") as info:
        store.check_writable()
    assert not isinstance(info.value, RetryableError)


def test_local_store_check_writable(tmp_path: Path) -> None:
    from dflash_tasks.store import LocalStore

    store = LocalStore(tmp_path / "new" / "out")
    store.check_writable()
    assert (tmp_path / "new" / "out").is_dir() and list((tmp_path / "new" / "out").iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="not writable"):
        LocalStore(tmp_path / "file" / "out").check_writable()
