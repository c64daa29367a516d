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


class ReliabilityTable:
    """Adds up the rows and the suite's time from the reports; prints and writes the table."""

    def __init__(self) -> None:
        self.collector = Collector()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid.startswith("tests/reliability/"):  # set-up, call and tear-down
            self.collector.seconds += report.duration
        if report.when == "teardown":  # its properties hold every row the test added
            for key, value in report.user_properties:
                if key == ROW_PROPERTY and isinstance(value, dict):
                    self.collector.add(Row(**value))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        collector = self.collector
        if not collector.rows:
            return
        md, js = collector.write(ARTIFACTS)
        t = collector.totals()
        terminalreporter.section("reliability: nothing lost, nothing duplicated")
        for line in collector.markdown().splitlines():
            terminalreporter.write_line(line)
        terminalreporter.write_line(
            f"{t['scenarios']} scenarios ({t['failed']} failed): {t['samples_expected']:,} samples "
            f"expected, {t['stored_once']:,} stored exactly once, {t['lost']} lost, "
            f"{t['duplicated']} duplicated, {t['wasted']:,} requests wasted; "
            f"suite time {t['suite_s']:.0f} s (set-up, tests and tear-down of tests/reliability)"
        )
        terminalreporter.write_line(
            f"written: {md.relative_to(ARTIFACTS.parent)}, {js.relative_to(ARTIFACTS.parent)}"
        )


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # an xdist worker's rows are the controller's to print
        config.pluginmanager.register(ReliabilityTable(), "reliability-table")
