"""Fixtures of the worker tests."""

from tests.workers.chunk_support import staged

__all__ = ["staged"]
