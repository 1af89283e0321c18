"""Records by global index: which shard and bytes hold them, read with coalesced range reads.

:class:`RecordTable` numbers the records of a list of indexed shards ``0 .. N-1`` (shard by
shard, in the order given) and answers where each one is. :func:`plan_spans` groups wanted
records into *spans* (:mod:`~streamrec.format.span`): neighbours share one range read when the
bytes between them cost less than another request (``gap_bytes``), up to ``span_bytes`` per
read. :func:`read_records` reads the spans concurrently (at most ``max_concurrency`` at once,
every byte reserved in the prefetch budget before it is requested), decodes and CRC-checks
them, and returns the records in the order asked, duplicates included.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streamrec._portal import run_all
from streamrec.errors import FormatError, TransientStorageError
from streamrec.format.codecs import Compression
from streamrec.format.index import ShardIndex
from streamrec.format.span import SpanDecoder
from streamrec.pipeline.budget import ByteBudget
from streamrec.pipeline.prefetch import ObjectReader
from streamrec.storage.base import ObjectInfo, ObjectStore
from streamrec.storage.retry import RetryPolicy

__all__ = ["RecordTable", "Span", "plan_spans", "read_records"]

# Records closer than this share one range read (see opener._GAP_BYTES for the reasoning:
# a request on a cloud link costs about what this many bytes cost).
DEFAULT_GAP_BYTES = 256 << 10


@dataclass(frozen=True, eq=False)
class RecordTable:
    """The records of ``shards`` (each with its index and codec), numbered globally."""

    shards: Sequence[ObjectInfo]
    indexes: Sequence[ShardIndex]
    compressions: Sequence[Compression]
    starts: npt.NDArray[np.int64]  # global index of each shard's first record; then the total

    @classmethod
    def build(
        cls,
        shards: Sequence[ObjectInfo],
        indexes: Sequence[ShardIndex],
        compressions: Sequence[Compression],
    ) -> RecordTable:
        counts = np.fromiter((len(index) for index in indexes), dtype=np.int64, count=len(indexes))
        starts = np.zeros(len(indexes) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        return cls(list(shards), list(indexes), list(compressions), starts)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, indices: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], ...]:
        """``(ordinals, local)``: each global index's shard and its record number there;
        IndexError naming the first index out of range."""
        total = len(self)
        bad = np.flatnonzero((indices < 0) | (indices >= total))
        if len(bad):
            raise IndexError(f"record index {int(indices[bad[0]])} out of range (0..{total - 1})")
        ordinals = np.searchsorted(self.starts, indices, side="right") - 1
        return ordinals, indices - self.starts[ordinals]


@dataclass(frozen=True)
class Span:
    """One range read: records ``first .. last`` (inclusive) of shard ``ordinal``, stored in
    bytes ``start .. end``."""

    ordinal: int
    first: int
    last: int
    start: int
    end: int


def _span_of(table: RecordTable, ordinal: int, first: int, last: int) -> Span:
    index = table.indexes[ordinal]
    if table.compressions[ordinal] is None:
        end = int(index.offsets[last] + index.lengths[last])
        return Span(ordinal, first, last, int(index.offsets[first]), end)
    assert index.restarts is not None
    restarts = index.restarts
    after = int(np.searchsorted(restarts, restarts[last], side="right"))
    end = int(restarts[after]) if after < len(restarts) else table.shards[ordinal].size
    return Span(ordinal, first, last, int(restarts[first]), end)


def plan_spans(
    table: RecordTable,
    ordinal: int,
    local: Sequence[int],
    *,
    gap_bytes: int = DEFAULT_GAP_BYTES,
    span_bytes: int,
) -> list[Span]:
    """The range reads that fetch records ``local`` (sorted, distinct) of shard ``ordinal``:
    one span per run of records whose stored bytes are at most ``gap_bytes`` apart and
    together at most ``span_bytes`` (a single record's span may be larger)."""
    if not table.indexes[ordinal].random_access:
        raise FormatError(
            "random access needs an index with restart points: this compressed shard's index "
            "only counts records (rewrite it with `streamrec reshard --index`, or read it "
            "sequentially)",
            url=table.shards[ordinal].url,
        )
    spans: list[Span] = []
    current = _span_of(table, ordinal, local[0], local[0])
    for record in local[1:]:
        alone = _span_of(table, ordinal, record, record)
        if alone.start - current.end <= gap_bytes and alone.end - current.start <= span_bytes:
            current = Span(
                ordinal, current.first, record, current.start, max(current.end, alone.end)
            )
        else:
            spans.append(current)
            current = alone
    spans.append(current)
    return spans


async def read_records(
    table: RecordTable,
    indices: Sequence[int],
    *,
    store_of: Callable[[str], ObjectStore],
    budget: ByteBudget,
    policy: RetryPolicy,
    max_concurrency: int,
    span_bytes: int,
    verify_crc: bool = True,
    gap_bytes: int = DEFAULT_GAP_BYTES,
    on_retry: Callable[[TransientStorageError], None] | None = None,
) -> list[bytes]:
    """The records at global ``indices``, in that order (see the module docstring)."""
    wanted = np.asarray(indices, dtype=np.int64)
    if not len(wanted):
        return []
    ordinals, local = table.locate(wanted)
    spans: list[Span] = []
    for ordinal in np.unique(ordinals).tolist():
        mine = np.unique(local[ordinals == ordinal]).tolist()
        spans += plan_spans(table, ordinal, mine, gap_bytes=gap_bytes, span_bytes=span_bytes)
    found: dict[tuple[int, int], bytes] = {}
    wanted_set = set(zip(ordinals.tolist(), local.tolist(), strict=True))
    limit = max(1, max_concurrency)
    queue = list(reversed(spans))

    async def worker() -> None:
        while queue:
            span = queue.pop()
            records = await _read_span(table, span, store_of, budget, policy, verify_crc, on_retry)
            for k, record in enumerate(records, start=span.first):
                if (span.ordinal, k) in wanted_set:
                    found[(span.ordinal, k)] = record

    await run_all(worker() for _ in range(min(limit, len(spans))))
    return [found[key] for key in zip(ordinals.tolist(), local.tolist(), strict=True)]


async def _read_span(
    table: RecordTable,
    span: Span,
    store_of: Callable[[str], ObjectStore],
    budget: ByteBudget,
    policy: RetryPolicy,
    verify_crc: bool,
    on_retry: Callable[[TransientStorageError], None] | None,
) -> list[bytes]:
    shard, index = table.shards[span.ordinal], table.indexes[span.ordinal]
    compression = table.compressions[span.ordinal]
    skip = 0
    if compression is not None:
        assert index.skips is not None
        skip = int(index.skips[span.first])
    decoder = SpanDecoder(
        url=shard.url,
        compression=compression,
        lengths=index.lengths[span.first : span.last + 1].tolist(),
        offset=int(index.offsets[span.first]),
        index=span.first,
        skip=skip,
        at_stream_start=compression is not None and span.start == 0,
        verify_crc=verify_crc,
    )
    length = max(span.end - span.start, 1)
    reader = ObjectReader(
        store_of(shard.url),
        ObjectInfo(shard.url, span.end, shard.version),
        budget,
        start=span.start,
        block_bytes=length,
        first_block_bytes=length,
        max_concurrency=1,
        policy=policy,
        on_retry=on_retry,
    )
    async with aclosing(_pieces(reader)) as pieces:
        async for piece in pieces:
            decoder.feed(piece)
            if decoder.done:
                break
    return decoder.close()


async def _pieces(reader: ObjectReader) -> AsyncGenerator[bytes, None]:
    try:
        reader.prime()
        async for piece in reader:
            yield piece
    finally:
        await reader.aclose()
