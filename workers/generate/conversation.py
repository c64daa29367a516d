"""Generating one sample: its turns in order, each from the model's own earlier answers.

A sample with k user turns becomes k requests (:mod:`dflash_tasks.core.conversation` says what each
one carries). :func:`start_conversation` puts a sample's first turn into the worker's request pool
and each next turn as soon as the previous one returns, so the pool's slots stay busy while
conversations advance; its future resolves to the sample's record when the conversation ends.
A turn that fails, hits ``max_tokens`` or has no answer ends the conversation there (see
:class:`~dflash_tasks.core.record.Record` for the outcomes): a record never has a hole. A repair
round continues a failed conversation: the turns it ``kept`` are not sent again; a turn whose thought
was cut (``resume``) is continued where it stopped, and the conversation goes on after it.
Under ``--max-tokens horizon`` each request's ``max_tokens`` is its own (a :data:`TurnBudget`, see
:mod:`workers.generate.request_budget`); the record names the job's sampling parameters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any

from dflash_tasks.core.conversation import can_continue, request_messages, turn_inputs
from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.record import Record, Turn
from dflash_tasks.core.repetition import RepetitionSettings
from dflash_tasks.core.sample import Sample
from workers.flow.request_pool import RequestPool
from workers.generation import (
    Continuation,
    RetryPolicy,
    WorkerIdentity,
    continue_turn,
    generate_turn,
    make_record,
)
from workers.monitor.listener import NO_LISTENER, WorkerListener
from workers.sglang_client import SGLangClient

#: A turn's ``max_tokens`` from the conversation's inputs (each turn's new messages) and the turns
#: answered before it.
TurnBudget = Callable[[Sequence[Sequence[Mapping[str, Any]]], Sequence[Turn]], int]


class Conversation:
    """One sample's progress: the turns answered so far, the next request, and the final record."""

    def __init__(
        self,
        spec: GenerationSpec,
        sample: Sample,
        who: WorkerIdentity,
        rid_prefix: str,
        kept: Sequence[Turn] = (),
        repair: int | None = None,
        resume: tuple[Turn, Continuation] | None = None,
        budget: TurnBudget | None = None,
    ) -> None:
        self.spec = spec
        self.budget = budget
        self.resume = resume  # the cut turn to continue first, until it is sent
        self.sample = sample
        self.who = who
        self.inputs = turn_inputs(sample.messages, spec.turns)
        self.turns: list[Turn] = list(kept)  # answered turns a repair round keeps
        self.repair = repair
        self._rid_prefix = f"{rid_prefix}-L{sample.line}"
        self._started = time.monotonic()

    @property
    def finished(self) -> bool:
        return len(self.turns) == len(self.inputs) or (bool(self.turns) and not can_continue(self.turns[-1]))

    def next_request(self) -> tuple[list[dict[str, str]], list[dict[str, str]], str]:
        """(messages to send, the messages new in this turn, rid prefix) of the next turn."""
        index = len(self.turns)
        answers = [t.content for t in self.turns]
        reasonings = [t.reasoning for t in self.turns] if self.spec.keeps_history_reasoning else None
        messages = request_messages(self.inputs, answers, reasonings)
        return messages, self.inputs[index], f"{self._rid_prefix}-T{index + 1}"

    def request_spec(self) -> GenerationSpec:
        """The spec the next request is sent with: the job's, its ``max_tokens`` the turn's budget."""
        if self.budget is None:
            return self.spec
        return dataclasses.replace(self.spec, max_tokens=self.budget(self.inputs, self.turns))

    def add(self, turn: Turn) -> None:
        self.turns.append(turn)

    def take_resume(self) -> tuple[Turn, Continuation] | None:
        """The cut turn to continue now (once), or None."""
        resume, self.resume = self.resume, None
        return resume

    def record(self) -> Record:
        return make_record(
            self.spec,
            self.sample,
            self.who,
            self.turns,
            len(self.inputs),
            time.monotonic() - self._started,
            self.repair,
        )


