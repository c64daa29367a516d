"""The ``sgl_kernel`` stand-in: any name imports, a call fails loudly and leaves the marker the
real-server tests scan for (no server needed)."""

from __future__ import annotations

import subprocess
import sys

from tests.real_sglang.server import STANDIN, STANDIN_MARKER, standin_calls

CALL = """
import sgl_kernel
from sgl_kernel import copy_all_layer_kv_cache_cpu as op
assert op.__name__ == "copy_all_layer_kv_cache_cpu"
try:
    import sgl_kernel.scalar_type
except ImportError:
    print("no submodules")
op(1, 2)
"""


def test_a_stand_in_op_imports_then_fails_loudly_when_called() -> None:
    res = subprocess.run(
        [sys.executable, "-c", CALL],
        env={"PYTHONPATH": str(STANDIN)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and res.stdout.strip() == "no submodules"
    assert "NotImplementedError: sgl_kernel.copy_all_layer_kv_cache_cpu was called" in res.stderr
    assert f"{STANDIN_MARKER} copy_all_layer_kv_cache_cpu" in res.stderr
    assert standin_calls(res.stderr) == ["copy_all_layer_kv_cache_cpu"]
    assert standin_calls("[2026-12-01] Prefill batch, #new-seq: 1\n") == []
