"""Records by global index: which shard and bytes hold them, read with coalesced range reads.

:class:`RecordTable` numbers the records of a list of indexed shards ``0 .. N-1`` (shard by
shard, in the order given) and answers where each one is. :func:`plan_spans` groups wanted
records into *spans* (:mod:`~streamrec.format.span`): neighbours share one range read when the
bytes between them cost less than another request (``gap_bytes``), up to ``span_bytes`` per
read. :func:`read_records` reads the spans concurrently (at most ``max_concurrency`` at once,
every span's bytes reserved in the prefetch budget before it is requested, without overdraft:
with ``span_bytes`` at most the budget, the budget is never exceeded unless one record is
larger), decodes and CRC-checks them, and returns the records in the order asked, duplicates
included. Planning is vectorised (numpy): a Python step per span, not per record.

An index is untrusted: a span is read only from a *verified* boundary
(:mod:`~streamrec.pipeline.indexed.trust`: the entries before it checked against the shard's own
length fields, or a compressed shard checked whole, once per dataset), so an index cannot
make bytes inside a payload a record. A compressed span is also cut and reserved by what it
inflates to (``Span.inflated``), and inflated a bounded piece at a time.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from streamrec._portal import run_all
from streamrec.errors import (
    FormatError,
    IndexMismatchError,
    RandomAccessUnavailableError,
    TransientStorageError,
)
from streamrec.format.codecs import Compression
from streamrec.format.index.core import ShardIndex
from streamrec.format.span import coalesce
from streamrec.pipeline.budget import ByteBudget
from streamrec.pipeline.indexed.host_checks import HostChecks
from streamrec.pipeline.indexed.span_read import read_span, trust_span
from streamrec.pipeline.indexed.trust import (
    BoundaryTrust,
    ShardKey,
    shard_key,
)
from streamrec.pipeline.listing.dataset_index import MappedIndexes, load_dataset_index
from streamrec.pipeline.listing.lengths import index_command
from streamrec.pipeline.listing.sidecars import load_indexes_and_codecs, stated_contradiction
from streamrec.pipeline.listing.urls import list_shards
from streamrec.pipeline.options import (
    DEFAULT_GAP_BYTES,
    DEFAULT_MAX_READ_AMPLIFICATION,
    ReadOptions,
)
from streamrec.pipeline.stats import Stats
from streamrec.redact import redact
from streamrec.storage.base import ObjectInfo, ObjectStore
from streamrec.storage.registry import StoreSet
from streamrec.storage.retry import RetryPolicy

__all__ = ["RecordTable", "Span", "as_indices", "build_table", "plan_spans", "read_records"]

Int64Array = npt.NDArray[np.int64]


def as_indices(indices: Sequence[int] | npt.ArrayLike) -> Int64Array:
    """``indices`` (a sequence or 1-d array of integers) as an int64 array; TypeError for
    anything else (floats, booleans, a lone integer)."""
    if isinstance(indices, (int, np.integer)):
        raise TypeError(
            f"record indices must be a sequence of integers, not the integer {indices}: "
            "ds.get([i])[0] reads one record"
        )
    array = np.asarray(indices)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise TypeError(
            f"record indices must be a sequence of integers, not {array.ndim}-d {array.dtype}"
        )
    if array.dtype.kind == "u" and array.max() > np.iinfo(np.int64).max:
        raise IndexError(f"record index {int(array.max())} out of range")
    return array.astype(np.int64, copy=False)


@dataclass(frozen=True, eq=False)
class RecordTable:
    """The records of ``shards`` (each with its index and codec), numbered globally."""

    shards: Sequence[ObjectInfo]
    indexes: Sequence[ShardIndex]
    compressions: Sequence[Compression]
    starts: Int64Array  # global index of each shard's first record; then the total
    framed_bytes: int
    """Every record's framed bytes, in all (the mean record size, without the entries)."""
    trust: BoundaryTrust = field(default_factory=BoundaryTrust, repr=False)
    """Which entries of each index are verified against the shard (pipeline/indexed/trust.py)."""
    _keys: dict[int, ShardKey] = field(default_factory=dict, repr=False)

    def shard_key(self, ordinal: int) -> ShardKey:
        """Shard ``ordinal`` with its index, as :attr:`trust` knows it (made once)."""
        key = self._keys.get(ordinal)
        if key is None:
            shard = self.shards[ordinal]
            if isinstance(self.indexes, MappedIndexes):  # keyed without decoding the entries
                key = (shard.url, shard.size, shard.version, self.indexes.digest(ordinal))
            else:
                key = shard_key(shard, self.indexes[ordinal])
            self._keys[ordinal] = key
        return key

    @classmethod
    def build(
        cls,
        shards: Sequence[ObjectInfo],
        indexes: Sequence[ShardIndex],
        compressions: Sequence[Compression],
        trust: BoundaryTrust | None = None,
    ) -> RecordTable:
        """The table of indexes in hand; ``trust``: what is verified of the shards' indexes,
        shared with other tables of the same dataset (a new one by default)."""
        counts = [len(index) for index in indexes]
        framed = sum(int(index.lengths.sum()) for index in indexes)
        return cls.of_counts(shards, list(indexes), compressions, counts, framed, trust)

    @classmethod
    def of_counts(
        cls,
        shards: Sequence[ObjectInfo],
        indexes: Sequence[ShardIndex],
        compressions: Sequence[Compression],
        counts: Sequence[int],
        framed_bytes: int,
        trust: BoundaryTrust | None = None,
    ) -> RecordTable:
        """The table from each shard's record count: ``indexes`` may decode a shard's entries
        only when asked (:class:`~streamrec.pipeline.listing.dataset_index.MappedIndexes`)."""
        starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(np.asarray(counts, dtype=np.int64), out=starts[1:])
        return cls(
            list(shards),
            indexes,
            list(compressions),
            starts,
            framed_bytes,
            trust or BoundaryTrust(),
        )

    def __len__(self) -> int:
        return int(self.starts[-1])

    def counts(self) -> tuple[int, ...]:
        """Each shard's record count, in order."""
        return tuple(np.diff(self.starts).tolist())

    def normalize(self, indices: Int64Array) -> Int64Array:
        """``indices`` with negative ones counted from the end (as a Python sequence's);
        IndexError naming the first one out of range and the record count."""
        total = len(self)
        bad = np.flatnonzero((indices < -total) | (indices >= total))
        if len(bad):
            index = int(indices[bad[0]])
            if not total:
                raise IndexError(f"record index {index} out of range: the dataset has no records")
            raise IndexError(
                f"record index {index} out of range: the dataset has {total} records "
                f"(0..{total - 1}, or -{total}..-1 from the end)"
            )
        return np.where(indices < 0, indices + total, indices)

    def lengths_of(self, records: Int64Array) -> Int64Array:
        """The framed length of each of ``records`` (global numbers, in range): one gather
        per shard they fall in, no table of every record's length."""
        ordinals = np.searchsorted(self.starts, records, side="right") - 1
        order = np.argsort(ordinals, kind="stable")
        grouped = ordinals[order]
        cuts = np.flatnonzero(np.diff(grouped)) + 1
        out = np.empty(len(records), dtype=np.int64)
        for low, high in itertools.pairwise([0, *cuts.tolist(), len(records)]):
            ordinal = int(grouped[low])
            chosen = order[low:high]
            local = records[chosen] - self.starts[ordinal]
            if isinstance(self.indexes, MappedIndexes):  # no shard's entries decoded for it
                out[chosen] = self.indexes.framed_lengths(ordinal, local)
            else:
                out[chosen] = self.indexes[ordinal].lengths[local]
        return out

    def entries(self, ordinal: int, low: int, high: int) -> tuple[Int64Array, Int64Array]:
        """Shard ``ordinal``'s index entries ``low .. high-1``: (offsets, framed lengths).
        From a dataset index, those alone are decoded (none of the shard's others): what a
        read or check holds across its awaits (see MappedIndexes.entries)."""
        if isinstance(self.indexes, MappedIndexes):
            return self.indexes.entries(ordinal, low, high)
        index = self.indexes[ordinal]
        return index.offsets[low:high], index.lengths[low:high]

    def locate(self, indices: Int64Array) -> tuple[Int64Array, Int64Array]:
        """``(ordinals, local)``: each global index's shard and its record number there;
        IndexError naming the first index out of range."""
        indices = self.normalize(indices)
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
    inflated: int = 0
    """A compressed span's uncompressed bytes, from its restart point to its last record's
    end (what inflating it produces at most); 0 for an uncompressed one."""


