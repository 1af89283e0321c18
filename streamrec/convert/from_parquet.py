"""Parquet rows -> TFRecord Examples, store to store (``streamrec convert --from parquet``).

A :func:`streamrec.reshard.reshard` whose inputs are Parquet files (:data:`PARQUET`): the files
are planned into tasks as input shards are (``max_records`` / ``max_bytes`` rotation in tasks
of ``task_bytes`` of input; each file's row count, read from its footer, numbers
``max_records`` shards across tasks), or, with a fixed ``num_shards``, by rows: shard k holds
the next ``total // num_shards`` rows (the first ``total % num_shards`` shards one more) in
file order, so counts differ by one at most and a shard is empty only when there are fewer
rows than shards (then shard i < total holds row i, as the writer's round-robin gave before);
each task writes its shards through
:func:`streamrec.open_writer` (index sidecars with ``index``; each shard appears only when
complete) and then its task manifest, ``_manifest.json`` comes last; a rerun after a kill redoes
only the unfinished tasks, and ``engine="dask"`` runs the tasks on a Dask cluster with the same
output. Each Parquet file (read whole into memory, then a batch of rows at a time) gives its rows
in order; each row becomes one Example (:func:`streamrec.example.encode`, TensorFlow's
serialization). Per column:

==========================================  ===============================================
Arrow type                                  feature
==========================================  ===============================================
integers, bool                              ``int64_list`` (one value)
floating point                              ``float_list`` (one float32 value, bits kept)
binary, string (UTF-8)                      ``bytes_list`` (one value)
list / large_list / fixed_size_list of ...  the leaf kind, the row's values flattened
null (a missing value)                      no feature in that row's Example
==========================================  ===============================================

A file that ``streamrec convert --to parquet`` wrote round-trips: Examples whose features are
all present (a VarLenFeature's missing feature becomes an empty list, written back as an empty
one) come back byte for byte. A null inside a list, or any other type (structs, maps, dates,
decimals), is a :class:`~streamrec.errors.FormatError` naming the file, the rows and the
column.
"""

from __future__ import annotations

import asyncio
import importlib
import io
import os
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, Literal

import numpy as np

from streamrec._portal import owned_generator, run_all
from streamrec.errors import FormatError
from streamrec.format.example.arrow import pyarrow
from streamrec.format.example.encoding import encode
from streamrec.pipeline.options import ReadOptions
from streamrec.reshard.job import InputFormat, ReshardProgress, ReshardSummary, reshard
from streamrec.reshard.plan import TaskSpec
from streamrec.reshard.task import TaskOptions, TaskRecords
from streamrec.storage.base import ObjectInfo, ObjectStore
from streamrec.storage.registry import StoreSet
from streamrec.storage.retry import RetryPolicy

__all__ = ["PARQUET", "column_values", "from_parquet", "list_parquet", "parquet_records"]

BATCH_ROWS = 65_536
"""Rows read (and written as Examples) at a time."""


def _is_list(pa: Any, kind: Any) -> bool:
    types = pa.types
    return bool(types.is_list(kind) or types.is_large_list(kind) or types.is_fixed_size_list(kind))


def _leaf(pa: Any, column: Any) -> tuple[Any, Any]:
    """``(leaf values, bounds)``: row ``i``'s values are ``leaf[bounds[i]:bounds[i + 1]]``."""
    types = pa.types
    kind = column.type
    n = len(column)
    if _is_list(pa, kind):
        if types.is_fixed_size_list(kind):
            size = kind.list_size
            offsets = (column.offset + np.arange(n + 1, dtype=np.int64)) * size
        else:
            offsets = np.asarray(column.offsets, dtype=np.int64)
        leaf, child_bounds = _leaf(pa, column.values)
        return leaf, child_bounds[offsets]
    return column, np.arange(n + 1, dtype=np.int64)


