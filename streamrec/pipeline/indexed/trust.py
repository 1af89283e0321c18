"""Which records of an indexed shard are known to be records: checked before any is read.

An index sidecar is untrusted: entries that add up but cut the shard at other boundaries
would make random access return bytes of a payload as records
(:mod:`streamrec.format.index.check`). A span of records is read only from a *verified*
boundary: the shard's start, or the start of an entry whose predecessors were all checked
against the shard's own framing. :class:`BoundaryTrust` keeps, per shard (and index), how
many leading entries are verified, for as long as its dataset lives in the process (and in
the DataLoader workers it is pickled into); the spans read extend it for free (their records
are framed from a verified boundary). What checking costs, once per shard and dataset:

* **uncompressed**: the 8-byte length field of every entry before the first record wanted
  that is not verified yet (:func:`verify_plain`): one range read per run of entries whose
  length fields lie at most ``gap_bytes`` (256 KiB) apart and together within ``span_bytes``
  (``block_bytes``, 4 MiB): for records under 256 KiB about the prefix's bytes in 4 MiB reads,
  for larger ones one 8-byte read each; up to ``max_concurrency`` at once. Where one such
  run would end just before the span that needs it, the check rides on the span's own read
  instead (:mod:`~streamrec.pipeline.indexed.span_read`: one read from the verified entry,
  the length fields checked from its bytes before any record is framed): no request more.
* **GZIP/ZLIB** (an extended index): the whole shard, read in ``span_bytes`` reads and inflated
  twice, on first use (:func:`verify_compressed`): the stream from its start, and each run
  from its restart point, compared (a restart point is only one if the bytes from it are the
  stream's).

A versioned shard's check is also recorded for the host's other processes
(:mod:`~streamrec.pipeline.indexed.host_checks`): a DataLoader worker, a DDP rank or a resumed
run of the same host takes that record's word instead of reading the shard again.

Every read is reserved in the caller's byte budget first; its pieces are dropped once
checked. A failed check raises :class:`~streamrec.errors.IndexMismatchError` and verifies
nothing: every later read of that shard checks again.
"""

from __future__ import annotations

import asyncio
import hashlib
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrec._portal import run_all
from streamrec.format.codecs import Compression
from streamrec.format.index.check import CompressedCheck, check_entries
from streamrec.format.index.core import ShardIndex
from streamrec.format.span import coalesce
from streamrec.pipeline.budget import ByteBudget
from streamrec.pipeline.indexed.host_checks import HostChecks
from streamrec.pipeline.stats import Stats
from streamrec.pipeline.stream.prefetch import read_exact
from streamrec.storage.base import ObjectInfo, ObjectStore
from streamrec.storage.retry import RetryPolicy

__all__ = [
    "BoundaryTrust",
    "Entries",
    "Reader",
    "ShardKey",
    "budgeted_reader",
    "shard_key",
    "verify_compressed",
    "verify_plain",
]

Reader = Callable[[int, int], Awaitable[list[bytes]]]
"""``read(start, end)``: exactly those stored bytes of the shard, reserved in the budget by
the caller."""

_LENGTH_BYTES = 8


ShardKey = tuple[str, int, str | None, bytes]
"""A shard as its boundaries were verified: url, size, version and a digest of its index."""


def shard_key(shard: ObjectInfo, index: ShardIndex) -> ShardKey:
    """What a verification holds for: this shard (url, size, version) with this index (a
    BLAKE2b digest of its columns: 8 bytes a number hashed once per table)."""
    digest = hashlib.blake2b(digest_size=16)
    for column in (index.offsets, index.lengths, index.restarts, index.skips):
        if column is not None:
            digest.update(np.ascontiguousarray(column).data)
    return (shard.url, shard.size, shard.version, digest.digest())


@dataclass(eq=False)
class _Read:
    """A span being read: once read, entries ``first .. stop-1`` are verified."""

    first: int
    stop: int
    done: asyncio.Event = field(default_factory=asyncio.Event)