def _extents(table: RecordTable, ordinal: int, local: Int64Array) -> tuple[Int64Array, Int64Array]:
    """Where each record's own span starts and ends as stored: an uncompressed record's bytes;
    a compressed one's restart point up to the next restart point (or the object's end)."""
    if table.compressions[ordinal] is None:  # (local: sorted, not empty) entries among them
        low = int(local[0])
        offsets, lengths = table.entries(ordinal, low, int(local[-1]) + 1)
        starts = offsets[local - low]
        return starts, starts + lengths[local - low]
    index = table.indexes[ordinal]
    restarts = index.restarts
    assert restarts is not None  # (checked by plan_spans: random access)
    starts = restarts[local]
    after = np.searchsorted(restarts, starts, side="right")
    following = restarts[np.minimum(after, len(restarts) - 1)]
    ends = np.where(after < len(restarts), following, table.shards[ordinal].size)
    return starts, ends.astype(np.int64)


def plan_spans(
    table: RecordTable,
    ordinal: int,
    local: Sequence[int] | Int64Array,
    *,
    gap_bytes: int = DEFAULT_GAP_BYTES,
    span_bytes: int,
    max_amplification: float | None = None,
) -> list[Span]:
    """The range reads that fetch records ``local`` (sorted, distinct) of shard ``ordinal``:
    one span per run of records whose stored bytes are at most ``gap_bytes`` apart and
    together at most ``span_bytes`` (a single record's span may be larger), fetching at most
    ``max_amplification`` times the stored bytes the records need (format/span.py)."""
    indexes = table.indexes
    if not (
        indexes.random_access(ordinal)
        if isinstance(indexes, MappedIndexes)
        else indexes[ordinal].random_access
    ):
        raise RandomAccessUnavailableError(
            f"{redact(table.shards[ordinal].url)}: this compressed shard's record index only "
            "counts records (no restart points): rewrite it with `streamrec reshard --index` "
            "for random access, or read it sequentially"
        )
    records = np.asarray(local, dtype=np.int64)
    if not len(records):
        return []
    starts, ends = _extents(table, ordinal, records)
    if table.compressions[ordinal] is None:
        return [
            Span(ordinal, int(records[k]), int(records[j - 1]), int(starts[k]), int(ends[j - 1]))
            for k, j in coalesce(
                starts,
                ends,
                gap_bytes=gap_bytes,
                span_bytes=span_bytes,
                max_amplification=max_amplification,
            )
        ]
    # compressed: a span is cut by what it inflates to as well (up to 1032x its stored bytes)
    index = table.indexes[ordinal]
    assert index.skips is not None
    points = index.offsets[records] - index.skips[records]
    record_ends = index.offsets[records] + index.lengths[records]
    runs = coalesce(
        starts,
        ends,
        gap_bytes=gap_bytes,
        span_bytes=span_bytes,
        inflated=(points, record_ends),
        max_amplification=max_amplification,
    )
    return [
        Span(
            ordinal,
            int(records[k]),
            int(records[j - 1]),
            int(starts[k]),
            int(ends[j - 1]),
            int(record_ends[j - 1] - points[k]),
        )
        for k, j in runs
    ]


