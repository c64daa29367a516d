"""A sample as the trainer will see it: its conversation rendered with the trainer's chat template,
each token marked as trained or not (:meth:`~dflash_tasks.core.loss_tokens.LossTokenCounter.marks`,
the code that counts the loss tokens), or why that cannot be shown."""

from __future__ import annotations

from dataclasses import dataclass

from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.job import JobDefinition
from dflash_tasks.core.loss_tokens import LossTokenCounter, TokenMarks, row_messages
from dflash_tasks.core.record import Record
from dflash_tasks.core.trainable import counter_for, served_model_path
from dflash_tasks.core.trainer_view import TrainerView


@dataclass(frozen=True, slots=True)
class TrainerSight:
    """The marks of one sample (None when no tokenizer is at hand) and a line saying how they were made."""

    marks: TokenMarks | None
    note: str


class TrainerLens:
    """Marks samples with one trainer view; the tokenizer is picked at the first sample and kept."""

    def __init__(self, view: TrainerView, definition: JobDefinition) -> None:
        self.view = view
        self.thinking = definition.spec.thinking
        self.preserve = definition.spec.keeps_history_reasoning
        self._counter: LossTokenCounter | None = None
        self._note = ""

    def _pick(self, record: Record) -> None:
        if self._counter is not None:
            return
        try:
            self._counter, self._note = counter_for(
                self.view, self.thinking, served_model_path([record]), self.preserve
            )
        except ConfigError as exc:
            self._note = f"the trainer's view cannot be shown: {exc}"

    def see(self, record: Record) -> TrainerSight:
        if not record.ok:
            return TrainerSight(None, "a failed sample is not exported: the trainer never sees it")
        self._pick(record)
        if self._counter is None:
            return TrainerSight(None, self._note + " (start the page with --tokenizer MODEL_DIR)")
        return TrainerSight(self._counter.marks(row_messages(record)), self._note)
