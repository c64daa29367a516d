"""The reliability table's hooks (a plugin that ``tests/conftest.py`` loads): one row per
scenario, printed and written at the end of ``make test`` and ``make reliability``.

Each scenario's rows ride on its test report (``user_properties``). Under ``pytest -n`` the
scenarios run in worker processes, and only the controller prints: it never loads
``tests/reliability/conftest.py`` (it collects nothing), which is why these hooks live here. The
table is also written to ``test-artifacts/reliability.md`` and ``test-artifacts/reliability.json``.
"""

from __future__ import annotations

import pytest

from tests.reliability.support import ARTIFACTS, ROW_PROPERTY, Collector, Row

_COLLECTOR = pytest.StashKey[Collector]()
_current: dict[str, Collector] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_COLLECTOR] = _current["collector"] = Collector()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add up the suite's own time (set-up, call, tear-down), also when it runs inside ``make test``."""
    collector = _current.get("collector")
    if collector is None:
        return
    if report.nodeid.startswith("tests/reliability/"):
        collector.seconds += report.duration
    if report.when == "teardown":  # its properties hold every row the test added
        for key, value in report.user_properties:
            if key == ROW_PROPERTY and isinstance(value, dict):
                collector.add(Row(**value))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    collector = config.stash.get(_COLLECTOR, None)
    if collector is None or not collector.rows or hasattr(config, "workerinput"):
        return  # an xdist worker's rows are the controller's to print
    md, js = collector.write(ARTIFACTS)
    t = collector.totals()
    terminalreporter.section("reliability: nothing lost, nothing duplicated")
    for line in collector.markdown().splitlines():
        terminalreporter.write_line(line)
    terminalreporter.write_line(
        f"{t['scenarios']} scenarios ({t['failed']} failed): {t['samples_expected']:,} samples expected, "
        f"{t['stored_once']:,} stored exactly once, {t['lost']} lost, {t['duplicated']} duplicated, "
        f"{t['wasted']:,} requests wasted; "
        f"suite time {t['suite_s']:.0f} s (set-up, tests and tear-down of tests/reliability)"
    )
    terminalreporter.write_line(
        f"written: {md.relative_to(ARTIFACTS.parent)}, {js.relative_to(ARTIFACTS.parent)}"
    )
