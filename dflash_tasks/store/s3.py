"""The output store on an S3-compatible bucket (AWS S3, MinIO, Cloudflare R2, Ceph RGW, ...).

``s3://bucket/prefix`` holds the same keys as a local output root, under ``prefix/``. Credentials
come from boto3's standard chain (environment, profiles, instance and container roles); the
endpoint from ``AWS_ENDPOINT_URL`` (read by boto3 itself) or ``--s3-endpoint-url`` /
``DFLASH_S3_ENDPOINT_URL``. Nothing here ever puts a credential in a message.

* Writes are one ``PutObject`` of the finished bytes: S3 replaces objects atomically, so a reader
  sees the old object or the whole new one. Each PUT carries the body's SHA-256
  (``x-amz-checksum-sha256``), so the server rejects a body corrupted on the way, and records it
  as ``x-amz-meta-sha256``, so :meth:`S3Store.read` detects an object corrupted or truncated
  later (:class:`~dflash_tasks.core.errors.CorruptObject`).
* Transient failures (5xx, ``SlowDown``, throttling, connection resets, unreachable endpoint)
  are retried by botocore (standard mode, 10 retries), then raised as
  :class:`~dflash_tasks.core.errors.RetryableError`; configuration problems (no bucket, access
  denied, no credentials) as :class:`~dflash_tasks.core.errors.StoreError` naming bucket and cause.
* Input files (any key, not only this store's) are listed with :meth:`S3Store.objects` and read
  with :meth:`S3Store.open_object`: streamed, and pinned to the listed version by ``If-Match``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ChecksumError,
    ClientError,
    ConnectionError,
    CredentialRetrievalError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)
from urllib3.exceptions import HTTPError as Urllib3HTTPError

from dflash_tasks.core.errors import CorruptObject, ObjectChanged, RetryableError, StoreError
from dflash_tasks.store.base import check_key
from dflash_tasks.store.s3_object import S3ObjectFile

#: Metadata field (``x-amz-meta-sha256``) holding the hex SHA-256 of the object's body.
SHA256_METADATA = "sha256"
#: Object written and deleted by :meth:`S3Store.check_writable` (hidden: never listed).
PROBE_KEY = ".dflash-write-probe"
#: botocore standard-mode retries per request (``max_attempts`` in its Config: retries, not tries).
RETRIES = 10

_BODY_ATTEMPTS = 3
_BODY_ERRORS = (HTTPClientError, IncompleteReadError, Urllib3HTTPError)
_USERINFO = re.compile(r"://[^/@\s\"']+@")
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,61}[A-Za-z0-9]$")
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "BadDigest",  # the body was corrupted on the way: sending it again fixes it
        "XAmzContentSHA256Mismatch",
        "OperationAborted",
        "InternalFailure",
    }
)
_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "InvalidSecurity",
        "AccountProblem",
        "403",
        "401",
    }
)
_MISSING_BUCKET_CODES = frozenset({"NoSuchBucket"})


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` → ``("bucket", "some/prefix/")``; the prefix may be empty.

    Raises :class:`StoreError` for anything else, without echoing a URI that holds credentials.
    """
    if not uri.startswith("s3://"):
        raise StoreError(f"not an s3:// location: {uri!r}")
    rest = uri[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket or "?" in rest or "#" in rest:
        raise StoreError(
            "an s3:// output location holds only a bucket and a prefix (s3://bucket/prefix); "
            "credentials come from the environment, a profile or an instance role, never the URI"
        )
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise StoreError(f"invalid S3 bucket name {bucket!r} in {uri!r}")
    prefix = prefix.strip("/")
    if prefix:
        check_key(prefix)
        prefix += "/"
    return bucket, prefix


class S3Store:
    """A :class:`~dflash_tasks.store.Store` on ``s3://bucket/prefix``."""

    def __init__(
        self,
        uri: str,
        *,
        endpoint_url: str | None = None,
        retries: int = RETRIES,
        client: Any = None,
    ) -> None:
        self._bucket, self._prefix = parse_s3_uri(uri)
        self._uri = f"s3://{self._bucket}/{self._prefix}".rstrip("/")
        self._endpoint = endpoint_url or None
        self._client: Any = None
        if self._endpoint and (
            not self._endpoint.startswith(("http://", "https://")) or "@" in self._endpoint.split("/")[2]
        ):
            raise StoreError(
                f"invalid S3 endpoint URL {_USERINFO.sub('://***@', self._endpoint)!r}: expected "
                "http(s)://host[:port], without credentials (e.g. http://127.0.0.1:9000)"
            )
        self._session = boto3.session.Session()
        if client is None:
            config = Config(
                retries={"mode": "standard", "max_attempts": retries},  # botocore: retries after the first
                connect_timeout=10,
                read_timeout=60,
                max_pool_connections=32,
            )
            try:
                client = self._session.client("s3", endpoint_url=self._endpoint, config=config)
            except (BotoCoreError, ValueError) as exc:
                raise self._translate(exc, f"connecting to {self._uri}") from None
        self._client = client

    @property
    def uri(self) -> str:
        return self._uri

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        """The key prefix inside the bucket: ``""`` or ending with ``/``."""
        return self._prefix

    def _key(self, key: str) -> str:
        return self._prefix + check_key(key)

    def read(self, key: str) -> bytes:
        full = self._key(key)
        doing = f"reading {self._uri}/{key}"
        for attempt in range(1, _BODY_ATTEMPTS + 1):
            try:
                response = self._client.get_object(Bucket=self._bucket, Key=full)
                data = bytes(response["Body"].read())
                break
            except ClientError as exc:
                if _code(exc) in ("NoSuchKey", "404"):
                    raise KeyError(key) from None
                raise self._translate(exc, doing) from None
            except _BODY_ERRORS as exc:  # the body broke off: botocore does not retry reading it
                if attempt == _BODY_ATTEMPTS:
                    raise self._translate(exc, doing) from None
            except (BotoCoreError, Urllib3HTTPError, OSError) as exc:
                raise self._translate(exc, doing) from None
        recorded = (response.get("Metadata") or {}).get(SHA256_METADATA)
        if recorded:
            actual = hashlib.sha256(data).hexdigest()
            if actual != recorded.lower():
                raise CorruptObject(
                    f"{self._uri}/{key} is corrupted: its {len(data):,} bytes have sha256 {actual[:16]}…, "
                    f"the sha256 recorded when it was written is {recorded[:16]}…"
                )
        return data

    def write(self, key: str, data: bytes) -> None:
        try:
            self._put(key, data)
        except (BotoCoreError, ClientError, Urllib3HTTPError, OSError) as exc:
            raise self._translate(exc, f"writing {self._uri}/{key}") from None

    def _put(self, key: str, data: bytes, **conditions: str) -> None:
        """One PUT carrying the SHA-256 checksum S3 verifies and ``verify`` re-checks."""
        digest = hashlib.sha256(data).digest()
        self._client.put_object(
            Bucket=self._bucket,
            Key=self._key(key),
            Body=data,
            ChecksumSHA256=base64.b64encode(digest).decode(),
            Metadata={SHA256_METADATA: digest.hex()},
            ContentType=_content_type(key),
            **conditions,
        )

    def write_new(self, key: str, data: bytes) -> bool:
        """A conditional PUT (``If-None-Match: *``): S3 answers 412 when the key exists.

        A retried PUT whose first try took effect unseen also gets 412: the object is read back,
        and holding ``data`` counts as written by this call.
        """
        try:
            self._put(key, data, IfNoneMatch="*")
        except ClientError as exc:
            if _code(exc) not in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                raise self._translate(exc, f"writing {self._uri}/{key}") from None
            try:
                return self.read(key) == data
            except KeyError:  # a conflicting write that did not land: try again later
                raise RetryableError(f"writing {self._uri}/{key}: S3 answered {_code(exc)}") from None
        except (BotoCoreError, Urllib3HTTPError, OSError) as exc:
            raise self._translate(exc, f"writing {self._uri}/{key}") from None
        return True

    def exists(self, key: str) -> bool:
        full = self._key(key)
        try:
            self._client.head_object(Bucket=self._bucket, Key=full)
        except ClientError as exc:
            if _code(exc) in ("NoSuchKey", "404", "NotFound"):
                return False
            raise self._translate(exc, f"looking up {self._uri}/{key}") from None
        except (BotoCoreError, Urllib3HTTPError, OSError) as exc:
            raise self._translate(exc, f"looking up {self._uri}/{key}") from None
        return True

    def delete(self, key: str) -> None:
        full = self._key(key)
        try:
            self._client.delete_object(Bucket=self._bucket, Key=full)
        except (BotoCoreError, ClientError, Urllib3HTTPError, OSError) as exc:
            raise self._translate(exc, f"deleting {self._uri}/{key}") from None

    def list(self, prefix: str) -> Iterator[str]:
        folder = check_key(prefix.rstrip("/")) + "/" if prefix else ""
        doing = f"listing {self._uri}/{folder}"
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self._bucket, Prefix=self._prefix + folder, Delimiter="/")
        skip = len(self._prefix)
        try:
            for page in pages:
                for item in page.get("Contents", ()):
                    rel = str(item["Key"])[skip:]
                    name = rel[len(folder) :]
                    if name and not name.startswith("."):
                        yield rel
        except (BotoCoreError, ClientError, Urllib3HTTPError, OSError) as exc:
            raise self._translate(exc, doing) from None

    def objects(self, prefix: str) -> Iterator[tuple[str, int, str]]:
        """(key, size, ETag) of every object whose key starts with ``prefix`` (raw keys, recursive):
        read-only access to input files, which need not follow this store's key rules."""
        doing = f"listing s3://{self._bucket}/{prefix}"
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self._bucket, Prefix=prefix
            ):
                for item in page.get("Contents", ()):
                    yield str(item["Key"]), int(item.get("Size", 0)), str(item.get("ETag", "")).strip('"')
        except (BotoCoreError, ClientError, Urllib3HTTPError, OSError) as exc:
            raise self._translate(exc, doing) from None

    def open_object(self, key: str, etag: str, size: int) -> S3ObjectFile:
        """Object ``key`` (a raw key) as a seekable, streamed file of the version listed with ``etag``
        and ``size``: read-only access to input files (see :mod:`dflash_tasks.store.s3_object`)."""
        name = f"s3://{self._bucket}/{key}"
        return S3ObjectFile(name, size, lambda start: self._body_from(key, etag, start), self._translate)

    def _body_from(self, key: str, etag: str, start: int) -> Any:
        """The streaming body of ``key`` from byte ``start``, only while its ETag is still ``etag``."""
        name = f"s3://{self._bucket}/{key}"
        doing = f"reading {name} at byte {start:,}"
        condition = {"IfMatch": etag} if etag else {}
        try:
            response = self._client.get_object(
                Bucket=self._bucket, Key=key, Range=f"bytes={start}-", **condition
            )
        except ClientError as exc:
            code = _code(exc)
            if code in ("PreconditionFailed", "412"):
                raise ObjectChanged(
                    f"{name} was replaced while it was read (at byte {start:,}): its ETag is no longer "
                    f"{etag}, the version this run listed and the job's input fingerprint names"
                ) from None
            if code in ("NoSuchKey", "404"):
                raise ObjectChanged(f"{name} was deleted while it was read (at byte {start:,})") from None
            raise self._translate(exc, doing) from None
        except (BotoCoreError, Urllib3HTTPError, OSError) as exc:
            raise self._translate(exc, doing) from None
        return response["Body"]

    def check_writable(self) -> None:
        """Fail now, naming bucket and cause, when this store cannot be listed, written or read."""
        try:
            self._client.head_bucket(Bucket=self._bucket)
        except ClientError as exc:
            if _code(exc) in ("404", "NoSuchBucket", "NotFound"):
                raise StoreError(f"S3 bucket {self._bucket!r} does not exist{self._where()}") from None
            raise self._translate(exc, f"checking bucket {self._bucket!r}") from None
        except (BotoCoreError, Urllib3HTTPError, OSError) as exc:
            raise self._translate(exc, f"checking bucket {self._bucket!r}") from None
        payload = f"dflash write probe {uuid.uuid4().hex}\n".encode()
        self.write(PROBE_KEY, payload)
        if self.read(PROBE_KEY) != payload:
            raise StoreError(f"{self._uri}/{PROBE_KEY} read back differently from what was written")
        with contextlib.suppress(StoreError, RetryableError):  # no s3:DeleteObject: the hidden probe stays
            self.delete(PROBE_KEY)

    def _where(self) -> str:
        return f" at {self._endpoint}" if self._endpoint else ""

    def _translate(self, exc: BaseException, doing: str) -> Exception:
        """A botocore error as :class:`RetryableError` (transient) or :class:`StoreError`, credential-free."""
        if isinstance(exc, NoCredentialsError | PartialCredentialsError | CredentialRetrievalError):
            return StoreError(
                f"{doing}: no usable AWS credentials for bucket {self._bucket!r} ({type(exc).__name__}): "
                "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or use an instance role"
            )
        if isinstance(exc, NoRegionError):
            return StoreError(f"{doing}: no AWS region configured: set AWS_DEFAULT_REGION (or AWS_REGION)")
        if isinstance(exc, ClientError):
            code = _code(exc)
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            what = f"{code} (HTTP {status})" if status else code
            if code in _TRANSIENT_CODES or status in (429, 500, 502, 503, 504):
                return RetryableError(f"{doing}: S3 answered {what}, a transient error{self._where()}")
            if code in _MISSING_BUCKET_CODES:
                return StoreError(f"{doing}: S3 bucket {self._bucket!r} does not exist{self._where()}")
            if code in _DENIED_CODES or status in (401, 403):
                return StoreError(
                    f"{doing}: access to S3 bucket {self._bucket!r} denied: {what}{self._where()}; "
                    "check the credentials and their permissions (s3:ListBucket, s3:GetObject, s3:PutObject)"
                )
            message = self._redact(str(exc.response.get("Error", {}).get("Message", "")))[:300]
            return StoreError(f"{doing}: S3 error {what}{self._where()}: {message}")
        if isinstance(
            exc,
            ConnectionError
            | HTTPClientError
            | IncompleteReadError
            | ChecksumError
            | FlexibleChecksumError
            | Urllib3HTTPError
            | OSError,
        ):
            detail = self._redact(str(exc))[:300]
            return RetryableError(f"{doing}: {type(exc).__name__}: {detail}")
        return StoreError(f"{doing}: {type(exc).__name__}: {self._redact(str(exc))[:300]}")

    def _redact(self, text: str) -> str:
        """``text`` with the client's secret key and session token removed (defence in depth)."""
        creds = getattr(getattr(self._client, "_request_signer", None), "_credentials", None)
        try:
            secrets = [creds.secret_key, creds.token] if creds is not None else []
        except Exception:  # refreshing credentials failed: nothing to redact with
            secrets = []
        for secret in secrets:
            if secret:
                text = text.replace(secret, "***")
        return _USERINFO.sub("://***@", text)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _content_type(key: str) -> str:
    if key.endswith(".jsonl"):
        return "application/x-ndjson"
    if key.endswith(".json"):
        return "application/json"
    return "application/octet-stream"
