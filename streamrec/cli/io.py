"""Async reading for the ``streamrec`` subcommands: list shards, decode them, bounded fan-out.

The subcommands need more than :class:`~streamrec.pipeline.dataset.Dataset` gives: which shard
a record came from, its offset, the errors a ``skip``-mode decoder dropped, and shards read
concurrently with one set of connections. So they drive the same parts directly: a store per
scheme, an :class:`~streamrec.pipeline.stream.prefetch.ObjectReader` per shard (retries, shared
prefetch budget) and a :class:`~streamrec.format.shard.ShardDecoder`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any, TypeVar

from streamrec._portal import owned_generator
from streamrec.format.codecs import Compression, resolve_compression
from streamrec.format.framing import FOOTER_BYTES, HEADER_BYTES, OnCorrupt
from streamrec.format.shard import ShardDecoder
from streamrec.pipeline.budget import ByteBudget
from streamrec.pipeline.listing.urls import list_sources
from streamrec.pipeline.stream.prefetch import ObjectReader
from streamrec.pipeline.stream.read import decode_blocks
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.stores import ObjectInfo, StoreSet

__all__ = [
    "Located",
    "ShardReader",
    "Stores",
    "detect_compression",
    "iter_records",
    "list_shards",
    "map_bounded",
]

T = TypeVar("T")
R = TypeVar("R")

#: (shard, index in the shard, header offset in the uncompressed stream, payload)
Located = tuple[ObjectInfo, int, int, bytes]


class Stores(StoreSet):
    """One store per scheme for one command run (a :class:`StoreSet`), and its retry policy."""

    def __init__(
        self, storage_options: dict[str, Any] | None, retry: RetryPolicy | None = None
    ) -> None:
        super().__init__(storage_options)
        self.retry = retry or RetryPolicy()


async def list_shards(stores: Stores, urls: Sequence[str]) -> list[ObjectInfo]:
    """Every shard the urls stand for, as ``open_dataset`` reads them (see
    :mod:`streamrec.pipeline.listing.urls`)."""
    return await list_sources(urls, stores.get, stores.retry)


async def detect_compression(stores: Stores, shard: ObjectInfo) -> Compression:
    """The codec of ``shard``: from its name, else from its first 12 bytes."""
    head = b""
    if resolve_compression("auto", shard.url, None) is None and shard.size:
        store = stores.get(shard.url)

        async def first_bytes() -> bytes:
            return await store.read_range(shard, 0, min(shard.size, HEADER_BYTES))

        head = await stores.retry.run(first_bytes, describe=f"{shard.url} bytes 0-11")
    return resolve_compression("auto", shard.url, head)


class ShardReader:
    """Decode one shard; afterwards ``decoder`` holds the codec used and what was dropped.

    ``on_bytes`` is called with the size of every block read (progress bars).
    ``lengths_only``: the chunks are empty; the records' lengths collect in
    ``decoder.framing.lengths`` (an index needs no payload).
    """

    def __init__(
        self,
        stores: Stores,
        shard: ObjectInfo,
        budget: ByteBudget,
        *,
        compression: str | None,
        on_corrupt: OnCorrupt = "raise",
        on_bytes: Callable[[int], None] | None = None,
        lengths_only: bool = False,
    ) -> None:
        self.stores = stores
        self.shard = shard
        self.budget = budget
        self.decoder = ShardDecoder(
            url=shard.url,
            compression=compression,
            on_corrupt=on_corrupt,
            size=shard.size,
            lengths_only=lengths_only,
        )
        self.on_bytes = on_bytes
        self.records = 0

    @owned_generator
    async def chunks(self) -> AsyncGenerator[list[bytes], None]:
        """The shard's payloads in order, as chunks; damage raises (or is dropped, in skip)."""
        reader = ObjectReader(
            self.stores.get(self.shard.url), self.shard, self.budget, policy=self.stores.retry
        )
        async with aclosing(decode_blocks(reader, self.decoder, self.on_bytes)) as chunks:
            async for records in chunks:
                self.records += len(records)
                yield records

    async def count(self) -> int:
        """Read the whole shard; the number of good records."""
        async with aclosing(self.chunks()) as chunks:
            async for _ in chunks:
                pass
        return self.records


@owned_generator
async def iter_records(
    stores: Stores, shards: Sequence[ObjectInfo], *, compression: str | None
) -> AsyncGenerator[Located, None]:
    """Every record of ``shards`` in order with its shard, index and header offset.

    Offsets are exact because nothing is skipped: damage raises.
    """
    budget = ByteBudget(64 << 20)
    for shard in shards:
        reader = ShardReader(stores, shard, budget, compression=compression)
        index = offset = 0
        async with aclosing(reader.chunks()) as chunks:
            async for chunk in chunks:
                for payload in chunk:
                    yield shard, index, offset, payload
                    index += 1
                    offset += HEADER_BYTES + len(payload) + FOOTER_BYTES


async def map_bounded(items: Sequence[T], jobs: int, work: Callable[[T], Awaitable[R]]) -> list[R]:
    """``[await work(item) for item in items]``, at most ``jobs`` at a time, results in order."""
    gate = asyncio.Semaphore(jobs)

    async def one(item: T) -> R:
        async with gate:
            return await work(item)

    return list(await asyncio.gather(*(one(item) for item in items)))
