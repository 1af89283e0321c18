"""Ray Data over TFRecord shards in any store streamrec reads: every CRC checked, no TensorFlow.

::

    import ray
    from streamrec.example import FixedLenFeature
    from streamrec.interop.ray import read_tfrecords, write_tfrecords

    spec = {"label": FixedLenFeature(np.int64), "bbox": FixedLenFeature(np.float32, (4,))}
    ds = read_tfrecords("s3://bucket/train/", spec=spec)       # a ray.data.Dataset
    ds.groupby("label").count().show()
    write_tfrecords(ds.filter(lambda row: row["label"] != 0), "s3://bucket/filtered/")

* :func:`read_tfrecords` lists the shards once, on the driver (streamrec's listing: globs,
  directories, manifests, every store), and makes Ray read tasks of them. Where every shard's
  record count is known without reading it (a manifest, the dataset index, index sidecars),
  tasks are record ranges of about equal length: an uncompressed shard may be cut between
  tasks (a cut piece is read by index, ``Dataset.get``, in ``batch_size`` records a call;
  shards read whole are streamed, several times cheaper), but a cut within half a task of a
  shard's boundary moves there; a compressed shard is not cut (its records past a cut could
  only be reached by inflating the shard from its start). Otherwise tasks are groups of whole
  shards of about equal bytes. A task reads at least ``min_task_bytes`` (16 MiB) stored
  unless ``override_num_blocks`` names the count (Ray asks for 200 tasks whatever the size);
  without it :func:`read_tfrecords` asks Ray for the tasks it makes, so that Ray does not
  split their blocks into 200 smaller ones. Each task opens its own streamrec dataset in
  its worker and yields Arrow blocks of ``batch_size`` rows: with ``spec`` the decoded features
  (:func:`streamrec.example.decode_batch` ``(to="arrow")``: its schema is
  :func:`~streamrec.format.example.arrow.arrow_schema`), without it one column ``"record"``
  of ``large_binary`` payloads. A damaged record raises streamrec's error (a
  :class:`~streamrec.errors.StreamrecError`; Ray re-raises it on the driver as a subclass of
  it) naming the shard, offset and record.
* :class:`TFRecordDatasink` (``ds.write_datasink(...)``, or :func:`write_tfrecords`) writes
  each Ray write task's rows through :func:`streamrec.sync.open_writer` as shards
  ``part-<task>-<index>.tfrecord`` in one directory (each appears only complete, rotated by
  ``max_records`` / ``max_bytes``, optionally gzip and indexed), then, on the driver once
  every task has finished, ``_manifest.json`` (and with ``index=True`` the dataset index)
  listing them in task order: the directory reads back as one streamrec dataset, ``len()``
  and ``ds.get`` included. A failed write leaves no manifest. Rows become payloads from a
  bytes column (``payload_column``) or are encoded as ``tf.train.Example`` s
  (:func:`streamrec.example.encode`, one feature per column; nulls left out).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

try:
    import pyarrow as pa
    import ray
    import ray.data
    from ray.data import DataContext, Datasink, Datasource, ReadTask
    from ray.data.block import BlockMetadata
except ImportError as error:  # pragma: no cover - the extra is installed in the tests
    raise ImportError("streamrec.interop.ray needs ray: pip install 'streamrec[ray]'") from error


from streamrec._portal import EventLoopThread
from streamrec.convert.from_parquet import batch_payloads
from streamrec.errors import ArgumentError, RandomAccessUnavailableError
from streamrec.format.codecs import Compression, compression_known, normalize_compression
from streamrec.format.example import FeatureSpec, decode_batch
from streamrec.format.example.arrow import arrow_schema
from streamrec.manifest.core import MANIFEST_NAME, ManifestEntry
from streamrec.pipeline.dataset import Dataset, open_dataset
from streamrec.pipeline.listing.lengths import list_counts
from streamrec.pipeline.stats import Stats
from streamrec.redact import redact
from streamrec.reshard.state import remove_manifest, write_dataset_index, write_manifest
from streamrec.storage.base import ObjectInfo, split_scheme
from streamrec.sync import open_writer

__all__ = ["TFRecordDatasink", "TFRecordDatasource", "read_tfrecords", "write_tfrecords"]

DEFAULT_BATCH_SIZE = 8192
"""Rows per Arrow block a read task yields (and records per ``Dataset.get`` call)."""
DEFAULT_MIN_TASK_BYTES = 16 << 20
"""Stored bytes a read task reads at least, unless ``override_num_blocks`` names the count:
Ray asks for 200 tasks or more whatever the size, and a task costs ~10 ms of its own
(measured: 200,000 1 KiB records as 198 tasks took 8x as long as 8 tasks)."""
RECORD_COLUMN = "record"
"""The column of raw payloads (``large_binary``) when no ``spec`` is given."""

# Ray splits and shuffles itself (tasks, ``ds.random_shuffle()``): a read task reads its
# piece in order, whole, so these streamrec options would only drop or reorder records.
_RAY_DECIDES = (
    "num_hosts",
    "host_index",
    "shuffle",
    "shuffle_shards",
    "shuffle_buffer",
    "even",
    "seed",
    "window_records",
)


@dataclass(frozen=True)
class _Piece:
    """Records ``[start, stop)`` of one shard (``whole``: all of them, streamed)."""

    url: str
    start: int
    stop: int | None  # None: to the shard's end (its count unknown)
    whole: bool


@dataclass(frozen=True)
class _Read:
    """What one read task does: pickled into its worker, which opens its own datasets."""

    pieces: tuple[_Piece, ...]
    spec: dict[str, FeatureSpec] | None
    batch_size: int
    options: dict[str, Any]

    def __call__(self) -> Iterator[pa.Table]:
        # consecutive whole shards stream through one dataset; cut pieces are read by index
        for whole, group in itertools.groupby(self.pieces, key=lambda piece: piece.whole):
            pieces = list(group)
            if whole:
                yield from self._stream(open_dataset([p.url for p in pieces], **self.options))
            else:
                for piece in pieces:
                    yield from self._cut(piece)

    def _stream(self, source: Any) -> Iterator[pa.Table]:
        if self.spec is not None:
            batches = source.parse(self.spec).to_arrow(batch_size=self.batch_size)
            for batch in batches:
                yield pa.Table.from_batches([batch])
        else:
            for payloads in source.batch(self.batch_size):
                yield self._table(payloads)

    def _cut(self, piece: _Piece) -> Iterator[pa.Table]:
        assert piece.stop is not None  # cut pieces come from known counts
        dataset = open_dataset(piece.url, **self.options)
        try:
            first = piece.start
            while first < piece.stop:
                last = min(piece.stop, first + self.batch_size)
                try:
                    payloads = dataset.get(range(first, last))
                except RandomAccessUnavailableError:
                    # counted (a manifest) but not indexed: stream the piece, prefix read
                    skipped = open_dataset(piece.url, **self.options).skip(first)
                    yield from self._stream(skipped.take(piece.stop - first))
                    return
                yield self._table(payloads)
                first = last
        finally:
            dataset.close()

    def _table(self, payloads: list[bytes]) -> pa.Table:
        if self.spec is not None:
            return pa.Table.from_batches([decode_batch(payloads, self.spec, to="arrow")])
        return pa.table({RECORD_COLUMN: pa.array(payloads, type=pa.large_binary())})


class TFRecordDatasource(Datasource):
    """A Ray Data datasource over TFRecord shards (see the module; :func:`read_tfrecords`)."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        spec: Mapping[str, FeatureSpec] | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        min_task_bytes: int = DEFAULT_MIN_TASK_BYTES,
        storage_options: dict[str, Any] | None = None,
        **open_dataset_options: Any,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call,unused-ignore]
        for name in _RAY_DECIDES:
            if name in open_dataset_options:
                raise ArgumentError(
                    f"{name}: Ray splits and orders the read tasks (use ds.random_shuffle() "
                    "or ds.randomize_block_order()); streamrec reads each task's piece in order"
                )
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ArgumentError(f"batch_size must be a positive int, not {batch_size!r}")
        self.spec = None if spec is None else dict(spec)
        if self.spec is not None:
            decode_batch([], self.spec)  # a bad spec fails here, not in a worker
        self.batch_size = batch_size
        self.min_task_bytes = min_task_bytes
        self._options = dict(open_dataset_options, storage_options=storage_options)
        dataset = open_dataset(urls, **self._options)  # every option checked here
        try:
            self.urls = dataset.urls
            self.shards, self.counts = _listed(dataset)
        finally:
            dataset.close()
        self._compression = dataset.compression

    def get_name(self) -> str:
        return "TFRecord(streamrec)"

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(shard.size for shard in self.shards)

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        """One task per group of shards or record range (see the module), at most
        ``parallelism`` of them, each of ``min_task_bytes`` or more."""
        plan = self._plan(parallelism)
        schema = (
            arrow_schema(self.spec)
            if self.spec is not None
            else pa.schema([(RECORD_COLUMN, pa.large_binary())])
        )
        tasks = []
        for pieces, rows, size_bytes in plan:
            read = _Read(tuple(pieces), self.spec, self.batch_size, self._options)
            metadata = BlockMetadata(
                num_rows=rows,
                size_bytes=size_bytes,
                exec_stats=None,
                input_files=tuple(dict.fromkeys(piece.url for piece in pieces)),
            )
            tasks.append(
                ReadTask(read, metadata, schema=schema, per_task_row_limit=per_task_row_limit)
            )
        return tasks

    def num_tasks(self, parallelism: int) -> int:
        """How many read tasks there are when Ray asks for ``parallelism``: a count that
        ``get_read_tasks`` keeps (asked for it, it makes that many)."""
        count = len(self._plan(parallelism))
        while 0 < count < parallelism:  # fewer (whole shards, min_task_bytes): ask again
            parallelism, count = count, len(self._plan(count))
        return max(1, count)

    def _plan(self, parallelism: int) -> list[tuple[list[_Piece], int | None, int]]:
        if self.min_task_bytes > 0:
            stored = sum(shard.size for shard in self.shards)
            parallelism = min(parallelism, -(-stored // self.min_task_bytes))
        if self.counts is not None:
            return self._by_records(max(1, parallelism))
        return self._by_shards(max(1, parallelism))

    def _by_records(self, parallelism: int) -> list[tuple[list[_Piece], int | None, int]]:
        assert self.counts is not None
        total = sum(self.counts)
        ends = list(itertools.accumulate(self.counts))
        starts = [end - count for end, count in zip(ends, self.counts, strict=True)]
        # a cut within half a task of a shard boundary moves there (no task over twice its
        # share): a whole shard streams, at a quarter or less of the CPU a record of a cut
        # piece read by index (measured: 8 whole shards 0.2-0.5 s, 12 tasks cutting them
        # 0.9-1.4 s; a cut piece's worker also loads the shard's index)
        slack = -(-total // (2 * parallelism))
        cuts = {0, total}
        for k in range(1, parallelism):
            cut = k * total // parallelism
            for shard, start, end in zip(self.shards, starts, ends, strict=True):
                if start < cut < end:
                    nearer = start if cut - start < end - cut else end
                    if abs(cut - nearer) <= slack or not self._may_cut(shard):
                        cut = nearer
            cuts.add(cut)
        bounds = sorted(cuts)
        plan: list[tuple[list[_Piece], int | None, int]] = []
        for low, high in itertools.pairwise(bounds):
            pieces, size_bytes = [], 0
            for shard, start, end in zip(self.shards, starts, ends, strict=True):
                first, last = max(low, start), min(high, end)
                if first < last:
                    whole = first == start and last == end
                    pieces.append(_Piece(shard.url, first - start, last - start, whole))
                    size_bytes += shard.size * (last - first) // max(1, end - start)
            if pieces:
                plan.append((pieces, high - low, size_bytes))
        return plan

    def _may_cut(self, shard: ObjectInfo) -> bool:
        # stated or named compressed: records past a cut need the shard inflated from its start
        return compression_known(self._compression, shard.url, shard.compression) in (
            None,
            "unknown",
        )

    def _by_shards(self, parallelism: int) -> list[tuple[list[_Piece], int | None, int]]:
        total = sum(shard.size for shard in self.shards)
        groups: list[list[ObjectInfo]] = [[]]
        done = 0
        for shard in self.shards:
            # a new group where the bytes so far pass the next of parallelism equal shares
            if groups[-1] and done * parallelism >= len(groups) * total:
                groups.append([])
            groups[-1].append(shard)
            done += shard.size
        return [
            (
                [_Piece(shard.url, 0, None, True) for shard in group],
                None,
                sum(shard.size for shard in group),
            )
            for group in groups
            if group
        ]

    def __repr__(self) -> str:
        what = "bytes" if self.spec is None else f"spec={sorted(self.spec)}"
        return f"TFRecordDatasource({[redact(url) for url in self.urls]!r}, {what})"


def _located(shard: ObjectInfo) -> ObjectInfo:
    """A local shard by its absolute path: a worker need not share the driver's directory."""
    if split_scheme(shard.url)[0] == "file" and not os.path.isabs(shard.url):
        return replace(shard, url=os.path.abspath(shard.url))
    return shard


def _listed(dataset: Dataset) -> tuple[list[ObjectInfo], list[int] | None]:
    """The shards, in listing order, and each one's record count (None: not all known)."""
    with EventLoopThread("streamrec-ray-listing") as portal:
        counts = portal.call(list_counts(dataset.urls, dataset.options, Stats()))
    shards = [_located(shard) for shard in counts.shards]
    if counts.unknown is not None or len(counts.counts) != len(shards):
        return shards, None
    return shards, list(counts.counts)


def _cluster_cpus() -> int:
    """The CPUs of the Ray cluster (Ray's default read parallelism is at least twice that)."""
    if not ray.is_initialized():
        return 1
    return int(ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call,unused-ignore]


def read_tfrecords(
    urls: str | Sequence[str],
    *,
    spec: Mapping[str, FeatureSpec] | None = None,
    storage_options: dict[str, Any] | None = None,
    override_num_blocks: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    ray_remote_args: dict[str, Any] | None = None,
    **open_dataset_options: Any,
) -> ray.data.Dataset:
    """A ``ray.data.Dataset`` of the records of TFRecord shards (see the module).

    Args:
        urls: what :func:`streamrec.open_dataset` takes: paths, globs, directories, manifests,
            in any store streamrec reads.
        spec: decode each record as a ``tf.train.Example`` into these columns; None: one
            column ``"record"`` of the raw payloads.
        storage_options: the stores' options, as :func:`streamrec.open_dataset` takes them
            (pickled into every read task).
        override_num_blocks: how many read tasks (at most one per record); by default
            Ray's choice (200, or twice the cluster's CPUs), but none smaller than
            :data:`DEFAULT_MIN_TASK_BYTES` stored, a block each (Ray's size limit aside).
        batch_size: rows per Arrow block.
        ray_remote_args: passed to Ray's read tasks (``num_cpus``, ...).
        open_dataset_options: the rest of :func:`streamrec.open_dataset`'s options
            (``compression``, ``on_corrupt``, ``prefetch_bytes``, ``retry``, ...); the
            splits and shuffles are Ray's.
    """
    source = TFRecordDatasource(
        urls,
        spec=spec,
        batch_size=batch_size,
        # a count asked for is kept; Ray's default (200 or more) is bounded by the bytes
        min_task_bytes=DEFAULT_MIN_TASK_BYTES if override_num_blocks is None else 0,
        storage_options=storage_options,
        **open_dataset_options,
    )
    if override_num_blocks is None:
        # Ask Ray for exactly the tasks made: else it splits each task's block until there
        # are 200, each its own object (measured, 200,000 1 KiB records: the driver's CPU
        # 0.62 s for 200 blocks against 0.15 s for 8, the raylet's 0.2 s against 0.05 s)
        wanted = max(DataContext.get_current().read_op_min_num_blocks, 2 * _cluster_cpus())
        override_num_blocks = source.num_tasks(wanted)
    dataset: ray.data.Dataset = ray.data.read_datasource(
        source, override_num_blocks=override_num_blocks, ray_remote_args=ray_remote_args
    )
    return dataset


# ---------------------------------------------------------------------------- writing


_WriteReturn = tuple[int, list[ManifestEntry]]
"""What a write task hands the driver: its index and the shards it committed."""


class TFRecordDatasink(Datasink[_WriteReturn]):
    """Writes a Ray dataset as TFRecord shards in ``directory`` through streamrec's writer,
    then its ``_manifest.json`` (see the module).

    Args:
        directory: where the shards go (a path or url of any store streamrec writes).
        payload_column: write this column's bytes as the records; None: encode each row as a
            ``tf.train.Example`` (:func:`streamrec.example.encode`).
        max_records, max_bytes, compression, index, storage_options, writer_options:
            :func:`streamrec.sync.open_writer`'s, for each write task's writer. ``index``
            also writes the dataset index beside the manifest.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        payload_column: str | None = None,
        max_records: int | None = None,
        max_bytes: int | None = None,
        compression: str | None = None,
        index: bool = False,
        storage_options: dict[str, Any] | None = None,
        **writer_options: Any,
    ) -> None:
        directory = str(directory).rstrip("/")
        if not directory:
            raise ArgumentError("directory must name a directory or prefix")
        if split_scheme(directory)[0] == "file":  # the workers' directory may not be ours
            directory = os.path.abspath(directory)
        self.directory = directory
        self.payload_column = payload_column
        codec = normalize_compression(compression)
        if codec == "auto":
            raise ArgumentError("compression must be None, 'gzip' or 'zlib', not 'auto'")
        self.compression: Compression = codec
        self.index = index
        self.storage_options = storage_options
        self.manifest_url = f"{directory}/{MANIFEST_NAME}"
        suffix = {None: "", "gzip": ".gz", "zlib": ".zz"}[self.compression]
        self.template = f"part-{{task:05d}}-{{index:05d}}.tfrecord{suffix}"
        """The shards' names: write task, then the shard's index within the task."""
        self._writer_options = dict(
            writer_options,
            max_records=max_records,
            max_bytes=max_bytes,
            compression=self.compression,
            index=index,
            storage_options=storage_options,
            manifest=None,  # one manifest for every task's shards, on the driver
        )

    def get_name(self) -> str:
        return "TFRecord(streamrec)"

    def on_write_start(self, schema: Any = None) -> None:
        """An earlier manifest in the directory goes first (it would describe old shards)."""
        with EventLoopThread("streamrec-ray-sink") as portal:
            portal.call(remove_manifest(self.manifest_url, self.storage_options))

    def write(self, blocks: Iterable[Any], ctx: Any) -> _WriteReturn:
        """This task's rows as shards; returns the task's index and its shards."""
        task = int(ctx.task_idx)
        # the task's own template: {index} stays for its writer (a retried task rewrites
        # the same names; the manifest of an earlier run was removed in on_write_start)
        name = self.template.replace("{task:05d}", f"{task:05d}")
        writer = None
        try:
            for block in blocks:
                table = block if isinstance(block, pa.Table) else pa.Table.from_pandas(block)
                if table.num_rows == 0:
                    continue
                if writer is None:  # a task without rows writes no shard
                    writer = open_writer(f"{self.directory}/{name}", **self._writer_options)
                writer.write_many(self._payloads(table))
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        if writer is None:
            return task, []
        writer.close()
        return task, writer.shards

    def _payloads(self, table: pa.Table) -> Iterable[bytes]:
        if self.payload_column is not None:
            return table.column(self.payload_column).to_pylist()  # type: ignore[no-any-return]
        return itertools.chain.from_iterable(map(batch_payloads, table.to_batches()))

    def on_write_complete(self, write_result: Any) -> None:
        """Every task's shards in task order: the dataset index (``index=True``), then the
        manifest, last."""
        by_task = sorted(write_result.write_returns, key=lambda result: result[0])
        entries: list[ManifestEntry] = []
        for _, shards in by_task:
            for entry in shards:
                entries.append(replace(entry, index=len(entries)))
        if not entries:
            return
        with EventLoopThread("streamrec-ray-sink") as portal:
            if self.index:
                portal.call(
                    write_dataset_index(
                        self.manifest_url,
                        entries,
                        compression=self.compression,
                        storage_options=self.storage_options,
                    )
                )
            portal.call(
                write_manifest(
                    self.manifest_url,
                    entries,
                    compression=self.compression,
                    template=self.template,
                    storage_options=self.storage_options,
                )
            )


def write_tfrecords(
    dataset: ray.data.Dataset,
    directory: str | os.PathLike[str],
    *,
    ray_remote_args: dict[str, Any] | None = None,
    concurrency: int | None = None,
    **sink_options: Any,
) -> None:
    """Write ``dataset`` as TFRecord shards and a manifest in ``directory``
    (:class:`TFRecordDatasink`'s options)."""
    sink = TFRecordDatasink(directory, **sink_options)
    write: Callable[..., None] = dataset.write_datasink
    write(sink, ray_remote_args=ray_remote_args or {}, concurrency=concurrency)
