"""The budget arithmetic of ``--max-tokens horizon`` (dflash_tasks.core.budget) and its values."""

from __future__ import annotations

import pytest

from dflash_tasks.core.budget import HORIZON, HORIZON_FLOOR, horizon_budget, parse_max_tokens
from dflash_tasks.core.errors import ConfigError


@pytest.mark.parametrize(
    ("max_length", "prefix", "closing", "expected"),
    [
        (4096, 100, 2, 3998),  # max_length less the prefix, plus the closing tokens
        (4096, 4000, 2, 98),
        (4096, 4096 - HORIZON_FLOOR + 2, 2, HORIZON_FLOOR),  # exactly at the floor
        (4096, 4090, 2, HORIZON_FLOOR),  # a prefix all but filling max_length: the floor
        (256, 900, 2, HORIZON_FLOOR),  # a prefix past max_length: the floor, never negative
        (8192, 0, 0, 8192),
    ],
)
def test_the_horizon_budget(max_length: int, prefix: int, closing: int, expected: int) -> None:
    assert horizon_budget(max_length, prefix, closing) == expected


def test_a_row_cut_at_its_budget_reaches_max_length_by_the_closing_tokens() -> None:
    for prefix in range(0, 4000, 37):
        budget = horizon_budget(4096, prefix, 2)
        assert prefix + budget == 4096 + 2  # the trainer's cut 2 tokens inside the generated text


@pytest.mark.parametrize(("text", "value"), [("horizon", HORIZON), ("HORIZON", HORIZON), ("12", 12), (7, 7)])
def test_max_tokens_values(text: str | int, value: int | str) -> None:
    assert parse_max_tokens(text) == value


@pytest.mark.parametrize("text", ["0", "-1", "1.5", "", "auto", 0, True])
def test_bad_max_tokens_values_are_refused(text: str | int) -> None:
    with pytest.raises(ConfigError, match="expected a number of tokens"):
        parse_max_tokens(text)
