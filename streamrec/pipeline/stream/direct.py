"""Large records of a local, uncompressed shard read straight into their final ``bytes``.

The block path (:mod:`streamrec.pipeline.stream.prefetch` + the framing decoder) copies every byte
twice: out of the page cache into a block, then out of the block into its record, and the
event-loop thread makes the second copy. Here each record of at least
:data:`DIRECT_RECORD_BYTES` is read by :mod:`streamrec.storage.local.records` straight into its
final ``bytes`` object (allocated at its length, which was checked against the object's size
first) in ``STEP_BYTES`` steps, each step's CRC computed right after it was read, while it is
still in the cache: one copy, no second pass. The reads and the CRCs run in worker threads
with the GIL released (C: ``storage/_cread.c``; its pure-Python twin holds the GIL between
``os.preadv`` calls and copies each payload once more); the loop thread only receives
finished records. The shard's reader decides to come here from its first block
(:func:`~streamrec.pipeline.stream.read.read_shard`).

A *walk* (a worker thread reading 12-byte headers from record to record: the next header's
offset is known as soon as one header is read) runs ahead, far enough for a group on every
reading thread, and lists the records; *groups* of walked records (up to :data:`GROUP_BYTES`,
at least a block, or one larger record) are read by up to the store's
``concurrency_limit`` threads at once, each group's bytes reserved through the shard's
:class:`~streamrec.pipeline.stream.prefetch.ObjectReader` (the same budget, share and cap as its
blocks) before anything is allocated; a group larger than the budget is read alone, as a
block would be. Groups are handed on in file order.

Only clean records are read this way. Anything else — a small record (below the threshold:
the block path frames those faster), a header whose CRC fails, a length the object cannot
hold, a payload CRC that does not match, a short read, a storage error — hands the
rest of the shard, from that record's header, to the block path (:attr:`DirectRead.handoff`),
which reads it as it always did: the errors and their offsets are exactly the block path's.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from streamrec._portal import cancel_and_wait, owned_generator
from streamrec.errors import StorageError
from streamrec.format.framing import OVERHEAD_BYTES
from streamrec.pipeline.stream.prefetch import ObjectReader
from streamrec.storage.base import ObjectInfo
from streamrec.storage.local.records import (
    END,
    HANDOFF,
    PayloadPool,
    Plan,
    Pooled,
    Stop,
    read_records,
    walk,
)
from streamrec.storage.local.records import min_record_bytes as min_record_bytes_for
from streamrec.storage.local.store import LocalStore

__all__ = ["DIRECT_RECORD_BYTES", "GROUP_BYTES", "DirectRead"]

DIRECT_RECORD_BYTES = 64 << 10
"""Records at least this large (framing included) are read directly; below it, the per-record
system call and thread hop cost more than the block path's second copy. (The pure-Python twin
starts higher: ``storage.records.PURE_MIN_RECORD_BYTES``.)"""
GROUP_BYTES = 6 << 20
"""The most bytes of records one reading thread's job takes (when the budget has room)."""
_WALK_RECORDS = 512  # headers one walk job reads at most


@dataclass
class _Walk:
    plans: list[Plan] = field(default_factory=list)
    offset: int = 0  # the header offset after the last record walked
    ended: bool = False  # the walk reached the object's end exactly
    handoff: bool = False  # what is at ``offset`` is for the block path


