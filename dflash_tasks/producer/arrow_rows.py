"""Rows of Parquet and Arrow IPC files, streamed by record batches: memory bounded by a batch.

Only the columns a :class:`~dflash_tasks.producer.prompt_row.ColumnMap` needs are read. A Parquet
file is read a page at a time (a buffered stream, nothing pre-read), so a row group of any size
costs one batch of rows, not the row group; an Arrow file is read a batch at a time (not mapped,
whose pages would count as the process's memory). An S3 file of either format is read through its
seekable stream. A file without the needed columns, or one
that cannot be read, raises :class:`~dflash_tasks.core.errors.InputError` naming the file (and
the columns it has, or the row after which it stopped); rows already yielded stay yielded.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from dflash_tasks.core.errors import DflashError, InputError
from dflash_tasks.producer.input_files import InputFile
from dflash_tasks.producer.prompt_row import ColumnMap

#: Rows per record batch read from a Parquet file.
BATCH_ROWS: Final = 4096
#: Bytes a Parquet column reads at a time (its pages are streamed through a buffer this size).
PARQUET_BUFFER: Final = 1 << 20
_ERRORS: Final = (OSError, pa.ArrowException, ValueError)


def arrow_rows(file: InputFile, fmt: str, columns: ColumnMap) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number from 1, row as a dict of the needed columns) of a Parquet or Arrow file."""
    row = 0
    with ExitStack() as stack:
        try:
            batches, schema = _open(stack, file, fmt)
            wanted = _check_columns(file.name, schema.names, columns)
            for batch in batches(wanted):
                for item in batch.select(wanted).to_pylist():
                    row += 1
                    yield row, item
        except InputError:
            raise
        except (*_ERRORS, DflashError) as exc:  # DflashError: from the store (S3)
            where = f"after row {row}" if row else "before the first row"
            raise InputError(f"{file.name}: cannot read this {fmt} file {where}: {exc}") from None


def count_rows(file: InputFile, fmt: str) -> int:
    """The rows of a Parquet file (from its footer) or an Arrow file (its batches' lengths)."""
    with ExitStack() as stack:
        try:
            source = _source(stack, file, fmt)
            if fmt == "parquet":
                return int(pq.ParquetFile(source).metadata.num_rows)
            return sum(batch.num_rows for batch in _ipc_reader(source))
        except InputError:
            raise
        except (*_ERRORS, DflashError) as exc:
            raise InputError(f"{file.name}: cannot read this {fmt} file: {exc}") from None


def _source(stack: ExitStack, file: InputFile, fmt: str) -> Any:
    """A local file by path or as a native file, an S3 file as its buffered stream."""
    if file.path is not None and fmt == "arrow":
        return stack.enter_context(pa.OSFile(file.path))  # read, not mapped: the RSS stays a batch
    if file.path is not None:
        return file.path
    return stack.enter_context(io.BufferedReader(file.open(), PARQUET_BUFFER))


def _open(stack: ExitStack, file: InputFile, fmt: str) -> tuple[Any, pa.Schema]:
    source = _source(stack, file, fmt)
    if fmt == "parquet":
        parquet = stack.enter_context(pq.ParquetFile(source, buffer_size=PARQUET_BUFFER, pre_buffer=False))

        def parquet_batches(wanted: list[str]) -> Iterator[pa.RecordBatch]:
            # One thread: decoding columns in parallel leaves ~40 MB more in the threads' heaps.
            yield from parquet.iter_batches(batch_size=BATCH_ROWS, columns=wanted, use_threads=False)

        return parquet_batches, parquet.schema_arrow
    reader = _ipc_reader(source)

    def ipc_batches(_: list[str]) -> Iterator[pa.RecordBatch]:
        yield from reader

    return ipc_batches, reader.schema


def _ipc_reader(source: Any) -> Any:
    """An Arrow stream reader (``save_to_disk`` shards) or, for the file format, its batches."""
    if isinstance(source, io.BufferedReader):
        head = source.peek(6)[:6]
    else:
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
