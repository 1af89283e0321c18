"""``open_dataset``: TFRecord payloads from files, via ``async for`` or plain ``for``."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator, Sequence
from contextlib import aclosing
from typing import Any

from streamrec.format.codecs import normalize_compression
from streamrec.format.framing import OnCorrupt
from streamrec.pipeline.read import read_shard
from streamrec.pipeline.stats import Stats
from streamrec.storage.stores import ObjectInfo, open_store
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
    "storage_options": None,
}


class Dataset:
    """A sequence of TFRecord payloads (``bytes``) read from one or more shards.

    Iterate with ``async for`` inside an event loop or with plain ``for`` anywhere; both give
    the same records in the same order (shards sorted by name within a glob, in the order given
    across a list). Each iteration reads the files again. ``stats`` accumulates counters.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        compression: str | None = "auto",
        verify_crc: bool = True,
        on_corrupt: OnCorrupt = "raise",
        prefetch_bytes: int = 64 << 20,
    ) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ValueError("open_dataset needs at least one path, glob or url")
        normalize_compression(compression)  # reject bad values now, not on first read
        if on_corrupt not in ("raise", "skip"):
            raise ValueError(f"on_corrupt must be 'raise' or 'skip', not {on_corrupt!r}")
        if prefetch_bytes <= 0:
            raise ValueError(f"prefetch_bytes must be positive, not {prefetch_bytes}")
        self.compression = compression
        self.verify_crc = verify_crc
        self.on_corrupt: OnCorrupt = on_corrupt
        self.prefetch_bytes = prefetch_bytes
        self.stats = Stats()

    async def shards(self) -> list[ObjectInfo]:
        """Every shard to read, in reading order, with its size."""
        found: list[ObjectInfo] = []
        for url in self.urls:
            store = open_store(url)
            try:
                found += await store.expand(url)
            finally:
                await store.close()
        return found

    async def record_chunks(self) -> AsyncGenerator[list[bytes], None]:
        """The records in reading order, as chunks (lists): the fast path for consumers."""
        for shard in await self.shards():
            store = open_store(shard.url)
            try:
                self.stats.shards_opened += 1
                async with aclosing(
                    read_shard(
                        store,
                        shard,
                        compression=self.compression,
                        verify_crc=self.verify_crc,
                        on_corrupt=self.on_corrupt,
                        stats=self.stats,
                    )
                ) as chunks:
                    async for chunk in chunks:
                        yield chunk
            finally:
                await store.close()

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:
        async with aclosing(self.record_chunks()) as chunks:
            async for chunk in chunks:
                for record in chunk:
                    yield record

    def __iter__(self) -> Iterator[bytes]:
        return iterate_chunks(self.record_chunks)

    def __repr__(self) -> str:
        return f"Dataset({self.urls!r}, compression={self.compression!r})"


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
        num_hosts, host_index, storage_options: the interleaving, shuffling, splitting and
            cloud options of the full pipeline; this version accepts them at their defaults
            only and raises NotImplementedError otherwise.
        prefetch_bytes: bound on bytes read ahead.

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
        "storage_options": storage_options,
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
    )
