"""A stand-in for ``sgl_kernel``, put on the real SGLang server's ``PYTHONPATH`` by the tests only.

SGLang 0.5.23's CPU engine imports a few names from ``sgl_kernel`` at module level (for example
``sglang/kernels/ops/kvcache/cache_move.py``: ``if _is_cpu: from sgl_kernel import
copy_all_layer_kv_cache_cpu``). sgl-kernel's CPU build is not on PyPI (its wheels there are
CUDA-only), so without this module the server cannot even start. Here any name of this module
resolves to a function that raises ``NotImplementedError`` naming the op; on a dense model's path
on a CPU without AMX none of them is called. It is a plain module, not a package: ``import
sgl_kernel.scalar_type`` still fails, so SGLang's ``try: ... except ImportError`` fallbacks for
the submodules (e.g. ``sglang/srt/layers/quantization/utils.py``) take effect as without it.

A call must never go unnoticed: besides raising, the function writes one line starting with
:data:`MARKER` to stderr (which the tests capture into the server's log) before SGLang can catch
the error, and the tests fail when that marker appears (``tests/real_sglang/server.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

MARKER = "SGL_KERNEL_STANDIN_CALLED"


def _op(name: str) -> Callable[..., Any]:
    def missing(*args: Any, **kwargs: Any) -> Any:
        sys.stderr.write(f"{MARKER} {name}\n")
        sys.stderr.flush()
        raise NotImplementedError(
            f"sgl_kernel.{name} was called, but this sgl_kernel is the tests' stand-in "
            "(tests/real_sglang/standin): sgl-kernel's CPU build is not installed"
        )

    missing.__name__ = missing.__qualname__ = name
    return missing


def __getattr__(name: str) -> Any:
    """Any public name is an op that raises when called (PEP 562: only for names not defined here)."""
    if name.startswith("__"):
        raise AttributeError(name)
    return _op(name)


__version__ = "0.0.0+tests-standin"
