"""The project's exception tree.

DflashError
├── RetryableError          transient: try again later (connection reset, 5xx, 503, S3 SlowDown)
│   ├── ServerUnavailable   the SGLang server is down; the chunk goes back to the queue
│   └── WrongModel          the chunk's job is for a model this worker's server does not serve
└── PermanentError          retrying cannot help
    ├── SampleRejected      the server refused one sample (HTTP 400); recorded, never retried
    ├── ConfigError         bad settings or arguments
    ├── InputError          the input file cannot be read at all
    ├── JobMismatch         the output root holds a different job
    └── StoreError          the output store is unusable (missing bucket, permissions)
        ├── CorruptObject   a stored object does not match the checksum recorded when written
        ├── ObjectChanged   an object read in parts was replaced (or deleted) between them
        └── BadRecord       a stored output line is not a valid record (names the field)
            └── RepeatedRecord  a repair round's file holds a sample's id a second time
"""

from __future__ import annotations

from dflash_tasks.core.states import ErrorKind


class DflashError(Exception):
    """Base of every error this package raises on purpose.

    ``kind`` says what failed, for metrics and retry decisions, so nobody parses the message.
    """

    def __init__(self, message: str = "", kind: ErrorKind = ErrorKind.OTHER) -> None:
        super().__init__(message)
        self.kind = kind


class RetryableError(DflashError):
    """A transient failure: the same operation may succeed later."""


class ServerUnavailable(RetryableError):
    """The inference server cannot be reached or is unhealthy."""


class WrongModel(RetryableError):
    """A chunk reached a worker whose server serves another model; it goes to its model's queue."""


class PermanentError(DflashError):
    """A failure that retrying will not fix."""


class SampleRejected(PermanentError):
    """The server rejected one request (e.g. the prompt is longer than the context)."""

    def __init__(self, message: str = "", kind: ErrorKind = ErrorKind.REJECTED) -> None:
        super().__init__(message, kind)


class ConfigError(PermanentError):
    """Invalid settings or command-line arguments."""


class InputError(PermanentError):
    """The input cannot be read at all (missing file, unreadable gzip)."""


class JobMismatch(PermanentError):
    """The output root already holds a job with another input or generation spec."""


class StoreError(PermanentError):
    """The output store cannot be used."""


class CorruptObject(StoreError):
    """A stored object's bytes do not match the SHA-256 recorded when it was written."""


class ObjectChanged(StoreError):
    """An object read in several requests is no longer the version the first one read (its ETag)."""


class BadRecord(StoreError):
    """A stored output line is not a valid record: not JSON, or a field missing or of the wrong type.

    ``cause`` says what is wrong without the place (``no id``, ``turns[1].usage.completion_tokens:
    expected an integer, got 'x'``), ``field`` names the field (``""`` when the line is not JSON).
    """

    def __init__(self, where: str, cause: str, field: str = "") -> None:
        super().__init__(f"{where}: not a valid output record ({cause})" if where else cause)
        self.cause = cause
        self.field = field


class RepeatedRecord(BadRecord):
    """A repair round's file holds a sample's id a second time (a round writes each sample once)."""
