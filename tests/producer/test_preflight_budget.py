"""The preflight's projection of other budgets from its own sample (producer/preflight_budget.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.record import Record, Usage
from dflash_tasks.core.yields import YieldTally
from dflash_tasks.producer.preflight_budget import BudgetProjection, project_budgets, render_budgets
from tests.core.test_record import record, turn

MAX_LENGTH = 1000
SPEC = GenerationSpec("m", max_tokens=4096)


def sample(rid: str, *turns: tuple[int, int, str]) -> Record:
    """A record of turns (prompt tokens, completion tokens, finish reason)."""
    made = [
        turn(usage=Usage(p, c, c), finish_reason=f, content="" if f == "length" else "c") for p, c, f in turns
    ]
    return replace(record(*made), id=rid)


RECORDS = [
    sample("a", (100, 500, "stop")),  # fits every budget but 300
    sample("b", (100, 3000, "stop")),  # past the window (900): the trainer cut it
    sample("c", (50, 200, "stop"), (300, 4096, "length")),  # its second turn cut at the chosen 4,096
]
PER_TURN = {("a", 0): 502, ("b", 0): 900, ("c", 0): 202, ("c", 1): 700}


def by_budget(projections: list[BudgetProjection]) -> dict[Any, BudgetProjection]:
    return {p.budget: p for p in projections}


def test_each_budget_projected_turn_by_turn_from_the_sample() -> None:
    tally = YieldTally(generated=7796, trainable=2304)
    got = project_budgets(RECORDS, PER_TURN, MAX_LENGTH, SPEC, tally, ("horizon", 300, 4096, 8192))
    assert [p.budget for p in got] == ["horizon", 300, 4096, 8192]  # the horizon first, then ascending
    p = by_budget(got)
    assert p[4096] == BudgetProjection(4096, True, 7796, 2304, False)  # the sample's own figures
    # The horizon: b and c's second turn cut at their windows (900, 700), every row still written.
    assert p["horizon"] == BudgetProjection("horizon", False, 500 + 900 + 200 + 700, 2304, False)
    # 300 cuts short of every window: those rows are left out (truncated), c stops at its second turn.
    assert p[300] == BudgetProjection(300, False, 300 + 300 + 200 + 300, 202, False)
    # 8,192: c's second turn, cut at 4,096, would have run longer: at least the sample's figures.
    assert p[8192] == BudgetProjection(8192, False, 7796, 2304, True)
    assert p["horizon"].ratio is not None and p["horizon"].ratio > p[8192].ratio  # type: ignore[operator]


def test_a_conversation_row_is_kept_or_left_out_whole() -> None:
    whole = {("a", None): 502, ("b", None): 900, ("c", None): 902}
    tally = YieldTally(generated=7796, trainable=2304)
    p = by_budget(project_budgets(RECORDS, whole, MAX_LENGTH, SPEC, tally, ("horizon", 300)))
    assert p["horizon"].trainable == 2304  # every cut past its window: the rows are the same
    assert p[300].trainable == 0  # each record cut short of its window somewhere


def test_a_horizon_job_is_compared_with_the_fixed_budgets() -> None:
    spec = GenerationSpec("m", max_tokens=MAX_LENGTH, budget_policy="horizon")
    cut = [sample("x", (100, 902, "length")), sample("y", (100, 40, "stop"))]
    got = project_budgets(cut, {("x", 0): 900, ("y", 0): 42}, MAX_LENGTH, spec, YieldTally(942, 942))
    assert [(p.budget, p.chosen) for p in got] == [
        ("horizon", True),
        (4096, False),
        (8192, False),
        (32768, False),
    ]
    assert all(p.lower_bound for p in got[1:])  # x, cut at its horizon, would have run on


def test_the_lines_mark_the_chosen_budget_lower_bounds_and_the_cost() -> None:
    lines = render_budgets(
        [
            BudgetProjection("horizon", False, 2300, 2304, False),
            BudgetProjection(8192, True, 7796, 2304, True),
        ],
        2.0,
    )
    assert "horizon" in lines[1] and "yield 1.002" in lines[1] and "~$2.00 per million trainable" in lines[1]
    assert "8,192 (chosen)" in lines[2] and "generated >=7,796" in lines[2] and "~$6.77" in lines[2]
    assert render_budgets([BudgetProjection(4096, True, 1, 1, False)], None) == []
