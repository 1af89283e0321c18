"""The shards after the current one of a sequential read, opened ahead of their turn.

Reading one shard at a time (``cycle_length=1``), every shard's first bytes are a round trip
away: small shards read strictly one after another pay that round trip each (measured through
a 60 ms link: 130 KB shards at ~2 MB/s). So once every block of the current shard is requested,
the next shards in the plan's order are opened too:

* the next one as before: its reader ramps up within the budget, so that a large shard's pipe
  stays full across the boundary;
* those after it only while each shard before them has requested every block (small shards:
  their one read), each its first block alone until the shard before it is the current one:
  many small shards' round trips overlap, and a large shard ahead holds one block.

How far: at most ``max_shards`` shards ahead (``2 x max_concurrency - 1``: with the current
shard, the reads the read's connections are sized for; at most the store's own limit; local
files, which have no round trip to hide, the next shard only, as before: more ahead measured
no faster), whose first blocks, beyond the next shard's, add up to at most ``max_bytes``
(:attr:`~streamrec.pipeline.budget.BudgetPlan.read_ahead_bytes`). Their bytes are reserved in
the iteration's budget as any block's are, never overdrawn (only the stream the consumer waits
for overdraws): a shard not reached yet never holds more than that part of the room the
current one needs, and a tiny budget only means fewer reads ahead. Readers are handed on in
order and read from their start: the records, their order and every position saved are those
of opening each shard at its turn.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from streamrec.pipeline.stream.opener import ShardOpener
from streamrec.pipeline.stream.prefetch import ObjectReader

__all__ = ["ReadAhead"]


@dataclass
class _Ahead:
    reader: ObjectReader
    cost: int  # its first block, counted against max_bytes while it is limited to it
    limited: bool  # requesting its first block alone (see limit_concurrency)


class ReadAhead:
    """Readers of the shards ``ordinals`` (in reading order, each read from its start),
    opened ahead of their turn (:meth:`top_up`) and handed on in order (:meth:`take`);
    :meth:`aclose` closes the ones never handed on."""

    def __init__(
        self,
        opener: ShardOpener,
        ordinals: Sequence[int],
        *,
        max_shards: int,
        max_bytes: int,
        first_block_bytes: int,
    ) -> None:
        self._opener = opener
        self._ordinals = list(ordinals)
        self._next = 0  # index in _ordinals of the first shard not opened yet
        self._max_shards = max_shards
        self._max_bytes = max_bytes
        self._first_block_bytes = first_block_bytes
        self._held = 0  # the costs of the limited readers
        self._readers: deque[_Ahead] = deque()

    @property
    def opened(self) -> list[int]:
        """The ordinals of the shards opened ahead and not handed on yet, in order."""
        first = self._next - len(self._readers)
        return self._ordinals[first : self._next]

    def _unlimit(self, ahead: _Ahead) -> None:
        if ahead.limited:
            ahead.limited = False
            self._held -= ahead.cost
            ahead.reader.restore_concurrency()

    def top_up(self, current: ObjectReader) -> None:
        """Open shards ahead as far as the bounds allow, once ``current`` (the shard being
        read) and each shard opened before them has requested every block."""
        if not current.fully_requested:
            return
        readers = self._readers
        if readers and readers[0].limited:  # the next shard: it may ramp up now
            self._unlimit(readers[0])
            readers[0].reader.prime()
        limit = self._max_shards
        if current.store.direct_reads:  # local files: no round trip to hide, the next only
            limit = 1
        elif current.store.concurrency_limit:
            limit = min(limit, current.store.concurrency_limit)
        while self._next < len(self._ordinals) and len(readers) < limit:
            if readers and not readers[-1].reader.fully_requested:
                return
            ordinal = self._ordinals[self._next]
            cost = 0
            if readers:
                size = self._opener.plan.shards[ordinal].size
                cost = min(size, self._first_block_bytes)
                if self._held + cost > self._max_bytes:
                    return
            reader = self._opener.reader(ordinal)
            ahead = _Ahead(reader, cost, limited=bool(readers))
            if ahead.limited:
                reader.limit_concurrency(1)
                self._held += cost
            readers.append(ahead)
            self._next += 1
            reader.prime()

    def take(self) -> ObjectReader:
        """The next shard's reader, its turn come: opened ahead, or now."""
        if not self._readers:
            ordinal = self._ordinals[self._next]
            self._next += 1
            return self._opener.reader(ordinal)
        ahead = self._readers.popleft()
        self._unlimit(ahead)
        return ahead.reader

    async def aclose(self) -> None:
        """Close the readers opened ahead and never handed on (each of them, whatever the
        others' closing raises; the first error is raised after)."""
        readers, self._readers = list(self._readers), deque()
        self._held = 0
        error: BaseException | None = None
        for ahead in readers:
            try:
                await ahead.reader.aclose()
            except BaseException as exc:  # (a cancellation too: the rest are still closed)
                error = error or exc
        if error is not None:
            raise error
