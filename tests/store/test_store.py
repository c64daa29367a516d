"""Tests for the local store: LocalStore on a real directory, key validation, open_store, errno mapping."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dflash_tasks.core.errors import PermanentError, RetryableError, StoreError
from dflash_tasks.store import LocalStore, check_key, open_store


def all_files(root: Path) -> list[str]:
    """Every file under ``root`` (hidden temp files included), relative and sorted."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "out")


# -- write / read / exists / list --------------------------------------------------------------------


def test_write_then_read_returns_the_same_bytes_and_creates_folders(store: LocalStore) -> None:
    data = bytes(range(256)) * 3
    store.write("outputs/chunk-000001.jsonl", data)
    assert store.read("outputs/chunk-000001.jsonl") == data
    assert (store.root / "outputs" / "chunk-000001.jsonl").read_bytes() == data


def test_write_replaces_an_existing_object(store: LocalStore) -> None:
    store.write("job.json", b"old")
    store.write("job.json", b"new contents")
    assert store.read("job.json") == b"new contents"


def test_write_empty_object(store: LocalStore) -> None:
    store.write("invalid.jsonl", b"")
    assert store.exists("invalid.jsonl")
    assert store.read("invalid.jsonl") == b""


def test_read_missing_key_raises_key_error(store: LocalStore) -> None:
    with pytest.raises(KeyError):
        store.read("outputs/chunk-000000.jsonl")


def test_read_a_folder_is_a_store_error(store: LocalStore) -> None:
    store.write("outputs/chunk-000000.jsonl", b"x")
    with pytest.raises(StoreError, match="reading"):
        store.read("outputs")


def test_exists_only_for_files(store: LocalStore) -> None:
    assert not store.exists("job.json")
    store.write("outputs/chunk-000000.jsonl", b"x")
    assert store.exists("outputs/chunk-000000.jsonl")
    assert not store.exists("outputs")  # a folder is not an object
    assert not store.exists("outputs/chunk-000001.jsonl")


def test_write_leaves_no_temp_files(store: LocalStore) -> None:
    for i in range(5):
        store.write(f"outputs/chunk-{i:06d}.jsonl", b"line\n" * i)
    store.write("job.json", b"{}")
    assert all_files(store.root) == ["job.json"] + [f"outputs/chunk-{i:06d}.jsonl" for i in range(5)]


def test_list_returns_keys_under_prefix_with_the_prefix(store: LocalStore) -> None:
    store.write("outputs/chunk-000000.jsonl", b"a")
    store.write("outputs/chunk-000002.jsonl", b"b")
    store.write("inputs/chunk-000000.jsonl", b"c")
    store.write("outputs/sub/deeper.jsonl", b"d")  # a subfolder is not listed
    store.write("job.json", b"{}")
    assert sorted(store.list("outputs/")) == ["outputs/chunk-000000.jsonl", "outputs/chunk-000002.jsonl"]
    assert sorted(store.list("outputs")) == ["outputs/chunk-000000.jsonl", "outputs/chunk-000002.jsonl"]
    assert sorted(store.list("")) == ["job.json"]


def test_list_skips_hidden_temp_files(store: LocalStore) -> None:
    store.write("outputs/chunk-000000.jsonl", b"a")
    (store.root / "outputs" / ".chunk-000001.jsonl.tmp-0123456789ab").write_bytes(b"partial")
    assert list(store.list("outputs/")) == ["outputs/chunk-000000.jsonl"]


def test_list_of_a_missing_folder_is_empty(store: LocalStore) -> None:
    assert list(store.list("outputs/")) == []


def test_list_of_a_file_is_a_store_error(store: LocalStore) -> None:
    store.write("job.json", b"{}")
    with pytest.raises(StoreError, match="listing"):
        list(store.list("job.json/"))


def test_keys_written_are_listed_and_read_back(store: LocalStore) -> None:
    keys = [f"outputs/chunk-{i:06d}.jsonl" for i in range(20)]
    for key in keys:
        store.write(key, key.encode())
    assert sorted(store.list("outputs/")) == keys
    assert all(store.read(k) == k.encode() for k in store.list("outputs/"))


def test_uri_is_what_the_user_wrote_and_root_is_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = LocalStore("rel/out")
    assert store.uri == "rel/out"
    assert store.root == tmp_path.resolve() / "rel" / "out"
    store.write("job.json", b"{}")
    assert (tmp_path / "rel" / "out" / "job.json").read_bytes() == b"{}"


