"""Resharding: rewrite a set of TFRecord shards as another set, store to store, resumably.

::

    from streamrec.reshard.job import reshard

    summary = reshard(
        "gs://src/train-*.tfrecord", "s3://dst/train/part-{index:05d}.tfrecord",
        max_bytes=256 << 20, compression="gzip")
    print(summary.records, summary.mb_per_s, summary.manifest_url)

Records stream from the sources (any store) straight to the destination (any store): no local
staging. Every record's two CRCs are verified on the way in (``open_dataset``); payloads are
passed through as bytes, never decoded; output shards are written by the shard writer (S3
multipart / GCS resumable uploads while writing, atomic local files), so an output shard exists
complete or not at all. ``_manifest.json`` (the writer's manifest format) is written last.

The plan (deterministic)
------------------------
The sources are listed and sorted by url (``shuffle=True``: then permuted with ``seed``). The
sorted listing (url, size, version) and every argument that changes the output give the job's
*fingerprint*. The inputs are cut into *tasks*, each reading whole input shards:

* **Rotation** (``max_records`` / ``max_bytes``): consecutive input shards are grouped into
  tasks of at least ``task_bytes`` input bytes (default: 256 MiB or 4 x ``max_bytes``). Each
  task runs the writer's exact rotation over its records, so each task's last shard may be
  short. Output shard *j* of task *t* is named by the template with ``{index}`` written as
  ``<t>-<j>`` in the field's format (``part-{index:05d}`` -> ``part-00003-00001``), or, when the
  template has a ``{task}`` field, with ``{task}`` = *t* and ``{index}`` = *j*. A job of one
  task (input smaller than ``task_bytes``) names its shards with the global ``{index}``
  (``part-00000``, ``part-00001``, ...). The manifest numbers the shards 0, 1, 2, ... in (task,
  j) order.
* **Fixed** (``num_shards=N``; no limit at all means ``N=1``): names are the template with the
  global ``{index}`` and ``{num_shards}``, known before anything is written. With at least *N*
  inputs, the inputs are cut into *N* consecutive groups balanced by bytes and each output shard
  is one group's records in order (one task each). With fewer inputs, input *i* gets
  ``k_i >= 1`` output shards in proportion to its size and deals its records round-robin over
  them (one task per input). An :class:`InputFormat` with ``by_rows`` (Parquet: row counts
  from the footers) is cut by rows instead: *N* shards of consecutive rows whose counts differ
  by one at most, one task per input that holds shards' first rows, reading only its rows.

With ``shuffle=True``, a task reads its inputs interleaved (up to 16 at once) through a record
shuffle buffer of ``shuffle_buffer`` records seeded by (``seed``, task): still deterministic.

Resuming
--------
A task writes its output shards (deterministic names, deterministic bytes), and only once all of
them are committed, its *task manifest*: ``<output dir>/_reshard/<fingerprint>/task-NNNNN.json``.
A run first looks for the job's task manifests; a task whose manifest is valid (it lists exactly
the names the plan gives the task, and every listed shard exists at its listed size) is skipped.
Every other task runs (again). The driver writes ``_manifest.json`` last, listing every shard,
then removes the task manifests. So after an interruption at any point (even SIGKILL), a rerun
with the same arguments redoes only unfinished tasks and ends with exactly the output of an
uninterrupted run:

* half-written objects do not exist (the writer commits atomically; uncommitted multipart
  uploads and resumable sessions are never completed);
* a task that died after committing some shards, before its manifest, writes the same objects
  under the same names again: an overwrite with identical bytes, no duplicate;
* a retried or repeated Dask task does the same; the final manifest comes from the task results,
  one per task;
* different arguments or changed inputs give another fingerprint, so nothing is reused by
  mistake. (Local files carry no version: an input rewritten at the same size is not noticed.)

With ``index=True`` (``--index``) every output shard gets its record index sidecar
(``<shard>.idx``, committed right after the shard; :mod:`streamrec.write.writer`), listed in
the task manifests and the final manifest. ``index`` is part of the fingerprint, so a run
without it is never resumed by one with it (or the other way round); a task counts as done
only when every shard *and* its sidecar is there at its listed size, so a run killed between a
shard and its index redoes that task; the leftovers aborted at the start include the
sidecars' (a local sidecar's temporary file, an S3 upload).

The manifest is written last, so its presence marks a complete output. A run starts by removing
a ``_manifest.json`` already in the output directory (with a warning in the log): the shards it
lists are about to be rewritten, and no reader may follow it to them meanwhile. A finished job
that is run again does the work again (its task manifests are gone) and writes the same output.
Objects of an earlier job with *other* arguments in the same directory are not removed; the
manifest lists only this job's shards.

Engines
-------
``engine="local"``: tasks run one after another in this process (reads, CRC checks, compression
and uploads of a task overlap). ``engine="dask"``: one Dask task per pending reshard task on a
``dask.distributed`` cluster (``scheduler``: an address, a ``Client``, or ``None`` for a
LocalCluster of ``workers`` processes on loopback); each writes its shards and task manifest and
returns its entries; the driver writes the final manifest. Both engines write the same objects
for the same arguments.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from streamrec._portal import EventLoopThread
from streamrec.errors import ArgumentError, StorageError
from streamrec.format.codecs import normalize_compression
from streamrec.manifest.core import ManifestEntry
from streamrec.pipeline.arguments import PathOrUrls, check_url, check_urls
from streamrec.pipeline.dataset import open_dataset
from streamrec.reshard.plan import DEFAULT_SHUFFLE_BUFFER, Naming, Plan, TaskSpec, make_plan
from streamrec.reshard.state import (
    abort_unfinished_writes,
    delete_objects,
    load_done_tasks,
    remove_manifest,
    same_url,
    write_dataset_index,
    write_manifest,
)
from streamrec.reshard.task import (
    TaskOptions,
    TaskRecords,
    TaskResult,
    run_task,
    run_task_blocking,
)
from streamrec.storage.base import ObjectInfo
from streamrec.storage.registry import store_key
from streamrec.storage.retry import RetryPolicy

__all__ = ["InputFormat", "ReshardProgress", "ReshardSummary", "reshard"]

Engine = Literal["local", "dask"]


@dataclass(frozen=True)
class InputFormat:
    """Inputs other than TFRecord shards, read as records (``streamrec convert --from parquet``
    gives Parquet files, a row an Example): planned, run, resumed and committed as a reshard."""

    name: str
    """The format, part of the job's identity (``"parquet/1"``)."""
    list_inputs: Callable[
        [Sequence[str], dict[str, Any] | None, RetryPolicy | None], Awaitable[list[ObjectInfo]]
    ]
    """``(sources, storage options, retry)`` -> the input objects."""
    records: Callable[[TaskSpec, TaskOptions], TaskRecords]
    """A task's inputs as records (:attr:`~streamrec.reshard.task.TaskOptions.records`)."""
    by_rows: bool = False
    """``list_inputs`` gives each input's row count and ``records`` reads a task's
    :attr:`~streamrec.reshard.plan.TaskSpec.input_rows`: a fixed ``num_shards`` is then
    planned by rows (record counts differing by one at most), not by whole inputs."""


