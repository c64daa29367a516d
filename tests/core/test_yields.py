"""The yield's pieces: the turns a repair round generated again, and the tally as job counters."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from dflash_tasks.core.record import Record, Usage
from dflash_tasks.core.repair import Superseded, superseded
from dflash_tasks.core.states import RecordStatus
from dflash_tasks.core.yields import YieldTally, written_share
from tests.core.test_continuation import continued, cut
from tests.core.test_record import record, turn


def two_turns(second_tokens: int = 40, **second: object) -> Record:
    return record(turn(), turn(usage=Usage(5, second_tokens, 30), **second))  # type: ignore[arg-type]


def test_a_regenerated_turn_is_superseded_a_kept_one_is_not() -> None:
    old = two_turns(70, content="", finish_reason="length")
    again = two_turns(90, reasoning="another thought")  # turn 1 kept, turn 2 generated anew
    assert superseded(old, again)[0] == 70
    assert superseded(old, record(turn(reasoning="x", latency_s=9.0)))[0] == 40 + 70  # both anew


def test_a_turn_equal_but_for_its_checks_is_kept() -> None:
    old = two_turns()
    rechecked = replace(old, turns=tuple(replace(t, checks=("no_reasoning",)) for t in old.turns))
    assert superseded(old, rechecked)[0] == 0


def test_a_continued_turn_carries_its_tokens_and_a_failed_continuation_too() -> None:
    old = cut(done=1000)
    once = continued(old, added=500)
    assert superseded(old, once)[0] == 0
    assert superseded(once, continued(once, added=200))[0] == 0  # continued twice
    assert superseded(old, old)[0] == 0  # the continuation failed: the cut turn as it was
    # the same text generated again from scratch (temperature 0) was paid for twice
    regenerated = record(replace(once.turns[0], parts=(), latency_s=7.0))
    assert superseded(old, regenerated)[0] == 1000


def test_a_failed_turn_generated_again_supersedes_what_it_had_generated() -> None:
    old = two_turns(25, status=RecordStatus.FAILED, content="", finish_reason=None)
    acc = Superseded()
    acc(old, two_turns(60))
    acc(old, old)
    assert (acc.tokens, acc.records) == (25, 2)


def test_the_tally_as_counters_reads_back_and_a_round_moves_them_by_its_change() -> None:
    chunk = YieldTally(generated=1000, trainable=700, written_generated=800, lost_to_max_length=50)
    chunk.failed_turns, chunk.horizon_rows = 30, 2
    chunk.dropped.update(truncated=150, empty_answer=20)
    counters = chunk.counters()
    assert counters["yield_generated_tokens"] == 1000 and counters["yield_dropped_truncated"] == 150
    assert YieldTally.from_counters(counters).to_dict() == chunk.to_dict()

    replaced = YieldTally(generated=150, trainable=0)
    replaced.dropped["truncated"] = 150
    repaired = YieldTally(generated=400, trainable=380, written_generated=400)
    repaired.add_superseded(100)  # regenerated, not continued: its old turn paid for again
    delta = repaired.counters(minus=replaced)
    assert delta["yield_dropped_truncated"] == -150 and delta["yield_generated_tokens"] == 500 - 150
    after = {k: counters.get(k, 0.0) + delta.get(k, 0.0) for k in {*counters, *delta}}
    total = YieldTally.from_counters(after)
    assert total.generated == 1000 + 350 and total.superseded == 100 and total.trainable == 1080
    assert total.dropped == Counter(empty_answer=20)  # the truncated rows were replaced
    assert total.to_dict()["where_the_rest_went"]["dropped_rows"] == {"empty_answer": 20}


def test_the_preflights_advice_names_loops_when_they_cost_the_yield() -> None:
    from dflash_tasks.producer.preflight_yield import what_would_raise

    tally = YieldTally(generated=1000, trainable=700, written_generated=700, looping=300)
    (advice,) = what_would_raise(tally, "per-turn")
    assert advice.startswith("30.0% of generated tokens: thoughts or answers stopped in a loop")


def test_a_written_row_counts_at_most_what_its_turns_generated_so_the_rest_is_never_negative() -> None:
    # finished: the template's end of turn (and a marker the server counted as one token) are loss
    assert written_share(generated=100, loss_tokens=104, lost=0) == (100, 0)
    # cut past max_length (the horizon rule): the </think> and end of turn closing it lie past it too
    assert written_share(generated=4096, loss_tokens=4000, lost=101) == (4000, 96)
    # earlier turns the template leaves untrained: the loss tokens are the trainable ones
    assert written_share(generated=300, loss_tokens=200, lost=10) == (200, 10)
    tally = YieldTally(generated=4096 + 100 + 300)
    for row in ((4096, 4000, 101), (100, 104, 0), (300, 200, 10)):
        tally.add_written(*row)
    assert (tally.trainable, tally.lost_to_max_length, tally.untrained) == (4300, 106, 90)
    assert tally.ratio is not None and tally.ratio <= 1
    tally.add_written(50)  # a row no tokenizer counted: generated, not trainable
    assert (tally.written_generated, tally.trainable) == (4546, 4300)
