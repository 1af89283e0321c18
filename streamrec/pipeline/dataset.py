"""``open_dataset``: TFRecord payloads from files, via ``async for`` or plain ``for``."""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Callable, Generator, Iterator, Sequence
from contextlib import aclosing
from dataclasses import replace
from functools import partial
from typing import Any, Literal

from streamrec._portal import EventLoopThread, iterate_ahead, iterate_blocking, owned, owning
from streamrec.format.accel import log_fallback_once
from streamrec.format.framing import OnCorrupt
from streamrec.pipeline.arguments import PathOrUrls, check_url, check_urls
from streamrec.pipeline.budget import ByteBudget
from streamrec.pipeline.indexed.engine import IndexedEngine
from streamrec.pipeline.indexed.lookup import Indices, RecordLookup
from streamrec.pipeline.listing.lengths import (
    RecordCounts,
    ShardCounts,
    count_for,
    counts_key,
    list_counts,
)
from streamrec.pipeline.listing.plan import ShardPlan
from streamrec.pipeline.listing.urls import list_shards
from streamrec.pipeline.options import (
    DEFAULT_MAX_READ_AMPLIFICATION,
    FOR_CHUNK_BYTES,
    ReadOptions,
    read_ahead,
)
from streamrec.pipeline.position.events import Piece
from streamrec.pipeline.position.state import DatasetState, parse_state
from streamrec.pipeline.position.trackers import (
    Cursor,
    Locate,
    Reported,
    Where,
    tracker_for,
    where_from,
)
from streamrec.pipeline.position.url_names import UrlNames, url_names
from streamrec.pipeline.stats import Stats, clocked, settings_of
from streamrec.pipeline.stream.engine import ReadEngine
from streamrec.pipeline.stream.views import Chained, RecordViews, ViewSource
from streamrec.pipeline.transforms.chainable import Chainable
from streamrec.pipeline.transforms.ledger import Consumption
from streamrec.redact import redact
from streamrec.storage import timing, warmup
from streamrec.storage.registry import ObjectInfo, StoreSet, prewarm, store_key
from streamrec.storage.retry import RetryPolicy

__all__ = ["Dataset", "open_dataset"]


