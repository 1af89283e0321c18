"""Opening the shards of one iteration, from their start or from a saved position.

A shard resumes by seeking to its saved byte offset when that is exact: the shard is
uncompressed, no corrupt record was skipped (``on_corrupt="raise"``) and records are not
split every n-th across consumers. Otherwise (GZIP/ZLIB shards especially) it is read from
its start and the records already handed on are dropped: compressed shards re-inflate their
prefix. The shuffle buffer's records are fetched again from their locations the same way.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import numpy as np

from streamrec._portal import owned_generator, run_all
from streamrec.errors import FormatError, StateError
from streamrec.format.framing import OVERHEAD_BYTES, Records
from streamrec.format.span import coalesce
from streamrec.pipeline.budget import BudgetPlan
from streamrec.pipeline.listing.plan import ShardPlan
from streamrec.pipeline.listing.sidecars import decoder_compression, shard_compression
from streamrec.pipeline.options import DEFAULT_GAP_BYTES
from streamrec.pipeline.position.state import (
    CycleState,
    DatasetState,
    Location,
    ReadyState,
    ShardPosition,
    check_against_plan,
)
from streamrec.pipeline.stream.prefetch import ObjectReader
from streamrec.pipeline.stream.read import read_shard, stated_or_failing
from streamrec.storage.base import ObjectInfo, ObjectStore

if TYPE_CHECKING:
    from streamrec.pipeline.options import ReadOptions
    from streamrec.pipeline.stats import Stats
    from streamrec.storage.registry import StoreSet

#: ``make_reader(shard, start, ahead)``: a prefetching reader of ``shard`` from byte
#: ``start``, sized for this iteration (``ahead``: opened before its turn)
MakeReader = Callable[[ObjectInfo, int, bool], ObjectReader]

__all__ = ["ShardOpener"]

Chunks = AsyncGenerator[Records, None]


class ShardOpener:
    """Readers and record chunks for the shards of one plan, resumed where a state says."""

    def __init__(
        self,
        options: ReadOptions,
        stores: StoreSet,
        budget_plan: BudgetPlan,
        plan: ShardPlan[ObjectInfo],
        stats: Stats,
        make_reader: MakeReader,
    ) -> None:
        self.options = options
        self.stores = stores
        self.budget_plan = budget_plan
        self.budget = budget_plan.budget
        self.plan = plan
        self.stats = stats
        self._make_reader = make_reader
        self._exact = options.on_corrupt == "raise" and plan.record_stride == 1
        self._uncompressed: dict[int, bool] = {}
        self._primed: dict[int, ObjectReader] = {}  # readers opened ahead of their turn

    def _count_retry(self, error: Exception) -> None:
        self.stats.retries += 1

    def prefetch(self, ordinal: int) -> None:
        """Start reading shard ``ordinal`` from its start now, before :meth:`chunks` asks."""
        if ordinal not in self._primed:
            shard = self.plan.shards[ordinal]
            reader = self._make_reader(shard, 0, True)
            self._primed[ordinal] = reader
            reader.prime()

    async def aclose(self) -> None:
        """Close the readers opened ahead that were never used."""
        primed, self._primed = self._primed, {}
        for reader in primed.values():
            await reader.aclose()

    async def prepare(self, resume: DatasetState | None) -> None:
        """Check the shards a resume names exist; learn which of those it seeks into are
        uncompressed."""
        if resume is not None:
            check_against_plan(resume, len(self.plan.shards))
        if resume is None or not self._exact:
            return
        ordinals: set[int] = set()
        read = resume.read
        positions: list[ShardPosition | None] = []
        if isinstance(read, CycleState):
            positions += read.slots
        elif isinstance(read, ReadyState):
            positions += read.open
        for position in positions:
            if position is not None and position.records > 0:
                ordinals.add(position.ordinal)
        if resume.shuffle is not None:
            ordinals.update(location[0] for location in resume.shuffle.buffer)
        for ordinal in sorted(ordinals):
            self._check(ordinal)
            self._uncompressed[ordinal] = await self._is_uncompressed(self.plan.shards[ordinal])

    def _check(self, ordinal: int) -> None:
        if not 0 <= ordinal < len(self.plan.shards):
            count = len(self.plan.shards)
            raise StateError(f"resume state names shard {ordinal}; there are only {count}")

    async def _is_uncompressed(self, shard: ObjectInfo) -> bool:
        store: ObjectStore = self.stores.get(shard.url)
        codec = await shard_compression(
            shard, store, self.options.retry, self.options.compression, on_retry=self._count_retry
        )
        return codec is None

    def _seeks(self, ordinal: int, records: int) -> bool:
        return records > 0 and self._uncompressed.get(ordinal, False)

    def reader(self, ordinal: int, records: int = 0, offset: int | None = 0) -> ObjectReader:
        """A reader of shard ``ordinal`` that starts where resuming after ``records`` needs."""
        start = (offset or 0) if self._seeks(ordinal, records) else 0
        size = self.plan.shards[ordinal].size
        if start > size:
            raise StateError(
                f"resume state seeks to byte {start} of shard {ordinal} "
                f"({self.plan.shards[ordinal].url}), which has {size}"
            )
        return self._make_reader(self.plan.shards[ordinal], start, False)

    def chunks(
        self,
        ordinal: int,
        records: int = 0,
        offset: int | None = 0,
        reader: ObjectReader | None = None,
    ) -> Chunks:
        """Record chunks of shard ``ordinal`` after its first ``records`` records."""
        self._check(ordinal)
        seeks = self._seeks(ordinal, records)
        if reader is None and records == 0:
            reader = self._primed.pop(ordinal, None)
            if reader is not None:  # its turn: from now on it gets a full share
                reader.set_share(self.budget_plan.stream_share)
                reader.prime()
        if reader is None:
            reader = self.reader(ordinal, records, offset)
            reader.prime()
        options = self.options
        shard = self.plan.shards[ordinal]
        codec = None if seeks else decoder_compression(shard, options.compression)
        chunks = read_shard(
            reader,
            compression=codec,
            verify_crc=options.verify_crc,
            on_corrupt=options.on_corrupt,
            stats=self.stats,
            start_offset=(offset or 0) if seeks else 0,
            start_index=records if seeks else 0,
            group_bytes=options.chunk_bytes,
            spans=options.record_spans,
        )
        if seeks:
            chunks = _starting_a_record(chunks, ordinal, offset or 0)
        store = self.stores.get(shard.url)
        chunks = stated_or_failing(chunks, shard, codec, store, options.retry)
        if self.plan.record_stride > 1:
            chunks = every_nth(chunks, self.plan.record_stride, self.plan.record_offset)
        if records and not seeks:
            chunks = _drop_first(chunks, records)
        return _ClosingReader(chunks, reader)

    async def fetch(self, locations: Sequence[Location]) -> list[bytes]:
        """The records at ``locations`` (``(ordinal, index, offset, length)``), in order.

        Records of uncompressed shards resumed exactly are fetched by location: neighbouring
        ones (see :func:`_runs`) share one range read, and the reads of every shard run
        concurrently (at most ``max_concurrency`` at once, each within the prefetch budget).
        Other shards are read from their start up to their last wanted record.
        """
        wanted: dict[int, list[Location]] = defaultdict(list)
        for location in locations:
            self._check(location[0])
            wanted[location[0]].append(location)
        found: dict[tuple[int, int], bytes] = {}
        spans: list[tuple[int, list[Location]]] = []
        for ordinal, places in wanted.items():
            if self._exact and self._uncompressed.get(ordinal, False):
                runs = _runs(places, _GAP_BYTES, self._span_bytes)
                spans += [(ordinal, run) for run in runs]
            else:
                await self._fetch_prefix(ordinal, places, found)
        if spans:
            limit = asyncio.Semaphore(min(self._fetch_concurrency(o) for o in wanted))

            async def one(ordinal: int, run: list[Location]) -> None:
                async with limit:
                    await self._fetch_span(ordinal, run, found)

            await run_all(one(ordinal, run) for ordinal, run in spans)
        try:
            return [found[(loc[0], loc[1])] for loc in locations]
        except KeyError as exc:
            raise StateError(f"resume state names a record that is not there: {exc}") from None

    @property
    def _span_bytes(self) -> int:
        """Most bytes one refetch read covers (a single record may exceed it)."""
        return self.options.block_bytes

    def _fetch_concurrency(self, ordinal: int) -> int:
        store: ObjectStore = self.stores.get(self.plan.shards[ordinal].url)
        return min(self.options.max_concurrency, store.concurrency_limit or _MAX_FETCHES)

    async def _fetch_span(
        self, ordinal: int, places: list[Location], found: dict[tuple[int, int], bytes]
    ) -> None:
        """One range read from the first to the last wanted record of an uncompressed shard."""
        shard = self.plan.shards[ordinal]
        first = min(places, key=lambda loc: loc[2])
        last = max(loc[2] + loc[3] + OVERHEAD_BYTES for loc in places)
        span = ObjectInfo(shard.url, min(last, shard.size), shard.version)
        length = max(span.size - first[2], 1)
        reader = ObjectReader(
            self.stores.get(shard.url),
            span,
            self.budget,
            start=first[2],
            block_bytes=length,
            first_block_bytes=length,
            max_concurrency=1,
            policy=self.options.retry,
            on_retry=self._count_retry,
            on_read=self.stats.count_read,
        )
        reader.prime()
        offsets = {loc[2]: loc[1] for loc in places}
        offset = first[2]
        chunks = read_shard(
            reader,
            compression=None,
            verify_crc=self.options.verify_crc,
            on_corrupt="raise",
            stats=self.stats,
            start_offset=offset,
            start_index=first[1],
        )
        try:
            async with aclosing(chunks) as source:
                async for chunk in source:
                    for record in chunk:
                        index = offsets.get(offset)
                        if index is not None:
                            found[(ordinal, index)] = record
                        offset += len(record) + OVERHEAD_BYTES
        except FormatError as exc:  # the span and its start come from the state alone
            raise StateError(
                f"resume state's shuffle buffer names records of shard {ordinal} that do not "
                f"frame there (offsets or lengths do not match the shard): {exc}"
            ) from exc

    async def _fetch_prefix(
        self, ordinal: int, places: list[Location], found: dict[tuple[int, int], bytes]
    ) -> None:
        """Read the shard from its start up to the last wanted record."""
        indices = {loc[1] for loc in places}
        last = max(indices)
        index = 0
        async with aclosing(self.chunks(ordinal)) as source:
            async for chunk in source:
                for record in chunk:
                    if index in indices:
                        found[(ordinal, index)] = record
                    index += 1
                if index > last:
                    return


_GAP_BYTES = DEFAULT_GAP_BYTES  # random access's (see options.py); bench_resume varies it
_MAX_FETCHES = 16  # refetch reads in flight at once where the store sets no limit


def _runs(places: list[Location], gap_bytes: int, span_bytes: int) -> list[list[Location]]:
    """``places`` sorted by offset and cut as random access cuts its reads
    (:func:`~streamrec.pipeline.indexed.table.coalesce`)."""
    ordered = sorted(places, key=lambda loc: loc[2])
    starts = np.array([loc[2] for loc in ordered], dtype=np.int64)
    ends = starts + np.array([loc[3] for loc in ordered], dtype=np.int64) + OVERHEAD_BYTES
    runs = coalesce(starts, ends, gap_bytes=gap_bytes, span_bytes=span_bytes)
    return [ordered[k:j] for k, j in runs]


class _ClosingReader(AsyncGenerator[Records, None]):
    """``chunks`` that close their reader however they end, also when closed before their
    first chunk was asked for: an async generator closed unstarted never runs its body (nor
    its ``finally``), and the reader, primed already, holds requests, budget and maybe a cache
    download."""

    def __init__(self, chunks: Chunks, reader: ObjectReader) -> None:
        self._chunks = chunks
        self._reader = reader

    async def __anext__(self) -> Records:
        return await self._chunks.__anext__()

    async def asend(self, value: None) -> Records:
        return await self._chunks.asend(value)

    async def athrow(self, typ: Any, val: Any = None, tb: Any = None) -> Records:
        return await self._chunks.athrow(typ, val, tb)

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()
        finally:
            await self._reader.aclose()


@owned_generator
async def _starting_a_record(chunks: Chunks, ordinal: int, offset: int) -> Chunks:
    """``chunks`` of a shard resumed at byte ``offset``; a record that does not frame right at
    that very offset means the state's offset is wrong, not the shard: StateError."""
    first = True
    async with aclosing(chunks) as source:
        try:
            async for chunk in source:
                first = False
                yield chunk
        except FormatError as exc:
            if first and exc.offset == offset:
                raise StateError(
                    f"resume state seeks to byte {offset} of shard {ordinal}, where no record "
                    f"starts ({exc.problem})"
                ) from exc
            raise


@owned_generator
async def every_nth(chunks: Chunks, stride: int, offset: int) -> Chunks:
    """The records whose index in their shard is ``offset`` modulo ``stride``."""
    index = 0  # index in the shard of the chunk's first record
    async with aclosing(chunks) as source:
        async for chunk in source:
            first = (offset - index) % stride
            kept = chunk[first::stride]
            index += len(chunk)
            if kept:
                yield kept


@owned_generator
async def _drop_first(chunks: Chunks, count: int) -> Chunks:
    """All but the first ``count`` records."""
    async with aclosing(chunks) as source:
        async for chunk in source:
            if count >= len(chunk):
                count -= len(chunk)
                continue
            yield chunk[count:] if count else chunk
            count = 0
