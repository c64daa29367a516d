"""Rows of Parquet and Arrow IPC files, streamed by record batches (bounded memory).

Only the columns a :class:`~dflash_tasks.producer.prompt_row.ColumnMap` needs are read. A file
without them, or one pyarrow cannot read, raises :class:`~dflash_tasks.core.errors.InputError`
naming the file (and the columns it has); rows already yielded stay yielded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from dflash_tasks.core.errors import InputError
from dflash_tasks.producer.prompt_row import ColumnMap

#: Rows per record batch read from a Parquet file.
BATCH_ROWS: Final = 4096
_ERRORS: Final = (OSError, pa.ArrowException, ValueError)


def arrow_rows(name: str, fmt: str, columns: ColumnMap) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number from 1, row as a dict of the needed columns) of a Parquet or Arrow file."""
    row = 0
    try:
        batches, schema = _open(name, fmt)
        wanted = _check_columns(name, schema.names, columns)
        for batch in batches(wanted):
            for item in batch.select(wanted).to_pylist():
                row += 1
                yield row, item
    except _ERRORS as exc:
        where = f"after row {row}" if row else "before the first row"
        raise InputError(f"{name}: cannot read this {fmt} file {where}: {exc}") from None


def count_rows(name: str, fmt: str) -> int:
    """The rows of a Parquet file (from its footer) or an Arrow file (its batches' lengths)."""
    try:
        if fmt == "parquet":
            return int(pq.ParquetFile(name).metadata.num_rows)
        with pa.memory_map(name) as source:
            return sum(batch.num_rows for batch in _ipc_reader(source))
    except _ERRORS as exc:
        raise InputError(f"{name}: cannot read this {fmt} file: {exc}") from None


def _open(name: str, fmt: str) -> tuple[Any, pa.Schema]:
    if fmt == "parquet":
        parquet = pq.ParquetFile(name)

        def parquet_batches(wanted: list[str]) -> Iterator[pa.RecordBatch]:
            yield from parquet.iter_batches(batch_size=BATCH_ROWS, columns=wanted)

        return parquet_batches, parquet.schema_arrow
    source = pa.memory_map(name)
    reader = _ipc_reader(source)

    def ipc_batches(_: list[str]) -> Iterator[pa.RecordBatch]:
        with source:
            yield from reader

    return ipc_batches, reader.schema


def _ipc_reader(source: Any) -> Any:
    """An Arrow stream reader (``save_to_disk`` shards) or, for the file format, its batches."""
    head = source.read(6)
    source.seek(0)
    if head == b"ARROW1":
        file_reader = pa.ipc.open_file(source)
        return _FileBatches(file_reader)
    return pa.ipc.open_stream(source)


class _FileBatches:
    """An Arrow IPC file's batches, iterable like a stream reader."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self.schema = reader.schema

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for i in range(self._reader.num_record_batches):
            yield self._reader.get_batch(i)


def _check_columns(name: str, available: list[str], columns: ColumnMap) -> list[str]:
    problem = columns.missing(available)
    if problem is not None:
        raise InputError(f"{name}: {problem}; its columns are: {', '.join(available) or 'none'}")
    return columns.wanted(available)