def _leaf_values(pa: Any, leaf: Any, name: str) -> Any:
    """The leaf values as an int64 / float32 array or a list of bytes."""
    types = pa.types
    kind = leaf.type
    if leaf.null_count:
        raise ValueError(f"column {name!r} holds a null inside a list: no Example holds one")
    if types.is_integer(kind) or types.is_boolean(kind):
        return np.asarray(leaf.cast(pa.int64()), dtype=np.int64)
    if types.is_floating(kind):
        return np.asarray(leaf.cast(pa.float32()), dtype=np.float32)
    if types.is_binary(kind) or types.is_large_binary(kind) or types.is_fixed_size_binary(kind):
        return leaf.to_pylist()
    if types.is_string(kind) or types.is_large_string(kind):
        return [text.encode("utf-8") for text in leaf.to_pylist()]
    raise ValueError(
        f"column {name!r} has type {kind}: only numbers, bool, binary, string "
        "and lists of them become Example features"
    )


def column_values(column: Any, name: str) -> list[Any]:
    """One column of a RecordBatch as each row's feature value (None: null, no feature)."""
    pa = pyarrow()
    valid = (
        np.ones(len(column), dtype=bool)
        if column.null_count == 0
        else np.asarray(column.is_valid(), dtype=bool)
    )
    if column.null_count and not _is_list(pa, column.type):
        # nulls of a plain column: rows without the feature, no value among the others'
        leaf, bounds = column.drop_null(), np.concatenate([[0], np.cumsum(valid)])
    else:
        leaf, bounds = _leaf(pa, column)
    values = _leaf_values(pa, leaf, name)
    rows: list[Any] = []
    for i in range(len(column)):
        rows.append(values[bounds[i] : bounds[i + 1]] if valid[i] else None)
    return rows


def batch_payloads(batch: Any) -> list[bytes]:
    """Each row of a RecordBatch as a serialized Example."""
    names = batch.schema.names
    columns = [column_values(batch.column(i), name) for i, name in enumerate(names)]
    payloads = []
    for r in range(batch.num_rows):
        features = {
            name: column[r]
            for name, column in zip(names, columns, strict=True)
            if column[r] is not None
        }
        payloads.append(encode(features))
    return payloads


async def list_parquet(urls: Sequence[str], stores: StoreSet) -> list[ObjectInfo]:
    """The Parquet files ``urls`` name: files, globs, or directories (their ``*.parquet``)."""
    found: list[ObjectInfo] = []
    for url in urls:
        pattern = url
        if url.endswith("/") or ("://" not in url and os.path.isdir(url)):
            pattern = url.rstrip("/") + "/*.parquet"
        found += await stores.get(pattern).expand(pattern)
    return found


class _ParquetRecords:
    """A task's Parquet files as records: each file read whole, then a batch of rows at a time,
    each row an Example (:data:`PARQUET`'s ``records``)."""

    def __init__(self, spec: TaskSpec, options: TaskOptions) -> None:
        self.inputs = spec.inputs
        self.rows = spec.input_rows or tuple((0, -1) for _ in spec.inputs)  # -1: to the end
        self.storage_options = options.src_storage_options
        self._read = 0

    @property
    def bytes_read(self) -> int:
        return self._read

    @owned_generator  # (read and closed by the reshard task)
    async def record_chunks(self) -> AsyncGenerator[Sequence[bytes], None]:
        pq = importlib.import_module("pyarrow.parquet")
        async with StoreSet(self.storage_options) as stores:
            for info, (first, last) in zip(self.inputs, self.rows, strict=True):
                data = await stores.get(info.url).read_range(info, 0, info.size)
                if len(data) != info.size:
                    raise FormatError(f"read {len(data)} of {info.size} bytes", url=info.url)
                self._read += len(data)
                try:
                    parquet = pq.ParquetFile(io.BytesIO(data))
                except (ValueError, OSError) as exc:
                    raise FormatError(f"not a Parquet file: {exc}", url=info.url) from exc
                for row, batch in _batches(parquet, first, last):
                    try:
                        payloads = batch_payloads(batch)
                    except (ValueError, TypeError) as exc:
                        raise FormatError(
                            f"rows {row}..{row + batch.num_rows - 1}: {exc}", url=info.url
                        ) from exc
                    yield payloads


