"""Output records and a local store of chunk files for the page's tests."""

from __future__ import annotations

from pathlib import Path

from dflash_tasks.core.job import output_key, repair_key
from dflash_tasks.core.record import Record, Turn, Usage, encode_records, outcome_of
from dflash_tasks.core.states import RecordStatus
from dflash_tasks.store import LocalStore


def make_record(
    sample_id: str,
    *,
    tokens: int = 40,
    finish: str = "stop",
    ok: bool = True,
    checks: tuple[str, ...] | None = (),
    prompt: str = "alpha",
    reasoning: str = "alpha beta",
    answer: str = "beta gamma",
) -> Record:
    turn = Turn(
        input=({"role": "user", "content": prompt},),
        reasoning=reasoning if ok else "",
        content=answer if ok else "",
        finish_reason=finish if ok else None,
        usage=Usage(5, tokens, tokens // 2),
        meta_info={"spec_verify_ct": max(1, tokens // 4)},
        status=RecordStatus.OK if ok else RecordStatus.FAILED,
        error=None if ok else "400: prompt too long",
        latency_s=1.0,
        attempts=1,
        checks=checks,
    )
    turns = (turn,)
    return Record(
        id=sample_id,
        line=1,
        user_turns=1,
        turns=turns,
        outcome=outcome_of(turns, 1),
        status=turn.status,
        error=turn.error,
        finish_reason=turn.finish_reason,
        usage=turn.usage,
        model="m",
        endpoint="http://127.0.0.1:1",
        worker="gpu0@test",
        latency_s=1.0,
        attempts=1,
        checks=checks,
    )


def store_with(
    root: Path, chunks: dict[int, list[Record]], repairs: dict[tuple[int, int], list[Record]] | None = None
) -> LocalStore:
    store = LocalStore(str(root))
    for chunk, records in chunks.items():
        store.write(output_key(chunk), encode_records(records))
    for (chunk, round_), records in (repairs or {}).items():
        store.write(repair_key(chunk, round_), encode_records(records))
    return store
