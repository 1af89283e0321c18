"""Running one reshard task: read its input shards, write its output shards, then its manifest.

Runs wherever the engine puts it (the driver's event loop for the local engine, a Dask worker
for the Dask engine). Records are read with :func:`streamrec.open_dataset` (both CRCs of every
record verified; payloads handed on as they are, never decoded), or from other inputs by
:attr:`TaskOptions.records` (``streamrec convert --from parquet``), and written with
:func:`streamrec.open_writer` (atomic commits: S3 multipart, GCS resumable, local rename). The
task manifest is written only after every output shard is committed.

Fault-injection seam: :data:`after_shard_committed` (``None`` in production; the crash tests set
it in the process that runs the task, see tests/support/reshard_crash.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from streamrec._portal import owned, run_all, settle_all
from streamrec.errors import FormatError
from streamrec.manifest.core import ManifestEntry
from streamrec.pipeline.dataset import open_dataset
from streamrec.reshard.plan import TaskSpec
from streamrec.reshard.state import write_manifest
from streamrec.storage.retry import RetryPolicy
from streamrec.write.writer import ShardWriter, open_writer

__all__ = ["TaskOptions", "TaskRecords", "TaskResult", "run_task", "run_task_blocking"]

ProgressFn = Callable[[int, int], None]  # (records, bytes read) since the last call

#: A seam for tests (fault injection), ``None`` in production: nothing in streamrec sets it and
#: no setting reaches it. When set, a task calls it in its own process as ``hook(spec, committed)``
#: after every chunk it has written and once more after its writers have closed (just before its
#: task manifest), ``committed`` being how many output shards the task has committed so far. The
#: crash tests install one that kills the process at a chosen point.
after_shard_committed: Callable[[TaskSpec, int], None] | None = None


class TaskRecords(Protocol):
    """A task's input records, read in order (see :attr:`TaskOptions.records`)."""

    def record_chunks(self) -> AsyncGenerator[Sequence[bytes], None]:
        """The records, a chunk at a time."""
        ...

    @property
    def bytes_read(self) -> int:
        """Input bytes read so far (as stored)."""
        ...


@dataclass(frozen=True)
class TaskOptions:
    """What every task of a job shares (picklable: it travels to Dask workers)."""

    template: str
    compression: str | None
    max_records: int | None = None
    max_bytes: int | None = None
    shuffle_buffer: int = 0
    # (credentials: never in the repr, which Dask shows)
    src_storage_options: dict[str, Any] | None = field(default=None, repr=False)
    dst_storage_options: dict[str, Any] | None = field(default=None, repr=False)
    prefetch_bytes: int = 64 << 20
    part_bytes: int = 16 << 20
    index: bool = False
    retry: RetryPolicy | None = None
    records: Callable[[TaskSpec, TaskOptions], TaskRecords] | None = None
    """Where a task's records come from: ``None``, its TFRecord input shards (every CRC
    checked); else a module-level function (it travels to Dask workers by name) that opens
    the task's inputs as records (``streamrec convert --from parquet``: Parquet rows)."""


class _ShardRecords:
    """The records of a task's TFRecord input shards, through ``open_dataset``."""

    def __init__(self, spec: TaskSpec, options: TaskOptions) -> None:
        self.dataset = open_dataset(
            [obj.url for obj in spec.inputs],
            compression="auto",
            storage_options=options.src_storage_options,
            cycle_length=spec.cycle_length,
            shuffle_buffer=options.shuffle_buffer if spec.seed is not None else 0,
            seed=spec.seed or 0,
            prefetch_bytes=options.prefetch_bytes,
            retry=options.retry,
        )

    def record_chunks(self) -> AsyncGenerator[Sequence[bytes], None]:
        return self.dataset.record_chunks()

    @property
    def bytes_read(self) -> int:
        return self.dataset.stats.bytes_read


@dataclass(frozen=True)
class TaskResult:
    """What a task wrote (its shards, indexes local to the task) and what it read."""

    index: int
    entries: list[ManifestEntry] = field(default_factory=list)
    records: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    skipped: bool = False


def _escape(url: str) -> str:
    return url.replace("{", "{{").replace("}", "}}")


