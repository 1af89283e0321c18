"""``open_dataset``: TFRecord payloads from files, via ``async for`` or plain ``for``."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from contextlib import aclosing
from typing import Any

from streamrec.format.codecs import normalize_compression
from streamrec.format.framing import OnCorrupt
from streamrec.pipeline.budget import ByteBudget
from streamrec.pipeline.read import read_shard
from streamrec.pipeline.stats import Stats
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.stores import ObjectInfo, ObjectStore, open_store, store_key
from streamrec.storage.stream import ObjectReader
from streamrec.sync import iterate_chunks

__all__ = ["Dataset", "open_dataset"]

# Options of the full pipeline (DESIGN.md) that this version accepts only at their defaults.
_PIPELINE_DEFAULTS: dict[str, Any] = {
    "cycle_length": 1,
    "block_length": 1,
    "deterministic": True,
    "shuffle_shards": False,
    "shuffle_buffer": 0,
    "seed": 0,
    "num_hosts": 1,
    "host_index": 0,
}


class Dataset:
    """A sequence of TFRecord payloads (``bytes``) read from one or more shards.

    Iterate with ``async for`` inside an event loop or with plain ``for`` anywhere; both give
    the same records in the same order (shards sorted by name within a glob, in the order given
    across a list). Each iteration lists and reads the shards again, with its own connections,
    closed when the iteration ends. ``stats`` accumulates counters.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        compression: str | None = "auto",
        verify_crc: bool = True,
        on_corrupt: OnCorrupt = "raise",
        prefetch_bytes: int = 64 << 20,
        block_bytes: int = 8 << 20,
        max_concurrency: int = 4,
        retry: RetryPolicy | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ValueError("open_dataset needs at least one path, glob or url")
        for url in self.urls:
            store_key(url)  # unsupported schemes fail now, not on first read
        normalize_compression(compression)  # so do bad codec names
        if on_corrupt not in ("raise", "skip"):
            raise ValueError(f"on_corrupt must be 'raise' or 'skip', not {on_corrupt!r}")
        for name, value in (
            ("prefetch_bytes", prefetch_bytes),
            ("block_bytes", block_bytes),
            ("max_concurrency", max_concurrency),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, not {value}")
        self.compression = compression
        self.verify_crc = verify_crc
        self.on_corrupt: OnCorrupt = on_corrupt
        self.prefetch_bytes = prefetch_bytes
        self.block_bytes = block_bytes
        self.max_concurrency = max_concurrency
        self.retry = retry or RetryPolicy()
        self.storage_options = storage_options
        self.stats = Stats()

    async def shards(self) -> list[ObjectInfo]:
        """Every shard to read, in reading order, with its size and version."""
        async with _Stores(self.storage_options) as stores:
            return await self._list(stores)

    async def _list(self, stores: _Stores) -> list[ObjectInfo]:
        found: list[ObjectInfo] = []
        for url in self.urls:
            store = stores.get(url)

            async def expand(store: ObjectStore = store, url: str = url) -> list[ObjectInfo]:
                return await store.expand(url)

            found += await self.retry.run(expand, describe=f"listing {url}")
        return found

    def _reader(self, stores: _Stores, shard: ObjectInfo, budget: ByteBudget) -> ObjectReader:
        self.stats.shards_opened += 1
        return ObjectReader(
            stores.get(shard.url),
            shard,
            budget,
            block_bytes=self.block_bytes,
            max_concurrency=self.max_concurrency,
            policy=self.retry,
            on_retry=self._count_retry,
        )

    def _count_retry(self, error: Exception) -> None:
        self.stats.retries += 1

    async def record_chunks(self) -> AsyncGenerator[list[bytes], None]:
        """The records in reading order, as chunks (lists): the fast path for consumers.

        The next shard's first blocks are requested as soon as the current shard has requested
        its last one, so its first-byte latency hides behind the current shard's tail. All
        shards share one prefetch budget of ``prefetch_bytes``.
        """
        budget = ByteBudget(self.prefetch_bytes)
        upcoming: ObjectReader | None = None
        async with _Stores(self.storage_options) as stores:
            try:
                shards = await self._list(stores)
                for index, shard in enumerate(shards):
                    reader = upcoming or self._reader(stores, shard, budget)
                    upcoming = None
                    reader.prime()
                    following = shards[index + 1] if index + 1 < len(shards) else None
                    async with aclosing(
                        read_shard(
                            reader,
                            compression=self.compression,
                            verify_crc=self.verify_crc,
                            on_corrupt=self.on_corrupt,
                            stats=self.stats,
                        )
                    ) as chunks:
                        waited = time.monotonic()
                        async for chunk in chunks:
                            self.stats.wait_s += time.monotonic() - waited
                            if following and upcoming is None and reader.fully_requested:
                                upcoming = self._reader(stores, following, budget)
                                upcoming.prime()
                            yield chunk
                            waited = time.monotonic()
            finally:
                if upcoming is not None:
                    await upcoming.aclose()
                self.stats.peak_prefetch_bytes = max(self.stats.peak_prefetch_bytes, budget.peak)

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:
        async with aclosing(self.record_chunks()) as chunks:
            async for chunk in chunks:
                for record in chunk:
                    yield record

    def __iter__(self) -> Iterator[bytes]:
        return iterate_chunks(self.record_chunks)

    def __repr__(self) -> str:
        return f"Dataset({self.urls!r}, compression={self.compression!r})"


class _Stores:
    """The stores one iteration uses, one per scheme, created in its loop and closed with it."""

    def __init__(self, storage_options: dict[str, Any] | None) -> None:
        self._options = storage_options
        self._stores: dict[str, ObjectStore] = {}

    def get(self, url: str) -> ObjectStore:
        key = store_key(url)
        store = self._stores.get(key)
        if store is None:
            store = self._stores[key] = open_store(url, self._options)
        return store

    async def __aenter__(self) -> _Stores:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        stores, self._stores = self._stores, {}
        for store in stores.values():
            await store.close()


def open_dataset(
    urls: str | Sequence[str],
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
    block_bytes: int = 8 << 20,
    max_concurrency: int = 4,
    retry: RetryPolicy | None = None,
) -> Dataset:
    """Open TFRecord shards for reading.

    Args:
        urls: a path, a glob (expanded and sorted by name, like ``tf.io.gfile.glob``), or a
            list of them (read in the order given).
        compression: ``"auto"`` (by suffix ``.gz``/``.gzip``/``.zlib``/``.zz``, else by the
            first bytes), ``None``, ``"gzip"`` or ``"zlib"`` (TF's ``"GZIP"``/``"ZLIB"``/``""``
            spellings work too).
        verify_crc: check both masked CRC32Cs of every record (cheap: keep it on).
        on_corrupt: ``"raise"`` yields every good record before the damage, then raises a
            :class:`~streamrec.errors.FormatError`; ``"skip"`` drops a record with a bad
            payload CRC, or the rest of a file whose framing is broken, logs a warning with the
            file and offset, and counts it in ``stats.corrupt_skipped``.
        cycle_length, block_length, deterministic, shuffle_shards, shuffle_buffer, seed,
        num_hosts, host_index: the interleaving, shuffling and splitting options of the full
            pipeline; this version accepts them at their defaults only and raises
            NotImplementedError otherwise.
        prefetch_bytes: the hard bound on bytes read ahead and not yet decoded, all shards
            together (plus at most one block).
        storage_options: passed to the fsspec filesystem (``endpoint_url`` via
            ``client_kwargs`` for s3fs, ``token``, ``key``/``secret``, ``anon``, ...).
        block_bytes: size of one range read.
        max_concurrency: range reads in flight per shard.
        retry: the :class:`~streamrec.storage.retry.RetryPolicy` for every storage request
            (attempts, backoff, per-attempt timeout, overall deadline).

    Urls may be local paths, ``file://``, ``s3://``, ``gs://``, ``http(s)://`` or
    ``memory://``.

    Returns:
        A :class:`Dataset`: iterate it with ``async for`` or ``for``.
    """
    given = {
        "cycle_length": cycle_length,
        "block_length": block_length,
        "deterministic": deterministic,
        "shuffle_shards": shuffle_shards,
        "shuffle_buffer": shuffle_buffer,
        "seed": seed,
        "num_hosts": num_hosts,
        "host_index": host_index,
    }
    unsupported = [k for k, v in given.items() if v != _PIPELINE_DEFAULTS[k]]
    if unsupported:
        raise NotImplementedError(
            f"open_dataset: {', '.join(unsupported)} not supported yet in this version "
            "(they arrive with the cloud streaming and pipeline work)"
        )
    return Dataset(
        urls,
        compression=compression,
        verify_crc=verify_crc,
        on_corrupt=on_corrupt,
        prefetch_bytes=prefetch_bytes,
        block_bytes=block_bytes,
        max_concurrency=max_concurrency,
        retry=retry,
        storage_options=storage_options,
    )
