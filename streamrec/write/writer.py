"""Writing TFRecord shards: ``open_writer`` (async) and its blocking twin in ``streamrec.sync``.

::

    async with streamrec.open_writer("s3://b/out/part-{index:05d}.tfrecord",
                                     max_bytes=256 << 20) as w:
        await w.write(payload)            # or: await w.write_many(payloads)

Three layers, each one thing:

1. **Planning** (:class:`~streamrec.write.planner.Planner`, sans-I/O, on
   :class:`~streamrec.format.encoder.ShardEncoder`, in the caller's thread): frames and
   compresses records, routes each to its shard (rotation by ``max_records`` / ``max_bytes``,
   or ``num_shards`` filled round-robin or contiguously), cuts blocks of ``flush_bytes``.
2. **Sinks** (``store.open_sink``): one per shard; S3 multipart and GCS resumable uploads run
   while blocks arrive (parts sized by :mod:`streamrec.write.tune`), local files are written
   under a temporary name. A shard object appears only when its sink commits.
3. **The writer** (:class:`ShardWriter`): hands blocks to sinks, commits finished shards in the
   background (the next shard keeps filling meanwhile), raises any upload failure on the next
   call, aborts everything on error or cancellation, and writes the manifest last.

Rotation, exactly
-----------------
A new shard starts when the next record would make the current one exceed ``max_records``
records or ``max_bytes`` bytes *as stored* (a bigger record alone gets a shard of its own).
Uncompressed, the stored size is the framed size (payload + 16 bytes): exact by arithmetic.
Compressed (gzip / zlib) it is exact too: while a worst-case bound on deflate's output shows
that the record fits, it is simply added; near the limit the compressor is sync-flushed
(``Z_SYNC_FLUSH``: the stream stays one standard gzip member / zlib stream, with a few empty
stored blocks that every inflater skips) so that its output so far is known exactly, and then a
copy of the compressor is given the record and finished: the record goes in if and only if that
finished size is within ``max_bytes``. So every shard is at most ``max_bytes`` bytes, and the
record that opened the next shard would have pushed the previous one over, measured on the
stream as written.

``num_shards`` (fixed-size sets, TensorFlow's ``train-00003-of-00016`` names)
---------------------------------------------------------------------------------
``order="round_robin"`` (default): record *i* goes to shard *i* mod *N*; all *N* shards are
open at once (each buffers up to one part: memory grows with *N*). ``order="contiguous"`` with
``total_records=T``: shard *k* holds the next ``T // N`` records, one more for the first
``T % N`` shards (``numpy.array_split``'s split); more records than ``T`` is an error at
``write``, fewer is an error at ``close``. Either way exactly *N* shards are written (some may
be empty when there are fewer records than shards).

Manifest
--------
A writer whose template has an ``{index}`` field writes ``manifest`` (``"_manifest.json"``)
beside the shards after the last one is committed (see :mod:`streamrec.manifest.core`). A manifest
already there (an earlier write to the same directory) is removed before the first shard is
opened, with a warning in the log: its shards are about to be replaced, and a reader of the
old manifest must not read the new objects through it. The manifest lists each shard by its
name relative to the manifest's directory (which must hold the shards, at any depth) with its
size, CRC32C and version (S3 ETag, GCS generation) as committed. A single-file
writer (no template field) writes none unless ``manifest=`` is passed explicitly;
``manifest=None`` writes none.

Record index (``index=True``)
-----------------------------
Each shard gets its record index sidecar, ``<shard url>.idx`` (:mod:`streamrec.format.index.core`):
the plain ``<offset> <length>`` lines of DALI's ``tfrecord2idx`` and the ``tfrecord`` package
for uncompressed shards; for GZIP / ZLIB shards the extended four-column lines, the stream
having a restart point (a full flush) about every MiB of records
(:mod:`streamrec.format.encoder`). The sidecar goes through the same kind of sink as the shard
(nothing visible half-written, aborted on failure) and is committed right *after* its shard,
so an index never describes a shard that is not there; an older sidecar at that url (an
earlier indexed write of the same names) is removed while the shard is written, before the
shard can appear, so it never describes the new shard either. A writer killed between the two
commits leaves a shard without an index: readers treat it as unindexed (and the set has no
manifest). The manifest lists each shard's sidecar (``record_index``: its name and size);
``shards`` entries carry ``index_url`` / ``index_bytes``. Without ``index`` nothing changes:
the same bytes, no sidecars, no extra requests.

Failure
-------
An upload error (after its retries) is raised by the next ``write`` / ``write_many`` /
``close``. Any error, a cancellation, or leaving ``async with`` by an exception aborts every
open shard (multipart uploads aborted, resumable sessions cancelled, temporary files removed)
and writes no manifest. Shards committed before the failure stay (each is complete); the
missing manifest marks the set as incomplete.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, NoReturn

from streamrec._portal import cancel_and_wait, run_all, settle_all
from streamrec.errors import ArgumentError, ObjectNotFoundError, StorageError
from streamrec.format.codecs import Compression, normalize_compression
from streamrec.format.crc import BytesLike
from streamrec.format.index.core import ShardIndex, index_url
from streamrec.format.index.dataset import (
    DATASET_INDEX_NAME,
    EncodedShard,
    dataset_index_bytes,
    encode_shard,
)
from streamrec.manifest.check import invalidate_manifest
from streamrec.manifest.core import MANIFEST_NAME, Manifest, ManifestEntry, dumps, relative_name
from streamrec.pipeline.arguments import (
    check_bool,
    check_choice,
    check_int,
    check_optional_int,
    check_url,
)
from streamrec.storage.base import ObjectStore
from streamrec.storage.registry import open_store, store_key
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.sink_base import ObjectSink, run_to_completion
from streamrec.write.misuse import ASYNC_WRITER, check_in_loop, unawaited
from streamrec.write.planner import Order, Planner
from streamrec.write.template import ShardTemplate
from streamrec.write.tune import UploadSettings, upload_context, upload_settings

__all__ = ["DEFAULT_MANIFEST", "ShardWriter", "open_writer"]

_FLUSH_BYTES = 1 << 20


class _DefaultName(str):
    """The default manifest name: written for shard sets, not for single files."""

    __slots__ = ()


#: ``manifest=`` default: ``"_manifest.json"`` beside the shards of a templated writer.
DEFAULT_MANIFEST: str = _DefaultName(MANIFEST_NAME)


# ----------------------------------------------------------------------------------------------
# the writer


class ShardWriter:
    """Writes TFRecord shards; each appears only once complete, the manifest last.

    Use as ``async with open_writer(template, ...) as w: await w.write(payload)``; see
    :func:`open_writer` for the options and this module's docstring for the semantics.
    """

    def __init__(
        self,
        template: str | os.PathLike[str],
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
        num_shards: int | None = None,
        order: Order = "round_robin",
        total_records: int | None = None,
        compression: str | None = None,
        part_bytes: int | None = None,
        max_concurrency: int | None = None,
        manifest: str | os.PathLike[str] | None = DEFAULT_MANIFEST,
        storage_options: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        flush_bytes: int | None = None,
        compression_level: int = 6,
        first_index: int = 0,
        index: bool = False,
    ) -> None:
        template = check_url(template, "template")
        self.template = template
        self.indexed = index = check_bool(index, "index")
        if compression is not None and not isinstance(compression, str):
            raise ArgumentError(f"compression must be None, 'gzip' or 'zlib', not {compression!r}")
        codec = normalize_compression(compression)
        if codec == "auto":
            raise ValueError("a writer needs an explicit compression: None, 'gzip' or 'zlib'")
        max_records = check_optional_int(max_records, "max_records", minimum=1)
        max_bytes = check_optional_int(max_bytes, "max_bytes", minimum=1)
        num_shards = check_optional_int(num_shards, "num_shards", minimum=1)
        flush_bytes = check_optional_int(flush_bytes, "flush_bytes", minimum=1)
        total_records = check_optional_int(total_records, "total_records", minimum=0)
        part_bytes = check_optional_int(part_bytes, "part_bytes", minimum=1)
        max_concurrency = check_optional_int(max_concurrency, "max_concurrency", minimum=1)
        first_index = check_int(first_index, "first_index", minimum=0)
        compression_level = check_int(compression_level, "compression_level", minimum=-1)
        if compression_level > 9:
            raise ArgumentError(f"compression_level must be in [-1, 9], not {compression_level}")
        order = check_choice(order, "order", ("round_robin", "contiguous"))
        if manifest is not None and not isinstance(manifest, _DefaultName):
            manifest = check_url(manifest, "manifest")
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise ArgumentError(
                "storage_options must be a mapping (dict) or None, not "
                f"{type(storage_options).__name__}"
            )
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ArgumentError(
                f"retry must be a streamrec RetryPolicy or None, not {type(retry).__name__}"
            )
        if num_shards is not None and (max_records is not None or max_bytes is not None):
            raise ValueError(
                "num_shards fixes the number of shards: it cannot be combined with "
                "max_records / max_bytes (use one or the other)"
            )
        if order == "contiguous":
            if num_shards is None or total_records is None:
                raise ValueError(
                    'order="contiguous" needs num_shards= and total_records= (the shards '
                    "are cut by count, so the count must be known up front)"
                )
        elif total_records is not None:
            raise ValueError('total_records= is only used with order="contiguous"')
        self._template = ShardTemplate(template, num_shards, first_index)
        several = max_records is not None or max_bytes is not None or (num_shards or 1) > 1
        if several and not self._template.sharded:
            raise ValueError(
                f"{template}: more than one shard may be written "
                f"({'num_shards' if num_shards else 'max_records / max_bytes'}) but the "
                "template has no {index} field to tell them apart, e.g. "
                "'out/part-{index:05d}.tfrecord'"
            )
        if store_key(template) == "http":
            raise StorageError(f"{template}: http(s) urls are read-only")
        self.compression: Compression = codec
        self._context, self._tuner = upload_context(
            part_bytes, max_concurrency, retry or RetryPolicy()
        )
        self._plan = Planner(
            self._template,
            compression=codec,
            level=compression_level,
            max_records=max_records,
            max_bytes=max_bytes,
            num_shards=num_shards,
            order=order,
            total_records=total_records,
            flush_bytes=flush_bytes or min(_FLUSH_BYTES, part_bytes or _FLUSH_BYTES),
            index=index,
        )
        self.manifest_url = self._manifest_url(manifest)
        self.storage_options = storage_options
        self._store: ObjectStore | None = None
        self._sinks: dict[int, ObjectSink] = {}
        self._finishing: set[asyncio.Task[None]] = set()
        self._committing: dict[int, ObjectSink] = {}  # sealed, commit under way
        self._removing: dict[int, asyncio.Task[None]] = {}  # older sidecars being removed
        self._entries: dict[int, ManifestEntry] = {}
        self._encoded: dict[int, EncodedShard] = {}  # dataset index entries, by shard
        self._state = "open"  # open -> closed | aborted | failed
        self._failure: BaseException | None = None
        self._invalidated = False  # an earlier manifest at manifest_url is removed
        self._calls = self._awaited = 0  # write calls made, and those whose coroutine ran

    def _manifest_url(self, manifest: str | None) -> str | None:
        if manifest is None:
            return None
        if isinstance(manifest, _DefaultName) and not self._template.sharded:
            return None
        if not manifest or manifest.endswith("/"):
            raise ValueError(f"manifest must name a file, not {manifest!r}")
        if "://" in manifest or os.path.isabs(manifest):
            url = manifest
        else:
            directory = self._template.directory()
            url = f"{directory.rstrip('/')}/{manifest}" if directory else manifest
        if store_key(url) != store_key(self.template):
            raise ValueError(f"the manifest {url} must be in the same store as the shards")
        if relative_name(self._template.url(0), url) is None:
            raise ValueError(
                f"the manifest {url} must be in the shards' directory or above it: readers "
                "only follow shard names relative to the manifest's directory"
            )
        return url

    # -- properties -----------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The template (the file's url for a single-file writer)."""
        return self.template

    @property
    def records(self) -> int:
        """Records written so far."""
        return self._plan.records

    @property
    def shards(self) -> list[ManifestEntry]:
        """The shards committed so far, by index (all of them after ``close()``)."""
        return [self._entries[i] for i in sorted(self._entries)]

    @property
    def stats(self) -> UploadSettings:
        """The upload settings as they stand: part size, uploads in flight, the room."""
        return upload_settings(self._context, self._tuner)

    # -- writing --------------------------------------------------------------------------
    def write(self, payload: BytesLike) -> Coroutine[Any, Any, None]:
        """Append one record (a serialized Example or any bytes): ``await w.write(payload)``."""
        check_in_loop("write")
        self._calls += 1
        return self._write(payload)

    def write_many(self, payloads: Iterable[BytesLike]) -> Coroutine[Any, Any, None]:
        """Append many records at once (faster than ``write`` in a loop for small records)."""
        check_in_loop("write_many")
        self._calls += 1
        return self._write_many(payloads)

    async def _write(self, payload: BytesLike) -> None:
        self._awaited += 1
        if self.encode(payload):
            await self.send()

    async def _write_many(self, payloads: Iterable[BytesLike]) -> None:
        self._awaited += 1
        if self.encode_many(payloads):
            await self.send()

    def encode(self, payload: BytesLike) -> bool:
        """Frame, compress and route one record, without I/O (any thread, one at a time).

        True when there is something to hand to storage: ``await send()`` then. ``write`` is
        ``encode`` + ``send``; the blocking writer encodes in the caller's thread and crosses
        into the event loop only for ``send``.
        """
        self._check_open()
        return self._plan.add(payload) or self._context.failure is not None

    def encode_many(self, payloads: Iterable[BytesLike]) -> bool:
        """:meth:`encode` for many records at once."""
        self._check_open()
        return self._plan.add_many(payloads) or self._context.failure is not None

    async def send(self) -> None:
        """Hand what :meth:`encode` made to the uploads; raises an earlier upload failure."""
        await self._drain()

    def close(self) -> Coroutine[Any, Any, None]:
        """Finish every shard, wait for them to be committed, then write the manifest.

        Idempotent. Raises the first upload failure (everything is aborted then), or a
        TypeError when some ``write`` was never awaited (aborted too: its records are lost).
        """
        check_in_loop("close")
        return self._close()

    async def _close(self) -> None:
        if self._state in ("closed", "aborted"):
            return
        if self._calls != self._awaited and self._state == "open":
            error = unawaited(self._calls - self._awaited)
            await self._fail(error)
            raise error
        if self._state == "failed":
            raise StorageError(
                f"{self.template}: the writer failed earlier: {self._failure}"
            ) from self._failure
        try:
            self._plan.finish()
            await self._drain_ops()
            while self._finishing:
                await run_all(list(self._finishing))
            self._context.raise_failure()
            if self.manifest_url is not None:
                if self.indexed and len(self._encoded) == len(self._entries):
                    await self._write_dataset_index(self.manifest_url)
                await self._write_manifest(self.manifest_url)
            await self._close_store()
            self._state = "closed"
        except BaseException as exc:
            await self._fail(exc)
            raise

    async def abort(self) -> None:
        """Drop every shard not yet committed and write no manifest. Idempotent."""
        if self._state != "open":
            return
        self._state = "aborted"
        await run_to_completion(self._abort_all())

    # -- inside ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"{self.template}: writer is {self._state}")

    def _store_now(self) -> ObjectStore:
        if self._store is None:
            self._store = open_store(self.template, self.storage_options)
        return self._store

    async def _drain(self) -> None:
        """Hand the planner's ops to the sinks; on any failure abort everything."""
        try:
            await self._drain_ops()
        except BaseException as exc:
            await self._fail(exc)
            raise

    async def _drain_ops(self) -> None:
        self._context.raise_failure()
        if not self._invalidated:
            self._invalidated = True
            if self.manifest_url is not None:
                await invalidate_manifest(self._store_now(), self.manifest_url, self._context.retry)
                # an older dataset index here would describe other shards: gone before any
                # shard is written (a new one is written with the manifest, when indexed)
                base = self.manifest_url.rpartition("/")[0]
                await self._remove(f"{base}/{DATASET_INDEX_NAME}")
        for op in self._plan.take_ops():
            self._context.raise_failure()
            sink = self._sinks.get(op.index)
            if sink is None:
                sink = self._sinks[op.index] = self._store_now().open_sink(
                    self._template.url(op.index), self._context
                )
                if self.indexed:  # meanwhile: an older sidecar must not describe this shard
                    self._removing[op.index] = self._background(self._remove(index_url(sink.url)))
            if op.data:
                await sink.write(op.data)
            if op.end:
                del self._sinks[op.index]
                self._committing[op.index] = sink
                removing = self._removing.pop(op.index, None)
                if removing is not None:
                    await removing  # gone before the shard can appear (sealing may commit it)
                await sink.seal()  # the last part starts here: waits for upload capacity
                self._background(self._commit(op.index, sink, op.records, op.shard_index))

    def _background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task the writer awaits at close and cancels on failure; its error fails it."""
        task = asyncio.ensure_future(work)
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)
        self._context.track(task)
        return task

    async def _remove(self, url: str) -> None:
        """Remove the object ``url`` if there is one (looked up first: a writer may lack the
        right to delete, and needs it only when there is something to remove)."""
        store, retry = self._store_now(), self._context.retry
        try:
            await retry.run(lambda: store.expand(url), describe=f"{url}: looking it up")
        except ObjectNotFoundError:
            return
        await retry.run(lambda: store.delete(url), describe=f"{url}: removing it")

    async def _commit(
        self, index: int, sink: ObjectSink, records: int, shard_index: ShardIndex | None
    ) -> None:
        committed = await sink.commit()
        indexed = None
        if shard_index is not None:  # the index after its shard: never one without the shard
            sidecar = index_url(committed.url)
            index_sink = self._store_now().open_sink(sidecar, self._context)
            self._committing[index] = index_sink
            await index_sink.write(shard_index.to_bytes())
            indexed = await index_sink.commit()
            name = (
                None
                if self.manifest_url is None
                else relative_name(committed.url, self.manifest_url)
            )
            if name is not None:  # its entries in the dataset index (a byte or two a record)
                self._encoded[index] = encode_shard(
                    name, committed.bytes, committed.version, self.compression, shard_index
                )
        del self._committing[index]
        number = self._template.first_index + index  # the {index} in its name
        self._entries[index] = ManifestEntry(
            committed.url,
            records,
            committed.bytes,
            committed.crc32c,
            number,
            committed.version,
            index_url=None if indexed is None else indexed.url,
            index_bytes=None if indexed is None else indexed.bytes,
        )

    async def _write_dataset_index(self, manifest_url: str) -> None:
        """Every shard's entries in one object beside the manifest, before it."""
        url = manifest_url.rpartition("/")[0] + "/" + DATASET_INDEX_NAME
        await self._put(url, dataset_index_bytes([self._encoded[k] for k in sorted(self._entries)]))

    async def _write_manifest(self, url: str) -> None:
        manifest = Manifest(self.shards, compression=self.compression, template=self.template)
        await self._put(url, dumps(manifest, url))

    async def _put(self, url: str, data: bytes) -> None:
        sink = self._store_now().open_sink(url, self._context)
        await sink.write(data)
        await sink.commit()

    async def _fail(self, exc: BaseException) -> None:
        if self._state == "open":
            self._state = "failed"
            self._failure = exc
            await run_to_completion(self._abort_all())

    async def _abort_all(self) -> None:
        await cancel_and_wait(list(self._finishing))  # each commit aborts its sink when cancelled
        # a commit task cancelled before it ran never aborted its sink: abort them all here
        # (abort is idempotent and leaves committed objects alone)
        sinks = [*self._committing.values(), *self._sinks.values()]
        self._committing.clear()
        self._sinks.clear()
        self._removing.clear()  # (their tasks were among those cancelled)
        if sinks:
            await settle_all(sink.abort() for sink in sinks)
        await self._close_store()

    async def _close_store(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            await store.close()

    async def __aenter__(self) -> ShardWriter:
        return self

    def __enter__(self) -> NoReturn:
        raise TypeError(f"streamrec.open_writer is async: {ASYNC_WRITER}")

    def __exit__(self, *exc_info: object) -> None:  # (never reached: __enter__ raises)
        pass

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.abort()


def open_writer(
    template: str | os.PathLike[str],
    *,
    max_records: int | None = None,
    max_bytes: int | None = None,
    num_shards: int | None = None,
    compression: str | None = None,
    part_bytes: int | None = None,
    max_concurrency: int | None = None,
    manifest: str | os.PathLike[str] | None = DEFAULT_MANIFEST,
    storage_options: dict[str, Any] | None = None,
    retry: RetryPolicy | None = None,
    index: bool = False,
    **options: Any,
) -> ShardWriter:
    """Open TFRecord shards for writing (async): ``async with open_writer(...) as w``.

    Args:
        template: a path (``str`` or ``os.PathLike``) or url (``s3://``, ``gs://``,
            ``memory://``, local). Without fields it names one file. ``{index}`` (0-based,
            format specs allowed: ``{index:05d}``) numbers the shards; ``{num_shards}``
            (with ``num_shards``) gives TensorFlow's ``train-{index:05d}-of-{num_shards:05d}``
            names.
        max_records: start a new shard before a record would make this one hold more.
        max_bytes: start a new shard before a record would make this one bigger, in bytes as
            stored (after compression; exact, see the module docstring). A record bigger
            than this alone gets a shard of its own.
        num_shards: write exactly this many shards; ``order="round_robin"`` (default) or
            ``order="contiguous"`` with ``total_records=`` (keyword options).
        compression: ``None``, ``"gzip"`` or ``"zlib"`` (as TensorFlow writes them).
        part_bytes: S3 part size (>= 5 MiB for all parts but the last), GCS chunk size (rounded
            up to a 256 KiB multiple); a shard no bigger than one part is one request.
        max_concurrency: data requests in flight at once over all shards. Neither given,
            the writer sizes both to the link (:mod:`streamrec.write.tune`: 5-16 MiB parts,
            as many in flight as 128 MiB holds; ``w.stats`` says what it chose); either
            given, both are fixed (the other at 16 MiB / 8). Memory: the parts in flight
            (<= 128 MiB, or ``max_concurrency * part_bytes``), one part filling per open
            shard and the client (~40 MiB for S3; benchmarks/README.md).
        manifest: file name (beside the shards) or full url of the manifest, written last;
            ``None`` for none. Written by default for templated writers only.
        storage_options: passed to the fsspec filesystem (``endpoint_url``, ``key``, ...).
        retry: the :class:`~streamrec.storage.retry.RetryPolicy` of every upload request.
        index: write each shard's record index sidecar ``<shard url>.idx`` (committed after
            its shard; listed in the manifest) and give GZIP / ZLIB streams restart points
            about every MiB, so readers can seek to any record (see the module docstring).
        **options: ``order``, ``total_records``, ``flush_bytes`` (bytes handed to the sink at
            a time, default ``min(1 MiB, part_bytes)``), ``compression_level`` (default 6),
            ``first_index`` (the ``{index}`` of the first shard, default 0: for a writer that
            continues a numbering, as reshard's tasks do).

    Refused at open (ValueError): several shards possible but no ``{index}`` field, unknown
    template fields, ``num_shards`` with ``max_records`` / ``max_bytes``, ``compression="auto"``.
    """
    return ShardWriter(
        template,
        max_records=max_records,
        max_bytes=max_bytes,
        num_shards=num_shards,
        compression=compression,
        part_bytes=part_bytes,
        max_concurrency=max_concurrency,
        manifest=manifest,
        storage_options=storage_options,
        retry=retry,
        index=index,
        **options,
    )
