"""Indexed reading: one epoch as a fixed order of record numbers, read by coalesced range reads.

Used when ``shuffle="global"`` or ``"block"`` or ``even`` is set (every shard needs an index
sidecar: records are read by position). One iteration:

1. list the shards and load their indexes (the dataset index,
   :mod:`~streamrec.pipeline.listing.dataset_index`, else the sidecars,
   :mod:`~streamrec.pipeline.listing.sidecars`) into a
   :class:`~streamrec.pipeline.indexed.table.RecordTable`, or take the dataset's (kept from
   an earlier epoch, a resume or ``get()``: listed and loaded once per process);
2. the epoch's order (:class:`~streamrec.pipeline.order.EpochOrder`) and this consumer's part
   of the positions still to read (:func:`~streamrec.pipeline.order.part_of`: hosts x
   DataLoader workers, ``even`` drop/pad), from the resume state or the start;
3. positions in *chunks* (at most a third of ``prefetch_bytes`` of records each, as the
   :class:`~streamrec.pipeline.budget.BudgetPlan` says, the first ones smaller: 8 records,
   doubling, so that the first record waits for a small chunk's reads; cut by the index's
   record lengths, so skewed sizes keep the bound; a record larger than that is a chunk
   alone; in block mode whole runs of ``mix`` positions where they fit): each chunk's records
   read with :func:`~streamrec.pipeline.indexed.table.read_records` while the one before is
   consumed (the second once the first is read: no read-ahead before the first record). A
   chunk *holds* its bytes in the budget (:meth:`ByteBudget.hold
   <streamrec.pipeline.budget.ByteBudget.hold>`: its framed bytes and
   :data:`RECORD_COST_BYTES` a record) from before its reads until the consumer asks for the
   next piece, chunks in reading order, beside the reads in flight (their bytes, gaps
   included: a span's read and its decoded records are alive at once while it is decoded). So
   what the consumer has, what is decoded and what is in flight stay within
   ``prefetch_bytes``, but for one read granted alone when no other is in flight (a record
   larger than the budget: its read and its copy); a next chunk that does not fit waits for
   the consumer (issue 29 B.9: 4 MiB records under an 8 MiB budget held three chunks and
   their copies, 5.4x). The reads of all chunks share one gate of ``max_concurrency``
   slots, first come first served: the next chunk's reads take slots as the current chunk's
   free them, and no more reads are in flight than one chunk would have. Every shard is
   pinned for the iteration (:func:`~streamrec.pipeline.indexed.lookup.pin_shards`).
   Pieces carry :class:`~streamrec.pipeline.position.events.Begin` /
   :class:`~streamrec.pipeline.position.events.Advance` events, so the consumer's state is one
   number.

Block mode's window (records read by one range read, when ``window_records`` is not given),
chosen from the record size and the link by :func:`window_records`: a sixteenth of a chunk
(so that a run mixes 16 windows), but at least :data:`MIN_WINDOW_BYTES` of records (a range
read must carry many times what a request costs on a cloud link) and at most one
``block_bytes`` read. The link is assumed, not measured (see :data:`MIN_WINDOW_BYTES`).

Read-ahead tuning (:mod:`streamrec.pipeline.stream.tune`) fits here only in part. The block
size does not apply: a range read covers the records a chunk wants from one shard, coalesced
(gaps up to ``gap_bytes``, within ``max_read_amplification``) up to ``block_bytes``: one
record in global shuffle, a window in block shuffle; cutting those spans smaller would only
add requests, and their sizes are the order's, not a free choice. Nor does the measuring
tuner: a span's bytes vary with the order (global shuffle's single records are far below the
128 KiB a rate needs), so its trials (more reads, kept only if the next window pulls more)
would compare windows of different work; and the reads' gate is sized once per iteration.
What it uses instead: where ``max_concurrency`` is not given, block shuffle and ``even``'s
sequential chunks size the gate, once per iteration, from the store's memory
(:data:`~streamrec.pipeline.stream.tune.LINKS`, filled by streaming reads of the same store
in the process): as many reads of a span as carry the bytes in flight those reads verified,
never fewer than the default 16, at most 32, and above 16 within a chunk's bytes
(:func:`~streamrec.pipeline.stream.tune.indexed_concurrency`; ``ds.stats.settings``'s
``tuned`` is 2); global shuffle keeps its 64 single-record reads. The budget binds as before:
every read reserves its bytes, whatever the gate.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass

import numpy as np

from streamrec._portal import cancel_and_wait, owned_generator
from streamrec.errors import StateError
from streamrec.pipeline.budget import BudgetPlan, ByteBudget
from streamrec.pipeline.indexed.lookup import pin_shards
from streamrec.pipeline.indexed.table import Int64Array, RecordTable, build_table, read_records
from streamrec.pipeline.indexed.trust import BoundaryTrust
from streamrec.pipeline.listing.plan import (
    dataloader_worker,
    indexed_digest_v1,
    shards_digest,
    shards_digest_v2,
)
from streamrec.pipeline.listing.urls import list_shards
from streamrec.pipeline.options import ReadOptions
from streamrec.pipeline.order import EpochOrder, Intervals, Part, part_of
from streamrec.pipeline.position.events import Advance, Begin, Event, Piece
from streamrec.pipeline.position.state import DatasetState, IndexedState
from streamrec.pipeline.position.trackers import Where
from streamrec.pipeline.stats import Stats
from streamrec.pipeline.stream.tune import LINKS, indexed_concurrency, link_key
from streamrec.storage.base import ObjectInfo
from streamrec.storage.local.store import FileVersions
from streamrec.storage.registry import StoreSet

__all__ = ["IndexedEngine", "window_records"]

_NONE: Int64Array = np.zeros(0, dtype=np.int64)
_GLOBAL_CONCURRENCY = 64  # single-record GETs in flight (global shuffle): a link's worth
MIN_WINDOW_BYTES = 1 << 20
"""The smallest default window of block shuffle. A request on a cloud link costs about a round
trip (30-100 ms) of one connection's rate (25-100 MB/s): roughly 1-5 MB, the bytes it could
have carried meanwhile. ``max_concurrency`` reads in flight hide that cost only while each
carries a good part of it: at 1 MiB and 16 reads in flight a 60 ms, 25 MB/s-per-connection
link stays full (benchmarks/README.md, "Shuffled reading")."""
_MIX_WINDOWS = 16  # block mode's default run: at most this many windows
_FIRST_CHUNK_BYTES = 256 << 10
_FIRST_CHUNK_RECORDS = 8
"""The first read chunk holds at most this many records of the mean size and 256 KiB; each
next one twice the one before, up to the plan's ``chunk_bytes``: a shard's first read
verifies its index up to the record wanted (pipeline/indexed/trust.py), so a global shuffle's
first record waits for a few shards' checks, not every shard's; and a job of many consumers
sends few requests before each has its first record (issue 31: at most 20 each)."""
RECORD_COST_BYTES = 64
"""What a record read by index costs beyond its framed bytes while its chunk is held: its
``bytes`` object's header and its slots in the chunk's lists and position arrays (100,000
empty records are ~6 MiB, not 1.6)."""
_PIECES_LOCATED = 64  # pieces whose records where() finds (more than are ever pending)


@dataclass(frozen=True)
class _Plan:
    order: EpochOrder
    part: Part
    pool: Intervals
    begin: Begin
    mean_bytes: float  # framed bytes of a record, on average


def mean_record_bytes(table: RecordTable) -> float:
    return max(table.framed_bytes / max(len(table), 1), 1.0)


def window_records(options: ReadOptions, budget_plan: BudgetPlan, mean_bytes: float) -> int:
    """Block shuffle's window: ``options.window_records``, else chosen from the record size
    and the link (see the module docstring): a sixteenth of a chunk's records, but at least
    :data:`MIN_WINDOW_BYTES` of them and at most one read (``block_bytes``); one at least."""
    if options.window_records:
        return options.window_records
    low = max(1, int(MIN_WINDOW_BYTES // mean_bytes))
    high = max(1, int(options.block_bytes // mean_bytes))
    return min(high, max(low, budget_plan.chunk_records(mean_bytes) // _MIX_WINDOWS))


class IndexedEngine:
    """Reads this consumer's part of an indexed epoch (see the module docstring)."""

    def __init__(
        self,
        urls: Sequence[str],
        options: ReadOptions,
        epoch: int,
        stats: Stats,
        trust: BoundaryTrust | None = None,
        table: RecordTable | None = None,
        on_table: Callable[[RecordTable], None] | None = None,
        listed: Sequence[ObjectInfo] = (),
        versions: FileVersions | None = None,
    ):
        self.urls = list(urls)
        self.options = options
        self.epoch = epoch
        self.stats = stats
        self.trust = trust  # what is verified of the indexes (the dataset's, across epochs)
        self.kept_table = table
        """The dataset's table from an earlier epoch, resume or ``get()``: no listing, no
        index read again (else one is built, and handed to ``on_table``)."""
        self.on_table = on_table
        self.listed = listed
        """The shards as the dataset listed them already (``len()``): not listed again."""
        self.versions: FileVersions = {} if versions is None else versions
        """The local shards as first seen (the dataset's: see pin_shards)."""
        self.budget_plan = BudgetPlan(options)
        """How this iteration spends its prefetch budget (the budget, the read chunks)."""
        self._table: RecordTable | None = None
        # the record ids of the last pieces made, by the id() of their record list (lists
        # cannot be weakly referenced; a list not made here is never looked up: see where)
        self._ids: OrderedDict[int, Int64Array] = OrderedDict()

    def _count_retry(self, error: Exception) -> None:
        self.stats.retries += 1

    def where(self, pending: Sequence[Piece], payload: object) -> Where | None:
        """Where ``payload`` (the very object), a record of the ``pending`` pieces this engine
        made, comes from: its shard's url, index in it and byte offset."""
        table = self._table
        if table is None:
            return None
        for records, _ in pending:
            ids = self._ids.get(id(records))
            if ids is None:
                continue
            for k, record in enumerate(records):
                if record is payload:
                    ordinals, local = table.locate(ids[k : k + 1])
                    ordinal, index = int(ordinals[0]), int(local[0])
                    offset = int(table.indexes[ordinal].offsets[index])
                    return table.shards[ordinal].url, index, offset
        return None

    def _plan(self, table: RecordTable, resume: IndexedState | None) -> _Plan:
        options = self.options
        workers, worker = dataloader_worker()
        consumers = options.num_hosts * workers
        consumer = options.host_index * workers + worker
        records = len(table)
        pool: Intervals = [(0, records)] if records else []
        taken = 0
        if resume is not None:
            if resume.records != records:
                raise StateError(
                    f"the state was saved over {resume.records} records; the shards now hold "
                    f"{records}: it cannot resume here"
                )
            pool = list(resume.remaining)
            if resume.consumers:
                if (resume.consumers, resume.consumer) != (consumers, consumer):
                    raise StateError(
                        f"this state belongs to consumer {resume.consumer} of "
                        f"{resume.consumers}; this is consumer {consumer} of {consumers} "
                        "(hosts x DataLoader workers). To continue with other consumers, merge "
                        "the states of all of them with streamrec.merge_states(states) and "
                        "load the merged state into every new consumer"
                    )
                taken = resume.taken
        even = options.even_mode
        part = part_of(pool, consumers, consumer, even)
        kind = options.shuffle or "none"
        window, mix = 1, 1
        mean = mean_record_bytes(table)
        if kind == "block":
            window = window_records(options, self.budget_plan, mean)
            mix = options.shuffle_buffer or max(
                window, min(_MIX_WINDOWS * window, self.budget_plan.chunk_records(mean))
            )
        order = EpochOrder(records, kind, options.seed, self.epoch, window, mix)
        begin = Begin(records, consumers, consumer, tuple(pool), taken)
        return _Plan(order, part, pool, begin, mean)

    @owned_generator
    async def pieces(
        self,
        resume: DatasetState | None,
        *,
        on_planned: Callable[[str], None] | None = None,
        timed: bool = True,
    ) -> AsyncGenerator[Piece, None]:
        """This consumer's records of the epoch, in pieces, from ``resume`` or the start.
        ``timed``: add the time waited for each piece to ``stats.wait_s`` (off where the
        consumer's own thread measures its wait: the blocking ``for``)."""
        options = self.options
        budget = self.budget_plan.budget
        async with StoreSet(options.storage_options, options.max_concurrency * 4) as stores:
            try:
                table = self.kept_table
                if table is None:
                    shards = list(self.listed) or await list_shards(
                        self.urls, options, stores.get, self.stats
                    )
                    table = await build_table(
                        self.urls, options, self.stats, stores, shards, self.trust
                    )
                    if self.on_table is not None:
                        self.on_table(table)
                self._table = table
                await pin_shards(table, stores, self.versions)
                digest = shards_digest(table.shards, table.counts())
                if (
                    resume is not None
                    and resume.shards not in (None, digest)
                    and all(
                        resume.shards != older(table.shards, table.counts())
                        for older in (
                            shards_digest_v2,
                            indexed_digest_v1,
                        )  # earlier versions' states
                    )
                ):
                    raise StateError(
                        "the state was saved over different shards (other files, sizes or "
                        "versions); it cannot resume here"
                    )
                if on_planned is not None:
                    on_planned(digest)
                start = resume.read if resume is not None else None
                assert start is None or isinstance(start, IndexedState)
                plan = self._plan(table, start)
                # closed here, before the stores: an Owned generator dropped open is closed
                # by the garbage collector, synchronously ("ignored GeneratorExit")
                async with aclosing(self._read(table, plan, stores, budget)) as pieces:
                    waited = time.monotonic()
                    async for piece in pieces:
                        if timed:
                            self.stats.wait_s += time.monotonic() - waited
                        yield piece
                        waited = time.monotonic()
            finally:
                self.stats.peak_prefetch_bytes = max(self.stats.peak_prefetch_bytes, budget.peak)

    def _chunks(self, table: RecordTable, plan: _Plan) -> Iterator[tuple[Int64Array, int]]:
        """The records at the part's positions still to read, in reading order, cut into
        chunks of at most the plan's ``chunk_bytes`` framed bytes by the index's lengths
        (a record larger than that alone): a mean size says nothing of how the sizes are
        spread. In block mode a chunk is whole runs of ``mix`` positions where they fit.
        Positions are looked up a mean-sized chunk's worth at a time, and what one chunk
        did not take starts the next. A record counts :data:`RECORD_COST_BYTES` beyond its
        framed bytes (empty records are not free). With each chunk: the bytes it counts."""
        full = self.budget_plan.chunk_bytes
        mean = plan.mean_bytes + RECORD_COST_BYTES
        # the first chunks ramp up (doubling): the first record comes after a small chunk's
        # reads, not a full one's (in global shuffle one record per shard of thousands)
        limit = max(1, min(full, _FIRST_CHUNK_BYTES, int(_FIRST_CHUNK_RECORDS * mean)))
        mix = plan.order.mix if plan.order.shuffle == "block" else 1
        step = self.budget_plan.chunk_records(mean)
        position, end = plan.begin.taken, plan.part.length
        records, sizes = _NONE, _NONE
        while position < end or len(records):
            while int(sizes.sum()) <= limit and position < end:
                wanted = int(2 * limit / mean) + 1  # (the ramp's chunks: fewer)
                stop = min(position + min(step, wanted), end)
                more = plan.order.records_at(plan.part.positions(position, stop, plan.pool))
                records = np.concatenate((records, more))
                sizes = np.concatenate((sizes, table.lengths_of(more) + RECORD_COST_BYTES))
                position = stop
            total = np.cumsum(sizes)
            take = max(1, int(np.searchsorted(total, limit, side="right")))
            if mix < take < len(records):
                take = take // mix * mix
            yield records[:take], int(total[take - 1])
            records, sizes = records[take:], sizes[take:]
            limit = min(full, limit * 2)

    def _tuned_concurrency(self, table: RecordTable, plan: _Plan) -> int:
        """Reads in flight (none given) from what the store's streaming reads learned (see
        the module docstring): as many spans as carry the bytes in flight they verified,
        within a chunk, never fewer than the default; ``ds.stats.settings`` says so."""
        options = self.options
        learned = LINKS.get(link_key(table.shards[0].url, options.storage_options))
        span = options.block_bytes  # the longest coalesced read; block mode: its window's
        if plan.order.shuffle == "block":
            span = min(span, max(1, int(plan.order.window * plan.mean_bytes)))
        chunk = self.budget_plan.chunk_bytes
        concurrency = indexed_concurrency(learned, span, chunk, options.max_concurrency)
        if concurrency != options.max_concurrency:
            self.stats.settings.update(max_concurrency=concurrency, block_bytes=span, tuned=2)
        return concurrency

    @owned_generator
    async def _read(
        self, table: RecordTable, plan: _Plan, stores: StoreSet, budget: ByteBudget
    ) -> AsyncGenerator[Piece, None]:
        options = self.options
        concurrency = options.max_concurrency
        if plan.order.shuffle == "global":
            concurrency = max(concurrency, _GLOBAL_CONCURRENCY)
        elif options.tune_max_concurrency and table.shards:
            concurrency = self._tuned_concurrency(table, plan)
        gate = asyncio.Semaphore(concurrency)  # shared by the chunks' reads (module docstring)
        opened: set[int] = set()  # shards read from in this iteration, for stats.shards_opened

        held = 0  # bytes held in the budget for chunks read or being read, not yet consumed

        async def fetch(
            records: Int64Array, size: int, after: asyncio.Event | None, holding: asyncio.Event
        ) -> list[bytes]:
            nonlocal held
            if after is not None:  # the chunk before holds its room first (never starved)
                await after.wait()
            await budget.hold(size)
            held += size
            holding.set()
            touched = set(np.unique(table.locate(records)[0]).tolist()) - opened
            opened.update(touched)
            self.stats.shards_opened += len(touched)
            got = await read_records(
                table,
                records,
                store_of=stores.get,
                budget=budget,
                policy=options.retry,
                max_concurrency=concurrency,
                gate=gate,
                span_bytes=options.block_bytes,
                verify_crc=options.verify_crc,
                max_amplification=options.max_read_amplification,
                stats=self.stats,
                on_retry=self._count_retry,
            )
            self._ids[id(got)] = records
            while len(self._ids) > _PIECES_LOCATED:
                self._ids.popitem(last=False)
            return got

        def start(chunk: tuple[Int64Array, int], after: asyncio.Event | None) -> _Fetch:
            records, size = chunk
            holding = asyncio.Event()

            async def run() -> list[bytes]:
                try:
                    return await fetch(records, size, after, holding)
                finally:
                    holding.set()  # (failed before holding: the next one is cancelled anyway)

            return _Fetch(asyncio.ensure_future(run()), size, holding)

        chunks = self._chunks(table, plan)
        events: list[Event] = [plan.begin]
        pending: _Fetch | None = None
        first = True
        try:
            chunk = next(chunks, None)
            while chunk is not None:
                current = pending or start(chunk, None)
                pending = None
                chunk = next(chunks, None)
                if chunk is not None and not first:
                    # the next chunk is read while this one is consumed
                    pending = start(chunk, current.holding)
                records = await current.task
                if chunk is not None and first:
                    # only once the first chunk is read: its reads alone before the first
                    # record (a job of many consumers sends few requests before it starts)
                    pending = start(chunk, current.holding)
                first = False
                events.append(Advance(len(records)))
                yield records, events
                # the consumer asked for the next piece: done with these records
                del records
                held -= current.size
                budget.unhold(current.size)
                events = []
            if events:
                yield [], events
        finally:
            if pending is not None:
                await cancel_and_wait([pending.task])
            budget.unhold(held)  # chunks read (or being read) and never consumed


@dataclass(frozen=True)
class _Fetch:
    """One chunk's reads under way: the task, the bytes it holds in the budget, and an event
    set once it holds them (the next chunk's reads wait for it)."""

    task: asyncio.Task[list[bytes]]
    size: int
    holding: asyncio.Event
