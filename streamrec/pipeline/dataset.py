"""``open_dataset``: TFRecord payloads from files, via ``async for`` or plain ``for``."""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from contextlib import aclosing
from typing import Any

from streamrec.format.codecs import normalize_compression
from streamrec.format.framing import OnCorrupt
from streamrec.pipeline.budget import ByteBudget
from streamrec.pipeline.interleave import interleave_deterministic, interleave_first_ready
from streamrec.pipeline.read import read_shard
from streamrec.pipeline.shards import ShardPlan, plan_shards, seeded_random
from streamrec.pipeline.shuffle import shuffle_chunks
from streamrec.pipeline.stats import Stats
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.stores import ObjectInfo, ObjectStore, open_store, store_key
from streamrec.storage.stream import ObjectReader
from streamrec.sync import iterate_chunks

__all__ = ["Dataset", "open_dataset"]

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
        cycle_length: int = 1,
        block_length: int = 1,
        deterministic: bool = True,
        shuffle_shards: bool = False,
        shuffle_buffer: int = 0,
        seed: int = 0,
        num_hosts: int = 1,
        host_index: int = 0,
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
            ("cycle_length", cycle_length),
            ("block_length", block_length),
            ("num_hosts", num_hosts),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, not {value}")
        if shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be >= 0, not {shuffle_buffer}")
        if not 0 <= host_index < num_hosts:
            raise ValueError(f"host_index must be in [0, {num_hosts}), not {host_index}")
        self.compression = compression
        self.verify_crc = verify_crc
        self.on_corrupt: OnCorrupt = on_corrupt
        self.prefetch_bytes = prefetch_bytes
        self.block_bytes = block_bytes
        self.max_concurrency = max_concurrency
        self.retry = retry or RetryPolicy()
        self.storage_options = storage_options
        self.cycle_length = cycle_length
        self.block_length = block_length
        self.deterministic = deterministic
        self.shuffle_shards = shuffle_shards
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.num_hosts = num_hosts
        self.host_index = host_index
        self.epoch = 0
        self.stats = Stats()

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch: shard and record shuffling depend on ``(seed, epoch)``."""
        self.epoch = epoch

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

        Shards are planned (shuffled, split across hosts and workers), read (interleaved when
        ``cycle_length`` > 1) and optionally shuffled through a record buffer. All shards
        share one prefetch budget of ``prefetch_bytes``.
        """
        budget = ByteBudget(self.prefetch_bytes)
        async with _Stores(self.storage_options) as stores:
            try:
                plan = self._plan(await self._list(stores))

                def open_shard(shard: ObjectInfo) -> AsyncGenerator[list[bytes], None]:
                    reader = self._reader(stores, shard, budget)
                    reader.prime()
                    chunks = self._decode(reader)
                    if plan.record_stride > 1:
                        chunks = _every_nth(chunks, plan.record_stride, plan.record_offset)
                    return chunks

                chunks = self._interleave(plan.shards, open_shard, stores, budget, plan)
                if self.shuffle_buffer:
                    rng = seeded_random(self.seed, self.epoch, "records")
                    chunks = shuffle_chunks(chunks, self.shuffle_buffer, rng)
                async with aclosing(chunks) as ordered:
                    waited = time.monotonic()
                    async for chunk in ordered:
                        self.stats.wait_s += time.monotonic() - waited
                        yield chunk
                        waited = time.monotonic()
            finally:
                self.stats.peak_prefetch_bytes = max(self.stats.peak_prefetch_bytes, budget.peak)

    def _plan(self, shards: list[ObjectInfo]) -> ShardPlan[ObjectInfo]:
        num_workers, worker_index = _torch_worker()
        return plan_shards(
            shards,
            shuffle=self.shuffle_shards,
            seed=self.seed,
            epoch=self.epoch,
            num_hosts=self.num_hosts,
            host_index=self.host_index,
            num_workers=num_workers,
            worker_index=worker_index,
        )

    def _decode(self, reader: ObjectReader) -> AsyncGenerator[list[bytes], None]:
        return read_shard(
            reader,
            compression=self.compression,
            verify_crc=self.verify_crc,
            on_corrupt=self.on_corrupt,
            stats=self.stats,
        )

    def _interleave(
        self,
        shards: list[ObjectInfo],
        open_shard: Callable[[ObjectInfo], AsyncGenerator[list[bytes], None]],
        stores: _Stores,
        budget: ByteBudget,
        plan: ShardPlan[ObjectInfo],
    ) -> AsyncGenerator[list[bytes], None]:
        if self.cycle_length == 1 or len(shards) <= 1:
            if plan.record_stride > 1:
                return interleave_deterministic(shards, open_shard, 1, 1)
            return self._sequential(shards, stores, budget)
        if self.deterministic:
            return interleave_deterministic(
                shards, open_shard, self.cycle_length, self.block_length
            )
        return interleave_first_ready(shards, open_shard, self.cycle_length)

    async def _sequential(
        self, shards: list[ObjectInfo], stores: _Stores, budget: ByteBudget
    ) -> AsyncGenerator[list[bytes], None]:
        """One shard after another; the next shard's first blocks are requested as soon as
        the current one has requested its last, so its first-byte latency hides."""
        upcoming: ObjectReader | None = None
        try:
            for index, shard in enumerate(shards):
                reader = upcoming or self._reader(stores, shard, budget)
                upcoming = None
                reader.prime()
                following = shards[index + 1] if index + 1 < len(shards) else None
                async with aclosing(self._decode(reader)) as chunks:
                    async for chunk in chunks:
                        if following and upcoming is None and reader.fully_requested:
                            upcoming = self._reader(stores, following, budget)
                            upcoming.prime()
                        yield chunk
        finally:
            if upcoming is not None:
                await upcoming.aclose()

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:
        async with aclosing(self.record_chunks()) as chunks:
            async for chunk in chunks:
                for record in chunk:
                    yield record

    def __iter__(self) -> Iterator[bytes]:
        return iterate_chunks(self.record_chunks)

    def __repr__(self) -> str:
        return f"Dataset({self.urls!r}, compression={self.compression!r})"


def _torch_worker() -> tuple[int, int]:
    """(num_workers, worker_id) inside a PyTorch DataLoader worker, else (1, 0).

    torch is only consulted when the process has already imported it.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return 1, 0
    info = torch.utils.data.get_worker_info()
    if info is None:
        return 1, 0
    return int(info.num_workers), int(info.id)


async def _every_nth(
    chunks: AsyncGenerator[list[bytes], None], stride: int, offset: int
) -> AsyncGenerator[list[bytes], None]:
    """The records whose index in their shard is ``offset`` modulo ``stride``."""
    index = 0  # index in the shard of the chunk's first record
    async with aclosing(chunks) as source:
        async for chunk in source:
            first = (offset - index) % stride
            kept = chunk[first::stride]
            index += len(chunk)
            if kept:
                yield kept


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
        cycle_length=cycle_length,
        block_length=block_length,
        deterministic=deterministic,
        shuffle_shards=shuffle_shards,
        shuffle_buffer=shuffle_buffer,
        seed=seed,
        num_hosts=num_hosts,
        host_index=host_index,
    )
