"""One sample generated the way a worker does it, for tests of generation and the client."""

from __future__ import annotations

import time
from collections.abc import Callable

from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.record import Record
from dflash_tasks.core.repetition import RepetitionSettings
from dflash_tasks.core.sample import Sample
from workers.flow.request_pool import RequestPool
from workers.generate.conversation import start_conversation
from workers.generation import RetryPolicy, WorkerIdentity
from workers.sglang_client import SGLangClient


def generate_sample(
    client: SGLangClient,
    spec: GenerationSpec,
    sample: Sample,
    who: WorkerIdentity,
    policy: RetryPolicy,
    rid_prefix: str,
    sleep: Callable[[float], None] = time.sleep,
    repetition: RepetitionSettings | None = None,
) -> Record:
    """``sample``'s record through :func:`start_conversation` on a one-slot pool (the worker's own
    path, turn after turn); raises what a turn raised, e.g. ``ServerUnavailable``. ``repetition``:
    streamed and watched for loops (None: plain requests)."""
    pool = RequestPool(1)
    try:
        future = start_conversation(
            pool, client, spec, sample, who, policy, rid_prefix, sleep=sleep, repetition=repetition
        )
        return future.result()
    finally:
        pool.shutdown()
