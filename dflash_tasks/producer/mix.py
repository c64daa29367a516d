"""The job's input: one source or several, read in order into one stream of samples.

This is the one way prompts are read: a single ``--input`` is a mix of one source
(:meth:`InputMix.of`, :func:`read_input`), and every format and place (local or S3) is read by
the same per-source loop.

Each row of a source yields one :class:`Sample` or one :class:`InvalidLine` (naming its source,
file and row), unless the source's quota leaves it out. A source's quota is its row count, or its
``limit``, or, when the sources have weights, its share of the largest mix they can supply (the
source that runs out first sets the size: weights 3 and 1 over 900 and 500 rows take 900 and
300). Rows are chosen uniformly at random by selection sampling (exactly the quota, one pass,
no memory per row), seeded by the job's sampling seed and the source's name: the same command
stages the same rows.

A sample's ``line`` is its place in the job's input (the JSONL line, for a job of one JSONL
file). In a job of several sources its id is ``<source>:<id>`` (``<source>:L<row>`` without an
id column) and it carries ``source``, so ids stay unique and every record names where it came
from; a job of one source keeps the ids it always had.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from dflash_tasks.core.errors import ConfigError, InputError
from dflash_tasks.core.sample import Sample
from dflash_tasks.core.settings import CommonSettings
from dflash_tasks.producer.arrow_rows import arrow_rows, count_rows
from dflash_tasks.producer.input_files import InputFile
from dflash_tasks.producer.input_formats import InputFiles
from dflash_tasks.producer.inputs import InvalidLine, count_lines, jsonl_lines, parse_json_line
from dflash_tasks.producer.prompt_row import ColumnMap, RowIds, RowInvalid, parse_row
from dflash_tasks.producer.sources import Located, SourceSpec, default_name

_ANY_SHAPE = ColumnMap()


@dataclass(slots=True)
class SourceFigures:
    """What staging found in one source."""

    name: str
    rows: int = 0  # rows read
    selected: int = 0  # rows the quota took (valid or not)
    samples: int = 0
    invalid: int = 0
    first_chunk: int | None = None  # of its first staged sample
    last_chunk: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class InputMix:
    """The sources of one job, their identity, and the stream of their rows."""

    def __init__(
        self, specs: list[SourceSpec], seed: int = 0, settings: CommonSettings | None = None
    ) -> None:
        if not specs:
            raise ConfigError("no --input given")
        self.specs = specs
        self.seed = seed
        self._located = [Located(s, settings) for s in specs]
        self.figures = [SourceFigures(s.name) for s in specs]
        self._counts: list[int] = []

    @classmethod
    def of(cls, location: str | os.PathLike[str], columns: ColumnMap = _ANY_SHAPE) -> InputMix:
        """The job's input when it is one location read as it is (``--input LOCATION``)."""
        name = os.fspath(location)
        return cls([SourceSpec(name, default_name(name), columns=columns)])

    @property
    def tagged(self) -> bool:
        """Samples carry their source (a job of several sources)."""
        return len(self.specs) > 1

    @property
    def sampled(self) -> bool:
        return any(s.weight is not None or s.limit is not None for s in self.specs)

    @property
    def plain(self) -> bool:
        """One local file read as it always was: the job's identity is that file's, as before."""
        spec = self.specs[0]
        return (
            len(self.specs) == 1
            and not (spec.named or spec.is_s3 or spec.format or self.sampled or spec.columns.to_dict())
            and os.path.isfile(spec.location)
        )

    def identity(self) -> tuple[str, str, dict[str, Any] | None]:
        """(fingerprint, name, the ``inputs`` document of job.json or None for a plain job)."""
        if self.plain:
            loc = self._located[0]
            return loc.fingerprint(), os.path.basename(self.specs[0].location), None
        doc: dict[str, Any] = {"sources": [loc.spec.identity(loc.fingerprint()) for loc in self._located]}
        if self.sampled:
            doc["seed"] = self.seed
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
        return "mix:sha256:" + digest, ", ".join(s.name for s in self.specs), doc

    def read(self) -> Iterator[Sample | InvalidLine]:
        """Every chosen row of every source, in order, as a Sample or an InvalidLine.

        The sources' files are listed, and a file of another format refused, before this returns;
        a file that breaks off while it is read raises InputError naming the source (in a job of
        several), the file and the row after which it stopped.
        """
        found = [loc.files() for loc in self._located]
        quotas: list[int | None] = self._quotas(found) if self.sampled else [None] * len(found)
        return self._rows(found, quotas)

    def _rows(self, found: list[InputFiles], quotas: list[int | None]) -> Iterator[Sample | InvalidLine]:
        line = 0
        for i, (spec, files, quota) in enumerate(zip(self.specs, found, quotas, strict=True)):
            left = self._counts[i] if quota is not None else None
            try:
                for item in self._source(spec, files, (quota, left), self.figures[i], line):
                    line += 1
                    yield item
            except InputError as exc:
                if not self.tagged:
                    raise
                raise InputError(f"source {spec.name!r}: {exc}") from exc

    def _quotas(self, files: list[InputFiles]) -> list[int | None]:
        counts = self._counts = [sum(_count(f, found.format) for f in found.files) for found in files]
        caps = [n if s.limit is None else min(n, s.limit) for s, n in zip(self.specs, counts, strict=True)]
        if self.specs[0].weight is None:
            return list(caps)
        weights = [float(s.weight or 0) for s in self.specs]
        total = sum(weights)
        size = min(cap * total / w for cap, w in zip(caps, weights, strict=True))
        return [min(cap, round(size * w / total)) for cap, w in zip(caps, weights, strict=True)]

    def _source(
        self,
        spec: SourceSpec,
        found: InputFiles,
        quota: tuple[int | None, int | None],
        figures: SourceFigures,
        line: int,
    ) -> Iterator[Sample | InvalidLine]:
        """The source's rows; ``quota`` is (rows to choose, rows it has), both None to take all."""
        rows = 0
        need, left = quota
        chooser = random.Random(f"{self.seed}:{spec.name}")
        ids = RowIds("line" if found.format == "jsonl" else "row")
        tag = spec.name if self.tagged else None
        for file in found.files:
            for row_in_file, raw in _rows(file, found.format, spec):
                rows += 1
                if need is not None and left is not None:
                    take = need > 0 and chooser.random() * left < need
                    left -= 1
                    if not take:
                        continue
                    need -= 1
                line += 1
                figures.selected += 1
                try:
                    if isinstance(raw, bytes):
                        ident, messages = parse_json_line(raw, spec.columns)
                    else:
                        ident, messages = parse_row(raw, spec.columns)
                    ident = ids.claim(ident, rows)
                except RowInvalid as exc:
                    figures.invalid += 1
                    yield InvalidLine(file.name, row_in_file, exc.args[0], tag)
                    continue
                figures.samples += 1
                yield Sample(ident if tag is None else f"{tag}:{ident}", messages, line, tag)
            figures.rows = rows


def read_input(
    location: str | os.PathLike[str], columns: ColumnMap = _ANY_SHAPE
) -> Iterator[Sample | InvalidLine]:
    """Every row of one location (a file, folder or glob, local or ``s3://``), as a job of that
    one source reads it; its files are listed before this returns."""
    return InputMix.of(location, columns).read()


def _rows(file: InputFile, fmt: str, spec: SourceSpec) -> Iterator[tuple[int, Any]]:
    if fmt == "jsonl":
        return jsonl_lines(file)
    return arrow_rows(file, fmt, spec.columns)


def _count(file: InputFile, fmt: str) -> int:
    return count_lines(file) if fmt == "jsonl" else count_rows(file, fmt)
