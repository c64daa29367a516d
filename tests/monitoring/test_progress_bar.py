"""Tests for dflash_tasks.monitoring.progress_bar: windowed rates, durations and the rendered line."""

from __future__ import annotations

import io

import pytest
import redis

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.keys import Keys
from dflash_tasks.coord.progress_keys import window_bounds
from dflash_tasks.monitoring.progress_bar import ProgressBar, format_duration, live_rates


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


# -- format_duration ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "--"),
        (float("nan"), "--"),
        (float("inf"), "--"),
        (0, "0s"),
        (0.9, "0s"),
        (59.99, "59s"),
        (60, "1m00s"),
        (61, "1m01s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (3661, "1h01m"),
        (86_400 * 2 + 5 * 60, "48h05m"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


# -- ProgressBar.render (tqdm's formatter, our rates) ---------------------------------------------------


def test_render_shows_counts_both_rates_and_the_eta_from_the_sample_rate() -> None:
    bar = ProgressBar(1000, stream=io.StringIO())
    line = bar.render(250, samples_per_s=2.5, tokens_per_s=12345.6, width=100)
    assert line.startswith(" 25.0%|")
    assert "250/1000 samples" in line
    assert "2.50 samples/s" in line and "12,346 tok/s" in line
    assert line.endswith("ETA 05:00]")  # 750 samples left at 2.5/s


def test_render_eta_uses_remaining_samples_only() -> None:
    bar = ProgressBar(100_000, stream=io.StringIO())
    assert bar.render(64_000, samples_per_s=10.0, tokens_per_s=0).endswith("ETA 1:00:00]")


def test_render_shows_tokens_per_second_even_before_a_sample_rate() -> None:
    bar = ProgressBar(10, stream=io.StringIO())
    line = bar.render(0, 0.0, 850.0)
    assert "850 tok/s" in line and line.endswith("ETA ?]")


def test_render_done() -> None:
    bar = ProgressBar(10, stream=io.StringIO())
    line = bar.render(10, 1.0, 1.0)
    assert line.startswith("100.0%|") and "10/10 samples" in line and line.endswith("ETA 00:00]")


# -- ProgressBar.update ----------------------------------------------------------------------------------


def test_update_on_a_terminal_redraws_one_line() -> None:
    out = Tty()
    bar = ProgressBar(10, stream=out)
    bar.update(1, 1.0, 10.0)
    bar.update(2, 1.0, 10.0)
    bar.close()
    text = out.getvalue()
    assert text.count("\r") == 2
    assert text.endswith("\n") and text.count("\n") == 1
    assert "2/10 samples" in text.split("\r")[-1]


def fake_clock(monkeypatch: pytest.MonkeyPatch, start: float) -> list[float]:
    now = [start]
    monkeypatch.setattr("dflash_tasks.monitoring.progress_bar.time.monotonic", lambda: now[0])
    return now


def test_update_off_a_terminal_prints_a_line_now_and_then(monkeypatch: pytest.MonkeyPatch) -> None:
    now = fake_clock(monkeypatch, 100_000.0)
    out = io.StringIO()
    bar = ProgressBar(10, stream=out, plain_every=10)
    bar.update(1, 1.0, 1.0)
    now[0] += 5
    bar.update(2, 1.0, 1.0)  # too soon: not printed
    now[0] += 5
    bar.update(3, 1.0, 1.0)
    now[0] += 1
    bar.update(10, 1.0, 1.0, force=True)  # the final line is always printed
    bar.close()
    lines = out.getvalue().splitlines()
    assert [line.split("|")[2].split(" ")[1] for line in lines] == ["1/10", "3/10", "10/10"]
    assert "\r" not in out.getvalue()


def test_first_plain_update_is_printed_right_after_boot(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_clock(monkeypatch, 5.0)  # CLOCK_MONOTONIC counts from boot on Linux
    out = io.StringIO()
    bar = ProgressBar(10, stream=out)  # default plain_every = 10 s
    bar.update(1, 1.0, 1.0)
    assert out.getvalue().count("\n") == 1 and "1/10 samples" in out.getvalue()


# -- live_rates: the same buckets status reads ---------------------------------------------------------


def test_live_rates_come_from_the_workers_buckets(rclient: redis.Redis, prefix: str) -> None:
    keys = Keys(prefix)
    now = 1_800_000_000.0
    start, end = window_bounds(now)
    for b in range(start, end, 5):  # a full minute at 2 samples/s and 3,000 tokens/s
        rclient.hset(keys.bucket("j1", b), mapping={"samples": 10, "tokens": 15_000})
    bk = Bookkeeping(rclient, prefix)
    assert live_rates(bk, "j1", now) == (pytest.approx(2.0), pytest.approx(3000.0))
    assert live_rates(bk, "other", now) == (0.0, 0.0)