class Dataset(Chainable[bytes]):
    """A sequence of TFRecord payloads (``bytes``) read from one or more shards.

    Iterate with ``async for`` inside an event loop or with plain ``for`` anywhere; both give
    the same records in the same order (shards sorted by name within a glob, in the order given
    across a list). Each iteration lists and reads the shards again, with its own connections,
    closed when the iteration ends. ``stats`` accumulates counters. :meth:`get` reads records
    by their index instead (indexed shards). The transforms (``parse``, ``batch``, ``map``,
    ``filter``, ``take``, ``skip``, ``repeat``, ``unbatch``) come from
    :class:`~streamrec.pipeline.transforms.chainable.Chainable`.
    """

    def __init__(self, urls: PathOrUrls, options: ReadOptions | None = None) -> None:
        log_fallback_once()  # a build without the C accelerators says so, once
        self.urls = check_urls(urls)
        if not self.urls:
            raise ValueError("open_dataset needs at least one path, glob or url")
        for url in self.urls:
            store_key(url)  # unsupported schemes fail now, not on first read
        self.options = options or ReadOptions()
        """How the dataset reads (frozen; see :class:`~streamrec.pipeline.options.ReadOptions`)."""
        # the first client's set-up, done while the caller prepares the rest (a model, ...)
        prewarm(self.urls, self.options.storage_options)
        self.epoch = 0
        self._stats = Stats(settings=settings_of(self.options))
        self._handed_before = 0  # records handed out by the cursors before the current one
        self._resume: DatasetState | None = None  # loaded state, for the next iteration
        self._cursor: Cursor | None = None  # the consumer's position in this epoch
        # pieces handed to a consumer that reports later what it took (auto_consume=False)
        self._ledger: Consumption[Piece] | None = None
        self._finished = False  # this epoch has been read to its end
        self._shards_digest: str | None = None
        self._url_names: UrlNames | None = None  # how states name the urls (by _config)
        # a consumer that reports records handed out lazily (a transform's hand-out counter):
        # asked to report before any state is described, so the state is never behind it
        self._report_consumed: Callable[[], None] | None = None
        # ... and how many records it has handed out so far (read only: for ``stats``, which
        # any thread may read while the consumer iterates)
        self._handed_out: Callable[[], int] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch: shard and record shuffling depend on ``(seed, epoch)``.

        A different epoch starts at its beginning; setting the epoch a loaded state or the
        last iteration is in keeps that position.
        """
        if epoch != self.epoch:
            self._resume, self._finished = None, False
            self._set_cursor(None)
        self.epoch = epoch

    async def shards(self) -> list[ObjectInfo]:
        """Every shard to read, in order, with its size and version (requests in ``stats``)."""
        async with StoreSet(
            self.options.storage_options,
            lookup_reads_first_bytes=self.options.cache_dir is None,
        ) as stores:
            shards = list_shards(self.urls, self.options, stores.get, self._stats)
            return await timing.recorded(self._stats, shards)

    # Settings a DDP launcher (torch.py splits by rank) or the user may change between epochs.
    @property
    def num_hosts(self) -> int:
        """How many hosts share the shards (see ``open_dataset``)."""
        return self.options.num_hosts

    @property
    def host_index(self) -> int:
        """Which share of the shards this host reads."""
        return self.options.host_index

    def split_hosts(self, num_hosts: int, host_index: int) -> None:
        """Read share ``host_index`` of ``num_hosts`` from the next iteration on."""
        self.options = replace(self.options, num_hosts=num_hosts, host_index=host_index)

    @property
    def compression(self) -> str | None:
        """The ``compression`` setting."""
        return self.options.compression

    def _add_wait(self, seconds: float) -> None:
        self._stats.wait_s += seconds

    # ------------------------------------------------------------------ resume state

    def state_dict(self) -> dict[str, Any]:
        """Where the consumer is: JSON-serialisable, small (positions, never record data).

        Taken between any two records (after the last one handed out), or before or after
        an iteration. :meth:`load_state_dict` on a fresh dataset with the same
        configuration continues with exactly the records that would have come next.
        """
        return self._position().to_json()

    def _position(self) -> DatasetState:
        if self._report_consumed is not None:
            self._report_consumed()
        if self._resume is not None:
            return self._resume
        state = DatasetState(self.epoch, self._config(), self._shards_digest, self._finished)
        # (indexed: a finished consumer's position still says how much of its part it took)
        if self._cursor is not None and (not self._finished or self.options.indexed):
            state.read, state.shuffle = self._cursor.position()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) on the next iteration.

        Raises :class:`~streamrec.errors.StateError` when the state comes from a different
        configuration (the message lists the differences) or any field has the wrong type or
        range (states are untrusted: see :mod:`streamrec.pipeline.position.state`); a different set
        of shards, or positions past them, are detected when the iteration lists them.
        """
        resume = parse_state(state, self._config())  # every field, before any use
        self.epoch = resume.epoch
        self._resume = resume
        self._set_cursor(None)
        self._finished = resume.finished

    def _config(self) -> dict[str, Any]:  # (no credentials in states)
        if self._url_names is None:  # (once: state_dict() may run after every batch)
            self._url_names = url_names(self.urls)
        return {"urls": self._url_names, **self.options.config()}

    def _begin(self) -> tuple[Cursor, DatasetState | None]:
        """Consumer side of a new iteration: its cursor, and the state it resumes from."""
        resume, self._resume = self._resume, None
        if resume is not None and resume.finished:
            resume = None
            self._finished = True
        else:
            self._finished = False
        cursor = Cursor(tracker_for(self.options, self.epoch, resume))
        self._set_cursor(cursor)
        return cursor, resume

    def _set_cursor(self, cursor: Cursor | None) -> None:
        """The consumer's new position (None: none yet); what the old one counted is kept."""
        if self._cursor is not None:
            self._handed_before += self._cursor.handed_out()
        self._cursor, self._ledger = cursor, None
        self._report_consumed = self._handed_out = None  # that consumer is done reporting

    @property
    def own_stats(self) -> Stats:
        """The live counters (what :attr:`stats` returns; transforms above add to them)."""
        return self._stats

    @property
    def stats(self) -> Stats:
        """Counters of everything this dataset did so far, over all its iterations.

        ``records`` is exactly the records handed to the consumer (up to the one last handed
        out); ``records_read`` what was decoded from storage.
        """
        handed = self._handed_before
        if self._handed_out is not None:
            handed += self._handed_out()
        elif self._cursor is not None:
            handed += self._cursor.handed_out()
        self._stats.records = handed
        return self._stats

    def _end(self, cursor: Cursor) -> None:
        """The iteration ran to its end: the epoch is finished."""
        cursor.settle()
        self._finished = True
        self._plan: ShardPlan[ObjectInfo] | Locate | None = None  # (nothing left to locate)

    # ------------------------------------------------------------------ the pipeline

    async def _pieces(
        self,
        resume: DatasetState | None,
        *,
        timed: bool = True,
        in_place: bool = False,
        on_budget: Callable[[ByteBudget], None] | None = None,
    ) -> AsyncGenerator[Piece, None]:
        """This epoch's pieces from the read engine (none once the epoch is finished);
        ``on_budget`` gets their iteration's budget (record_views hold chunks in it)."""
        if self._finished:
            return
        if self.options.indexed:
            lookup = self._lookup_of()  # its table and verified boundaries: every epoch, get()
            indexed = IndexedEngine(
                self.urls,
                self.options,
                self.epoch,
                self._stats,
                lookup.trust,
                lookup.table,
                partial(lookup.keep, on_counts=self._keep_counts),
                counts.shards if (counts := self._known_counts()) is not None else (),
                lookup.versions,
            )
            pieces = indexed.pieces(
                resume, on_planned=partial(self._planned, indexed.where), timed=timed
            )
            budget = indexed.budget_plan.budget
        else:
            chunk_bytes = self.options.chunk_bytes if timed else FOR_CHUNK_BYTES
            options = replace(self.options, chunk_bytes=chunk_bytes, record_spans=in_place)
            engine = ReadEngine(self.urls, options, self.epoch, self._stats)
            budget = engine.budget_plan.budget
            pieces = engine.pieces(resume, timed=timed, on_planned=partial(self._planned, engine))
        if on_budget is not None:
            on_budget(budget)
        clock = clocked(pieces, self._stats, lambda: self.stats, self.options.stats_interval_s)
        async with aclosing(clock) as ordered:
            async for piece in ordered:
                yield piece

    def _planned(self, plan: ReadEngine | Locate | None, digest: str) -> None:
        self._shards_digest = digest  # states taken from now on name these shards
        self._plan = plan.plan if isinstance(plan, ReadEngine) else plan  # (see locate)

    def locate(self, payload: object) -> Where | None:
        """Where a record handed out and not yet consumed (the very object) comes from."""
        pending = () if self._ledger is None else self._ledger.pieces
        plan = getattr(self, "_plan", None)
        return where_from(self._cursor, pending, plan, payload, self.options.on_corrupt)

    # ------------------------------------------------------------------ consumers

    async def record_chunks(
        self,
        *,
        auto_consume: bool = True,
        report_consumed: Callable[[], None] | None = None,
        handed_out: Callable[[], int] | None = None,
        in_place: bool = False,
    ) -> AsyncGenerator[Sequence[bytes], None]:
        """Records in reading order, as chunks (lists; ``in_place``: RecordSpans too): fast path.

        Shards are planned (shuffled, split across hosts and workers), read (interleaved when
        ``cycle_length`` > 1) and optionally shuffled through a record buffer. All shards
        share one prefetch budget of ``prefetch_bytes``.

        For :meth:`state_dict`, a chunk counts as consumed once it has been handed out; with
        ``auto_consume=False`` records count only once :meth:`mark_consumed` says so (for
        consumers that hand records on later, like ``.batch()``). Such a consumer may count
        lazily: ``report_consumed()`` is called whenever :meth:`state_dict` is about to
        describe the position (also when asked on this dataset, not on the consumer), and
        makes its outstanding :meth:`mark_consumed` calls; ``handed_out()`` says, without side
        effects, how many records it has handed out in this iteration (for :attr:`stats`).
        """
        cursor, resume = self._begin()
        self._report_consumed = None if auto_consume else report_consumed
        self._handed_out = None if auto_consume else handed_out
        ledger = None if auto_consume else Consumption(Reported(cursor))
        self._ledger = ledger
        async with owning(self._pieces(resume, in_place=in_place)) as pieces:
            async for records, events in pieces:
                if ledger is None:
                    cursor.take(records, events)
                else:
                    ledger.add((records, events))
                if records:
                    yield records
        if ledger is None:
            self._end(cursor)
        else:
            ledger.end(partial(self._end, cursor))

    def mark_consumed(self, n: int) -> None:
        """``n`` more records from ``record_chunks(auto_consume=False)`` reached the consumer
        (in order); :meth:`state_dict` then counts them."""
        if self._ledger is not None:  # (None: an iteration set_epoch/load_state_dict ended)
            self._ledger.consume(n)

    def __getstate__(self) -> dict[str, Any]:
        # pickled into DataLoader workers: configuration and position, never records in hand
        state = dict(self.__dict__)
        state["_report_consumed"] = state["_handed_out"] = state["_ledger"] = None
        state.pop("_plan", None)
        if self._cursor is not None and not self._finished:
            state["_resume"], state["_cursor"] = self._position(), None
            state["_handed_before"] = self.stats.records
        return state

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:
        cursor, resume = self._begin()
        async with owning(self._pieces(resume)) as pieces:
            async for records, events in pieces:
                it = iter(records)
                cursor.take(records, events, it)
                for record in it:
                    yield record
        self._end(cursor)

    def __iter__(self) -> Iterator[bytes]:
        return Chained.from_iterable(self._record_lists())

    def _record_lists(self) -> Generator[Iterator[bytes], None, None]:
        """The iterators over each piece's records (see :class:`Chained`)."""
        cursor, resume = self._begin()
        # one piece ahead of the consumer's: two record lists, as the README's memory bound
        # counts; not an indexed read's (its chunks are a third of the budget each: +33 %)
        iterate = iterate_blocking if self.options.indexed else iterate_ahead
        pieces = iterate(lambda: owned(self._pieces(resume, timed=False)), self._add_wait)
        for records, events in pieces:
            it = iter(records)
            cursor.take(records, events, it)
            yield it  # (asked again once it is used up: the piece's last record handed out)
            cursor.settle()  # this piece is done: neither the cursor nor we keep it alive
            del records, events, it  # beside the next two, made while we wait for them
        self._end(cursor)

    def record_views(self) -> RecordViews:
        """The payloads as read-only ``memoryview`` objects into the pieces read, no copy (``for``
        or ``async for``): use each before the next chunk; one kept holds its piece, counted
        in ``prefetch_bytes``. See :mod:`streamrec.pipeline.stream.views`."""
        steps = (self._begin, self._pieces, self._end, self._add_wait)
        return RecordViews(ViewSource(*steps, blocking=self.options.indexed))

    def __repr__(self) -> str:
        return f"Dataset({[redact(u) for u in self.urls]!r}, compression={self.compression!r})"

    # ------------------------------------------------------------------ record counts

    async def count_records(self) -> RecordCounts:
        """How many records, without reading the shards: ``total`` in every shard listed
        (:attr:`num_records`) and ``consumer``, what this consumer reads in the current epoch
        (``len(ds)``). Counts come from manifests, else index sidecars (``streamrec index``);
        :class:`~streamrec.errors.RecordCountUnknownError` if a shard has neither. Listed
        once and kept, known or not (see :mod:`streamrec.pipeline.listing.lengths`)."""
        counts = self._known_counts()
        if counts is None:
            counts = self._counts = await list_counts(self.urls, self.options, self._stats)
        return count_for(counts, self.options, self.epoch)

    def _known_counts(self) -> ShardCounts | None:
        counts: ShardCounts | None = getattr(self, "_counts", None)
        return counts if counts and counts.key == counts_key(self.urls, self.options) else None

    def _keep_counts(self, counts: ShardCounts) -> None:
        known = self._known_counts()
        if known is None or known.unknown is not None:
            self._counts = counts  # a record table's: len(ds) needs no listing now

    def _count_blocking(self) -> RecordCounts:
        counts = self._known_counts()
        if counts is None:
            with EventLoopThread("streamrec-count") as portal:
                return portal.call(self.count_records())
        return count_for(counts, self.options, self.epoch)  # kept: no I/O, no loop thread

    @property
    def num_records(self) -> int:
        """Records in every shard listed, before any host or worker split (blocking
        :meth:`count_records`)."""
        return self._count_blocking().total

    def __len__(self) -> int:
        """Records this consumer reads in one epoch: its host's share (``num_hosts``), its
        DataLoader worker's share within a worker; with ``shuffle_shards`` the share depends on
        the epoch. Records stored, whatever was consumed (a resumed epoch yields fewer,
        ``on_corrupt="skip"`` drops damaged ones). Blocking :meth:`count_records`; raises
        :class:`~streamrec.errors.RecordCountUnknownError` (a ``TypeError``: ``list(ds)``, which
        asks for a length first, then just reads; its listing costs one per dataset)."""
        return self._count_blocking().consumer

    # ------------------------------------------------------------------ random access

    def get(self, indices: Indices) -> list[bytes]:
        """The records at ``indices`` (blocking; from plain code, threads and DataLoader
        workers), in the order asked, duplicates included: index ``i`` is the ``i``-th record
        of all shards the urls list, in listing order (as :attr:`num_records` counts them),
        whatever the host or worker split, shuffle or epoch; negative ones count from the
        end. Neighbouring records share one range read; reads run ``max_concurrency`` at
        once within ``prefetch_bytes``; CRCs are checked. Batch indices into one call: a call
        costs about one round trip. Needs every shard's index
        (:class:`~streamrec.errors.RandomAccessUnavailableError` names what to run);
        IndexError out of range. See :mod:`streamrec.pipeline.indexed.lookup`."""
        return self._lookup_of().get(indices, self._known_counts(), self._keep_counts)

    async def aget(self, indices: Indices) -> list[bytes]:
        """:meth:`get` for async code: the reads run on the dataset's loop thread, so they
        never block the caller's loop."""
        return await self._lookup_of().aget(indices, self._known_counts(), self._keep_counts)

    def _lookup_of(self) -> RecordLookup:
        lookup: RecordLookup | None = getattr(self, "_lookup", None)
        if lookup is None or lookup.key != counts_key(self.urls, self.options):
            lookup = self._lookup = RecordLookup(self.urls, self.options, self._stats)
        return lookup

    def close(self) -> None:
        """End :meth:`get`'s loop thread and connections (also done when the dataset is
        garbage-collected, or at exit), and wait for the start-up work ``open_dataset``
        began (:mod:`streamrec.storage.warmup`); the dataset stays usable. Iterations hold
        nothing."""
        warmup.wait()
        lookup: RecordLookup | None = getattr(self, "_lookup", None)
        if lookup is not None:
            lookup.close()


