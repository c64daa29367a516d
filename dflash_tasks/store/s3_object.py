"""One S3 object read as a seekable file, streamed, each part checked to be the same object.

A run of contiguous reads is one streamed GET from its first byte to the object's end, so a JSONL
file is read in one request however large it is, and a Parquet file's column chunks each keep
their own stream (a few at a time). Every GET carries ``If-Match`` with the ETag the object had
when it was listed: a stream that broke off is resumed where it stopped, and an object replaced
since (or in between) raises :class:`~dflash_tasks.core.errors.ObjectChanged` naming it instead
of mixing two versions. Transient failures of the request are retried by botocore; a body that
breaks off is resumed up to :data:`BODY_ATTEMPTS` times in a row without progress.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

from botocore.exceptions import HTTPClientError, IncompleteReadError
from urllib3.exceptions import HTTPError as Urllib3HTTPError

from dflash_tasks.core.errors import RetryableError

#: Tries in a row to read on from one position (a body broken off is resumed with a new GET).
BODY_ATTEMPTS: Final = 3
#: Streams kept open at once (a Parquet row group reads each column from its own place).
OPEN_STREAMS: Final = 4
_BODY_ERRORS: Final = (HTTPClientError, IncompleteReadError, Urllib3HTTPError, OSError)

#: ``open_at(start)`` → a streaming body of the object from byte ``start`` to its end.
OpenAt = Callable[[int], Any]
#: ``broken(exc, doing)`` → the error to raise for a body that broke off ``BODY_ATTEMPTS`` times.
Broken = Callable[[BaseException, str], Exception]


class S3ObjectFile(io.RawIOBase):
    """The bytes of one object version; ``name`` is its ``s3://bucket/key``."""

    def __init__(self, name: str, size: int, open_at: OpenAt, broken: Broken) -> None:
        super().__init__()
        self.name = name
        self.size = size
        self._open_at = open_at
        self._broken = broken
        self._pos = 0
        self._streams: OrderedDict[int, Any] = OrderedDict()  # next byte -> the body that reads it

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.name}: seek to {base + offset}, before the start")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self.size - self._pos)
        if want <= 0:
            return 0
        failures = 0
        while True:
            body = self._streams.pop(self._pos, None)
            if body is None:
                body = self._open_at(self._pos)
            try:
                data = body.read(want)
            except _BODY_ERRORS as exc:
                data, error = b"", exc
            else:
                error = None
            if data:
                break
            body.close()  # broken off (or ended early): resume from here, same version or an error
            failures += 1
            if failures == BODY_ATTEMPTS:
                doing = f"reading {self.name} at byte {self._pos:,} of {self.size:,}"
                if error is None:
                    raise RetryableError(f"{doing}: the body ended early {failures} times in a row")
                raise self._broken(error, doing)
        n = len(data)
        buffer[:n] = data
        self._pos += n
        self._keep(body)
        return n

    def _keep(self, body: Any) -> None:
        if self._pos >= self.size:
            body.close()
            return
        self._streams[self._pos] = body
        while len(self._streams) > OPEN_STREAMS:
            self._streams.popitem(last=False)[1].close()

    def close(self) -> None:
        while self._streams:
            self._streams.popitem()[1].close()
        super().close()
