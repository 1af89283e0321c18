"""TFRecord Examples -> Parquet files, store to store, resumable (``streamrec convert``).

The input shards (listed as ``open_dataset`` lists them) are cut into tasks of consecutive
shards, about ``task_bytes`` of input each (:func:`streamrec.reshard.plan.group_by_bytes`,
reshard's planner). Task ``t`` writes ``part-<t:05d>-<f:05d>.parquet`` in the destination
directory, a new file every ``rows_per_file`` rows, a row group every ``row_group_rows``;
records become rows through ``decode_batch(..., to="arrow")`` with the job's spec (with a
``sequence`` spec, ``SequenceExample`` records through ``decode_sequence_batch``: the spec's
context columns, then a list of steps per feature list). Each file
is written to a local temporary file by pyarrow, then stored through the destination store's
sink (a rename for local paths, one PUT or a multipart upload for S3): a file appears only when
complete.

Resume: the job is named by a fingerprint of its inputs (url, size, version), spec and
settings (:func:`streamrec.reshard.plan.fingerprint_of`); once all of a task's files are
stored, ``_convert/<fingerprint>/task-<t>.json`` records them. A rerun of the same job skips
the tasks that have one and redoes the others, whose files get the same names and contents
(written over, never beside them): no duplicates, nothing complete rewritten.

Engines: ``"local"`` runs ``jobs`` tasks at a time in this process; ``"dask"`` runs one Dask
task per pending task (:func:`streamrec.reshard.dask.run_on_dask`, as ``reshard`` does), each
storing its files and then its state on a worker, exactly as the local engine does: the same
files, byte for byte, under the same names. A task whose worker dies is run again by Dask and
writes the same files over the ones it had stored.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Literal

from streamrec._portal import EventLoopThread, run_all
from streamrec.errors import ExampleError, ObjectNotFoundError, StateError
from streamrec.format.example.arrow import arrow_schema
from streamrec.format.example.batch import decode_batch
from streamrec.format.example.decoding import decode
from streamrec.format.example.infer import spec_to_json
from streamrec.format.example.sequence import decode_sequence_batch, sequence_schema
from streamrec.format.example.spec import FeatureSpec
from streamrec.format.framing import FOOTER_BYTES, HEADER_BYTES
from streamrec.pipeline.options import ReadOptions
from streamrec.pipeline.stream.scan import ShardScan
from streamrec.reshard.plan import fingerprint_of, group_by_bytes
from streamrec.storage.base import ObjectInfo, ObjectStore
from streamrec.storage.registry import StoreSet

__all__ = ["ParquetSummary", "to_parquet"]

STATE_DIR = "_convert"
DEFAULT_ROWS_PER_FILE = 1_000_000
DEFAULT_ROW_GROUP_ROWS = 65_536
DEFAULT_TASK_BYTES = 256 << 20
_COPY_BYTES = 8 << 20


@dataclass
class ParquetSummary:
    """What a conversion did."""

    fingerprint: str
    files: list[dict[str, Any]] = field(default_factory=list)
    """Every output file of the job, by name: ``{"url", "rows", "bytes"}``."""
    tasks: int = 0
    tasks_skipped: int = 0
    """Tasks a previous run had completed (their files were not written again)."""

    @property
    def rows(self) -> int:
        """Rows in all output files."""
        return sum(int(f["rows"]) for f in self.files)


def _join(directory: str, name: str) -> str:
    return f"{directory.rstrip('/')}/{name}"


async def _read_all(store: ObjectStore, url: str) -> bytes | None:
    """The whole object at ``url``, or None when there is none."""
    try:
        [obj] = await store.expand(url)
    except ObjectNotFoundError:
        return None
    return await store.read_range(obj, 0, obj.size)


async def _store_file(store: ObjectStore, path: str, url: str) -> int:
    """Copy the local file ``path`` to ``url`` through the store's sink; its size."""
    sink = store.open_sink(url)
    try:
        with open(path, "rb") as source:  # a local temp file; its reads run in a thread
            while block := await asyncio.to_thread(source.read, _COPY_BYTES):
                await sink.write(block)
        committed = await sink.commit()
    except BaseException:
        await sink.abort()
        raise
    return committed.bytes


@dataclass(frozen=True)
class _Task:
    index: int
    inputs: tuple[ObjectInfo, ...]


