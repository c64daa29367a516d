"""The named states and outcomes the code passes around, as enums (never parsed back from text).

* :class:`JobState`: a job's state in the registry, in ``progress.json`` and in ``status``.
* :class:`Delivery` and :class:`Cause`: what became of one chunk message, and why: the status
  and cause of a :class:`~dflash_tasks.core.delivery_outcome.DeliveryOutcome`.
* :class:`ErrorKind`: what kind of failure one generation attempt met; the SGLang client sets it
  on the error it raises, the metrics label retries with it.
* :class:`RecordStatus` and :class:`Outcome`: whether a turn or sample was answered, and how its
  conversation ended; fields of an output record (:mod:`dflash_tasks.core.record`).
* :class:`FailureKind`: whether a failed turn or sample may pass (a repair round regenerates it)
  or not; the ``failure`` field of an output record.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"  # by the live quality gate or a failed preflight, until `resume`
    PREFLIGHT = "preflight"  # only the preflight sample is being generated
    DONE = "done"  # every chunk is stored (computed from the store, never written to Redis)

    @classmethod
    def parse(cls, text: str) -> JobState:
        """The state named ``text``; an empty or unknown one (a hand-edited registry) is RUNNING."""
        try:
            return cls(text)
        except ValueError:
            return cls.RUNNING


class Delivery(StrEnum):
    """What a worker did with one chunk message."""

    DONE = "done"  # generated and stored
    SKIPPED = "skipped"  # nothing to do (see the cause)
    REQUEUED = "requeued"  # put back on its queue (see the cause)
    REROUTED = "rerouted"  # another model's chunk: put on its model's queue
    PAUSED = "paused"  # the job is paused: resume queues it again
    PARKED = "parked"  # it kept failing: left aside until resume
    DROPPED = "dropped"  # a message no job or chunk matches


class Cause(StrEnum):
    """Why a delivery was skipped or put back."""

    NONE = ""
    ALREADY_DONE = "already_done"  # the store holds the chunk
    LEASED_ELSEWHERE = "leased_elsewhere"  # another worker's live lease: it runs there
    SERVER_UNHEALTHY = "server_unhealthy"
    WRONG_MODEL = "wrong_model"
    ERROR = "error"  # store or Redis trouble, or a bug
    BAD_MESSAGE = "bad_message"


class ErrorKind(StrEnum):
    """A bounded label for a failed generation attempt."""

    REJECTED = "rejected"  # HTTP 400: the sample is refused, never retried
    HTTP_503 = "http_503"
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    BAD_RESPONSE = "bad_response"
    ABORT = "abort"
    OTHER = "other"

    @classmethod
    def of_status(cls, status: int) -> ErrorKind:
        if status == 400:
            return cls.REJECTED
        if status == 503:
            return cls.HTTP_503
        return cls.HTTP_5XX if status >= 500 else cls.HTTP_4XX


class RecordStatus(StrEnum):
    """Whether a generated turn, or a whole sample, got its answer (``status`` of an output record)."""

    OK = "ok"
    FAILED = "failed"  # the request failed: ``error`` says why


class Outcome(StrEnum):
    """How a sample's conversation ended (``outcome`` of an output record)."""

    COMPLETE = "complete"  # every turn answered
    TRUNCATED = (
        "truncated"  # the last turn hit max_tokens, looped or has no answer: the conversation stopped there
    )
    FAILED = "failed"  # the last turn failed (``failed_turn`` names it)


class FailureKind(StrEnum):
    """Whether a failure may pass (``failure`` of a failed turn and of its record).

    A record that failed before the field existed has none; readers treat it as transient
    (:attr:`dflash_tasks.core.record.Record.transient`): a repair round finds out.
    """

    PERMANENT = "permanent"  # the server refused the request (HTTP 400: too long, bad values)
    TRANSIENT = "transient"  # 5xx, 503, timeout, connection reset, abort, a truncated body