class DirectRead:
    """Reads ``reader``'s object from ``start_offset`` (the header of record ``start_index``)
    by the direct path while its records are large and clean; see the module docstring.

    Iterate :meth:`chunks`; once it ends, :attr:`handoff` is None when the object was read to
    its end, else ``(offset, index)``: the block path continues from that record's header.
    ``on_bytes(n)`` is called with the file bytes of each group of records handed on.
    """

    def __init__(
        self,
        reader: ObjectReader,
        *,
        start_offset: int,
        start_index: int,
        verify_crc: bool,
        min_record_bytes: int | None = None,
        on_bytes: Callable[[int], None] | None = None,
        pool: PayloadPool | None = None,
    ) -> None:
        assert isinstance(reader.store, LocalStore)
        self.reader = reader
        self.store: LocalStore = reader.store
        self.obj: ObjectInfo = reader.obj
        self.verify_crc = verify_crc
        if min_record_bytes is None:
            min_record_bytes = min_record_bytes_for(DIRECT_RECORD_BYTES)
        self.min_record_bytes = min_record_bytes
        # a group is one job for a reading thread: the bigger, the less the per-group cost
        # (a thread hop, the file opened, a chunk up the pipeline: ~0.15 ms) weighs; the
        # groups in flight take at most half the budget (100 KiB records, interleaved runs:
        # 4 MiB groups 6.4-6.7 GB/s, 6 MiB 7.0, 8 MiB 6.9-7.8; 8 MiB took a blocking `for`'s
        # peak RSS to +90-103 MiB over the 64 MiB budget, 6 MiB +78)
        self.group_bytes = max(
            reader.block_bytes,
            min(GROUP_BYTES, reader.budget.limit // (2 * max(1, reader.max_concurrency))),
        )
        # walked ahead: enough records for a group on every reading thread (a walk is 12-byte
        # preads and keeps only (offset, length) pairs; walking 2 groups ahead left threads
        # idle while the next walk ran: 100 KiB records 5.2-5.5 -> 6.3-7.1 GB/s)
        self.ahead_bytes = max(2, reader.max_concurrency) * self.group_bytes
        self.handoff: tuple[int, int] | None = None
        self.on_bytes = on_bytes
        self.pool = pool  # payload objects to reuse (chunks come as Pooled lists then)
        self._offset = start_offset  # where the walk goes on
        self._index = start_index  # index of the record at _offset
        self._walked: deque[Plan] = deque()  # walked, not yet in a group
        self._walked_bytes = 0
        self._walk_ended = False  # no more walking: the end, or a handoff at _offset
        self._walk_handoff = False

    @owned_generator
    async def chunks(self) -> AsyncGenerator[list[bytes], None]:
        """The records read directly, a group (a list) at a time, in file order."""
        stop = Stop()
        walking: asyncio.Future[_Walk] | None = None
        # (bytes held, index of the group's first record, its plans, its read)
        inflight: deque[tuple[int, int, list[Plan], asyncio.Future[tuple[list[bytes], int]]]]
        inflight = deque()
        group_index = self._index - len(self._walked)  # index of the first walked record
        try:
            while True:
                if walking is not None and walking.done():
                    self._take_walk(walking.result())
                    walking = None
                if walking is None and not self._walk_ended and self._wants_walk():
                    walking = asyncio.ensure_future(
                        asyncio.to_thread(
                            _walk,
                            self.store,
                            self.obj,
                            self._offset,
                            self.min_record_bytes,
                            self.ahead_bytes,
                        )
                    )
                while self._walked and len(inflight) < self.reader.max_concurrency:
                    plans, held = self._next_group()
                    if not self.reader.try_hold(held):
                        if inflight:
                            self._walked.extendleft(reversed(plans))
                            self._walked_bytes += held
                            break
                        await self.reader.hold(held)  # the consumer waits: overdraw
                    task = asyncio.ensure_future(
                        asyncio.to_thread(
                            _read_group,
                            self.store,
                            self.obj,
                            plans,
                            self.verify_crc,
                            stop,
                            self.pool,
                        )
                    )
                    inflight.append((held, group_index, plans, task))
                    group_index += len(plans)
                if not inflight:
                    if walking is None:
                        if self._walk_handoff:
                            self.handoff = (self._offset, self._index)
                        return
                    walked = await walking
                    walking = None
                    self._take_walk(walked)
                    continue
                held, first, plans, oldest = inflight[0]
                if walking is not None and not oldest.done():
                    # the walk may end first: its records' groups start meanwhile
                    await asyncio.wait((oldest, walking), return_when=asyncio.FIRST_COMPLETED)
                    if not oldest.done():
                        continue
                records, bad = await oldest
                inflight.popleft()
                self.reader.unhold(held)
                if bad < len(plans):
                    self.handoff = (plans[bad][0], first + bad)
                if records:
                    if self.on_bytes is not None:
                        self.on_bytes(sum(map(len, records)) + OVERHEAD_BYTES * len(records))
                    if self.pool is not None:
                        records = Pooled(records)
                        records.pool = self.pool
                    yield records
                if self.handoff is not None:
                    return
        finally:
            stop.set()
            tasks: list[asyncio.Future[Any]] = [read for _, _, _, read in inflight]
            if walking is not None:
                tasks.append(walking)
            await cancel_and_wait(tasks)
            for held, _, _, _ in inflight:
                self.reader.unhold(held)

    def _wants_walk(self) -> bool:
        return self._walked_bytes < self.ahead_bytes or len(self._walked) <= (
            self.reader.max_concurrency
        )

    def _take_walk(self, walked: _Walk) -> None:
        self._walked.extend(walked.plans)
        self._walked_bytes += sum(length + OVERHEAD_BYTES for _, length in walked.plans)
        self._index += len(walked.plans)
        self._offset = walked.offset
        if walked.ended or walked.handoff:
            self._walk_ended = True
            self._walk_handoff = walked.handoff

    def _next_group(self) -> tuple[list[Plan], int]:
        """The next walked records, about ``group_bytes`` of them (at least one)."""
        plans: list[Plan] = []
        held = 0
        while self._walked and (not plans or held + self._walked[0][1] <= self.group_bytes):
            plan = self._walked.popleft()
            plans.append(plan)
            held += plan[1] + OVERHEAD_BYTES
        self._walked_bytes -= held
        return plans, held


def _walk(
    store: LocalStore, obj: ObjectInfo, offset: int, min_record_bytes: int, max_bytes: int
) -> _Walk:
    """(Worker thread.) The records from the header at ``offset`` on that the direct path
    reads: at most :data:`_WALK_RECORDS` of them, about ``max_bytes``."""
    try:
        with store.open_file(obj) as file:
            plans, offset, status = walk(
                file,
                offset,
                obj.size,
                min_record_bytes=min_record_bytes,
                max_records=_WALK_RECORDS,
                max_bytes=max_bytes,
            )
            file.check()  # headers read from a file changed in place are not walked
    except StorageError:
        return _Walk(offset=offset, handoff=True)  # the block path retries or raises it
    return _Walk(plans, offset, ended=status == END, handoff=status == HANDOFF)


def _read_group(
    store: LocalStore,
    obj: ObjectInfo,
    plans: list[Plan],
    verify: bool,
    stop: Stop,
    pool: PayloadPool | None,
) -> tuple[list[bytes], int]:
    """(Worker thread.) The payloads of ``plans`` (into ``pool``'s objects where it has
    some), with how many were clean."""
    try:
        with store.open_file(obj) as file:
            read = read_records(file, plans, verify, stop, pool)
            file.check()  # records read from a file changed in place are not handed on
            return read
    except StorageError:
        return [], 0  # the block path retries or raises it