@dataclass(frozen=True)
class _Job:
    """What every task of a job shares (picklable: it travels to Dask workers)."""

    destination: str
    spec: dict[str, FeatureSpec]
    rows_per_file: int
    row_group_rows: int
    state_dir: str
    options: ReadOptions  # (its storage options stay out of its repr, which Dask shows)
    sequence: dict[str, FeatureSpec] | None = None  # SequenceExamples: the feature lists

    def decode(self, payloads: Sequence[bytes]) -> Any:
        """``payloads`` as one ``pyarrow.RecordBatch`` of the job's columns."""
        if self.sequence is not None:
            return decode_sequence_batch(payloads, self.spec, self.sequence)
        return decode_batch(payloads, self.spec, to="arrow")

    def schema(self) -> Any:
        """The ``pyarrow.Schema`` of every batch :meth:`decode` makes."""
        if self.sequence is not None:
            return sequence_schema(self.spec, self.sequence)
        return arrow_schema(self.spec)


@dataclass(frozen=True)
class _TaskResult:
    """What a task run on a Dask worker wrote and read."""

    index: int
    files: list[dict[str, Any]]
    rows: int
    bytes_read: int


#: A seam for tests (fault injection), ``None`` in production: nothing in streamrec sets it.
#: When set, a task calls it in its own process as ``hook(task index, files stored)`` after it
#: has stored each Parquet file (before its state): the crash tests end a worker there.
after_file_stored: Callable[[int, int], None] | None = None


class _TaskRun:
    """One task: its shards' records, as rows of Parquet files of ``rows_per_file`` rows."""

    def __init__(
        self,
        job: _Job,
        task: _Task,
        scan: ShardScan,
        tmp_dir: str,
        on_bytes: Callable[[int], None],
        on_rows: Callable[[int], None],
    ) -> None:
        self.job, self.task, self.scan = job, task, scan
        self.store = scan.stores.get(job.destination)
        self.schema = job.schema()
        self.on_bytes, self.on_rows = on_bytes, on_rows
        self.tmp_path = os.path.join(tmp_dir, f"task-{task.index:05d}.parquet")
        self.files: list[dict[str, Any]] = []
        self.writer: Any = None
        self.rows_in_file = 0
        self.batch: list[bytes] = []
        self.where: list[tuple[str, int, int]] = []  # (url, index, offset) of each record

    async def run(self) -> list[dict[str, Any]]:
        """Write the task's files, then its state; the files."""
        job = self.job
        for shard in self.task.inputs:
            read = self.scan.shard(shard, on_bytes=self.on_bytes)
            index = offset = 0
            async with aclosing(read.chunks()) as chunks:
                async for chunk in chunks:
                    for payload in chunk:
                        self.batch.append(payload)
                        self.where.append((shard.url, index, offset))
                        index += 1
                        offset += HEADER_BYTES + len(payload) + FOOTER_BYTES
                        room = job.rows_per_file - self.rows_in_file
                        if len(self.batch) >= min(job.row_group_rows, room):
                            await self._flush()
        if self.batch:
            await self._flush()
        if self.writer is not None:
            await self._finish_file()
        # only now, every file stored: a rerun skips the task
        number = self.task.index
        document = {"format": TASK_STATE_FORMAT, "version": 1, "task": number}
        state = json.dumps({**document, "files": self.files}).encode()
        await _put(self.store, _join(job.state_dir, f"task-{number:05d}.json"), state)
        return self.files

    def _decoded(self) -> Any:
        try:
            return self.job.decode(self.batch)
        except ExampleError:
            for payload, (url, index, offset) in zip(self.batch, self.where, strict=True):
                try:
                    if self.job.sequence is None:
                        decode(payload, self.job.spec)
                    else:
                        self.job.decode([payload])
                except ExampleError as exc:
                    raise ExampleError(
                        f"record {index} in {url} at byte offset {offset}: {exc} (the spec "
                        "does not fit it: sample more records, or give a spec)"
                    ) from exc
            raise

    async def _flush(self) -> None:
        batch = self._decoded()
        if self.writer is None:
            pq = importlib.import_module("pyarrow.parquet")
            self.writer = pq.ParquetWriter(self.tmp_path, self.schema)
        self.writer.write_batch(batch, row_group_size=self.job.row_group_rows)
        self.rows_in_file += len(self.batch)
        self.on_rows(len(self.batch))
        self.batch, self.where = [], []
        if self.rows_in_file >= self.job.rows_per_file:
            await self._finish_file()

    async def _finish_file(self) -> None:
        self.writer.close()
        self.writer = None
        name = f"part-{self.task.index:05d}-{len(self.files):05d}.parquet"
        url = _join(self.job.destination, name)
        size = await _store_file(self.store, self.tmp_path, url)
        os.remove(self.tmp_path)
        self.files.append({"url": url, "rows": self.rows_in_file, "bytes": size})
        self.rows_in_file = 0
        if after_file_stored is not None:
            after_file_stored(self.task.index, len(self.files))