class BoundaryTrust:
    """How many leading entries of each shard's index are verified (see the module
    docstring): one per dataset, shared by its ``get`` calls and every epoch's indexed
    reading (each builds its own record table, from the same shards and sidecars), kept in
    the DataLoader workers it is pickled into. Keyed by :func:`shard_key`: a shard or index
    that changed is checked again.

    A span read from a verified boundary verifies its own records, so a span waits for the
    spans being read before it (:meth:`reading`) rather than check their entries too: in
    order, reading costs nothing more; what is checked is only entries no span reads
    before them (the records between shuffled ones)."""

    def __init__(self) -> None:
        self.verified: dict[ShardKey, int] = {}
        self.host: HostChecks | None = None
        """The host's record of checks (pipeline/indexed/host_checks.py), set with the table."""
        # per event loop (locks and events belong to one): the checks and the spans read
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )

    def __getstate__(self) -> dict[str, Any]:
        return {"verified": dict(self.verified), "host": self.host}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self.verified.update(state["verified"])
        self.host = state.get("host")

    def trusted(self, key: ShardKey) -> int:
        """Entries of the shard that start where its own framing puts a record."""
        return self.verified.get(key, 0)

    def extend(self, key: ShardKey, upto: int) -> None:
        """Entries before ``upto`` are verified (records framed from a verified boundary)."""
        if upto > self.trusted(key):
            self.verified[key] = upto

    def _state(self) -> _LoopState:
        return self._loops.setdefault(asyncio.get_running_loop(), _LoopState())

    @contextmanager
    def reading(self, key: ShardKey, first: int, stop: int) -> Iterator[None]:
        """Entries ``first .. stop-1`` are being read as one span (which :meth:`extend` s
        the verified entries once read from a verified boundary)."""
        reads = self._state().reads.setdefault(key, [])
        read = _Read(first, stop)
        reads.append(read)
        try:
            yield
        finally:
            reads.remove(read)
            read.done.set()

    async def ensure(
        self,
        key: ShardKey,
        upto: int,
        verify: Callable[[int, int], Awaitable[int]],
        *,
        wait: bool = True,
        slot: int | None = None,
    ) -> None:
        """Entry ``upto`` of the shard starts at a verified boundary: waits for a span being
        read from the last verified entry (it verifies its records; not with ``wait=False``:
        a compressed shard is checked whole, its spans verify nothing), else
        ``verify(start, stop)`` checks the entries up to the next span being read (or
        ``upto``) and returns how many are verified then. One check per shard at a time.
        A versioned shard (``slot``: its place in the dataset) is looked up in the host's
        record first, and what this process verifies is recorded there."""
        state = self._state()
        # only for shards read pinned to a version (bytes that never change) does another
        # process's check hold: HostChecks knows which
        host = self.host if slot is not None else None
        looked_up = False
        while (start := self.trusted(key)) < upto:
            if host is not None and not looked_up:
                assert slot is not None
                looked_up = True
                known = host.known(slot, key)
                if known > start:
                    self.extend(key, known)
                    continue
            reads = state.reads.get(key, []) if wait else []
            covering = next((r for r in reads if r.first <= start < r.stop), None)
            if covering is not None:
                await covering.done.wait()
                continue
            stop = min((r.first for r in reads if start < r.first < upto), default=upto)
            async with state.locks.setdefault(key, asyncio.Lock()):
                if self.trusted(key) == start:
                    verified = await verify(start, stop)
                    self.extend(key, verified)
                    if host is not None:
                        assert slot is not None
                        host.record(slot, key, verified)


@dataclass
class _LoopState:
    locks: dict[ShardKey, asyncio.Lock] = field(default_factory=dict)
    reads: dict[ShardKey, list[_Read]] = field(default_factory=dict)


def budgeted_reader(
    store: ObjectStore,
    shard: ObjectInfo,
    budget: ByteBudget,
    policy: RetryPolicy,
    on_retry: Callable[[Any], None] | None,
    stats: Stats | None = None,
) -> Reader:
    """A :data:`Reader` of ``shard`` whose reads are reserved in ``budget`` while they are in
    flight (the caller drops their pieces before the next) and counted in ``stats``."""

    async def read(start: int, end: int) -> list[bytes]:
        await budget.reserve(end - start)
        try:
            pieces = await read_exact(
                store,
                shard,
                start,
                end,
                policy=policy,
                on_retry=on_retry,
                on_read=None if stats is None else stats.count_read,
            )
        finally:
            budget.release(end - start)
        if stats is not None:  # fetched, whatever the check finds
            stats.bytes_fetched += end - start
            stats.bytes_checked += end - start
        return pieces

    return read


Entries = Callable[[int, int], tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]
"""``entries(low, high)``: a shard's index entries ``low .. high-1`` (offsets, framed lengths),
decoded when asked (:meth:`~streamrec.pipeline.indexed.table.RecordTable.entries`)."""


async def verify_plain(
    entries: Entries,
    start: int,
    stop: int,
    read: Reader,
    *,
    url: str,
    gap_bytes: int,
    span_bytes: int,
    concurrency: int,
) -> int:
    """Check entries ``start .. stop-1`` of an uncompressed shard's index (``entries``)
    against its length fields (``start``: verified already); ``stop``. A run's entries are
    decoded once its bytes are read, and dropped with them: a check waiting for the budget
    holds none (issue 31)."""
    if stop <= start:
        return start
    offsets, _ = entries(start, stop)
    runs = [
        (start + k, start + j, int(offsets[k]), int(offsets[j - 1]) + _LENGTH_BYTES)
        for k, j in coalesce(
            offsets, offsets + _LENGTH_BYTES, gap_bytes=gap_bytes, span_bytes=span_bytes
        )
    ]
    del offsets
    queue = iter(runs)

    async def worker() -> None:
        for first, after, at, end in queue:
            pieces = await read(at, end)
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            del pieces
            check_entries(data, at, *entries(first, after), first, url)

    await run_all(worker() for _ in range(min(len(runs), max(1, concurrency))))
    return stop


async def verify_compressed(
    index: ShardIndex,
    compression: Compression,
    shard: ObjectInfo,
    read: Reader,
    *,
    span_bytes: int,
) -> int:
    """Check a compressed shard's whole extended ``index`` against it (read from its start,
    ``span_bytes`` at a time); every entry (``len(index)``)."""
    check = CompressedCheck(
        url=shard.url, compression=compression, index=index, stored_size=shard.size
    )
    step = max(1, span_bytes)
    for at in range(0, shard.size, step):
        for piece in await read(at, min(at + step, shard.size)):
            check.feed(piece)
    check.close()
    return len(index)
