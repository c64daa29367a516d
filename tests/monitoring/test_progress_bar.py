"""Tests for dflash_tasks.monitoring.progress_bar: windowed rates, durations and the rendered line."""

from __future__ import annotations

import io

import pytest

from dflash_tasks.monitoring.progress_bar import ProgressBar, RateWindow, format_duration


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


# -- RateWindow ------------------------------------------------------------------------------------------


def test_rates_are_zero_until_two_points() -> None:
    w = RateWindow(60)
    assert w.rates() == (0.0, 0.0)
    w.add(10, 1000, now=100.0)
    assert w.rates() == (0.0, 0.0)
    w.add(20, 3000, now=110.0)
    assert w.rates() == (1.0, 200.0)


def test_rates_with_no_elapsed_time_are_zero() -> None:
    w = RateWindow(60)
    w.add(10, 10, now=5.0)
    w.add(20, 20, now=5.0)
    assert w.rates() == (0.0, 0.0)


def test_rates_cover_only_the_window() -> None:
    w = RateWindow(60)
    # 10 samples/s for 100 s, then 1 sample/s for 100 s.
    samples = 0
    for t in range(0, 101):
        w.add(samples, samples * 100, now=float(t))
        samples += 10
    assert w.rates()[0] == pytest.approx(10.0)
    for t in range(101, 201):
        w.add(samples, samples * 100, now=float(t))
        samples += 1
    s_rate, t_rate = w.rates()
    assert s_rate == pytest.approx(1.0)
    assert t_rate == pytest.approx(100.0)


def test_window_keeps_a_point_just_older_than_the_window() -> None:
    w = RateWindow(10)
    for t in range(0, 31):
        w.add(t * 2, 0, now=float(t))
    assert len(w._points) == 11  # from t=20 to t=30: the rate spans exactly the window
    assert w._points[0][0] == 20.0
    assert w.rates()[0] == pytest.approx(2.0)


def test_sparse_points_keep_two_for_a_rate() -> None:
    w = RateWindow(10)
    w.add(0, 0, now=0.0)
    w.add(100, 0, now=1000.0)  # much longer than the window apart
    assert w.rates()[0] == pytest.approx(0.1)


def test_add_uses_monotonic_clock_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([50.0, 54.0])
    monkeypatch.setattr("dflash_tasks.monitoring.progress_bar.time.monotonic", lambda: next(clock))
    w = RateWindow(60)
    w.add(0, 0)
    w.add(8, 400)
    assert w.rates() == (2.0, 100.0)


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


# -- ProgressBar.render ------------------------------------------------------------------------------


def test_render_with_eta_from_sample_rate() -> None:
    bar = ProgressBar(1000, stream=io.StringIO(), width=10)
    line = bar.render(250, samples_per_s=2.5, tokens_per_s=12345.6)
    assert line == ("[##--------] 250/1,000 samples  25.0% | 12,346 tok/s 2.50 samples/s | ETA 5m00s")


def test_render_eta_uses_remaining_samples_only() -> None:
    bar = ProgressBar(100_000, stream=io.StringIO(), width=20)
    line = bar.render(64_000, samples_per_s=10.0, tokens_per_s=0)
    assert line.endswith("ETA 1h00m")
    assert "64,000/100,000" in line
    assert line.startswith("[" + "#" * 12 + "-" * 8 + "]")


def test_render_without_rate_has_unknown_eta() -> None:
    bar = ProgressBar(10, stream=io.StringIO(), width=10)
    assert bar.render(3, 0.0, 0.0).endswith("ETA --")


def test_render_done_and_empty_totals() -> None:
    bar = ProgressBar(10, stream=io.StringIO(), width=4)
    assert bar.render(10, 1.0, 1.0).startswith("[####] 10/10 samples 100.0%")
    assert bar.render(10, 1.0, 1.0).endswith("ETA 0s")
    empty = ProgressBar(0, stream=io.StringIO(), width=4)
    assert empty.render(0, 0.0, 0.0).startswith("[####] 0/0 samples 100.0%")


# -- ProgressBar.update ----------------------------------------------------------------------------------


def test_update_on_a_terminal_redraws_one_line() -> None:
    out = Tty()
    bar = ProgressBar(10, stream=out, width=10)
    bar.update(1, 1.0, 10.0)
    bar.update(2, 1.0, 10.0)
    bar.close()
    text = out.getvalue()
    assert text.count("\r") == 2
    assert text.endswith("\n") and text.count("\n") == 1
    assert text.split("\r")[-1].strip() == bar.render(2, 1.0, 10.0)


def fake_clock(monkeypatch: pytest.MonkeyPatch, start: float) -> list[float]:
    now = [start]
    monkeypatch.setattr("dflash_tasks.monitoring.progress_bar.time.monotonic", lambda: now[0])
    return now


def test_update_off_a_terminal_prints_a_line_now_and_then(monkeypatch: pytest.MonkeyPatch) -> None:
    now = fake_clock(monkeypatch, 100_000.0)
    out = io.StringIO()
    bar = ProgressBar(10, stream=out, width=10, plain_every=10)
    bar.update(1, 1.0, 1.0)
    now[0] += 5
    bar.update(2, 1.0, 1.0)  # too soon: not printed
    now[0] += 5
    bar.update(3, 1.0, 1.0)
    now[0] += 1
    bar.update(10, 1.0, 1.0, force=True)  # the final line is always printed
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines == [bar.render(n, 1.0, 1.0) for n in (1, 3, 10)]
    assert "\r" not in out.getvalue()


def test_first_plain_update_is_printed_right_after_boot(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_clock(monkeypatch, 5.0)  # CLOCK_MONOTONIC counts from boot on Linux
    out = io.StringIO()
    bar = ProgressBar(10, stream=out, width=10)  # default plain_every = 10 s
    bar.update(1, 1.0, 1.0)
    assert out.getvalue() == bar.render(1, 1.0, 1.0) + "\n"
