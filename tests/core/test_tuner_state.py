"""The tuner's state: the heartbeat's ``tuner`` field is its one JSON encoding, read back whole."""

from __future__ import annotations

import json

import pytest

from dflash_tasks.core.tuner_state import TunerPoint, TunerState
from workers.flow.inflight_tuner import InflightTuner
from workers.flow.tuner_inputs import TunerConfig, Window

STATE = TunerState(
    target=72,
    phase="climbing",
    reason="throughput rising",
    floor=8,
    ceiling=256,
    curve=(TunerPoint(48, 27000.0, 3.125, 0.41, 2), TunerPoint(72, 31000.5, 3.0, 0.6, 1)),
    window_seconds=30.0,
    completed_tokens=123456,
)


def test_the_heartbeat_field_reads_back_to_the_same_state_and_bytes() -> None:
    field = STATE.to_json()
    assert TunerState.from_json(field) == STATE
    assert json.dumps(json.loads(field), separators=(",", ":")) == field
    assert list(json.loads(field)) == [
        "target",
        "phase",
        "reason",
        "floor",
        "ceiling",
        "curve",
        "window_seconds",
        "completed_tokens",
    ]


def test_what_a_worker_reports_reads_back_as_it_was_reported() -> None:
    tuner = InflightTuner(TunerConfig())
    tuner.observe(Window(target=48, seconds=30, tokens_per_s=1234.5678, accept_length=2.71828, running=48))
    state = tuner.state()
    assert state.curve == (TunerPoint(48, 1234.6, 2.718, 0.0, 1),)
    assert TunerState.from_json(state.to_json()) == state


@pytest.mark.parametrize(
    "field",
    ["", "not json", "{}", "[]", '{"target": "72"}', STATE.to_json().replace('"target":72', '"target":true')],
)
def test_a_field_that_is_not_a_state_reads_as_none(field: str) -> None:
    assert TunerState.from_json(field) is None
