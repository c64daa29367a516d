"""The HTTP-free simulator core: admission, faults, timed generation and counters."""

from __future__ import annotations

import hashlib
import json
import secrets
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dflash_tasks.sim.batch import DecodeBatch
from dflash_tasks.sim.config import SPEC_NUM_DRAFT_TOKENS, FaultSpec, SimConfig
from dflash_tasks.sim.faults import FaultBoard
from dflash_tasks.sim.protocol import (
    ApiError,
    ChatRequest,
    Outcome,
    chat_response,
    error_body,
    parse_chat_request,
    queue_full_error,
    verify_passes,
)
from dflash_tasks.sim.pump import StreamPump
from dflash_tasks.sim.requestlog import RequestLog
from dflash_tasks.sim.scheduler import QueueFull, SlotScheduler, Stopped
from dflash_tasks.sim.streaming import Flush, GoneCheck, StreamJob, Write
from dflash_tasks.sim.textgen import (
    Plan,
    continue_plan,
    draw_accept_length,
    plan_loop,
    plan_output,
    prefix_tokens,
    prompt_rng,
    render_span,
    split_reasoning,
    truncate,
)

#: Prompts the simulated prefix cache remembers (a repeated prompt is served from the cache).
PREFIX_CACHE_PROMPTS = 4096