def _batches(parquet: Any, first: int, last: int) -> Iterator[tuple[int, Any]]:
    """``(its first row's number in the file, batch)`` for rows ``[first, last)`` of a
    ``pyarrow.parquet.ParquetFile`` (``last`` -1: to the end): only the row groups holding
    them are decoded, their batches cut to the range."""
    metadata = parquet.metadata
    stop = metadata.num_rows if last < 0 else last
    groups: list[int] = []
    row = skipped = 0
    for g in range(metadata.num_row_groups):
        rows = metadata.row_group(g).num_rows
        if row + rows <= first:
            skipped += rows
        elif row < stop:
            groups.append(g)
        row += rows
    if not groups or first >= stop:
        return
    row = skipped
    for batch in parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=groups):
        low, high = max(first, row), min(stop, row + batch.num_rows)
        if low < high:
            yield low, batch.slice(low - row, high - low)
        row += batch.num_rows
        if row >= stop:
            return


def parquet_records(spec: TaskSpec, options: TaskOptions) -> TaskRecords:
    """The rows of a reshard task's Parquet inputs as Examples."""
    pyarrow()  # an ImportError that says how to install it
    return _ParquetRecords(spec, options)


_FOOTER_READS_AT_ONCE = 16


async def _counted(store: ObjectStore, info: ObjectInfo) -> ObjectInfo:
    """``info`` with its row count (``records``) from the file's footer: two small reads."""
    pa = pyarrow()
    pq = importlib.import_module("pyarrow.parquet")
    end = await store.read_range(info, max(0, info.size - 8), info.size)
    length = int.from_bytes(end[:4], "little")
    if len(end) != 8 or end[4:] != b"PAR1" or length + 12 > info.size:
        raise FormatError("not a Parquet file: no Parquet footer at its end", url=info.url)
    footer = await store.read_range(info, info.size - 8 - length, info.size)
    try:
        rows = pq.read_metadata(pa.BufferReader(footer)).num_rows
    except (ValueError, OSError) as exc:
        raise FormatError(f"not a Parquet file: {exc}", url=info.url) from exc
    return replace(info, records=rows)


async def _list_inputs(
    urls: Sequence[str], storage_options: dict[str, Any] | None, retry: RetryPolicy | None
) -> list[ObjectInfo]:
    """The Parquet files, each with its row count: the plan then knows every task's shard
    count, and ``max_records`` rotation numbers the shards 0, 1, 2, ... across tasks (and a
    task whose rows differ from its footers' count fails before it writes a wrong name)."""
    pyarrow()  # before anything is listed
    gate = asyncio.Semaphore(_FOOTER_READS_AT_ONCE)
    async with StoreSet(storage_options) as stores:

        async def counted(info: ObjectInfo) -> ObjectInfo:
            async with gate:
                return await _counted(stores.get(info.url), info)

        return await run_all(counted(info) for info in await list_parquet(urls, stores))


PARQUET = InputFormat("parquet/1", _list_inputs, parquet_records, by_rows=True)
"""Parquet files as a reshard's input format: a row is an Example; a fixed ``num_shards`` is
planned by rows (shards of consecutive rows whose counts differ by one at most)."""


def from_parquet(
    urls: Sequence[str],
    template: str,
    options: ReadOptions,
    *,
    engine: Literal["local", "dask"] = "local",
    scheduler: Any = None,
    workers: int = 2,
    progress: bool | Callable[[ReshardProgress], None] = False,
    **reshard_options: Any,
) -> ReshardSummary:
    """Write every row of the Parquet files ``urls`` name as an Example in TFRecord shards
    named by ``template``: a :func:`streamrec.reshard.reshard` whose inputs are those files,
    planned, named, run (``engine``, ``scheduler``, ``workers``), resumed and committed as
    one (``reshard_options``: ``max_records``, ``max_bytes``, ``num_shards``, ``index``,
    ``compression``, ``task_bytes``, ``on_plan``...; no ``shuffle``).
    ``options``: the storage options and retry policy of both sides.
    """
    return reshard(
        list(urls),
        template,
        engine=engine,
        scheduler=scheduler,
        workers=workers,
        progress=progress,
        src_storage_options=options.storage_options,
        dst_storage_options=options.storage_options,
        retry=options.retry,
        input_format=PARQUET,
        **reshard_options,
    )