# -- atomic writes that fail midway ----------------------------------------------------------------


def test_failed_replace_leaves_old_object_and_no_temp_file(
    store: LocalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.write("outputs/chunk-000000.jsonl", b"old")

    def broken_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(StoreError, match=r"writing .*Permission denied"):
        store.write("outputs/chunk-000000.jsonl", b"new")
    monkeypatch.undo()
    assert store.read("outputs/chunk-000000.jsonl") == b"old"
    assert all_files(store.root) == ["outputs/chunk-000000.jsonl"]


def test_failed_first_write_leaves_no_object(store: LocalStore, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(RetryableError, match="No space left"):
        store.write("outputs/chunk-000003.jsonl", b"x" * 10_000)
    monkeypatch.undo()
    assert not store.exists("outputs/chunk-000003.jsonl")
    assert all_files(store.root) == []


def test_write_under_a_file_is_a_store_error_and_writes_nothing(store: LocalStore) -> None:
    store.write("outputs", b"I am a file, not a folder")
    with pytest.raises(StoreError, match="writing"):
        store.write("outputs/chunk-000000.jsonl", b"data")
    with pytest.raises(StoreError, match="writing"):
        store.write("outputs/deeper/chunk-000000.jsonl", b"data")
    assert all_files(store.root) == ["outputs"]
    assert store.read("outputs") == b"I am a file, not a folder"


def test_root_that_is_a_file_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    store = LocalStore(tmp_path / "file")
    with pytest.raises(StoreError):
        store.write("job.json", b"{}")
    with pytest.raises(StoreError):
        list(store.list("outputs/"))
    assert (tmp_path / "file").read_bytes() == b"x"


# -- errno mapping -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (errno.ENOSPC, RetryableError),
        (errno.EIO, RetryableError),
        (errno.EAGAIN, RetryableError),
        (errno.EDQUOT, RetryableError),
        (errno.ESTALE, RetryableError),
        (errno.EACCES, StoreError),
        (errno.EROFS, StoreError),
        (errno.ENOTDIR, StoreError),
    ],
)
def test_write_errno_mapping(
    store: LocalStore, monkeypatch: pytest.MonkeyPatch, code: int, kind: type[Exception]
) -> None:
    def failing(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(kind) as info:
        store.write("job.json", b"{}")
    assert os.strerror(code) in str(info.value)
    assert "job.json" in str(info.value)
    if kind is StoreError:
        assert isinstance(info.value, PermanentError)
    else:
        assert not isinstance(info.value, PermanentError)
    monkeypatch.undo()
    assert all_files(store.root) == []


@pytest.mark.parametrize(("code", "kind"), [(errno.ENOSPC, RetryableError), (errno.EACCES, StoreError)])
def test_read_errno_mapping(
    store: LocalStore, monkeypatch: pytest.MonkeyPatch, code: int, kind: type[Exception]
) -> None:
    store.write("job.json", b"{}")

    def failing(self: Path) -> bytes:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(Path, "read_bytes", failing)
    with pytest.raises(kind, match="reading"):
        store.read("job.json")


def test_list_errno_mapping(store: LocalStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.write("outputs/chunk-000000.jsonl", b"x")

    def denied(path: object) -> object:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "scandir", denied)
    with pytest.raises(StoreError, match=r"listing .*Permission denied"):
        list(store.list("outputs/"))

    def stale(path: object) -> object:
        raise OSError(errno.ESTALE, "Stale file handle")

    monkeypatch.setattr(os, "scandir", stale)
    with pytest.raises(RetryableError, match="Stale"):
        list(store.list("outputs/"))


# -- key validation --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "job.json",
        "manifest.json",
        "outputs/chunk-000000.jsonl",
        "inputs/chunk-123456.jsonl",
        "a/b/c/d.txt",
        "A-Z_0.9",
        "...",  # a name made of three dots is an ordinary file name
    ],
)
def test_valid_keys_pass(key: str) -> None:
    assert check_key(key) == key


