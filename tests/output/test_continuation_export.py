"""The export writes a continued turn whole: the cut thought and its continuation joined, as one
assistant message; the cut record it replaces would have been left out as truncated."""

from __future__ import annotations

from dflash_tasks.core.quality import QualitySettings, with_checks
from dflash_tasks.output.export import ExportCounts, ExportOptions, to_row
from tests.core.test_continuation import continued, cut


def test_a_continued_thought_is_exported_joined_and_the_cut_one_is_left_out() -> None:
    quality = QualitySettings()
    before, counts = with_checks(cut(), True, quality), ExportCounts()
    assert to_row(before, ExportOptions(), counts) is None and counts.dropped["truncated"] == 1

    after = with_checks(continued(cut()), True, quality)
    row = to_row(after, ExportOptions(), ExportCounts())

    assert row is not None
    answer = row["conversations"][-1]
    assert answer == {
        "role": "assistant",
        "content": "The answer.",
        "reasoning_content": "Okay let me think about it",
    }