def run_task_blocking(task: _Task, job: _Job) -> _TaskResult:
    """One task in a fresh event loop, with its own stores (what a Dask worker runs)."""
    return asyncio.run(_run_alone(task, job))


async def _run_alone(task: _Task, job: _Job) -> _TaskResult:
    read = [0, 0]  # bytes, rows

    def count(n: int, what: int) -> None:
        read[what] += n

    async with ShardScan(job.options) as scan:
        with tempfile.TemporaryDirectory(prefix="streamrec-convert-") as tmp_dir:
            run = _TaskRun(job, task, scan, tmp_dir, lambda n: count(n, 0), lambda n: count(n, 1))
            files = await run.run()
    return _TaskResult(task.index, files, rows=read[1], bytes_read=read[0])


def to_parquet(
    shards: Sequence[ObjectInfo],
    destination: str,
    spec: Mapping[str, FeatureSpec],
    options: ReadOptions,
    *,
    rows_per_file: int = DEFAULT_ROWS_PER_FILE,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    task_bytes: int = DEFAULT_TASK_BYTES,
    jobs: int = 4,
    engine: Literal["local", "dask"] = "local",
    scheduler: Any = None,
    workers: int = 2,
    on_bytes: Callable[[int], None] | None = None,
    on_rows: Callable[[int], None] | None = None,
    on_plan: Callable[[int, int], None] | None = None,
    sequence: Mapping[str, FeatureSpec] | None = None,
) -> ParquetSummary:
    """Write the Examples of ``shards`` (listed as ``ShardScan.list_shards`` lists them) as
    Parquet files in the directory ``destination``.

    ``engine="local"``: ``jobs`` tasks at a time in this process. ``engine="dask"``: one Dask
    task per pending task (:func:`streamrec.reshard.dask.run_on_dask`, as ``reshard`` does):
    ``scheduler`` is a scheduler address, a ``dask.distributed.Client``, or ``None`` for a
    LocalCluster of ``workers`` processes on 127.0.0.1. Each task stores its files and then its
    state, wherever it runs: both engines write the same files under the same names, and a
    rerun of either skips the tasks either finished.

    ``on_plan(tasks to run, their input bytes)`` is called once before any is run; ``on_bytes``
    with the bytes read and ``on_rows`` with the rows written: with each block and batch
    (local; from the thread the job's I/O runs in), with each finished task (dask).
    Blocking: the job's I/O runs in an event loop thread of its own (as ``reshard``'s), the
    Dask engine's waiting in the caller's thread (a KeyboardInterrupt cancels the Dask tasks).

    ``sequence``: the records are ``SequenceExample`` protos, ``spec`` their context's features
    and ``sequence`` their feature lists', each a column of steps (as
    :func:`~streamrec.format.example.sequence.decode_sequence_batch` makes it).
    """
    if not spec and not sequence:
        raise ValueError("the spec has no feature: there is no column to write")
    if rows_per_file < 1 or row_group_rows < 1 or task_bytes < 1 or jobs < 1 or workers < 1:
        raise ValueError("rows_per_file, row_group_rows, task_bytes, jobs and workers must be >= 1")
    if engine not in ("local", "dask"):
        raise ValueError(f"engine must be 'local' or 'dask', not {engine!r}")
    if engine == "local" and scheduler is not None:
        raise ValueError('scheduler= is only used with engine="dask"')
    job_sequence = None if sequence is None else dict(sequence)
    settings = {
        "convert": "parquet/1",
        "destination": destination,
        "spec": spec_to_json(spec),
        "rows_per_file": rows_per_file,
        "row_group_rows": row_group_rows,
        "task_bytes": task_bytes,
    }
    if job_sequence is not None:  # (Example jobs keep the fingerprints they had)
        settings["sequence"] = spec_to_json(job_sequence)
    fingerprint = fingerprint_of(shards, settings)
    groups = group_by_bytes([shard.size for shard in shards], task_bytes)
    tasks = [_Task(t, tuple(shards[i] for i in group)) for t, group in enumerate(groups)]
    summary = ParquetSummary(fingerprint, tasks=len(tasks))
    state_dir = _join(destination, f"{STATE_DIR}/{fingerprint}")
    job = _Job(
        destination, dict(spec), rows_per_file, row_group_rows, state_dir, options, job_sequence
    )
    job.schema()  # a spec with no Arrow column type (or a name in both) fails before any work
    bytes_seen = on_bytes or (lambda _: None)
    rows_seen = on_rows or (lambda _: None)
    portal = EventLoopThread(name="streamrec-convert")
    try:
        done = portal.call(_done_tasks(job, tasks))
        pending = [task for task in tasks if task.index not in done]
        summary.tasks_skipped = len(done)
        if on_plan is not None:
            on_plan(len(pending), sum(s.size for t in pending for s in t.inputs))
        if engine == "dask":
            from streamrec.reshard.dask import run_on_dask

            def finished(result: _TaskResult) -> None:
                bytes_seen(result.bytes_read)
                rows_seen(result.rows)

            results = run_on_dask(
                pending,
                job,
                run=run_task_blocking,
                name="convert",
                scheduler=scheduler,
                workers=workers,
                on_done=finished,
            )
            done.update({result.index: result.files for result in results})
        else:
            done.update(portal.call(_run_here(job, pending, jobs, bytes_seen, rows_seen)))
    finally:
        portal.close()
    summary.files = [f for number in sorted(done) for f in done[number]]
    return summary


