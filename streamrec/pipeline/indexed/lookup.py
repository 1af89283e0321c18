"""Records by their index in a dataset: ``ds.get(indices)`` and ``await ds.aget(indices)``.

**Numbering.** The records of every shard the urls stand for are numbered ``0 .. N-1``, shard
by shard in listing order (the shards and the order that ``ds.num_records`` counts), each
shard's in file order. The numbers do not depend on the host or DataLoader worker split, the
shard shuffle, the record shuffle or the epoch: ``ds.get([i])`` is the same record in every
process. Negative numbers count from the end, as in a Python sequence.

**The table.** The first call lists the shards (unless ``len(ds)`` / ``ds.num_records`` did:
their :class:`~streamrec.pipeline.listing.lengths.ShardCounts` keep the listing) and loads every
shard's index sidecar (:mod:`streamrec.pipeline.listing.sidecars`) into a
:class:`~streamrec.pipeline.indexed.table.RecordTable`, kept on the dataset (and pickled with
it into DataLoader workers, which then list nothing); its counts become ``len(ds)``'s when
those were not known. It holds 16 bytes a record (32 for a compressed shard). Every shard
needs an index with random access (an uncompressed shard's from ``streamrec index``, a
GZIP/ZLIB shard's from a writer with ``index=True``): else
:class:`~streamrec.errors.RandomAccessUnavailableError` on the first call, naming a shard and
what indexes it (not kept: index the shards and call again). A manifest count that disagrees
with the index is an :class:`~streamrec.errors.IndexMismatchError`.

**Reading.** :func:`~streamrec.pipeline.indexed.table.read_records`: neighbouring records
share one range read, reads of up to ``block_bytes`` (and at most ``prefetch_bytes``), at most
``max_concurrency`` in flight, every byte reserved in one ``prefetch_bytes`` budget before it
is requested, retried per ``retry`` (counted in ``stats.retries``), every CRC checked
(``verify_crc``; ``on_corrupt`` does not apply: a damaged record is an error, never skipped).
Every shard is pinned while read (:func:`pin_shards`): a local shard replaced meanwhile (an atomic
rename) is read as the dataset first saw it, or is an
:class:`~streamrec.errors.ObjectChangedError` naming it, never records of two versions.
A record is read only from a boundary verified against the shard's own framing
(:mod:`streamrec.pipeline.indexed.trust`: the first call into a shard reads the length fields of its
records before the one asked for, or a compressed shard whole; kept per dataset).

**The session.** Calls run in one event-loop thread per dataset and process (an
:class:`~streamrec._portal.EventLoopThread`), started by the first call and kept, with its
connections, so a call costs its range reads and no connection set-up; concurrent calls
(threads, tasks) share its budget and its ``max_concurrency``. ``aget`` awaits the same loop
from the caller's (neither the reads nor the decoding block it). The session ends with
``ds.close()``, when the dataset is garbage-collected, or at exit. A forked child (a
DataLoader worker) never touches its parent's session (it starts its own on its first call),
and a pickled dataset carries none.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy.typing as npt

from streamrec._portal import EventLoopThread
from streamrec.pipeline.budget import BudgetPlan
from streamrec.pipeline.indexed.table import RecordTable, as_indices, build_table, read_records
from streamrec.pipeline.indexed.trust import BoundaryTrust
from streamrec.pipeline.listing.lengths import ShardCounts, counts_key
from streamrec.pipeline.options import ReadOptions
from streamrec.pipeline.stats import Stats
from streamrec.storage.local.store import FileVersions, LocalStore, note_versions
from streamrec.storage.registry import StoreSet
from streamrec.storage.timing import recorded

__all__ = ["RecordLookup", "pin_shards"]

Indices = Sequence[int] | npt.ArrayLike
OnTable = Callable[[ShardCounts], None]

# Sessions a fork copied into this process: kept referenced, never used or closed (their
# thread does not exist here, their sockets are the parent's).
_INHERITED: list[_Session] = []


class _Session:
    """The loop thread, stores, budget and concurrency gate that one dataset's calls share
    in one process (see the module docstring)."""

    def __init__(self, options: ReadOptions) -> None:
        self.pid = os.getpid()
        self.portal = EventLoopThread("streamrec-get")
        self.stores = StoreSet(options.storage_options, options.max_concurrency)
        self.budget_plan = BudgetPlan(options)  # get()'s own budget and reads
        self.budget = self.budget_plan.budget
        self.gate = asyncio.Semaphore(options.max_concurrency)
        self.building = asyncio.Lock()  # one table build at a time
        self.pinned: RecordTable | None = None  # the table whose shards the stores pin
        self._closing = threading.Lock()
        self.finalizer: weakref.finalize[Any, Any] | None = None

    @property
    def usable(self) -> bool:
        return self.pid == os.getpid() and not self.portal.closed

    def close(self) -> None:
        """Close the stores and join the thread (nothing in a forked child; from the loop's
        own thread, on another thread)."""
        if self.pid != os.getpid():
            return
        if self.portal.is_current():  # a garbage collection that ran in the loop's thread
            threading.Thread(target=self.close, name="streamrec-get-close", daemon=True).start()
            return
        with self._closing:
            if self.portal.closed:
                return
            try:
                self.portal.call(_close(self.stores))
            finally:
                self.portal.close()


async def pin_shards(table: RecordTable, stores: StoreSet, versions: FileVersions) -> None:
    """Pin every shard of ``table`` in ``stores`` until they close (``ObjectStore.pin``).
    Remote reads are pinned to the listed version already; a local shard's reads must find
    the file noted in ``versions`` (the dataset's: noted when its table was first pinned), so
    a shard replaced meanwhile (an atomic rename by a writer or a reshard) is read as it was
    while a descriptor is open, else is an ObjectChangedError naming it: never two versions'
    records, and never records the index was not checked against."""
    local = []
    for shard in table.shards:
        store = stores.get(shard.url)
        if isinstance(store, LocalStore):
            store.pin(shard, versions)
            local.append(shard)
        else:
            store.pin(shard)
    if local:
        await asyncio.to_thread(note_versions, local, versions)


async def _close(stores: StoreSet) -> None:
    await stores.__aexit__(None, None, None)


class RecordLookup:
    """One dataset's random access: its record table and its session (see the module
    docstring). ``listed``: the dataset's kept counts, if any; ``on_table``: called with the
    counts of a newly built table."""

    def __init__(self, urls: Sequence[str], options: ReadOptions, stats: Stats) -> None:
        self.urls = list(urls)
        self.options = options
        self.stats = stats
        # what is verified of the shards' indexes (pipeline/indexed/trust.py): this dataset's, for
        # get() and every epoch of its indexed reading (Dataset passes it on)
        self.trust = BoundaryTrust()
        # the local shards as first seen (pin_shards): this dataset's, for get() and every
        # epoch (Dataset passes it on), pickled into DataLoader workers
        self.versions: FileVersions = {}
        self.key = counts_key(urls, options)
        self.table: RecordTable | None = None
        self._session: _Session | None = None
        self._guard = threading.Lock()

    def get(self, indices: Indices, listed: ShardCounts | None, on_table: OnTable) -> list[bytes]:
        """The records at ``indices``, blocking."""
        wanted = as_indices(indices)  # a TypeError before any thread starts
        session = self._session_here()
        return session.portal.call(
            recorded(self.stats, self._read(session, wanted, listed, on_table))
        )

    async def aget(
        self, indices: Indices, listed: ShardCounts | None, on_table: OnTable
    ) -> list[bytes]:
        """The records at ``indices``, awaited from the caller's loop."""
        wanted = as_indices(indices)
        session = self._session_here()
        reading = recorded(self.stats, self._read(session, wanted, listed, on_table))
        return await session.portal.run(reading)

    def _session_here(self) -> _Session:
        with self._guard:
            session = self._session
            if session is not None and session.usable:
                return session
            if session is not None and session.pid != os.getpid():
                _INHERITED.append(session)  # a fork's copy: see _INHERITED
            session = self._session = _Session(self.options)
            session.finalizer = weakref.finalize(self, session.close)
            return session

    async def _read(
        self,
        session: _Session,
        indices: npt.NDArray[Any],
        listed: ShardCounts | None,
        on_table: OnTable,
    ) -> list[bytes]:
        table = self.table
        if table is None:
            async with session.building:
                table = self.table
                if table is None:
                    shards = listed.shards if listed is not None and listed.shards else None
                    stores, stats = session.stores, self.stats
                    table = await build_table(
                        self.urls, self.options, stats, stores, shards, self.trust
                    )
                    self.table = table
                    on_table(ShardCounts(self.key, table.counts(), shards=tuple(table.shards)))
        if session.pinned is not table:  # (see pin_shards)
            session.pinned = table
            await pin_shards(table, session.stores, self.versions)
        options = self.options
        try:
            return await read_records(
                table,
                indices,
                store_of=session.stores.get,
                budget=session.budget,
                policy=options.retry,
                max_concurrency=options.max_concurrency,
                gate=session.gate,
                span_bytes=session.budget_plan.lookup_span_bytes,
                verify_crc=options.verify_crc,
                max_amplification=options.max_read_amplification,
                stats=self.stats,
                on_retry=self._count_retry,
            )
        finally:
            peak = max(self.stats.peak_prefetch_bytes, session.budget.peak)
            self.stats.peak_prefetch_bytes = peak

    def _count_retry(self, _: Exception) -> None:
        self.stats.retries += 1

    def keep(self, table: RecordTable, *, on_counts: OnTable) -> None:
        """Keep ``table`` (built by an indexed epoch) for ``get()`` and later epochs."""
        if self.table is None:
            self.table = table
            on_counts(ShardCounts(self.key, table.counts(), shards=tuple(table.shards)))

    def close(self) -> None:
        """End the session (a later call starts a new one); the table is kept."""
        with self._guard:
            session, self._session = self._session, None
        if session is None:
            return
        if session.finalizer is not None:
            if session.pid != os.getpid():
                session.finalizer.detach()
                _INHERITED.append(session)
                return
            session.finalizer()  # closes it, once

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_session"] = None  # a pickled copy starts its own
        del state["_guard"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("versions", {})  # (pickled by an earlier version)
        self.__dict__.update(state)
        self._guard = threading.Lock()
