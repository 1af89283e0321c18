"""Read one shard: its block stream driven through the format core, chunk by chunk."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from itertools import chain

from streamrec._portal import owned_generator
from streamrec.errors import FormatError, StateError
from streamrec.format.codecs import Compression, compression_from_name, normalize_compression
from streamrec.format.framing import HEADER_BYTES, OVERHEAD_BYTES, OnCorrupt, Records
from streamrec.format.payload import RecordSpans, read_header
from streamrec.format.shard import DEFAULT_PIECE_BYTES, ShardDecoder
from streamrec.pipeline.listing.sidecars import stated_contradiction
from streamrec.pipeline.stats import Stats
from streamrec.pipeline.stream.direct import DIRECT_RECORD_BYTES, DirectRead
from streamrec.pipeline.stream.prefetch import ObjectReader
from streamrec.storage.base import ObjectInfo, ObjectStore
from streamrec.storage.local.records import min_record_bytes, payload_pool
from streamrec.storage.retry import RetryPolicy

__all__ = ["GROUP_BYTES", "read_shard", "stated_or_failing"]

GROUP_BYTES = 1 << 20
"""Most bytes of arrived pieces decoded into one chunk of records by default (see
decode_blocks)."""

POOL_PART = 4
"""Large local records read for ``record_views`` keep at most ``prefetch_bytes / POOL_PART``
of payloads their views let go of, for the next reads (see
:class:`~streamrec.storage.local.records.PayloadPool`)."""

logger = logging.getLogger("streamrec")


@owned_generator
async def read_shard(
    reader: ObjectReader,
    *,
    compression: str | None,
    verify_crc: bool,
    on_corrupt: OnCorrupt,
    stats: Stats,
    start_offset: int = 0,
    start_index: int = 0,
    group_bytes: int = GROUP_BYTES,
    spans: bool = False,
) -> AsyncGenerator[Records, None]:
    """The payloads of one shard, in file order, as chunks (lists) of records (of at most
    ``group_bytes`` of an uncompressed shard's arrived pieces each: see decode_blocks);
    ``spans``: chunks may leave their records in the pieces (see
    :class:`~streamrec.format.framing.RecordDecoder`).

    Records before any damage are always yielded before the error is raised; with
    ``on_corrupt="skip"`` damage is logged and counted in ``stats`` instead. A compressed
    block is inflated one piece (at most ``reader.block_bytes``) at a time, each piece's
    records yielded before the next is inflated: what decoding holds beyond the prefetch
    budget does not grow with the compression ratio. The reader is
    closed (its requests cancelled, its budget returned) however this generator ends.
    A reader that starts mid-object, at ``start_offset``, must start at the header of record
    ``start_index`` of an uncompressed shard.

    A probing reader (a local file, no cache) of an uncompressed shard read with
    ``on_corrupt="raise"`` whose first record is large reads its large records directly
    (:mod:`streamrec.pipeline.stream.direct`); the block path takes over at the first record that
    is not large and clean, and reads it and the rest as always.
    """
    url = reader.obj.url

    def count_bytes(size: int) -> None:
        stats.bytes_read += size
        stats.bytes_fetched += size

    first = None  # the probing reader's first piece, for the decoder
    if _may_go_direct(reader, compression, on_corrupt, start_offset):
        first = await anext(reader, None)
    room = reader.obj.size - start_offset
    if first is not None and reader.probed and _starts_large(first, room):
        first = None
        await reader.pause()
        direct = DirectRead(
            reader,
            start_offset=start_offset,
            start_index=start_index,
            verify_crc=verify_crc,
            on_bytes=count_bytes,
            # in place (record_views gives payloads back once their views are gone): reused
            pool=payload_pool(reader.budget.limit // POOL_PART) if spans else None,
        )
        async with aclosing(direct.chunks()) as chunks:
            async for records in chunks:
                stats.records_read += len(records)
                yield records
        if direct.handoff is None:  # read to its end
            await reader.aclose()
            return
        if direct.handoff[0] != start_offset:  # records framed there: uncompressed
            compression = None
        start_offset, start_index = direct.handoff
        reader.start_blocks(start_offset)
    decoder = ShardDecoder(
        url=url,
        compression=compression,
        verify_crc=verify_crc,
        on_corrupt=on_corrupt,
        start_offset=start_offset,
        start_index=start_index,
        size=reader.obj.size,
        max_piece_bytes=min(reader.block_bytes, DEFAULT_PIECE_BYTES),
        spans=spans,
    )
    reported = 0
    blocks = decode_blocks(reader, decoder, count_bytes, first, group_bytes, stats)
    async with aclosing(blocks) as decoded:
        async for chunk in decoded:
            stats.records_read += len(chunk)
            reported = _report_drops(decoder.dropped, reported, stats)
            yield chunk
    _report_drops(decoder.dropped, reported, stats)


@owned_generator
async def decode_blocks(
    reader: ObjectReader,
    decoder: ShardDecoder,
    on_block: Callable[[int], None] | None = None,
    first: bytes | None = None,
    group_bytes: int = GROUP_BYTES,
    stats: Stats | None = None,
) -> AsyncGenerator[Records, None]:
    """Drive ``decoder`` with ``reader``'s blocks: the records of each inflated piece as soon
    as they are framed, those before any damage always before the error. ``on_block(size)``
    is called for every block read (``first``: a piece taken from the reader already, fed
    before the others). The reader is closed however this generator ends.

    The pieces of an uncompressed shard that have already arrived are decoded together, up
    to ``group_bytes``, and their records handed on as one chunk: bodies arrive in
    chunks of up to 256 KiB, and every chunk handed up the pipeline (and across to a
    blocking consumer's thread) costs more than framing it.

    A reader filling the local cache publishes its copy only once the whole object decoded
    clean; damage found in a copy *from* the cache is raised naming the cache file, and the
    copy is removed (the next read downloads the object again)."""
    # Asked at each settle, not now: "auto" may find the shard compressed only once its first
    # bytes are fed, and inflated bytes are not the reader's bytes.
    reader.track_carried(
        lambda: decoder.framing.buffered_bytes if decoder.compression is None else 0
    )
    try:
        async for head in _after(first, reader):
            gathered: list[Records] = []
            try:
                for block in [head, *reader.take_ready(group_bytes - len(head))]:
                    if on_block is not None:
                        on_block(len(block))
                    framed = decoder.stream(block)  # raises after the records before damage
                    while True:
                        started = time.perf_counter()  # the format core's time, not ours
                        inflated = decoder.inflate_s
                        records = next(framed, None)
                        if stats is not None:
                            stats.framing_s += time.perf_counter() - started
                            stats.inflate_s += decoder.inflate_s - inflated
                        if records is None:
                            break
                        if decoder.compression is None:
                            gathered.append(records)  # stored: one chunk per group of pieces
                        else:
                            yield records  # inflated: each piece's records on their own
            except FormatError:
                if gathered:
                    yield _joined(gathered)
                raise
            if gathered:
                yield _joined(gathered)
        records = decoder.close()
        if records:
            yield records
        decoder.raise_pending()
        await reader.finish(clean=not decoder.dropped)
    except FormatError as exc:
        hit = reader.cache_hit
        if hit is None:
            raise
        await hit.discard()
        exc.relocated(
            hit.path,
            f"(the local cache's copy of {reader.obj.url}; the copy was removed: the next "
            "read downloads the object again)",
        )
        raise
    finally:
        await reader.aclose()


def stated_or_failing(
    chunks: AsyncGenerator[Records, None],
    shard: ObjectInfo,
    codec: str | None,
    store: ObjectStore,
    policy: RetryPolicy,
) -> AsyncGenerator[Records, None]:
    """``chunks`` of ``shard`` read as ``codec`` (``"auto"``: as its first bytes say); where
    that codec is its listing's statement and reading fails, a failure the statement explains
    (its bytes are not that codec) is raised as such
    (:func:`~streamrec.pipeline.listing.sidecars.stated_contradiction`), not as damage or a
    bad resume state. ``chunks`` themselves where nothing states the codec."""
    read_as = normalize_compression(codec)
    if read_as == "auto" or shard.compression != read_as:
        return chunks
    return _stated_or_failing(chunks, shard, read_as, store, policy)


@owned_generator
async def _stated_or_failing(
    chunks: AsyncGenerator[Records, None],
    shard: ObjectInfo,
    codec: Compression,
    store: ObjectStore,
    policy: RetryPolicy,
) -> AsyncGenerator[Records, None]:
    async with aclosing(chunks) as source:
        try:
            async for chunk in source:
                yield chunk
        except (FormatError, StateError) as exc:
            wrong = await stated_contradiction(shard, codec, store, policy)
            if wrong is not None:
                raise wrong from exc
            raise


def _joined(lists: list[Records]) -> Records:
    """One chunk of ``lists``' records (the one list itself when there is one: a block of
    small records is tens of thousands of them, not worth copying into another list)."""
    if len(lists) == 1:
        return lists[0]
    if all(type(records) is list for records in lists):
        return list(chain.from_iterable(lists))
    return RecordSpans.join(lists)


@owned_generator
async def _after(first: bytes | None, reader: ObjectReader) -> AsyncGenerator[bytes, None]:
    if first is not None:
        yield first
    async for piece in reader:
        yield piece


def _starts_large(piece: bytes, room: int) -> bool:
    """Whether ``piece`` starts with the clean header of a record read directly (large, and
    within the ``room`` left in the object: else the decoder says what is wrong at once)."""
    if len(piece) < HEADER_BYTES:
        return False
    length = read_header(memoryview(piece)[:HEADER_BYTES])
    smallest = min_record_bytes(DIRECT_RECORD_BYTES)
    return length is not None and smallest <= length + OVERHEAD_BYTES <= room


def _may_go_direct(
    reader: ObjectReader, compression: str | None, on_corrupt: OnCorrupt, start: int
) -> bool:
    """True when ``reader``'s large records may be read directly (see :func:`read_shard`)."""
    if not reader.probing or on_corrupt != "raise" or start >= reader.obj.size:
        return False
    choice = normalize_compression(compression)
    if choice == "auto":  # a file named as compressed is; otherwise its first header decides
        return compression_from_name(reader.obj.url) in (None, "unknown")
    return choice is None


def _report_drops(dropped: list[FormatError], reported: int, stats: Stats) -> int:
    for error in dropped[reported:]:
        stats.corrupt_skipped += 1
        logger.warning("skipping corrupt data: %s", error)
    return len(dropped)
