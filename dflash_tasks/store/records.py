"""Reading a job's output records, chunk by chunk, in input order."""

from __future__ import annotations

from collections.abc import Iterator

from dflash_tasks.core.job import Manifest, output_key
from dflash_tasks.core.record import Record, decode_records
from dflash_tasks.store.base import Store


def iter_records(store: Store, manifest: Manifest, missing: list[int] | None = None) -> Iterator[Record]:
    """Every stored record in input order; chunks not done yet are skipped (and listed in ``missing``).

    A damaged line raises :class:`~dflash_tasks.core.errors.BadRecord` naming the chunk, the line
    and the field (``verify`` reports every one instead of stopping at the first).
    """
    for chunk in range(manifest.chunks):
        key = output_key(chunk)
        try:
            data = store.read(key)
        except KeyError:
            if missing is not None:
                missing.append(chunk)
            continue
        yield from decode_records(data, key)
