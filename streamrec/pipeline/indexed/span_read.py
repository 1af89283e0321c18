"""Reading one span of an indexed shard's records, its boundary made verified first.

:func:`trust_span` makes sure a span starts at a verified boundary
(:mod:`~streamrec.pipeline.indexed.trust`); where the check's read and the span's fetch about
the same bytes (:func:`mergeable`), they are one request (:func:`read_span`'s
``verify_from``): the entries before the span checked against those bytes, then the span's
records framed. :func:`read_span` reads, frames and CRC-checks a span's records within the
byte budget.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from streamrec.errors import TransientStorageError
from streamrec.format.index.check import check_entries
from streamrec.format.span import SpanDecoder
from streamrec.pipeline.budget import ByteBudget
from streamrec.pipeline.indexed.trust import (
    Entries,
    budgeted_reader,
    verify_compressed,
    verify_plain,
)
from streamrec.pipeline.stats import Stats
from streamrec.pipeline.stream.prefetch import read_exact
from streamrec.storage.base import ObjectStore
from streamrec.storage.retry import RetryPolicy

if TYPE_CHECKING:
    from streamrec.pipeline.indexed.table import Int64Array, RecordTable, Span

__all__ = ["mergeable", "read_span", "trust_span"]


async def trust_span(
    table: RecordTable,
    span: Span,
    store_of: Callable[[str], ObjectStore],
    budget: ByteBudget,
    policy: RetryPolicy,
    on_retry: Callable[[TransientStorageError], None] | None,
    stats: Stats | None,
    concurrency: int,
    gap_bytes: int,
    span_bytes: int,
    merged: Callable[[int], Awaitable[int]] | None = None,
) -> None:
    """Make sure ``span`` starts at a verified boundary (pipeline/indexed/trust.py), with reads as
    the spans' (``gap_bytes``, ``span_bytes``), counted in ``stats``. ``merged(start)``: the
    span read from entry ``start`` (verified), its entries before ``span.first`` checked from
    those bytes (:func:`read_span`'s ``verify_from``): one request for the check and the
    records, used where it fetches about what the two would (:func:`_mergeable`)."""
    ordinal = span.ordinal
    shard = table.shards[ordinal]
    compression = table.compressions[ordinal]
    read = budgeted_reader(store_of(shard.url), shard, budget, policy, on_retry, stats)

    def entries(low: int, high: int) -> tuple[Int64Array, Int64Array]:
        return table.entries(ordinal, low, high)

    # the shard's index is decoded only by a check that runs, and for a compressed shard
    # only: a span waiting (for the lock, a span before it, the budget) holds none
    async def verify(start: int, upto: int) -> int:
        if compression is not None:
            return await verify_compressed(
                table.indexes[ordinal], compression, shard, read, span_bytes=span_bytes
            )
        if (
            merged is not None
            and upto == span.first
            and mergeable(entries, start, span, gap_bytes, span_bytes)
        ):
            return await merged(start)
        return await verify_plain(
            entries,
            start,
            upto,
            read,
            url=shard.url,
            gap_bytes=gap_bytes,
            span_bytes=span_bytes,
            concurrency=concurrency,
        )

    key = table.shard_key(ordinal)
    if compression is None:
        await table.trust.ensure(key, span.first, verify, slot=ordinal)
    else:  # its restart point too: the whole shard is checked at once
        count = int(table.starts[ordinal + 1] - table.starts[ordinal])
        await table.trust.ensure(key, count, verify, wait=False, slot=ordinal)


def mergeable(entries: Entries, start: int, span: Span, gap_bytes: int, span_bytes: int) -> bool:
    """Whether checking an uncompressed shard's entries ``start .. span.first-1`` with the
    span's own read fetches about what the check and the span would apart: the check reads
    its length fields in one run (no record between them over ``gap_bytes``, the whole within
    ``span_bytes``), so one read from entry ``start`` to the span's end adds only the last
    checked record's payload (at most ``gap_bytes``) and saves a request."""
    if not start < span.first:
        return False
    offsets, lengths = entries(start, span.first)
    if span.end - int(offsets[0]) > span_bytes:
        return False
    return bool(int(lengths.max()) <= gap_bytes)


async def read_span(
    table: RecordTable,
    span: Span,
    store_of: Callable[[str], ObjectStore],
    budget: ByteBudget,
    policy: RetryPolicy,
    verify_crc: bool,
    stats: Stats | None,
    on_retry: Callable[[TransientStorageError], None] | None,
    *,
    verify_from: int | None = None,
) -> list[bytes]:
    """The records of ``span``, read, framed and CRC-checked. ``verify_from`` (an uncompressed
    shard's verified entry before ``span.first``): read from that entry's offset instead, and
    its entries up to ``span.first`` checked against those bytes first (IndexMismatchError:
    the span is not read as records)."""
    # the span's own entries only, taken before any await (none held while it waits)
    shard, ordinal = table.shards[span.ordinal], span.ordinal
    compression = table.compressions[ordinal]
    offsets, lengths = table.entries(ordinal, span.first, span.last + 1)
    start = (
        span.start
        if verify_from is None
        else int(table.entries(ordinal, verify_from, verify_from + 1)[0][0])
    )
    skip = 0
    if compression is not None:
        skips = table.indexes[ordinal].skips
        assert skips is not None
        skip = int(skips[span.first])
        del skips
    decoder = SpanDecoder(
        url=shard.url,
        compression=compression,
        lengths=lengths.tolist(),
        offset=int(offsets[0]),
        index=span.first,
        skip=skip,
        at_stream_start=compression is not None and span.start == 0,
        verify_crc=verify_crc,
    )
    del offsets, lengths
    length = span.end - start
    # a compressed span also holds what it inflates to (the index's claim, capped when it
    # was parsed at 1032x the stored bytes; inflated a bounded piece at a time)
    reserved = length + span.inflated
    await budget.reserve(reserved)  # no overdraft: granted alone when it exceeds the budget
    try:
        pieces = await read_exact(
            store_of(shard.url),
            shard,
            start,
            span.end,
            policy=policy,
            on_retry=on_retry,
            on_read=None if stats is None else stats.count_read,
        )
        if stats is not None:  # fetched, whatever its decoding finds
            stats.bytes_fetched += length
        if verify_from is not None:
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            del pieces
            checked = table.entries(ordinal, verify_from, span.first)
            check_entries(data, start, *checked, verify_from, shard.url)
            del checked
            if stats is not None:
                stats.bytes_checked += span.start - start
            pieces = [data[span.start - start :]]
            del data
        started = time.perf_counter()
        for piece in pieces:
            decoder.feed(piece)
            if decoder.done:
                break
        del pieces
        records = decoder.close()
        if stats is not None:
            stats.framing_s += time.perf_counter() - started
    finally:
        budget.release(reserved)
    if stats is not None:
        stats.records_read += len(records)
    return records