def open_dataset(
    urls: PathOrUrls,
    compression: str | None = "auto",
    verify_crc: bool = True,
    on_corrupt: OnCorrupt = "raise",
    *,
    cycle_length: int = 1,
    block_length: int = 1,
    deterministic: bool = True,
    shuffle_shards: bool = False,
    shuffle_buffer: int = 0,
    seed: int = 0,
    num_hosts: int = 1,
    host_index: int = 0,
    prefetch_bytes: int = 64 << 20,
    storage_options: dict[str, Any] | None = None,
    block_bytes: int | None = None,
    max_concurrency: int | None = None,
    retry: RetryPolicy | None = None,
    allow_absolute_urls: bool = False,
    shuffle: Literal["global", "block"] | None = None,
    even: bool | Literal["drop", "pad"] | None = None,
    window_records: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_bytes: int | None = None,
    max_read_amplification: float | None = DEFAULT_MAX_READ_AMPLIFICATION,
    stats_interval_s: float | None = None,
) -> Dataset:
    """Open TFRecord shards for reading.

    Args:
        urls: a path (``str`` or ``pathlib.Path``), a glob (expanded and sorted by name, like
            ``tf.io.gfile.glob``; ``**`` at any depth; names starting with ``_`` or ``.``
            skipped), a writer's manifest (a url ending in ``.json``: its shards, in index
            order), a directory or prefix (its ``_manifest.json``, else its files), or a list
            of them (read in the order given); see :mod:`streamrec.pipeline.listing.urls`.
        compression: ``"auto"`` (by suffix ``.gz``/``.gzip``/``.zlib``/``.zz``, else as the
            manifest states, else by the first bytes), ``None``, ``"gzip"`` or ``"zlib"``
            (TF's ``"GZIP"``/``"ZLIB"``/``""`` spellings work too).
        verify_crc: check both masked CRC32Cs of every record (cheap: keep it on).
        on_corrupt: ``"raise"`` yields every good record before the damage, then raises a
            :class:`~streamrec.errors.FormatError`; ``"skip"`` drops a record with a bad
            payload CRC, or the rest of a file whose framing is broken, logs a warning with the
            file and offset, and counts it in ``stats.corrupt_skipped``.
        cycle_length, block_length: read ``cycle_length`` shards at once, ``block_length``
            records from each in turn, in exactly tf.data's ``interleave`` order when
            ``deterministic``; otherwise records come from whichever open shard has them
            first (one slow shard never stalls the rest; each record still comes once).
        shuffle_shards: reorder shards by ``(seed, epoch)`` (see ``Dataset.set_epoch``).
        shuffle_buffer: records pass a seeded shuffle buffer of this many (tf.data's
            semantics); 0 for none.
        seed: seed of both shuffles; the same seed and epoch give the same order anywhere.
        num_hosts, host_index: this process's share of the shards (``shards[host_index::
            num_hosts]``); PyTorch DataLoader workers split a host's share again. With
            fewer shards than consumers, every n-th record of each shard instead (a warning
            says so: each consumer then reads every shard).
        prefetch_bytes: the hard bound on bytes read ahead and not yet decoded, all shards
            together (plus at most one block). With ``cycle_length`` > 1 each open shard is
            kept an equal share of it (deterministic mode: ``prefetch_bytes / (1.25 x
            cycle_length)``, the rest for the next ``cycle_length`` shards read ahead),
            and may use room no other shard needs.
        storage_options: passed to the fsspec filesystem (``endpoint_url`` via
            ``client_kwargs`` for s3fs, ``token``, ``key``/``secret``, ``anon``, ...); one
            mapping for every scheme, or one per scheme for lists that mix them:
            ``{"s3": {...}, "gs": {...}, "https": {...}}`` (each store gets its own only).
        block_bytes: size of one range read (a shard's first is 256 KiB, doubling up to
            this; interleaved shards use at most a quarter of their share). None: 4 MiB, tuned.
        max_concurrency: range reads in flight per shard, at most (the prefetch budget
            binds too: 64 MiB / 4 MiB blocks = 16; local files: 4). None: 16, both tuned to
            the link (:mod:`~.stream.tune`, ``ds.stats.settings``). Reading one shard at a
            time, up to ``2 x max_concurrency - 1`` shards are opened ahead of their turn
            (their first blocks, within a quarter of ``prefetch_bytes``; local files: the
            next one only), so that small shards' round trips overlap.
        retry: the :class:`~streamrec.storage.retry.RetryPolicy` for every storage request
            (attempts, backoff, per-attempt timeout, overall deadline).
        allow_absolute_urls: follow a manifest's shard names that are absolute urls or paths
            outside its directory (any scheme, host or bucket, read with your credentials).
            Off by default: such a name is a FormatError. Turn it on only for manifests you
            trust. Shards are checked against the manifest (size, and ETag / generation as
            committed): one replaced since is an ObjectChangedError.
        shuffle: read records by index (every shard needs an index sidecar: ``open_writer(...,
            index=True)``, ``streamrec reshard --index`` or ``streamrec index``) in an order
            of ``(seed, epoch)``: ``"global"``, a permutation of all records (one range read
            per record: fine for large records); ``"block"``, windows of ``window_records``
            consecutive records (default: 1 MiB to ``block_bytes`` of them) permuted, then mixed
            ``shuffle_buffer`` records at a time (default: up to 16 windows, within a third of
            ``prefetch_bytes``): the link stays busy with small records. Consumers (hosts x
            DataLoader workers) read contiguous parts of the epoch's order, and their states
            merge (``streamrec.merge_states``) so that any number of consumers continue.
        even: every consumer reads exactly as many records per epoch (no DDP rank runs out
            early): ``"drop"`` leaves the remainder out, ``"pad"`` (or True) wraps short parts
            around; reads by index like ``shuffle`` (unshuffled when ``shuffle`` is None).
        window_records: ``shuffle="block"``'s window (records read together).
        cache_dir, cache_bytes: copies of remote shards kept in ``cache_dir`` (at most
            ``cache_bytes``, least recently used evicted), written as they stream; later epochs
            and processes of this host read them (CRCs checked): :mod:`~.storage.cache.store`.
        max_read_amplification: reads by index (``shuffle``, ``even``, ``ds.get()``) take
            neighbouring records in one range read only while the bytes fetched stay within
            this many times the bytes of the records wanted (default 2; ``None``: any
            neighbour within 256 KiB). Sparse small records are then read one request each:
            raise it where requests cost more than bytes. ``ds.stats.bytes_fetched`` shows
            what storage sent beside ``bytes_read``.
        stats_interval_s: while the dataset is iterated, log ``ds.stats`` as one line of JSON
            (logger ``streamrec.stats``, level INFO) at most every this many seconds, and once
            more when an iteration ends; None (default): never. ``ds.stats.report()`` says
            where the time went.

    A bad argument (type or range) is an :class:`~streamrec.errors.ArgumentError` naming it.

    Urls may be local paths, ``file://``, ``s3://``, ``gs://``, ``http(s)://`` or
    ``memory://``. For ``s3://`` the S3 client's set-up starts now, in the background
    (:mod:`streamrec.storage.warmup`): time spent before the first record hides it.

    Returns:
        A :class:`Dataset`: iterate it with ``async for`` or ``for``.
    """
    return Dataset(
        urls,
        ReadOptions(
            compression=compression,
            verify_crc=verify_crc,
            on_corrupt=on_corrupt,
            prefetch_bytes=prefetch_bytes,
            **read_ahead(block_bytes, max_concurrency),
            retry=retry or RetryPolicy(),
            storage_options=storage_options,
            cycle_length=cycle_length,
            block_length=block_length,
            deterministic=deterministic,
            shuffle_shards=shuffle_shards,
            shuffle_buffer=shuffle_buffer,
            seed=seed,
            num_hosts=num_hosts,
            host_index=host_index,
            allow_absolute_urls=allow_absolute_urls,
            shuffle=shuffle,
            even=even,
            window_records=window_records,
            cache_dir=None if cache_dir is None else check_url(cache_dir, "cache_dir"),
            cache_bytes=cache_bytes,
            max_read_amplification=max_read_amplification,
            stats_interval_s=stats_interval_s,
        ),
    )
