"""A streamed chat request (``stream: true``): its chunks sent at the decode pace, and what happens
when its client goes away, as in SGLang 0.5.23.

The request waits for a slot like any other (its client's connection is looked at every
``disconnect_poll_seconds`` meanwhile: gone, it is aborted). Then each decode step's tokens are
sent as they are generated (:mod:`dflash_tasks.sim.sse`): one step is one speculative verify pass
(about the request's accept length in tokens); a chunk goes out at the first step and then once
``stream_interval`` tokens are unsent. When the client goes away (its connection is closed, or a
write fails) the request is aborted at once: its slot is freed and it counts as aborted, with the
tokens it generated. So does SGLang: the closed connection cancels the response's generator, and
``TokenizerManager.generate_request`` aborts a dispatched request on any exception (its
``create_abort_task``, 2 s later, is only a backstop); the release's CPU engine freed the slot
0.15 s after the client closed (``tests/real_sglang/test_loop_abort.py``).

Writes never block (:mod:`~dflash_tasks.sim.outbox`): a client that stops reading delays no other
stream, and once it took no byte for ``stream_stall_seconds`` it is dropped as gone. (SGLang's
uvicorn would pause that stream's writes and keep it; the simulator frees its slot instead.)
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Protocol

from dflash_tasks.sim.batch import DecodeBatch, DecodeSeq
from dflash_tasks.sim.config import FaultSpec, SimConfig
from dflash_tasks.sim.protocol import ChatRequest, spec_details
from dflash_tasks.sim.pump import StreamPump
from dflash_tasks.sim.scheduler import Gone, QueueFull, SlotScheduler, Stopped
from dflash_tasks.sim.sse import DONE, ChunkHead, ReasoningStream, error_event, usage, usage_json
from dflash_tasks.sim.textgen import IM_END_TOKEN_ID, Plan, prompt_rng, span_tokens

#: Writes one piece of a streamed body without blocking (what the client does not take at once
#: waits); True once nothing waits. Raises ``OSError`` when the client is gone or stopped reading.
Write = Callable[[bytes], bool]
#: Says whether the client closed its connection.
GoneCheck = Callable[[], bool]
#: Sends what waits for the client; True once nothing does. Raises as :data:`Write`.
Flush = Callable[[], bool]
#: How often a running stream's connection is looked at between two chunks (s).
GONE_POLL_SECONDS = 0.05
#: How soon a stream whose client left bytes waiting tries again (s).
BACKLOG_RETRY_SECONDS = 0.01


def emission_points(total: int, accept: float, interval: int) -> list[int]:
    """The token counts at which chunks go out: decode steps of ``accept`` tokens, the first at
    once, then whenever ``interval`` tokens are unsent, and the last one."""
    points: list[int] = []
    sent = step = 0
    while sent < total:
        step += 1
        done = min(total, max(sent + 1, math.floor(step * accept)))
        if not points or done - sent >= interval or done == total:
            points.append(done)
            sent = done
    return points


class StreamingEngine(Protocol):
    """What a stream needs of the simulator's engine (:class:`dflash_tasks.sim.engine.SimEngine`)."""

    config: SimConfig
    scheduler: SlotScheduler
    batch: DecodeBatch | None
    pump: StreamPump

    @property
    def stopping_event(self) -> threading.Event: ...

    def plan(self, req: ChatRequest, fault: FaultSpec | None) -> tuple[Plan, Plan, int, bool]: ...

    def accept_length(self, req: ChatRequest, mean: float) -> float: ...

    def account(
        self,
        req: ChatRequest,
        plan: Plan,
        generated: int,
        mean_accept: float,
        retractions: int,
        aborted: bool,
        client_gone: bool = False,
    ) -> tuple[int, int]: ...

    def count_gone_waiting(self) -> None: ...

    def release_rid(self, request_id: str) -> None: ...


class _FixedPace:
    """Every request at ``rate`` tokens per second, whatever else runs (no throughput curve)."""

    def __init__(self, total: int, rate: float) -> None:
        self.total, self.rate = total, rate
        self.started = time.monotonic()

    def generated(self) -> int:
        if math.isinf(self.rate):
            return self.total
        return min(self.total, int((time.monotonic() - self.started) * self.rate))

    def seconds_until(self, tokens: int) -> float:
        return 0.0 if math.isinf(self.rate) else self.started + tokens / self.rate - time.monotonic()

    def cancel(self) -> int:
        return self.generated()