async def read_records(
    table: RecordTable,
    indices: Sequence[int] | Int64Array,
    *,
    store_of: Callable[[str], ObjectStore],
    budget: ByteBudget,
    policy: RetryPolicy,
    max_concurrency: int,
    span_bytes: int,
    gate: asyncio.Semaphore | None = None,
    verify_crc: bool = True,
    gap_bytes: int = DEFAULT_GAP_BYTES,
    max_amplification: float | None = DEFAULT_MAX_READ_AMPLIFICATION,
    stats: Stats | None = None,
    on_retry: Callable[[TransientStorageError], None] | None = None,
) -> list[bytes]:
    """The records at global ``indices`` (negative ones from the end), in that order (see the
    module docstring). At most ``max_concurrency`` range reads are in flight, and at most
    ``gate``'s slots when given (a semaphore of that many, shared by concurrent calls);
    coalesced reads fetch at most ``max_amplification`` times the records' stored bytes.
    ``stats`` (optional) counts the records' bytes (``bytes_read``), the bytes fetched for
    them, boundary checks included (``bytes_fetched``), and the records decoded."""
    wanted = table.normalize(as_indices(indices))
    if not len(wanted):
        return []
    unique, inverse = np.unique(wanted, return_inverse=True)
    ordinals = np.searchsorted(table.starts, unique, side="right") - 1
    spans: list[Span] = []
    shard_cuts = np.flatnonzero(np.diff(ordinals)) + 1
    for low, high in itertools.pairwise([0, *shard_cuts.tolist(), len(unique)]):
        ordinal = int(ordinals[low])
        local = unique[low:high] - table.starts[ordinal]
        spans += plan_spans(
            table,
            ordinal,
            local,
            gap_bytes=gap_bytes,
            span_bytes=span_bytes,
            max_amplification=max_amplification,
        )
    # the wanted records of span k are unique[bounds[k]:bounds[k + 1]] (both sorted)
    firsts = np.array([table.starts[s.ordinal] + s.first for s in spans], dtype=np.int64)
    bounds = [*np.searchsorted(unique, firsts).tolist(), len(unique)]
    got: list[bytes] = [b""] * len(unique)
    queue = iter(range(len(spans)))
    slots = gate or asyncio.Semaphore(max_concurrency)
    checks = max(1, max_concurrency)  # a boundary check's reads in flight

    async def worker() -> None:
        for k in queue:
            span = spans[k]
            key = table.shard_key(span.ordinal)
            got_by_check: list[list[bytes]] = []

            async def merged(
                start: int, span: Span = span, got: list[list[bytes]] = got_by_check
            ) -> int:
                # the check's read and the span's are one (span_read.mergeable): records kept.
                # Without a slot, as the check's reads: the slots bound the reads of verified
                # spans; taking one here would cut the reads in flight below what the check
                # and the span had apart (measured: block shuffle of 100 KiB records)
                got.append(
                    await read_span(
                        table,
                        span,
                        store_of,
                        budget,
                        policy,
                        verify_crc,
                        stats,
                        on_retry,
                        verify_from=start,
                    )
                )
                return span.first

            try:
                with table.trust.reading(key, span.first, span.last + 1):
                    # its first record must start at a verified boundary (checked without a
                    # slot: the check's reads are reserved in the budget like any; or with
                    # the span's own read, also without)
                    await trust_span(
                        table,
                        span,
                        store_of,
                        budget,
                        policy,
                        on_retry,
                        stats,
                        checks,
                        gap_bytes,
                        span_bytes,
                        merged,
                    )
                    if got_by_check:
                        records = got_by_check[0]
                    else:
                        async with slots:
                            records = await read_span(
                                table, span, store_of, budget, policy, verify_crc, stats, on_retry
                            )
                    # framed exactly as the index says from a verified boundary: verified too
                    table.trust.extend(key, span.last + 1)
            except FormatError as exc:  # read as a codec metadata states, not the shard's?
                shard = table.shards[span.ordinal]
                wrong = await stated_contradiction(
                    shard,
                    table.compressions[span.ordinal],
                    store_of(shard.url),
                    policy,
                    on_retry=on_retry,
                )
                if wrong is not None:
                    raise wrong from exc
                raise
            low, high = bounds[k], bounds[k + 1]
            first = int(firsts[k])
            if stats is not None:  # the wanted records' framed bytes
                stats.bytes_read += int(table.lengths_of(unique[low:high]).sum())
            for at, index in enumerate(unique[low:high].tolist(), start=low):
                got[at] = records[index - first]  # only the wanted ones are kept

    await run_all(worker() for _ in range(min(len(spans), max(1, max_concurrency))))
    return [got[at] for at in inverse.reshape(-1).tolist()]