@dataclass(frozen=True)
class Reply:
    """An HTTP answer; ``reset`` means: close the connection without answering; ``stream``: a
    streamed body (server-sent events), sent by calling it with a writer and a disconnect check;
    it returns True when the connection must be closed afterwards."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    reset: bool = False
    stream: Callable[[Write, GoneCheck, Flush], bool] | None = None


def json_reply(status: int, payload: Any) -> Reply:
    """A JSON reply."""
    return Reply(status, json.dumps(payload).encode())


def _error_reply(err: ApiError) -> Reply:
    return json_reply(err.status, err.body())


class SimEngine:
    """Serves chat requests against a :class:`SimConfig`; thread-safe, one instance per server."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.scheduler = SlotScheduler(config.max_running_requests, config.max_queued_requests)
        curve = config.batch_curve()
        #: With a throughput curve the running requests decode together (their speed depends on
        #: the batch, the KV cache may bind); without one each runs at ``tokens_per_second``.
        self.batch = DecodeBatch(curve, config.time_scale) if curve is not None else None
        self.faults = FaultBoard(config.faults)
        self.started_at = time.time()
        self._ready_at: float | None = None  # set once HTTP is up: then the warmup runs
        self._stopping = threading.Event()
        #: sends every streamed request's chunks (one thread, as SGLang's one event loop)
        self.pump = StreamPump(self._stopping)
        self._lock = threading.Lock()
        self._rids: set[str] = set()
        self._counters: Counter[str] = Counter()
        self._totals: Counter[str] = Counter()
        self._prefixes: OrderedDict[bytes, None] = OrderedDict()
        # Speculative decoding, as the scheduler logs it: verify passes of the running log interval,
        # then the committed totals behind internal_states' cumulative avg_spec_accept_length.
        self._spec_pending = [0, 0]  # tokens, verify passes
        self._spec_total = [0, 0]
        self._spec_last: float | None = None  # the accept length of the last completed interval
        # GET /sim/requests, and every request body appended to --record-requests PATH
        self.requests = RequestLog(config.record_requests)

    # ----------------------------------------------------------------- lifecycle and health
    @property
    def stopping_event(self) -> threading.Event:
        """Set once the simulator stops: every wait ends."""
        return self._stopping

    def stop(self) -> None:
        """Wake every sleeping or waiting request; they end without an answer."""
        self._stopping.set()
        self.scheduler.stop()
        if self.batch is not None:
            self.batch.stop()
        self.requests.close()

    def http_up(self) -> None:
        """HTTP is listening: the warmup (``--startup-seconds``) starts now."""
        with self._lock:
            if self._ready_at is None:
                self._ready_at = time.monotonic() + self.config.startup_seconds

    def is_starting(self) -> bool:
        """True until HTTP is up and the simulated warmup (``--startup-seconds``) is over."""
        ready_at = self._ready_at
        return ready_at is None or time.monotonic() < ready_at

    def health_status(self) -> int:
        """200, or 503 while starting or under an ``unhealthy`` fault."""
        if self.is_starting() or self.faults.take_unhealthy():
            return 503
        return 200

    def ready_status(self) -> int:
        """``/ready``: 200 once the warmup is over, else 503."""
        return 503 if self.is_starting() else 200

    # ----------------------------------------------------------------- speculative decoding
    def _spec_account(self, tokens: int, verify: int) -> None:
        """Add a finished request's verify passes; commit the interval once it is complete."""
        with self._lock:
            pending = self._spec_pending
            pending[0] += tokens
            pending[1] += verify
            if pending[1] >= self.config.decode_log_interval:
                self._spec_last = pending[0] / pending[1]
                self._spec_total[0] += pending[0]
                self._spec_total[1] += pending[1]
                self._spec_pending = [0, 0]

    def avg_spec_accept_length(self) -> float | None:
        """``internal_states[0].avg_spec_accept_length``: cumulative over completed log intervals,
        None (the key is absent) before the first one."""
        with self._lock:
            tokens, verify = self._spec_total
        return tokens / verify if verify > 0 else None

    def last_spec_accept_length(self) -> float:
        """The accept length of the last completed log interval (``sglang:spec_accept_length``), or 0."""
        with self._lock:
            return self._spec_last or 0.0

    def _cached_tokens(self, prompt: str, prompt_tokens: int) -> int:
        """A repeated prompt hits the prefix cache: all but its last token (SGLang recomputes one)."""
        key = hashlib.sha256(prompt.encode()).digest()
        with self._lock:
            hit = key in self._prefixes
            self._prefixes[key] = None
            self._prefixes.move_to_end(key)
            while len(self._prefixes) > PREFIX_CACHE_PROMPTS:
                self._prefixes.popitem(last=False)
        return max(0, prompt_tokens - 1) if hit else 0

    # ----------------------------------------------------------------- statistics
    def _count(self, **amounts: int) -> None:
        with self._lock:
            self._counters.update(amounts)
            self._totals.update(amounts)

    def totals(self) -> dict[str, int]:
        """Cumulative counters since startup (never reset; used by ``/metrics``)."""
        with self._lock:
            return dict(self._totals)

    def gen_throughput(self) -> float:
        """Current generation rate in tokens per wall-clock second."""
        if self.batch is not None:
            return self.batch.gauges()["gen_throughput"]
        running, _ = self.scheduler.counts()
        scale = self.config.time_scale
        return running * self.config.tokens_per_second / (scale if scale > 0 else 1.0)

    def stats(self) -> dict[str, Any]:
        """The ``GET /sim/stats`` document."""
        with self._lock:
            counters = dict(self._counters)
        names: tuple[str, ...] = ("requests_total", "completed", "aborted", "bad_requests", "faults_injected")
        names += ("retractions", "streamed", "client_gone", "looping")
        tokens = ("prompt_tokens", "generation_tokens", "reasoning_tokens")
        stats: dict[str, Any] = {name: counters.get(name, 0) for name in names + tokens}
        stats.update(self.scheduler.snapshot())
        return stats

    def reset_stats(self) -> None:
        """Zero the ``/sim/stats`` counters and restart the occupancy window."""
        with self._lock:
            self._counters.clear()
        self.requests.reset()
        self.scheduler.reset_stats()

    # ----------------------------------------------------------------- chat
    def chat(self, content_type: str, raw: bytes) -> Reply:
        """Answer one ``POST /v1/chat/completions``.

        Order: chat fault (if any) → validation (400) → duplicate ``rid`` check → a running slot
        (FIFO; 503 when the queue is full) → sleep for the generation. As in SGLang, chat requests
        are served as soon as HTTP is up, during the warmup too. A streamed request (``stream``)
        gets a :class:`Reply` whose ``stream`` waits for the slot and sends the chunks
        (:mod:`dflash_tasks.sim.streaming`).
        """
        self._count(requests_total=1)
        record = self.requests.arrived(raw)
        fault = self.faults.take_chat()
        if fault is not None:
            self._count(faults_injected=1)
            early = self._early_fault(fault)
            if early is not None:
                return early
        try:
            req = parse_chat_request(content_type, raw, self.config)
        except ApiError as err:
            self._count(bad_requests=1)
            return _error_reply(err)
        self.requests.received(req.prompt, record)
        self._log(f"chat rid={req.rid} prompt_tokens={req.prompt_tokens} max_new={req.max_new_tokens}")
        return self._admit(req, fault)

    def _early_fault(self, fault: FaultSpec) -> Reply | None:
        if fault.kind == "http_500":
            return json_reply(
                500, error_body(500, "Internal server error (simulated fault).", "InternalServerError")
            )
        if fault.kind == "http_503":
            return _error_reply(queue_full_error())
        if fault.kind == "reset":
            return Reply(0, reset=True)
        if fault.kind == "hang" and self._stopping.wait(fault.hang_seconds):
            return Reply(0, reset=True)
        return None

    def _admit(self, req: ChatRequest, fault: FaultSpec | None) -> Reply:
        request_id = req.rid or secrets.token_hex(16)
        with self._lock:
            if request_id in self._rids:
                self._counters["bad_requests"] += 1
                return _error_reply(ApiError(400, f"Duplicate request ID detected: {request_id}"))
            self._rids.add(request_id)
        if req.stream:
            job = StreamJob(self, req, request_id, fault)
            return Reply(200, content_type="text/event-stream; charset=utf-8", stream=job)
        try:
            with self.scheduler.slot():
                outcome = self._generate(req, request_id, fault)
        except QueueFull:
            return _error_reply(queue_full_error())
        except Stopped:
            return Reply(0, reset=True)
        finally:
            self.release_rid(request_id)
        if outcome is None:
            return Reply(0, reset=True)
        body = json.dumps(chat_response(req, outcome, self.config)).encode()
        if fault is not None and fault.kind == "bad_json":
            body = body[: max(1, len(body) // 2)]
        return Reply(200, body)

    def release_rid(self, request_id: str) -> None:
        """The request is over: its ``rid`` may be used again."""
        with self._lock:
            self._rids.discard(request_id)

    def plan(self, req: ChatRequest, fault: FaultSpec | None) -> tuple[Plan, Plan, int, bool]:
        """(the untruncated plan, what this request generates of it, the tokens a continued prefix
        already holds, thinking)."""
        cfg = self.config
        thinking = req.thinking and not cfg.ignore_thinking_flag
        rng = prompt_rng(cfg.seed, req.plan_prompt)
        full = plan_output(
            rng, thinking, cfg.mean_output_tokens, cfg.output_tokens_sigma, cfg.reasoning_fraction
        )
        # another sampling seed may escape the loop; without one the prompt alone decides
        loop_key = req.plan_prompt if req.seed is None else f"{req.seed}\x00{req.plan_prompt}"
        full = plan_loop(prompt_rng(cfg.seed + 3, loop_key), full, cfg.loop_share, cfg.context_length)
        done = 0 if req.prefix is None else prefix_tokens(req.prefix)
        plan = full if req.prefix is None else continue_plan(full, done)
        plan = truncate(plan, req.max_new_tokens, "length")
        if fault is not None and fault.kind == "abort":
            plan = truncate(plan, plan.completion_tokens // 2, "abort")
        return full, plan, done, thinking

    def _generate(self, req: ChatRequest, request_id: str, fault: FaultSpec | None) -> Outcome | None:
        cfg = self.config
        started = time.monotonic()
        full, plan, done, thinking = self.plan(req, fault)
        mean_accept, retractions = cfg.accept_length, 0
        if self.batch is not None:
            run = self.batch.run(plan.completion_tokens, req.prompt_tokens, self._stopping)
            mean_accept, retractions = run.accept_length, run.retractions
        else:
            duration = plan.completion_tokens / cfg.tokens_per_second * cfg.time_scale
            if duration > 0 and self._stopping.wait(duration):
                return None
        raw = render_span(
            prompt_rng(cfg.seed + 1, req.plan_prompt), full, done, done + plan.completion_tokens
        )
        if cfg.has_reasoning_parser and req.separate_reasoning:
            reasoning, content = split_reasoning(raw, thinking, req.prefix or "")
        else:
            reasoning, content = None, raw
        reasoning_tokens, verify = self.account(
            req, plan, plan.completion_tokens, mean_accept, retractions, plan.finish_reason == "abort"
        )
        return Outcome(
            request_id=request_id,
            plan=plan,
            reasoning_content=reasoning,
            content=content,
            reasoning_tokens=reasoning_tokens,
            created=int(time.time()),
            e2e_latency=time.monotonic() - started,
            verify_ct=verify,
            cached_tokens=self._cached_tokens(req.prompt, req.prompt_tokens),
            retractions=retractions,
        )

    def accept_length(self, req: ChatRequest, mean: float) -> float:
        """This request's accept length around ``mean`` (deterministic per prompt)."""
        cfg = self.config
        rng = prompt_rng(cfg.seed + 2, req.prompt)
        return draw_accept_length(rng, mean, cfg.accept_length_sd, SPEC_NUM_DRAFT_TOKENS)

    def account(
        self,
        req: ChatRequest,
        plan: Plan,
        generated: int,
        mean_accept: float,
        retractions: int,
        aborted: bool,
        client_gone: bool = False,
    ) -> tuple[int, int]:
        """Count a finished request that generated ``generated`` of its plan's tokens; its
        (reasoning tokens, verify passes)."""
        reasoning = min(generated, plan.reasoning_tokens) if self.config.has_reasoning_parser else 0
        verify = verify_passes(generated, self.accept_length(req, mean_accept))
        self._spec_account(generated, verify)
        counts = {
            "completed": 1,
            "aborted": int(aborted),
            "retractions": retractions,
            "prompt_tokens": req.prompt_tokens,
            "generation_tokens": generated,
            "reasoning_tokens": reasoning,
            "looping": int(plan.loop is not None),
            "client_gone": int(client_gone),
        }
        if req.stream:
            counts |= {
                "streamed": 1,
                "stream_prompt_tokens": req.prompt_tokens,
                "stream_generation_tokens": generated,
            }
        self._count(**counts)
        self.requests.generated(req.prompt)
        return reasoning, verify

    def count_gone_waiting(self) -> None:
        """A streamed request's client went away while it waited for a slot: SGLang aborts it."""
        self._count(aborted=1, client_gone=1)

    def _log(self, line: str) -> None:
        if self.config.verbose:
            print(f"[sim] {line}", file=sys.stderr, flush=True)