class _BatchPace:
    """The request decoding in the simulated batch (the throughput curve)."""

    def __init__(self, batch: DecodeBatch, total: int, prompt: int) -> None:
        self.batch = batch
        self.seq: DecodeSeq = batch.submit(total, prompt)

    def generated(self) -> int:
        return self.batch.progress(self.seq)[0]

    def seconds_until(self, tokens: int) -> float:
        have, rate = self.batch.progress(self.seq)
        return GONE_POLL_SECONDS if rate <= 0 else (tokens - have) / rate

    def cancel(self) -> int:
        return self.batch.cancel(self.seq)


class _Client:
    """The streaming client's connection: whether it went away (or stopped reading), and since
    when; whether bytes wait for it."""

    def __init__(self, write: Write, gone: GoneCheck, flush: Flush) -> None:
        self._write, self._gone, self._flush = write, gone, flush
        self.gone_at: float | None = None
        self.waiting = False  # bytes wait for the client (its socket was full)
        self._checked = time.monotonic()

    def send(self, piece: bytes) -> None:
        if self.gone_at is not None:
            return
        try:
            self.waiting = not self._write(piece)
        except OSError:
            self.gone_at = time.monotonic()

    def flush(self) -> None:
        """Send what waits for the client."""
        if self.gone_at is None:
            try:
                self.waiting = not self._flush()
            except OSError:
                self.gone_at = time.monotonic()

    def look(self) -> None:
        """Send what waits; check the connection (at most every :data:`GONE_POLL_SECONDS`)."""
        if self.waiting:
            self.flush()
        now = time.monotonic()
        if self.gone_at is None and now - self._checked >= GONE_POLL_SECONDS:
            self._checked = now
            if self._gone():
                self.gone_at = now


class StreamJob:
    """One streamed chat request; call it with a writer and a disconnect check to serve it."""

    def __init__(
        self, engine: StreamingEngine, req: ChatRequest, request_id: str, fault: FaultSpec | None
    ) -> None:
        self.engine, self.req, self.request_id, self.fault = engine, req, request_id, fault

    def __call__(self, write: Write, gone: GoneCheck, flush: Flush) -> bool:
        """Serve the request; True when the connection must be closed afterwards. The server
        sends what still waits for the client once it returns."""
        engine = self.engine
        try:
            with engine.scheduler.slot(gone, engine.config.disconnect_poll_seconds):
                return self._generate(_Client(write, gone, flush))
        except QueueFull:  # the scheduler rejects it once the stream began: an error event
            write(error_event("The request queue is full.", "SERVICE_UNAVAILABLE", 503) + DONE)
            return False
        except Gone:
            engine.count_gone_waiting()
            return True
        except Stopped:
            return True
        finally:
            engine.release_rid(self.request_id)

    def _generate(self, client: _Client) -> bool:
        """Hand the stream to the engine's pump and wait for its end; True: close the connection."""
        run = _StreamRun(self, client)
        if not self.engine.pump.serve(run):
            raise Stopped
        return run.close

    def _chunks(
        self,
        head: ChunkHead,
        parser: ReasoningStream | None,
        text: str,
        plan: Plan,
        upto: int,
        first: bool,
        last: bool,
    ) -> list[bytes]:
        """The chunks of one decode step that generated ``text`` (``upto`` tokens so far): the
        role chunk first of all, then its reasoning and its answer text."""
        req = self.req
        out = [head.role()] if first else []
        reasoning, content = ("", text) if parser is None else parser.feed(text)
        if parser is not None and last and plan.finish_reason != "abort":
            more_reasoning, more_content = parser.finish()
            reasoning, content = reasoning + more_reasoning, content + more_content
        running = b""
        if req.continuous_usage:
            reasoning_tokens = (
                min(upto, plan.reasoning_tokens) if self.engine.config.has_reasoning_parser else 0
            )
            running = usage_json(req.prompt_tokens, upto, reasoning_tokens)
        if reasoning:
            out.append(head.reasoning(reasoning, running))
        if content:
            out.append(head.content(content, running))
        return out

    def _tail(self, head: ChunkHead, plan: Plan, total: int, verify: int) -> list[bytes]:
        """The finish chunk, the ``sglext`` and usage chunks when asked, and ``[DONE]``."""
        req, cfg = self.req, self.engine.config
        matched = IM_END_TOKEN_ID if plan.finish_reason == "stop" else None
        out = [head.finish(plan.finish_reason, matched)]
        spec = spec_details(total, verify)
        if req.return_spec_tokens_details and spec:
            out.append(head.tail(sglext={"spec_tokens_details": spec}))
        if req.include_usage:
            reasoning = plan.reasoning_tokens if cfg.has_reasoning_parser else 0
            out.append(head.tail(usage=usage(req.prompt_tokens, total, reasoning)))
        return [*out, DONE]