@pytest.mark.parametrize(
    "key",
    [
        "",
        "../x",
        "..",
        ".",
        "./x",
        "/abs",
        "/etc/passwd",
        "a/../b",
        "a/./b",
        "a//b",
        "a/",
        "outputs/",
        "with space",
        "tab\there",
        "nul\x00byte",
        "back\\slash",
        "ünïcode",
        "a/b c/d",
        "~/x",
        "$HOME",
    ],
)
def test_invalid_keys_are_rejected(key: str, store: LocalStore) -> None:
    with pytest.raises(StoreError, match="invalid store key"):
        check_key(key)
    with pytest.raises(StoreError, match="invalid store key"):
        store.write(key, b"x")
    with pytest.raises(StoreError, match="invalid store key"):
        store.read(key)
    with pytest.raises(StoreError, match="invalid store key"):
        store.exists(key)


def test_traversal_writes_nothing_outside_the_root(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root")
    for key in ("../escape", "a/../../escape", "/tmp/escape"):
        with pytest.raises(StoreError):
            store.write(key, b"x")
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize("key", ["job.json\n", "outputs/chunk-000000.jsonl\n", "a\n/b"])
def test_key_with_trailing_newline_is_rejected(key: str) -> None:
    with pytest.raises(StoreError):
        check_key(key)


# -- open_store ----------------------------------------------------------------------------------------


def test_open_store_plain_path(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "out"))
    assert isinstance(store, LocalStore)
    assert store.root == (tmp_path / "out").resolve()
    assert store.uri == str(tmp_path / "out")


def test_open_store_file_url(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/out")
    assert isinstance(store, LocalStore)
    assert store.root == (tmp_path / "out").resolve()
    store.write("job.json", b"{}")
    assert (tmp_path / "out" / "job.json").read_bytes() == b"{}"


def test_open_store_expands_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    store = open_store("~/out")
    assert isinstance(store, LocalStore)
    assert store.root == (tmp_path / "out").resolve()


@pytest.mark.parametrize(
    ("uri", "scheme"),
    [
        ("az://container/prefix", "az"),
        ("gs://bucket/x", "gs"),
        ("http://host/x", "http"),
        ("hdfs://nn/p", "hdfs"),
    ],
)
def test_open_store_unsupported_scheme(uri: str, scheme: str) -> None:
    with pytest.raises(StoreError) as info:
        open_store(uri)
    message = str(info.value)
    assert "unsupported" in message
    assert repr(scheme) in message
    assert uri in message


def test_open_store_empty_location() -> None:
    with pytest.raises(StoreError, match="--output"):
        open_store("")


def test_open_store_empty_file_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError):
        open_store("file://")


def test_a_missing_key_names_itself(store: LocalStore) -> None:
    with pytest.raises(KeyError) as caught:
        store.read("outputs/chunk-000009.jsonl")
    assert caught.value.args == ("outputs/chunk-000009.jsonl",)


def test_delete_removes_the_object_and_a_missing_one_is_fine(store: LocalStore) -> None:
    store.write("outputs/chunk-000001.jsonl", b"x")
    store.delete("outputs/chunk-000001.jsonl")
    assert not store.exists("outputs/chunk-000001.jsonl")
    store.delete("outputs/chunk-000001.jsonl")  # already gone: no error
    (store.root / "outputs" / "chunk-000002.jsonl").mkdir()
    with pytest.raises(StoreError, match=r"deleting .*chunk-000002\.jsonl"):
        store.delete("outputs/chunk-000002.jsonl")


def test_check_writable_leaves_nothing_and_names_a_root_it_cannot_write(tmp_path: Path) -> None:
    good = LocalStore(tmp_path / "new" / "root")
    good.check_writable()
    good.check_writable()  # an existing root too
    assert list((tmp_path / "new" / "root").iterdir()) == []  # the probe is gone
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(StoreError) as caught:
        LocalStore(tmp_path / "a-file" / "root").check_writable()
    assert str(caught.value) == f"output {tmp_path / 'a-file' / 'root'} is not writable: Not a directory"


def test_an_os_error_without_a_description_still_says_what_failed() -> None:
    from dflash_tasks.store.local import _translate

    err = _translate(OSError("unnamed trouble"), "writing x")
    assert isinstance(err, StoreError) and str(err) == "writing x: unnamed trouble"


