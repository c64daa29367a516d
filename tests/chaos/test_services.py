"""The chaos run's store faults: filling the tmpfs is the fault, never an error of the run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.services import LocalOutput

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def test_filling_the_store_while_workers_write_stops_at_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = LocalOutput(tmp_path / "mnt", size_mb=4)
    try:
        real = os.statvfs(out.mount)

        class Stale:  # what statvfs said just before a worker wrote a chunk: more than is left now
            f_frsize = real.f_frsize
            f_bavail = real.f_bavail * 2

        monkeypatch.setattr(os, "statvfs", lambda path: Stale)
        how = out.fail()  # ran out of space before its target: that is the fault, not an error
        monkeypatch.undo()
        assert how.startswith("tmpfs filled")
        assert os.statvfs(out.mount).f_bavail * real.f_frsize < 64 * 1024
        with pytest.raises(OSError):
            (out.mount / "chunk").write_bytes(b"x" * 65536)
        out.unfail()
        (out.mount / "chunk").write_bytes(b"x" * 65536)  # space is back
    finally:
        assert out.close() == []