async def run_task(
    spec: TaskSpec, options: TaskOptions, on_progress: ProgressFn | None = None
) -> TaskResult:
    """Run one task to its end: every output shard committed, then the task manifest."""
    started = time.monotonic()
    source: TaskRecords = (
        _ShardRecords(spec, options) if options.records is None else options.records(spec, options)
    )
    common: dict[str, Any] = {
        "compression": options.compression,
        "manifest": None,
        "storage_options": options.dst_storage_options,
        "part_bytes": options.part_bytes,
        "index": options.index,
        "retry": options.retry,
    }
    if spec.outputs:
        writers = [open_writer(_escape(url), **common) for url in spec.outputs]
    else:
        assert spec.writer_template is not None
        writers = [
            open_writer(
                spec.writer_template,
                max_records=options.max_records,
                max_bytes=options.max_bytes,
                first_index=spec.first_index,
                **common,
            )
        ]
    records = 0
    reported = 0
    try:
        async with aclosing(owned(source.record_chunks())) as chunks:
            async for chunk in chunks:
                _check_count(spec, records + len(chunk), final=False)
                if spec.output_records:
                    await _fill(writers, spec.output_records, chunk, records)
                else:
                    await _deal(writers, chunk, records)
                records += len(chunk)
                if on_progress is not None:
                    read = source.bytes_read
                    on_progress(len(chunk), read - reported)
                    reported = read
                if after_shard_committed is not None:
                    after_shard_committed(spec, sum(len(w.shards) for w in writers))
        _check_count(spec, records, final=True)
        await run_all(w.close() for w in writers)
    except BaseException:
        await settle_all(w.abort() for w in writers)  # every one, whatever the others do
        raise
    if on_progress is not None and source.bytes_read > reported:
        on_progress(0, source.bytes_read - reported)
    shards = [entry for w in writers for entry in w.shards]
    if after_shard_committed is not None:
        after_shard_committed(spec, len(shards))
    entries = [replace(e, index=j) for j, e in enumerate(shards)]
    await write_manifest(
        spec.scratch_url,
        entries,
        compression=options.compression,
        template=spec.writer_template or options.template,
        storage_options=options.dst_storage_options,
        scratch=True,
        retry=options.retry,
    )
    return TaskResult(
        spec.index,
        entries,
        records=records,
        bytes_read=source.bytes_read,
        seconds=time.monotonic() - started,
    )


async def _deal(writers: list[ShardWriter], chunk: Sequence[bytes], position: int) -> None:
    """Append ``chunk`` (whose first record is the task's record ``position``): to the one
    writer, or record i to writer i mod n."""
    n = len(writers)
    if n == 1:
        await writers[0].write_many(chunk)
        return
    for j, writer in enumerate(writers):
        part = chunk[(j - position) % n :: n]
        if part:
            await writer.write_many(part)


async def _fill(
    writers: list[ShardWriter], sizes: Sequence[int], chunk: Sequence[bytes], position: int
) -> None:
    """Append ``chunk`` (whose first record is the task's record ``position``) to the writers
    in turn, writer j taking ``sizes[j]`` records (a plan by rows); a writer is closed (its
    shard committed) once full, so one output at a time holds unsent bytes."""
    start = 0
    i = 0
    for writer, size in zip(writers, sizes, strict=True):
        end = start + size
        if position + i < end and i < len(chunk):
            take = min(len(chunk) - i, end - (position + i))
            await writer.write_many(chunk[i : i + take])
            i += take
            if position + i == end:
                await writer.close()
        start = end
    assert i == len(chunk), "more records than planned (_check_count stops them first)"


def run_task_blocking(spec: TaskSpec, options: TaskOptions) -> TaskResult:
    """:func:`run_task` in a fresh event loop (what a Dask worker runs)."""
    return asyncio.run(run_task(spec, options))


def _check_count(spec: TaskSpec, records: int, *, final: bool) -> None:
    """A task numbered from counts in the input manifests must hold exactly that many records:
    more would give a shard the number of the next task's first one (checked before a record
    past the count is written)."""
    expected = spec.expected_records
    if expected is None or not (records > expected or (final and records != expected)):
        return
    held = f"{records}" if final else f"at least {records}"
    raise FormatError(
        f"reshard task {spec.index}: its {len(spec.inputs)} input shard(s) hold {held} records, "
        f"but their manifests say {expected}; the output shards are numbered by those counts",
        url=spec.inputs[0].url,
    )
