"""Whole shards read for the command line's tools, with the engine's own parts.

``streamrec count``, ``verify``, ``head``, ``inspect`` and ``index`` need more than a
:class:`~streamrec.pipeline.dataset.Dataset` gives: which shard each record came from and the
byte offset of its header, the damage a ``skip``-mode decoder dropped, only the records'
lengths (an index), whole shards read side by side. :class:`ShardScan` gives that with what
``open_dataset`` reads with: one :class:`~streamrec.pipeline.options.ReadOptions` (its
``prefetch_bytes`` is the one budget of the run; its ``block_bytes``, ``max_concurrency``,
``retry``, ``compression``, ``verify_crc`` and ``on_corrupt``), the same listing
(:func:`~streamrec.pipeline.listing.urls.list_sources`), the same codec choice
(:func:`~streamrec.pipeline.listing.sidecars.shard_compression`) and the engine's reader and
decoding (:class:`~streamrec.pipeline.stream.prefetch.ObjectReader`,
:func:`~streamrec.pipeline.stream.read.decode_blocks`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing

from streamrec._portal import owned_generator
from streamrec.format.codecs import Compression
from streamrec.format.framing import FOOTER_BYTES, HEADER_BYTES, Records
from streamrec.format.shard import DEFAULT_PIECE_BYTES, ShardDecoder
from streamrec.pipeline.budget import BudgetPlan
from streamrec.pipeline.listing.sidecars import decoder_compression, shard_compression
from streamrec.pipeline.listing.urls import list_sources
from streamrec.pipeline.options import ReadOptions
from streamrec.pipeline.stream.prefetch import ObjectReader
from streamrec.pipeline.stream.read import decode_blocks, stated_or_failing
from streamrec.storage.registry import ObjectInfo, StoreSet

__all__ = ["Located", "ShardRead", "ShardScan"]

#: (shard, index in the shard, header offset in the uncompressed stream, payload)
Located = tuple[ObjectInfo, int, int, bytes]


class ShardScan:
    """One run over shards with ``options``: one store per scheme and one prefetch budget
    (its :class:`~streamrec.pipeline.budget.BudgetPlan`'s) shared by every shard read (an
    ``async with`` block)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.stores = StoreSet(options.storage_options)
        self.budget_plan = BudgetPlan(options)
        self.budget = self.budget_plan.budget

    async def __aenter__(self) -> ShardScan:
        await self.stores.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stores.__aexit__(*exc_info)

    async def list_shards(self, urls: Sequence[str]) -> list[ObjectInfo]:
        """Every shard ``urls`` stand for, in reading order, as ``open_dataset`` lists them."""
        options = self.options
        return await list_sources(
            urls,
            self.stores.get,
            options.retry,
            allow_absolute_urls=options.allow_absolute_urls,
        )

    async def compression(self, shard: ObjectInfo) -> Compression:
        """The codec ``shard`` is read with: ``options.compression``, or for ``"auto"`` its
        name's, else its listing's statement, else its first bytes'."""
        store = self.stores.get(shard.url)
        return await shard_compression(shard, store, self.options.retry, self.options.compression)

    def reader(self, shard: ObjectInfo) -> ObjectReader:
        """A prefetching reader of the whole of ``shard``, in the run's budget."""
        options = self.options
        return ObjectReader(
            self.stores.get(shard.url),
            shard,
            self.budget,
            block_bytes=options.block_bytes,
            max_concurrency=options.max_concurrency,
            policy=options.retry,
        )

    def shard(
        self,
        shard: ObjectInfo,
        *,
        on_bytes: Callable[[int], None] | None = None,
        lengths_only: bool = False,
    ) -> ShardRead:
        """A read of ``shard`` (see :class:`ShardRead`)."""
        return ShardRead(self, shard, on_bytes=on_bytes, lengths_only=lengths_only)

    @owned_generator
    async def located(self, shards: Sequence[ObjectInfo]) -> AsyncGenerator[Located, None]:
        """Every record of ``shards`` in order, with its shard, index and header offset.

        Offsets are exact only when nothing is skipped: read with ``on_corrupt="raise"``.
        """
        for shard in shards:
            read = self.shard(shard)
            index = offset = 0
            async with aclosing(read.chunks()) as chunks:
                async for chunk in chunks:
                    for payload in chunk:
                        yield shard, index, offset, payload
                        index += 1
                        offset += HEADER_BYTES + len(payload) + FOOTER_BYTES


class ShardRead:
    """Decode one shard; afterwards ``decoder`` holds the codec used and what was dropped.

    ``on_bytes`` is called with the size of every block read (progress bars).
    ``lengths_only``: the chunks are empty; the records' lengths collect in
    ``decoder.framing.lengths`` (an index needs no payload).
    """

    def __init__(
        self,
        scan: ShardScan,
        shard: ObjectInfo,
        *,
        on_bytes: Callable[[int], None] | None = None,
        lengths_only: bool = False,
    ) -> None:
        options = scan.options
        self.scan = scan
        self.shard = shard
        self.decoder = ShardDecoder(
            url=shard.url,
            compression=decoder_compression(shard, options.compression),
            verify_crc=options.verify_crc,
            on_corrupt=options.on_corrupt,
            size=shard.size,
            max_piece_bytes=min(options.block_bytes, DEFAULT_PIECE_BYTES),
            lengths_only=lengths_only,
        )
        self.on_bytes = on_bytes
        self.records = 0

    @owned_generator
    async def chunks(self) -> AsyncGenerator[Records, None]:
        """The shard's payloads in order, as chunks; damage raises (or is dropped, in skip)."""
        reader = self.scan.reader(self.shard)
        blocks = decode_blocks(reader, self.decoder, self.on_bytes)
        store, policy = self.scan.stores.get(self.shard.url), self.scan.options.retry
        codec = decoder_compression(self.shard, self.scan.options.compression)
        async with aclosing(stated_or_failing(blocks, self.shard, codec, store, policy)) as chunks:
            async for records in chunks:
                self.records += len(records)
                yield records

    async def count(self) -> int:
        """Read the whole shard; the number of good records."""
        async with aclosing(self.chunks()) as chunks:
            async for _ in chunks:
                pass
        return self.records
