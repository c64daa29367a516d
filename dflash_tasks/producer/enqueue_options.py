"""What one ``enqueue`` run is asked to do, as a typed object: the job it defines (or resumes)
and how to run it. The command builds it from its flags
(:func:`dflash_tasks.producer.enqueue_args.options_from_args`); a program builds it directly and
calls :func:`dflash_tasks.producer.enqueue.enqueue`."""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.quality import QualitySettings
from dflash_tasks.core.trainer_view import TrainerOverrides
from dflash_tasks.producer.prompt_row import ColumnMap

#: Samples the preflight generates and judges before a new job is queued whole.
DEFAULT_PREFLIGHT = 200


@dataclass(frozen=True, slots=True)
class EnqueueOptions:
    """One enqueue run. ``spec.max_tokens`` is the job's budget, or with ``repair_truncated``
    the budget of the truncated samples' repair."""

    #: The input sources, as ``--input`` takes them (``LOCATION[,key=value...]``).
    inputs: tuple[str, ...]
    #: The output root: a directory or ``s3://bucket/prefix``.
    output: str
    spec: GenerationSpec
    quality: QualitySettings = field(default_factory=QualitySettings)
    #: Changes to the job's trainer view for this run.
    trainer: TrainerOverrides = field(default_factory=TrainerOverrides)
    columns: ColumnMap = field(default_factory=ColumnMap)
    #: Seed choosing the rows of sources with ``weight=`` or ``limit=``.
    sample_seed: int = 0
    #: Preflight sample size for a new job; 0: none.
    preflight: int = DEFAULT_PREFLIGHT
    #: The caller waits for the job (``--wait``), which runs the repair rounds itself.
    wait: bool = False
    #: Plan only: write and queue nothing.
    dry_run: bool = False
    #: Repair rounds also regenerate samples that failed permanently.
    retry_failed: bool = False
    #: Repair rounds regenerate the samples truncated at the job's ``max_tokens`` with ``spec.max_tokens``.
    repair_truncated: bool = False
