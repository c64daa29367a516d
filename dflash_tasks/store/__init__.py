"""The output store: where staged chunk inputs, completions and the job files live.

The store is the source of truth. A chunk is done iff its completions object exists, and
objects are written atomically (whole or not at all). :class:`Store` is the small interface
everything above it uses; :class:`LocalStore` implements it on a directory and
:class:`~dflash_tasks.store.s3.S3Store` on an S3-compatible bucket. Keys are relative,
``/``-separated and validated, so nothing can be written outside the output root.
"""

from __future__ import annotations

from dflash_tasks.core.errors import StoreError
from dflash_tasks.core.settings import CommonSettings
from dflash_tasks.store.base import Store, check_key
from dflash_tasks.store.local import LocalStore

__all__ = ["LocalStore", "Store", "check_key", "open_store"]


def open_store(uri: str, settings: CommonSettings | None = None) -> Store:
    """Open the store at ``uri``: a local path (or ``file://`` URL), or ``s3://bucket/prefix``.

    ``settings`` supplies the S3 endpoint (``s3_endpoint_url``); without them, boto3's default.
    """
    if not uri:
        raise StoreError("no output location given (use --output PATH or s3://bucket/prefix)")
    if uri.startswith("s3://"):
        try:
            from dflash_tasks.store.s3 import S3Store  # boto3 only where S3 is used
        except ImportError as exc:
            raise StoreError(f"s3:// outputs need boto3 ({exc}): pip install boto3") from None
        endpoint = settings.s3_endpoint_url if settings is not None else ""
        return S3Store(uri, endpoint_url=endpoint or None)
    if uri.startswith("file://"):
        if not uri[len("file://") :]:
            raise StoreError(f"no path in output location {uri!r}")
        return LocalStore(uri[len("file://") :])
    if "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise StoreError(f"unsupported output location {uri!r}: scheme {scheme!r} is not supported")
    return LocalStore(uri)
