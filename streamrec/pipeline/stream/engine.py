"""One iteration of reading: list, plan, open, read, interleave, shuffle, hand over.

:class:`ReadEngine` turns urls and :class:`~streamrec.pipeline.options.ReadOptions` into an
async stream of ``(records, events)`` pieces in reading order (see
:mod:`streamrec.pipeline.position.events`). It owns everything one pass over the shards
uses - stores, the prefetch budget, the shard opener, the readers - and releases all of it when
the stream is closed, however it ends. It knows nothing of consumers: the
:class:`~streamrec.pipeline.dataset.Dataset` (the user's object) drives it and keeps the
consumer's position.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing

from streamrec._portal import owned_generator
from streamrec.errors import StateError
from streamrec.pipeline.budget import BudgetPlan
from streamrec.pipeline.listing.plan import (
    ShardPlan,
    dataloader_worker,
    plan_shards,
    seeded_random,
    shards_digest,
    shards_digest_v2,
)
from streamrec.pipeline.listing.urls import list_shards
from streamrec.pipeline.options import ReadOptions
from streamrec.pipeline.position.draws import restore
from streamrec.pipeline.position.events import Event, Open, Piece, take_event
from streamrec.pipeline.position.state import (
    CycleState,
    DatasetState,
    IndexedState,
    ReadState,
    ReadyState,
)
from streamrec.pipeline.stats import Stats
from streamrec.pipeline.stream.ahead import ReadAhead
from streamrec.pipeline.stream.interleave import interleave_deterministic, interleave_first_ready
from streamrec.pipeline.stream.opener import ShardOpener
from streamrec.pipeline.stream.prefetch import DEFAULT_FIRST_BLOCK_BYTES, ObjectReader, OpenCache
from streamrec.pipeline.stream.shuffle import shuffle_pieces
from streamrec.pipeline.stream.tune import (
    LINKS,
    MAX_TUNED_CONCURRENCY,
    LinkKey,
    ReadTuner,
    link_key,
)
from streamrec.storage.cache.store import (
    CacheFill,
    CacheHit,
    ShardCache,
    cache_namespace,
    is_cacheable,
)
from streamrec.storage.registry import ObjectInfo, StoreSet

__all__ = ["Piece", "ReadEngine"]


class ReadEngine:
    """Reads the shards ``urls`` name for one epoch, with ``options``, counting in ``stats``."""

    def __init__(self, urls: Sequence[str], options: ReadOptions, epoch: int, stats: Stats):
        self.urls = list(urls)
        self.options = options
        self.epoch = epoch
        self.stats = stats
        self.budget_plan = BudgetPlan(options)
        """How this iteration spends its prefetch budget (the budget, the streams' shares)."""
        self.shards_digest: str | None = None
        """The fingerprint of the shards read (set once they are listed and planned)."""
        self.plan: ShardPlan[ObjectInfo] | None = None
        """Which shards this consumer reads, in order (set with :attr:`shards_digest`)."""
        self.cache: ShardCache | None = None
        if options.cache_dir is not None and options.cache_bytes is not None:
            # a download that made no progress for one attempt's time is not waited for
            stall_s = options.retry.timeout_s
            self.cache = ShardCache(options.cache_dir, options.cache_bytes, stall_s=stall_s)
        # Records split across consumers (fewer shards than consumers): every consumer of this
        # host reads each shard whole, paced by its own consumer, in lockstep with the others
        # (DDP, the DataLoader's round robin): waiting for another's download could wait for a
        # reader whose consumer waits for us. Such readers read without the cache meanwhile.
        self._wait_for_downloads = True
        self._tuners: dict[LinkKey, ReadTuner] = {}  # per store (link_key): see tune.py

    def _starts_early(self, resume: DatasetState | None) -> bool:
        """Whether the listing's first shard is certainly the plan's first, read first from
        its start: one shard at a time, no shard shuffle, no split across hosts or workers,
        not resuming. Then its first blocks are requested as soon as a listing page shows it
        (:class:`_EarlyStart`), while the rest of the listing arrives."""
        options = self.options
        return (
            resume is None
            and options.cycle_length == 1
            and not options.shuffle_shards
            and options.num_hosts == 1
            and dataloader_worker()[0] == 1
        )

    def _count_retry(self, error: Exception) -> None:
        self.stats.retries += 1

    def _reader(
        self, stores: StoreSet, shard: ObjectInfo, start: int = 0, ahead: bool = False
    ) -> ObjectReader:
        """A prefetching reader of ``shard`` from ``start``, sized for this iteration."""
        options = self.options
        self.stats.shards_opened += 1
        sizes = self.budget_plan.reader_sizes(ahead)
        store = stores.get(shard.url)
        tuner = self._tuner(shard.url)
        return ObjectReader(
            store,
            shard,
            self.budget_plan.budget,
            start=start,
            block_bytes=min(sizes.block_bytes, tuner.block_bytes),
            max_concurrency=tuner.max_concurrency,
            share_bytes=sizes.share_bytes,
            max_held_bytes=sizes.max_held_bytes,
            policy=options.retry,
            on_retry=self._count_retry,
            on_read=self.stats.count_read,
            open_cache=self._open_cache(shard, start),
            tuner=tuner,
        )

    def _tuner(self, url: str) -> ReadTuner:
        """The read-ahead tuner of ``url``'s store for this iteration (created on first use,
        from what an earlier iteration learned of that store: see tune.py)."""
        key = link_key(url, self.options.storage_options)
        tuner = self._tuners.get(key)
        if tuner is None:
            options = self.options
            tuner = self._tuners[key] = ReadTuner(
                self.budget_plan.tuning_bytes,
                self.budget_plan.reader_sizes().block_bytes,  # the block the readers use
                options.max_concurrency,
                tune_block=options.tune_block_bytes,
                tune_concurrency=options.tune_max_concurrency,
                consumer_bps=self._consumer_bps,
                on_choice=self._chosen,
                learned=LINKS.get(key),
                memory=LINKS,
                key=key,
            )
            if tuner.learned is not None:
                self._chosen(tuner)
        return tuner

    def _consumer_bps(self) -> float | None:
        """Bytes/s the consumer takes while it does not wait for records (None: too early)."""
        stats = self.stats
        busy = stats.iterate_s - stats.wait_s
        return stats.bytes_read / busy if busy > 0.1 and stats.bytes_read else None

    def _chosen(self, tuner: ReadTuner) -> None:
        """A tuner chose (or started from what an earlier iteration learned): what the reads
        use now, and why, in ``ds.stats.settings`` (see :class:`~streamrec.pipeline.stats.
        Stats`)."""
        settings = self.stats.settings
        settings.update(
            block_bytes=tuner.block_bytes,
            max_concurrency=tuner.in_flight,
            tuned=2 if tuner.learned is not None else 1,
        )
        estimate = tuner.estimate
        if estimate is not None:
            settings.update(
                tuned_rtt_ms=round(estimate.rtt_s * 1e3), tuned_mbps=round(estimate.rate_bps / 1e6)
            )

    def _open_cache(self, shard: ObjectInfo, start: int) -> OpenCache | None:
        """How a reader of ``shard`` from ``start`` uses the local cache: reads its copy, or
        fills one when it reads the whole object (remote shards only)."""
        cache = self.cache
        if cache is None or not is_cacheable(shard.url):
            return None
        namespace = cache_namespace(shard.url, self.options.storage_options)

        async def open_cache() -> CacheHit | CacheFill | None:
            wait = self._wait_for_downloads
            route = await cache.open(shard, namespace, fill=start == 0, wait=wait)
            if isinstance(route, CacheHit):
                self.stats.cache_hits += 1
            return route

        return open_cache

    @owned_generator
    async def pieces(
        self,
        resume: DatasetState | None,
        *,
        timed: bool = True,
        on_planned: Callable[[str], None] | None = None,
    ) -> AsyncGenerator[Piece, None]:
        """The pipeline: ``(records, events)`` pieces in reading order, from ``resume`` (a
        parsed state) or the start. ``timed``: add the time
        spent waiting for each piece to ``stats.wait_s`` (the blocking path times its own).
        ``on_planned(digest)`` is called once the shards are listed and planned, before the
        first piece (``digest``: :attr:`shards_digest`)."""
        options = self.options
        budget = self.budget_plan.budget
        closers: list[Callable[[], Awaitable[None]]] = []
        most = MAX_TUNED_CONCURRENCY if options.tune_max_concurrency else options.max_concurrency
        connections = max(most, options.max_concurrency) * (options.cycle_length + 1)
        async with StoreSet(
            options.storage_options,
            connections,
            lookup_reads_first_bytes=options.cache_dir is None,
        ) as stores:
            early = _EarlyStart(lambda shard: self._reader(stores, shard))
            closers.append(early.aclose)
            try:
                on_first = early.start if self._starts_early(resume) else None
                listed = await list_shards(
                    self.urls, self.options, stores.get, self.stats, on_first
                )
                plan = self._plan(listed)
                first = await early.take(plan.shards[0] if plan.shards else None)
                self._wait_for_downloads = plan.record_stride == 1
                how = (plan.record_stride, plan.record_offset)
                digest = shards_digest(plan.shards, *how)
                saved = None if resume is None else resume.shards
                # (the earlier digest, of states saved by earlier versions: only then computed)
                if saved not in (None, digest) and saved != shards_digest_v2(plan.shards, *how):
                    raise StateError(
                        "the state was saved over different shards (other files, sizes or "
                        "versions, or another host/worker split); it cannot resume here"
                    )
                self.shards_digest = digest
                self.plan = plan  # (where each record comes from: Dataset.locate)
                if on_planned is not None:
                    on_planned(digest)
                # see ByteBudget: room kept for every stream's share
                self.budget_plan.keep_shares(len(plan.shards))

                def make_reader(shard: ObjectInfo, start: int, ahead: bool) -> ObjectReader:
                    return self._reader(stores, shard, start, ahead)

                opener = ShardOpener(
                    options, stores, self.budget_plan, plan, self.stats, make_reader
                )
                closers.append(opener.aclose)
                await opener.prepare(resume)
                pieces = read = self._read(opener, resume.read if resume else None, first)

                async def close_read() -> None:
                    # the shuffle wrapping it does not close it when closed early; not while
                    # it is closing already (a loop's shutdown closes every generator at once)
                    if not getattr(read, "ag_running", False):
                        await read.aclose()

                closers.insert(0, close_read)
                if options.shuffle_buffer:
                    shuffle_state = resume.shuffle if resume else None
                    rng = seeded_random(options.seed, self.epoch, "records")
                    buffer: list[bytes] = []
                    draining = False
                    if shuffle_state is not None:
                        restore(rng, shuffle_state.rng)
                        buffer = await opener.fetch(shuffle_state.buffer)
                        draining = shuffle_state.draining
                    pieces = shuffle_pieces(
                        pieces, options.shuffle_buffer, rng, buffer=buffer, draining=draining
                    )
                async with aclosing(pieces) as ordered:
                    waited = time.monotonic()
                    async for piece in ordered:
                        if timed:
                            self.stats.wait_s += time.monotonic() - waited
                        yield piece
                        waited = time.monotonic()
            finally:
                for close in closers:
                    await close()
                self.stats.peak_prefetch_bytes = max(self.stats.peak_prefetch_bytes, budget.peak)

    def _plan(self, shards: list[ObjectInfo]) -> ShardPlan[ObjectInfo]:
        num_workers, worker_index = dataloader_worker()
        options = self.options
        return plan_shards(
            shards,
            shuffle=options.shuffle_shards,
            seed=options.seed,
            epoch=self.epoch,
            num_hosts=options.num_hosts,
            host_index=options.host_index,
            num_workers=num_workers,
            worker_index=worker_index,
        )

    def _read(
        self, opener: ShardOpener, start: ReadState | None, first: ObjectReader | None = None
    ) -> AsyncGenerator[Piece, None]:
        """The shards' pieces in reading order; ``first``: shard 0's reader, started early
        (one shard at a time only)."""
        options = self.options
        assert not isinstance(start, IndexedState)  # (parse_state: by the configuration)
        if options.cycle_length > 1 and not options.deterministic:
            assert not isinstance(start, CycleState)
            return self._first_ready(opener, start)
        assert not isinstance(start, ReadyState)
        if options.cycle_length == 1:
            return self._sequential(opener, start, first)
        return interleave_deterministic(
            len(opener.plan.shards),
            opener.chunks,
            options.cycle_length,
            options.block_length,
            start,
            prefetch=opener.prefetch,
        )

    def _first_ready(
        self, opener: ShardOpener, start: ReadyState | None
    ) -> AsyncGenerator[Piece, None]:
        jobs: list[tuple[int, int, int | None]] = []
        started: set[int] = set()
        if start is not None:
            jobs = [(p.ordinal, p.records, p.offset) for p in start.open]
            # (ranges within the plan's shards: prepare() checked them)
            started = {job[0] for job in jobs}
            started.update(o for first, end in start.done for o in range(first, end))
        num_shards = len(opener.plan.shards)
        jobs += [(ordinal, 0, 0) for ordinal in range(num_shards) if ordinal not in started]
        return interleave_first_ready(jobs, opener.chunks, self.options.cycle_length)

    @owned_generator
    async def _sequential(
        self, opener: ShardOpener, start: CycleState | None, early: ObjectReader | None = None
    ) -> AsyncGenerator[Piece, None]:
        """One shard after another; once the current one has requested its every block, the
        next shards' first blocks are requested ahead of their turn (:class:`ReadAhead`), so
        their first-byte latency hides (``early``: shard 0's reader, already requesting)."""
        jobs: list[tuple[int, int, int | None]] = []
        first = 0
        if start is not None:
            first = start.next
            if start.slots[0] is not None:
                position = start.slots[0]
                jobs.append((position.ordinal, position.records, position.offset))
        jobs += [(ordinal, 0, 0) for ordinal in range(first, len(opener.plan.shards))]
        if early is not None and not (jobs and jobs[0] == (0, 0, 0)):
            early = None
        ahead = ReadAhead(
            opener,
            [ordinal for ordinal, _, _ in jobs[1:]],  # (all of them from their start)
            # the reads a sequential read's connections are sized for (the current shard's
            # and the next's max_concurrency each: see pieces()), one shard each when small
            # (measured, 130 KB shards through a 60 ms link: 15 ahead 25 MB/s, 31 ahead 39)
            max_shards=2 * self.options.max_concurrency - 1,
            max_bytes=self.budget_plan.read_ahead_bytes,
            first_block_bytes=min(
                DEFAULT_FIRST_BLOCK_BYTES, self.budget_plan.reader_sizes().block_bytes
            ),
        )
        try:
            for index, (ordinal, records, offset) in enumerate(jobs):
                if index == 0:
                    reader = early or opener.reader(ordinal, records, offset)
                    # the consumer's first records: their block alone (no shard ahead
                    # either) until a piece of it is handed on
                    reader.hold_ramp()
                else:
                    reader = ahead.take()
                events: list[Event] = [Open(0, ordinal, records, offset or 0)]
                chunks = opener.chunks(ordinal, records, offset, reader)
                async with aclosing(chunks) as source:  # (closes the reader however it ends)
                    reader.prime()
                    if index:
                        ahead.top_up(reader)
                    async for chunk in source:
                        if index:
                            ahead.top_up(reader)
                        events.append(take_event(0, chunk, False))
                        yield chunk, events
                        events = []
                        if not index:  # (the consumer's first records go before any of it)
                            ahead.top_up(reader)
                events.append(take_event(0, [], True))
                yield [], events
        finally:
            await ahead.aclose()


class _EarlyStart:
    """Shard 0's reader, started from the first listing page that shows it (``start``), and
    handed to the read (``take``) only if the complete listing's plan starts with the very
    same object (name, size, version); otherwise, or if anything fails first, its requests
    are cancelled and its budget returned (``aclose``, idempotent).

    Until then it requests its first block only: the rest of its ramp (up to
    ``max_concurrency`` blocks at once) would share the link with the listing's next pages
    and slow them (measured: 2,500 objects, three pages, a connection's handshake charged:
    the first record later than without the early start)."""

    def __init__(self, make_reader: Callable[[ObjectInfo], ObjectReader]) -> None:
        self._make_reader = make_reader
        self.reader: ObjectReader | None = None

    def start(self, shard: ObjectInfo) -> None:
        if self.reader is None:  # a retried listing tells the same shard again
            self.reader = reader = self._make_reader(shard)
            reader.limit_concurrency(1)
            reader.prime()

    async def take(self, planned: ObjectInfo | None) -> ObjectReader | None:
        """The early reader if it reads ``planned`` (the plan's first shard), else None."""
        reader = self.reader
        if reader is None:
            return None
        obj = reader.obj
        if planned is None or (planned.url, planned.size, planned.version) != (
            obj.url,
            obj.size,
            obj.version,
        ):
            await self.aclose()
            return None
        # the rest of its ramp once its first piece is handed on (see hold_ramp; the
        # cache's answer may have raised its concurrency already)
        reader.restore_concurrency()
        reader.hold_ramp()
        return reader

    async def aclose(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            await reader.aclose()
