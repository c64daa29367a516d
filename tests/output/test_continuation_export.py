"""The export writes a continued turn whole: the cut thought and its continuation joined, as one
assistant message; the cut record it replaces would have been left out as truncated."""

from __future__ import annotations

from dflash_tasks.core.job import GenerationSpec, JobDefinition
from dflash_tasks.core.quality import QualitySettings, with_checks
from dflash_tasks.core.record import Record
from dflash_tasks.core.row_planner import ExportOptions, RowPlanner
from dflash_tasks.core.trainer_view import TrainerView
from tests.core.test_continuation import continued, cut


def planned(record: Record) -> tuple[list[dict[str, object]], RowPlanner]:
    job = JobDefinition.create("sha256:x", "p.jsonl", GenerationSpec(model="m"))
    planner = RowPlanner(job, TrainerView(), ExportOptions(layout="conversation"))
    return list(planner.rows([record])), planner


def test_a_continued_thought_is_exported_joined_and_the_cut_one_is_left_out() -> None:
    quality = QualitySettings()
    rows, planner = planned(with_checks(cut(), True, quality))
    assert rows == [] and planner.counts.dropped["truncated"] == 1

    rows, planner = planned(with_checks(continued(cut()), True, quality))
    (row,) = rows
    answer = row["conversations"][-1]  # type: ignore[index]
    assert answer == {
        "role": "assistant",
        "content": "The answer.",
        "reasoning_content": "Okay let me think about it",
    }