@dataclass(frozen=True)
class ReshardProgress:
    """Where a running reshard is (handed to a ``progress=`` callable)."""

    bytes_read: int
    """Input bytes read so far by this run (as stored)."""
    bytes_total: int
    """Input bytes this run has to read (tasks finished by an earlier run excluded)."""
    records: int
    """Records copied so far by this run."""
    tasks_done: int
    """Tasks finished by this run."""
    tasks_total: int
    """Tasks this run has to do."""


@dataclass(frozen=True)
class ReshardSummary:
    """What a reshard produced, and how fast."""

    records: int
    """Records in the output (every shard, done by this run or an earlier one)."""
    bytes_in: int
    """Size of the input shards as stored."""
    bytes_out: int
    """Size of the output shards as stored."""
    seconds: float
    """Wall time of this run, listing and manifest included."""
    shards: list[str] = field(default_factory=list)
    """Output shard urls, by index."""
    manifest_url: str = ""
    """Where the manifest is."""
    tasks: int = 0
    """Tasks in the plan."""
    tasks_skipped: int = 0
    """Tasks an earlier run had finished (not redone)."""
    bytes_read: int = 0
    """Input bytes this run read."""
    engine: str = "local"

    @property
    def mb_per_s(self) -> float:
        """Input read by this run per second, in MB (10**6 bytes)."""
        return self.bytes_read / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict (``mb_per_s`` included)."""
        document = asdict(self)
        document["mb_per_s"] = round(self.mb_per_s, 3)
        return document


ProgressArg = bool | Callable[[ReshardProgress], None]


class _Reporter:
    """Counts progress; shows tqdm on stderr (when a terminal) and/or calls the callback."""

    def __init__(self, progress: ProgressArg, bytes_total: int, tasks_total: int) -> None:
        self.bytes_read = 0
        self.records = 0
        self.tasks_done = 0
        self.bytes_total = bytes_total
        self.tasks_total = tasks_total
        self.callback = progress if callable(progress) else None
        self.bar: Any = None
        if progress is True and sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:  # pragma: no cover - tqdm is optional here
                return
            self.bar = tqdm(
                total=bytes_total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc="reshard",
                file=sys.stderr,
                leave=False,
                dynamic_ncols=True,
            )

    def _report(self, nbytes: int) -> None:
        if self.bar is not None and nbytes:
            self.bar.update(nbytes)
        if self.callback is not None:
            self.callback(
                ReshardProgress(
                    self.bytes_read,
                    self.bytes_total,
                    self.records,
                    self.tasks_done,
                    self.tasks_total,
                )
            )

    def chunk(self, records: int, nbytes: int) -> None:
        """Local engine: a chunk of records was copied."""
        self.records += records
        self.bytes_read += nbytes
        self._report(nbytes)

    def task(self, result: TaskResult, counted: bool) -> None:
        """A task finished (``counted``: its records and bytes were reported chunk by chunk)."""
        self.tasks_done += 1
        nbytes = 0
        if not counted:
            self.records += result.records
            nbytes = result.bytes_read
            self.bytes_read += nbytes
        self._report(nbytes)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


async def _list_inputs(
    sources: Sequence[str], storage_options: dict[str, Any] | None, retry: RetryPolicy | None
) -> list[ObjectInfo]:
    return await open_dataset(sources, storage_options=storage_options, retry=retry).shards()


def _check_overlap(plan: Plan) -> None:
    """Refuse sources that this job's outputs, manifest or scratch could overwrite."""
    manifest = same_url(plan.manifest_url)
    scratch = same_url(plan.naming.beside("_reshard/"))
    outputs = Naming(same_url(plan.naming.text), plan.naming.mode, plan.naming.num_shards)
    for obj in plan.inputs:
        url = same_url(obj.url)
        if url == manifest or url.startswith(scratch) or outputs.matches_output(url):
            raise ValueError(
                f"{obj.url}: the sources include what {plan.naming.text} would write; choose "
                "a destination the sources do not match"
            )