def test_a_corrupt_job_or_manifest_file_is_named(store: LocalStore) -> None:
    from dflash_tasks.store.jobfiles import load_job, load_manifest

    assert load_job(store) is None and load_manifest(store) is None
    store.write("job.json", b"{not json")
    store.write("manifest.json", b"[]")
    with pytest.raises(StoreError, match=f"{store.uri}/job.json is not a valid dflash job file"):
        load_job(store)
    with pytest.raises(StoreError, match=f"{store.uri}/manifest.json is not a valid dflash manifest"):
        load_manifest(store)


def test_records_are_read_in_chunk_order_past_a_chunk_not_done(store: LocalStore) -> None:
    from dflash_tasks.core.job import Manifest
    from dflash_tasks.store.records import iter_records

    store.write("outputs/chunk-000000.jsonl", b'{"id": "a"}\n\n{"id": "b"}\n')
    store.write("outputs/chunk-000002.jsonl", b'{"id": "c"}\n')
    missing: list[int] = []
    manifest = Manifest("j", 9, 9, 0, 3, 4)
    assert [r.id for r in iter_records(store, manifest, missing)] == ["a", "b", "c"]
    assert missing == [1, 3]
    assert [r.id for r in iter_records(store, manifest)] == ["a", "b", "c"]


def test_a_damaged_record_is_named_by_chunk_line_and_field(store: LocalStore) -> None:
    from dflash_tasks.core.errors import BadRecord
    from dflash_tasks.core.job import Manifest
    from dflash_tasks.store.records import iter_records

    store.write("outputs/chunk-000000.jsonl", b'{"id": "a"}\n{"id": "b", "usage": {"prompt_tokens": "x"}}\n')
    with pytest.raises(BadRecord) as caught:
        list(iter_records(store, Manifest("j", 3, 3, 0, 3, 1)))
    assert str(caught.value) == (
        "outputs/chunk-000000.jsonl:2: not a valid output record "
        "(usage.prompt_tokens: expected an integer or null, got 'x')"
    )


def test_the_current_record_of_a_sample_is_its_latest_repair_rounds(store: LocalStore) -> None:
    from dflash_tasks.core.job import Manifest
    from dflash_tasks.store.records import iter_records, list_outputs, read_current

    store.write("outputs/chunk-000000.jsonl", b'{"id": "a", "status": "ok"}\n{"id": "b"}\n{"id": "c"}\n')
    store.write(
        "outputs/chunk-000000.repair-1.jsonl", b'{"id": "b", "error": "again"}\n{"id": "c", "status": "ok"}\n'
    )
    store.write("outputs/chunk-000000.repair-2.jsonl", b'{"id": "b", "status": "ok", "repair": 2}\n')
    store.write("outputs/chunk-000001.jsonl", b'{"id": "d", "status": "ok"}\n')
    listing = list_outputs(store)
    assert listing.chunks == {0, 1} and listing.rounds_of(0) == (1, 2) and listing.last_round(1) == 0
    current = read_current(store, 0, listing.rounds_of(0))
    assert [(r.id, r.ok, r.repair) for r in current] == [("a", True, None), ("b", True, 2), ("c", True, None)]
    assert [r.id for r in read_current(store, 0)] == ["a", "b", "c"]  # the chunk file alone
    assert not read_current(store, 0)[1].ok
    manifest = Manifest("j", 4, 4, 0, 3, 2)
    assert [(r.id, r.ok) for r in iter_records(store, manifest)] == [(i, True) for i in "abcd"]


def test_a_repair_round_holding_a_sample_twice_is_a_bad_record(store: LocalStore) -> None:
    from dflash_tasks.core.errors import RepeatedRecord
    from dflash_tasks.store.records import read_current

    store.write("outputs/chunk-000000.jsonl", b'{"id": "a"}\n{"id": "b"}\n')
    store.write("outputs/chunk-000000.repair-1.jsonl", b'{"id": "b", "status": "ok"}\n{"id": "b"}\n')
    with pytest.raises(
        RepeatedRecord, match=r"repair-1.jsonl:2: .*id 'b' written again by round 1 of chunk 0"
    ):
        read_current(store, 0, (1,))
    skipped: list[Exception] = []
    current = read_current(store, 0, (1,), on_bad=skipped.append)
    assert [(r.id, r.ok) for r in current] == [("a", False), ("b", True)]  # the first one stands
    assert [type(e) for e in skipped] == [RepeatedRecord]