async def build_table(
    urls: Sequence[str],
    options: ReadOptions,
    stats: Stats,
    stores: StoreSet,
    shards: Sequence[ObjectInfo] | None = None,
    trust: BoundaryTrust | None = None,
) -> RecordTable:
    """The record table of the shards ``urls`` stand for (listed unless ``shards`` are
    given): see the module docstring. ``trust``: what is verified of the shards' indexes
    already (the dataset's; indexed/trust.py)."""

    def count_retry(_: Exception) -> None:
        stats.retries += 1

    if shards is None:
        shards = await list_shards(urls, options, stores.get, stats)
    source = await load_dataset_index(shards, stores.get, options, stats)
    if source is not None:
        # the index states each shard's codec: a shard whose bytes are not it is said so
        stated = [
            replace(shard, compression=codec) if shard.compression == "unknown" else shard
            for shard, codec in zip(shards, source.compressions, strict=True)
        ]
        for shard, codec, random_access in zip(
            stated, source.compressions, source.random_access, strict=True
        ):
            if not random_access:
                store = stores.get(shard.url)
                wrong = await stated_contradiction(
                    shard, codec, store, options.retry, on_retry=count_retry
                )
                raise _not_random_access(shard) if wrong is None else wrong
        return _with_host_checks(
            RecordTable.of_counts(
                stated,
                source.indexes,
                source.compressions,
                source.counts,
                source.framed_bytes,
                trust,
            ),
            options,
        )
    loaded = await load_indexes_and_codecs(
        shards, stores.get, options.retry, compression=options.compression, on_retry=count_retry
    )
    missing = [shard.url for shard, found in zip(shards, loaded, strict=True) if found is None]
    if missing:
        raise RandomAccessUnavailableError(
            f"reading records by index needs every shard's record index (SHARD.idx): "
            f"{len(missing)} of {len(shards)} shards have none (e.g. {redact(missing[0])}); "
            f"index them once with `{index_command(urls)}` (GZIP/ZLIB shards: rewrite them "
            "with `streamrec reshard --index`, or write them with index=True)"
        )
    indexes, codecs = [], []
    for shard, found in zip(shards, loaded, strict=True):
        assert found is not None
        index, codec = found
        if not index.random_access:
            wrong = await stated_contradiction(
                shard, codec, stores.get(shard.url), options.retry, on_retry=count_retry
            )
            if wrong is not None:  # an uncompressed shard its metadata says is compressed
                raise wrong
            raise _not_random_access(shard)
        if shard.records is not None and shard.records != len(index):
            raise IndexMismatchError(
                f"its manifest says {shard.records} records, its record index has "
                f"{len(index)}: one of them is stale",
                url=shard.url,
            )
        indexes.append(index)
        codecs.append(codec)
    return _with_host_checks(RecordTable.build(shards, indexes, codecs, trust), options)


def _with_host_checks(table: RecordTable, options: ReadOptions) -> RecordTable:
    """``table``, its checks recorded for the host's other processes (indexed/host_checks.py)
    where any shard is read pinned to a version (only those are recorded)."""
    if table.trust.host is None:
        table.trust.host = HostChecks.for_dataset(options.cache_dir, table.shards)
    return table


def _not_random_access(shard: ObjectInfo) -> RandomAccessUnavailableError:
    return RandomAccessUnavailableError(
        f"{redact(shard.url)}: reading records by index needs a GZIP/ZLIB shard "
        "written with its random-access index (index=True: restart points); this "
        "one's index only counts records. Rewrite the shards with `streamrec reshard "
        "--index` (they can still be read sequentially)"
    )
