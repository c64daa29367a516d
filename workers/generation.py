"""Generating one turn: retries with backoff; and building the turn and sample records."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dflash_tasks.core.continuation import joined, prefix_message
from dflash_tasks.core.errors import RetryableError, SampleRejected, ServerUnavailable
from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.record import Record, Turn, Usage, outcome_of
from dflash_tasks.core.repetition import RepetitionSettings
from dflash_tasks.core.sample import Sample
from dflash_tasks.core.states import FailureKind, RecordStatus
from workers.monitor.listener import NO_LISTENER, WorkerListener
from workers.sglang_client import ChatRequest, Completion, ServerIdentity, SGLangClient

_EMPTY = Completion("", "", "", 0, 0, 0)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter."""

    attempts: int = 6
    backoff: float = 1.0
    backoff_max: float = 60.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return random.uniform(0, min(self.backoff_max, self.backoff * 2 ** (attempt - 1)))


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Recorded on every sample: which worker and endpoint produced it, and what the server said it
    serves (None until the server answered ``/model_info`` and ``/server_info``)."""

    worker: str
    endpoint: str
    server: ServerIdentity | None = None


def generate_turn(
    client: SGLangClient,
    spec: GenerationSpec,
    messages: list[dict[str, str]],
    added: list[dict[str, str]],
    policy: RetryPolicy,
    rid_prefix: str,
    sleep: Callable[[float], None] = time.sleep,
    *,
    listener: WorkerListener = NO_LISTENER,
    repetition: RepetitionSettings | None = None,
) -> Turn:
    """Send one turn (``messages``, of which ``added`` are new this turn) and return its turn record.

    Retryable failures are retried per ``policy``. A 400 fails only this turn. When retries run
    out, the turn is recorded as failed if the server is healthy (a transient failure, which a
    repair round regenerates), and :class:`ServerUnavailable` is raised if it is not (the chunk
    then goes back to the queue). A 400 is a permanent failure. ``repetition``: the job's loop
    settings; on, the answer is streamed and stopped where its text loops (the turn's ``loop``,
    ``finish_reason`` ``repetition``); None or off, it is not streamed.
    """
    started = time.monotonic()

    def request(rid: str) -> ChatRequest:
        return ChatRequest(spec, messages, rid, watch=repetition)

    answer = _send(client, request, policy, rid_prefix, sleep, listener)
    latency = time.monotonic() - started
    if isinstance(answer, _Failed):
        return make_turn(added, None, answer.error, latency, answer.attempts, answer.failure)
    completion, attempts = answer
    return make_turn(added, completion, None, latency, attempts)


def continue_turn(
    client: SGLangClient,
    spec: GenerationSpec,
    messages: list[dict[str, str]],
    cut: Turn,
    continuation: Continuation,
    policy: RetryPolicy,
    rid_prefix: str,
    sleep: Callable[[float], None] = time.sleep,
    *,
    listener: WorkerListener = NO_LISTENER,
    repetition: RepetitionSettings | None = None,
) -> Turn:
    """Continue ``cut``'s thought (:mod:`dflash_tasks.core.continuation`): ``messages`` are the
    turn's request, the prefix (the opener and the thought so far) goes after them with
    ``continue_final_message``, and the answer is joined to the turn, which keeps both parts.

    Retries, errors and ``repetition`` as :func:`generate_turn` (the detector watches the new
    text, primed with the cut thought's tail, so a loop that began before the cut starts where it
    began; a loop's positions are the joined turn's), except that a continuation that fails keeps
    the turn as it was (still cut, so a later round continues it): nothing generated is lost.
    """
    started = time.monotonic()
    prefixed = [*messages, prefix_message(cut, continuation.opener)]
    budget = dataclasses.replace(spec, max_tokens=continuation.budget)

    def request(rid: str) -> ChatRequest:
        return ChatRequest(
            budget,
            prefixed,
            rid,
            continues=True,
            watch=repetition,
            primer=cut.reasoning,
            primer_tokens=cut.usage.completion_tokens,
        )

    answer = _send(client, request, policy, rid_prefix, sleep, listener)
    if isinstance(answer, _Failed):
        return cut
    c, attempts = answer
    usage = Usage(c.prompt_tokens, c.completion_tokens, c.reasoning_tokens)
    meta = c.meta.as_record() if c.meta is not None else None
    latency = time.monotonic() - started
    return joined(cut, c.reasoning, c.content, c.finish_reason, usage, meta, latency, attempts, c.loop)


@dataclass(frozen=True, slots=True)
class Continuation:
    """How to continue a cut thought: the opener its prefix starts with, and the new-token budget."""

    opener: str
    budget: int


@dataclass(frozen=True, slots=True)
class _Failed:
    error: str
    attempts: int
    failure: FailureKind


def _send(
    client: SGLangClient,
    request: Callable[[str], ChatRequest],
    policy: RetryPolicy,
    rid_prefix: str,
    sleep: Callable[[float], None],
    listener: WorkerListener,
) -> tuple[Completion, int] | _Failed:
    """One request with the retries of ``policy``: the completion and the attempts it took."""
    last_error = ""
    for attempt in range(1, policy.attempts + 1):
        rid = f"{rid_prefix}-{attempt}"  # unique per delivery, sample, turn and attempt
        try:
            return client.chat(request(rid)), attempt
        except SampleRejected as exc:
            listener.request_failed(exc, False)
            return _Failed(str(exc), attempt, FailureKind.PERMANENT)
        except RetryableError as exc:
            last_error = str(exc)
            listener.request_failed(exc, attempt < policy.attempts)
            if attempt < policy.attempts:
                sleep(policy.delay(attempt))
    if not client.healthy():
        raise ServerUnavailable(f"{client.endpoint} is unhealthy; last error: {last_error}")
    return _Failed(
        f"gave up after {policy.attempts} attempts: {last_error}", policy.attempts, FailureKind.TRANSIENT
    )


def make_turn(
    added: Sequence[dict[str, str]],
    completion: Completion | None,
    error: str | None,
    latency: float,
    attempts: int,
    failure: FailureKind | None = None,
) -> Turn:
    """One turn of a record: the messages it added to the conversation, the model's answer, usage
    and the per-request server numbers (``meta_info``, None when the server sent none); a failed
    turn (no completion) says whether its ``failure`` may pass."""
    c = completion or _EMPTY
    return Turn(
        input=tuple(added),
        reasoning=c.reasoning,
        content=c.content,
        finish_reason=c.finish_reason or None,
        usage=Usage(c.prompt_tokens, c.completion_tokens, c.reasoning_tokens),
        meta_info=c.meta.as_record() if c.meta is not None else None,
        loop=c.loop,
        status=RecordStatus.OK if completion is not None else RecordStatus.FAILED,
        error=error,
        failure=None if completion is not None else (failure or FailureKind.TRANSIENT),
        latency_s=round(latency, 3),
        attempts=attempts,
    )


def make_record(
    spec: GenerationSpec,
    sample: Sample,
    who: WorkerIdentity,
    turns: Sequence[Turn],
    user_turns: int,
    latency: float,
    repair: int | None = None,
) -> Record:
    """One output line: every turn of the sample's conversation, totals and provenance (see
    :class:`~dflash_tasks.core.record.Record` for the outcomes); ``repair`` names the repair round
    that regenerated it (its turns then include those kept from the record it replaces)."""
    last = turns[-1]
    outcome = outcome_of(turns, user_turns)
    error = last.error
    if not last.ok and user_turns > 1:
        error = f"turn {len(turns)} of {user_turns}: {error}"
    return Record(
        id=sample.id,
        line=sample.line,
        source=sample.source,
        user_turns=user_turns,
        turns=tuple(turns),
        outcome=outcome,
        status=last.status,
        error=error,
        failure=last.failure if not last.ok else None,
        failed_turn=len(turns) if not last.ok else None,
        finish_reason=last.finish_reason,
        usage=Usage.total(t.usage for t in turns),
        model=spec.model,
        server=who.server.as_record() if who.server is not None else None,
        sampling=spec.sampling(),
        endpoint=who.endpoint,
        worker=who.worker,
        latency_s=round(latency, 3),
        attempts=sum(t.attempts for t in turns),
        repair=repair,
    )