class _StreamRun:
    """One stream's progress, turned by the pump (:class:`~dflash_tasks.sim.pump.StreamPump`):
    each turn sends every decode step generated since the last one, in one write."""

    def __init__(self, job: StreamJob, client: _Client) -> None:
        engine, req, cfg = job.engine, job.req, job.engine.config
        self.job, self.client = job, client
        self.full, self.plan, done, thinking = engine.plan(req, job.fault)
        self.total = total = self.plan.completion_tokens
        self.tokens = span_tokens(prompt_rng(cfg.seed + 1, req.plan_prompt), self.full, done, done + total)
        self.parser = None
        if cfg.has_reasoning_parser and req.separate_reasoning:
            self.parser = ReasoningStream(thinking, req.prefix or "")
        self.head = ChunkHead(job.request_id, int(time.time()), req.model)
        self.pace: _FixedPace | _BatchPace
        if engine.batch is not None and cfg.time_scale > 0 and total > 0:
            self.pace = _BatchPace(engine.batch, total, req.prompt_tokens)
        else:
            rate = cfg.tokens_per_second / cfg.time_scale if cfg.time_scale > 0 else math.inf
            self.pace = _FixedPace(total, rate)
        accept = engine.accept_length(req, cfg.accept_length)
        self.points = emission_points(total, accept, cfg.stream_interval)
        bad_json = job.fault is not None and job.fault.kind == "bad_json"
        self.cut = len(self.points) // 2 if bad_json else None
        self.sent = self.next = 0  # tokens sent; the next emission point
        self.close = False  # the connection must be closed afterwards
        self.wake_at = time.monotonic()

    def turn(self) -> bool:
        """Send what was generated since the last turn; True once the stream is over."""
        job, client, points = self.job, self.client, self.points
        engine, cfg = job.engine, job.engine.config
        client.look()
        if client.gone_at is not None:
            generated = self.pace.cancel()
            engine.account(job.req, self.plan, generated, cfg.accept_length, 0, True, client_gone=True)
            self.close = True
            return True
        due, pieces = self.pace.generated(), []
        while self.next < len(points) and points[self.next] <= due and self.next != self.cut:
            upto = points[self.next]
            text = "".join(self.tokens[self.sent : upto])
            first, last = self.next == 0, upto == self.total
            pieces += job._chunks(self.head, self.parser, text, self.plan, upto, first, last)
            self.sent, self.next = upto, self.next + 1
        if self.next == self.cut and points[self.next] <= due:  # half an event, then it drops
            client.send(b"".join(pieces) + b'data: {"id":')
            engine.account(job.req, self.plan, self.sent, cfg.accept_length, 0, False)
            self.close = True
            return True
        if self.next == len(points):
            self._finish(pieces)
            return True
        if pieces:
            client.send(b"".join(pieces))
        wait = min(self.pace.seconds_until(points[self.next]), GONE_POLL_SECONDS)
        if client.waiting:
            wait = min(wait, BACKLOG_RETRY_SECONDS)
        self.wake_at = time.monotonic() + max(wait, 0.0)
        return False

    def _finish(self, pieces: list[bytes]) -> None:
        """Account for the whole request and send the last steps with the tail."""
        job, engine, cfg, plan = self.job, self.job.engine, self.job.engine.config, self.plan
        retractions, accept = 0, cfg.accept_length
        if isinstance(self.pace, _BatchPace):
            run = engine.batch.outcome(self.pace.seq) if engine.batch is not None else None
            retractions, accept = (run.retractions, run.accept_length) if run else (0, accept)
        gone = self.client.gone_at is not None
        _, verify = engine.account(
            job.req, plan, self.total, accept, retractions, plan.finish_reason == "abort", gone
        )
        self.client.send(b"".join(pieces + job._tail(self.head, plan, self.total, verify)))
        self.close = self.client.gone_at is not None
