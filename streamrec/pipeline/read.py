"""Read one shard: the store's byte stream driven through the format core, chunk by chunk."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator

from streamrec.errors import FormatError
from streamrec.format.framing import OnCorrupt
from streamrec.format.shard import ShardDecoder
from streamrec.pipeline.stats import Stats
from streamrec.storage.stores import LocalStore, ObjectInfo

__all__ = ["read_shard"]

logger = logging.getLogger("streamrec")


async def read_shard(
    store: LocalStore,
    shard: ObjectInfo,
    *,
    compression: str | None,
    verify_crc: bool,
    on_corrupt: OnCorrupt,
    stats: Stats,
) -> AsyncGenerator[list[bytes], None]:
    """The payloads of one shard, in file order, as chunks (lists) of records.

    Records before any damage are always yielded before the error is raised; with
    ``on_corrupt="skip"`` damage is logged and counted in ``stats`` instead.
    """
    decoder = ShardDecoder(
        url=shard.url, compression=compression, verify_crc=verify_crc, on_corrupt=on_corrupt
    )
    reported = 0
    stream = store.stream(shard.url)
    try:
        async for data in stream:
            stats.bytes_read += len(data)
            records = decoder.feed(data)
            if records:
                stats.records += len(records)
                yield records
            reported = _report_drops(decoder.dropped, reported, stats)
            decoder.raise_pending()
    finally:
        await stream.aclose()
    records = decoder.close()
    if records:
        stats.records += len(records)
        yield records
    _report_drops(decoder.dropped, reported, stats)
    decoder.raise_pending()


def _report_drops(dropped: list[FormatError], reported: int, stats: Stats) -> int:
    for error in dropped[reported:]:
        stats.corrupt_skipped += 1
        logger.warning("skipping corrupt data: %s", error)
    return len(dropped)