def reshard(
    sources: PathOrUrls,
    dst_template: str | os.PathLike[str],
    *,
    max_bytes: int | None = None,
    max_records: int | None = None,
    num_shards: int | None = None,
    compression: str | None = None,
    shuffle: bool = False,
    seed: int = 0,
    engine: Engine = "local",
    scheduler: Any = None,
    src_storage_options: dict[str, Any] | None = None,
    dst_storage_options: dict[str, Any] | None = None,
    progress: ProgressArg = True,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    task_bytes: int | None = None,
    workers: int = 2,
    part_bytes: int = 16 << 20,
    on_plan: Callable[[Plan], None] | None = None,
    index: bool = False,
    retry: RetryPolicy | None = None,
    input_format: InputFormat | None = None,
) -> ReshardSummary:
    """Rewrite TFRecord shards as a new set of shards, from any store to any store; resumable.

    Args:
        sources: paths, globs or urls (``s3://``, ``gs://``, ``http(s)://``, ``memory://``,
            local); read with ``compression="auto"`` and every CRC verified.
        dst_template: the output shards' url with an ``{index}`` field (and ``{num_shards}``
            with ``num_shards``, or ``{task}`` with ``max_records`` / ``max_bytes``), e.g.
            ``"s3://b/out/part-{index:05d}.tfrecord"``; see the module docstring for the names.
            ``_manifest.json`` is written beside the shards, last.
        max_bytes: rotate output shards before they exceed this many bytes as stored.
        max_records: rotate output shards before they exceed this many records.
        num_shards: write exactly this many output shards (not with the two above). With none
            of the three, everything goes into one output shard.
        compression: of the output: ``None``, ``"gzip"`` or ``"zlib"``.
        shuffle: permute the inputs with ``seed`` and shuffle records within each task
            (interleaved inputs, a ``shuffle_buffer``-record buffer). Deterministic.
        seed: the shuffle's seed.
        engine: ``"local"`` (tasks in this process, one after another) or ``"dask"``.
        scheduler: Dask only: a scheduler address, a ``dask.distributed.Client``, or ``None``
            for a LocalCluster of ``workers`` processes on 127.0.0.1.
        src_storage_options: fsspec options for the sources (``client_kwargs``, ``token``...).
        dst_storage_options: fsspec options for the destination.
        progress: ``True``: a tqdm bar on stderr when stderr is a terminal; ``False``: none; a
            callable: called with a :class:`ReshardProgress` as work advances.
        shuffle_buffer: records held by each task's shuffle buffer (``shuffle=True`` only).
        task_bytes: rotation only: input bytes per task (parallelism and resume granularity
            against short last shards per task). Part of the job's identity.
        workers: Dask LocalCluster size when ``scheduler`` is None.
        part_bytes: upload part size (S3 multipart part, GCS resumable chunk).
        on_plan: called with the :class:`~streamrec.reshard.plan.Plan` before any task runs
            (its ``naming_rule`` says how the output shards will be named).
        index: write each output shard's record index sidecar ``<shard>.idx`` (see
            :mod:`streamrec.write.writer`), listed in the manifest. Part of the job's identity.
        retry: the :class:`~streamrec.storage.retry.RetryPolicy` of every storage request
            (listing, reading, writing; ``streamrec reshard --timeout`` sets its
            ``timeout_s``).
        input_format: the sources are not TFRecord shards but this format (no ``shuffle``).

    Returns:
        A :class:`ReshardSummary`.

    Raises:
        ValueError: bad arguments (naming them); the sources include the destination.
        streamrec.errors.FormatError: a damaged input record (the url, offset and record
            index are in the message); no manifest is written.
        streamrec.errors.StorageError: a source or the destination cannot be read or written.
    """
    started = time.monotonic()
    sources = check_urls(sources, "sources")
    dst_template = check_url(dst_template, "dst_template")
    codec = normalize_compression(compression)
    if codec == "auto":
        raise ValueError("compression of the output must be None, 'gzip' or 'zlib', not 'auto'")
    if engine not in ("local", "dask"):
        raise ValueError(f"engine must be 'local' or 'dask', not {engine!r}")
    if engine == "local" and scheduler is not None:
        raise ValueError('scheduler= is only used with engine="dask"')
    if store_key(dst_template) == "http":
        raise StorageError(f"{dst_template}: http(s) urls are read-only")
    if isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be a positive integer, not {workers!r}")
    if not isinstance(index, bool):
        raise ValueError(f"index must be True or False, not {index!r}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ArgumentError(f"retry must be a streamrec RetryPolicy or None, not {retry!r}")
    if input_format is not None and shuffle:
        raise ValueError(f"shuffle=True reads TFRecord inputs only, not {input_format.name}")
    list_inputs = _list_inputs if input_format is None else input_format.list_inputs
    portal = EventLoopThread(name="streamrec-reshard")
    try:
        inputs = portal.call(list_inputs(sources, src_storage_options, retry))
        plan = make_plan(
            inputs,
            dst_template,
            max_records=max_records,
            max_bytes=max_bytes,
            num_shards=num_shards,
            compression=codec,
            shuffle=shuffle,
            seed=seed,
            shuffle_buffer=shuffle_buffer,
            task_bytes=task_bytes,
            index=index,
            source=None if input_format is None else input_format.name,
            by_rows=input_format is not None and input_format.by_rows,
        )
        _check_overlap(plan)
        if on_plan is not None:
            on_plan(plan)
        portal.call(abort_unfinished_writes(plan.naming, dst_storage_options))
        # an earlier run's manifest must not describe the shards this run rewrites
        portal.call(remove_manifest(plan.manifest_url, dst_storage_options, retry))
        done = portal.call(load_done_tasks(plan, dst_storage_options, retry))
        pending = [task for task in plan.tasks if task.index not in done]
        options = TaskOptions(
            template=dst_template,
            compression=codec,
            max_records=max_records,
            max_bytes=max_bytes,
            shuffle_buffer=plan.shuffle_buffer,
            src_storage_options=src_storage_options,
            dst_storage_options=dst_storage_options,
            part_bytes=part_bytes,
            index=index,
            retry=retry,
            records=None if input_format is None else input_format.records,
        )
        reporter = _Reporter(progress, sum(t.input_bytes for t in pending), len(pending))
        try:
            if engine == "local":
                results = []
                for task in pending:
                    result = portal.call(run_task(task, options, reporter.chunk))
                    reporter.task(result, counted=True)
                    results.append(result)
            else:
                from streamrec.reshard.dask import run_on_dask

                results = run_on_dask(
                    pending,
                    options,
                    run=run_task_blocking,
                    scheduler=scheduler,
                    workers=workers,
                    on_done=lambda result: reporter.task(result, counted=False),
                )
        finally:
            reporter.close()
        by_task = {index: entries for index, entries in done.items()}
        by_task.update({result.index: result.entries for result in results})
        entries: list[ManifestEntry] = []
        for task in plan.tasks:
            for entry in by_task[task.index]:
                entries.append(replace(entry, index=len(entries)))
        if index:
            portal.call(
                write_dataset_index(
                    plan.manifest_url,
                    entries,
                    compression=codec,
                    storage_options=dst_storage_options,
                    retry=retry,
                )
            )
        portal.call(
            write_manifest(
                plan.manifest_url,
                entries,
                compression=codec,
                template=dst_template,
                storage_options=dst_storage_options,
                retry=retry,
            )
        )
        portal.call(delete_objects([task.scratch_url for task in plan.tasks], dst_storage_options))
    finally:
        portal.close()
    return ReshardSummary(
        records=sum(e.records for e in entries),
        bytes_in=plan.input_bytes,
        bytes_out=sum(e.bytes for e in entries),
        seconds=time.monotonic() - started,
        shards=[e.url for e in entries],
        manifest_url=plan.manifest_url,
        tasks=len(plan.tasks),
        tasks_skipped=len(done),
        bytes_read=sum(r.bytes_read for r in results),
        engine=engine,
    )