def start_conversation(
    pool: RequestPool,
    client: SGLangClient,
    spec: GenerationSpec,
    sample: Sample,
    who: WorkerIdentity,
    policy: RetryPolicy,
    rid_prefix: str,
    *,
    listener: WorkerListener = NO_LISTENER,
    sleep: Callable[[float], None] = time.sleep,
    kept: Sequence[Turn] = (),
    repair: int | None = None,
    resume: tuple[Turn, Continuation] | None = None,
    budget: TurnBudget | None = None,
    repetition: RepetitionSettings | None = None,
) -> Future[Record]:
    """Run ``sample``'s turns through ``pool``, each queued when the previous one returns.

    The future holds the record, or the exception a turn raised. Cancelling it cancels the
    turn waiting in the pool and sends no further turn. A repair round (``repair``, its number)
    passes the answered turns it keeps (``kept``, complete ones): the conversation goes on from
    the next turn; with ``resume`` (a cut turn and how to continue it) that turn is continued first.
    ``budget``: each request's ``max_tokens`` (``--max-tokens horizon``); None: the spec's.
    ``repetition``: the job's loop settings (each request streamed and stopped where it loops,
    which ends the conversation); None: not streamed.
    """
    conversation = Conversation(spec, sample, who, rid_prefix, kept, repair, resume, budget)
    send = functools.partial(generate_turn, sleep=sleep, listener=listener, repetition=repetition)
    extend = functools.partial(continue_turn, sleep=sleep, listener=listener, repetition=repetition)
    return _TurnChain(pool, client, conversation, policy, send, extend).start()


class _TurnChain:
    """Queues a conversation's turns one after another and resolves its future with the record."""

    def __init__(
        self,
        pool: RequestPool,
        client: SGLangClient,
        conversation: Conversation,
        policy: RetryPolicy,
        send: functools.partial[Turn],
        extend: functools.partial[Turn],
    ) -> None:
        self.pool = pool
        self.client = client
        self.conversation = conversation
        self.policy = policy
        self.send = send
        self.extend = extend
        self.result: Future[Record] = Future()
        self.lock = threading.Lock()
        self.current: Future[Turn] | None = None  # the turn in the pool

    def start(self) -> Future[Record]:
        """Queue the first turn; the future the record (or a turn's exception) resolves."""
        self.result.add_done_callback(self.on_result)
        try:
            self.submit_next()
        except BaseException as exc:
            _settle(self.result.set_exception, exc)
        return self.result

    def submit_next(self) -> None:
        """Queue the next turn (or the cut one's continuation), unless the sample was cancelled."""
        conversation, spec, policy = self.conversation, self.conversation.spec, self.policy
        messages, added, rid = conversation.next_request()
        resume = conversation.take_resume()
        request = conversation.request_spec() if resume is None else spec
        with self.lock:
            if self.result.cancelled():
                return
            if resume is None:
                turn = self.pool.submit(self.send, self.client, request, messages, added, policy, rid)
            else:
                cut, how = resume
                turn = self.pool.submit(self.extend, self.client, spec, messages, cut, how, policy, f"{rid}C")
            self.current = turn
        turn.add_done_callback(self.on_turn)

    def on_turn(self, turn: Future[Turn]) -> None:
        """Add a returned turn; then the record, or the next turn."""
        if turn.cancelled():
            return
        try:
            self.conversation.add(turn.result())
            if self.conversation.finished:
                _settle(self.result.set_result, self.conversation.record())
            else:
                self.submit_next()
        except BaseException as exc:  # a turn's error, or the pool shut down: the sample fails
            _settle(self.result.set_exception, exc)

    def on_result(self, done: Future[Record]) -> None:
        """A cancelled sample cancels the turn waiting in the pool."""
        if done.cancelled():
            with self.lock:
                if self.current is not None:
                    self.current.cancel()


def _settle(setter: Callable[[Any], None], value: Any) -> None:
    """Resolve the sample's future, unless it was cancelled meanwhile."""
    with contextlib.suppress(InvalidStateError):
        setter(value)