async def _done_tasks(job: _Job, tasks: Sequence[_Task]) -> dict[int, list[dict[str, Any]]]:
    """The files of the tasks an earlier run finished, by task."""
    done: dict[int, list[dict[str, Any]]] = {}
    async with StoreSet(job.options.storage_options) as stores:
        store = stores.get(job.destination)
        for task in tasks:  # (a job has few tasks: task_bytes of input each)
            state = await _read_all(store, _join(job.state_dir, f"task-{task.index:05d}.json"))
            if state is not None:
                done[task.index] = _task_files(state, job.state_dir, task.index)
    return done


async def _run_here(
    job: _Job,
    tasks: Sequence[_Task],
    jobs: int,
    on_bytes: Callable[[int], None],
    on_rows: Callable[[int], None],
) -> dict[int, list[dict[str, Any]]]:
    """The local engine: ``jobs`` of ``tasks`` at a time; their files by task."""
    done: dict[int, list[dict[str, Any]]] = {}
    gate = asyncio.Semaphore(jobs)
    async with ShardScan(job.options) as scan:
        with tempfile.TemporaryDirectory(prefix="streamrec-convert-") as tmp_dir:

            async def one(task: _Task) -> None:
                async with gate:
                    run = _TaskRun(job, task, scan, tmp_dir, on_bytes, on_rows)
                    done[task.index] = await run.run()

            await run_all(one(task) for task in tasks)
    return done


TASK_STATE_FORMAT = "streamrec-convert-task"
"""The literal marking a conversion task's state (``task-NNNNN.json``), version 1."""


def _task_files(state: bytes, state_dir: str, number: int) -> list[dict[str, Any]]:
    """The files a task's state lists; a StateError (a ValueError) naming it when it is not
    one, or of another version."""
    where = f"{state_dir}/task-{number:05d}.json"
    try:
        document = json.loads(state)
        files = document["files"]
        if document["format"] != TASK_STATE_FORMAT or document["version"] != 1:
            raise ValueError(f"format {document['format']!r} version {document['version']!r}")
        if document["task"] != number or not isinstance(files, list):
            raise ValueError("not this task's state")
        for entry in files:
            if not (isinstance(entry["url"], str) and isinstance(entry["rows"], int)):
                raise ValueError(f"a bad file entry {entry!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise StateError(f"{where}: not a conversion task's state ({exc}); remove it") from exc
    return list(files)


async def _put(store: ObjectStore, url: str, data: bytes) -> None:
    sink = store.open_sink(url)
    try:
        await sink.write(data)
        await sink.commit()
    except BaseException:
        await sink.abort()
        raise
