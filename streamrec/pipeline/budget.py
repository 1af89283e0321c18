"""The prefetch budget: a hard bound on bytes read ahead, shared by every stream of a dataset.

:class:`ByteBudget` is the bound itself (reservations, shares, wake-ups); :class:`BudgetPlan`
is the policy: how one iteration spends ``prefetch_bytes`` (each stream's share, what one reader
may hold, the indexed engine's chunks, ``get()``'s reads). Every reader of the number asks the
plan; no other module computes with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from streamrec.pipeline.options import ReadOptions

__all__ = ["CHUNK_PART", "READ_AHEAD_PART", "BudgetPlan", "ByteBudget", "ReaderSizes"]

READ_AHEAD_PART = 4
"""A shard read ahead of its turn is kept ``1 / READ_AHEAD_PART`` of a share; the shards a
sequential read opens ahead hold at most ``1 / READ_AHEAD_PART`` of the budget together."""
CHUNK_PART = 3
"""An indexed read chunk holds about ``prefetch_bytes / CHUNK_PART`` of records, held in the
budget with the reads in flight (see :mod:`streamrec.pipeline.indexed.engine`)."""
_MIN_STREAM_SHARE = 64 << 10  # a smaller share would mean tiny range reads
_BLOCKS_PER_SHARE = 4  # a few blocks per share, so that one arrives while another is decoded


class ByteBudget:
    """Bytes fetched (or being fetched) and not yet handed to the consumer.

    A stream reserves a block's bytes before requesting it and releases them once the
    consumer has taken the records decoded from them (a record still being assembled keeps
    its bytes: see ``ObjectReader.settle``). The total never exceeds ``limit``, except by
    one block per stream the consumer reads from: one reservation is always granted when
    nothing is reserved, and a stream the consumer is blocked on, holding nothing, may
    *overdraw* by one block (so a block larger than the whole budget still makes progress,
    and bytes prefetched by streams the consumer reaches later can never starve the one it
    is waiting for; see :meth:`reserve`).

    Streams read side by side (an interleave) may each be given a *share*. The reader of the
    streams sets :attr:`kept`, the sum of the shares of every stream it will have open at
    once, whether opened yet or not; streams count the part of their share they hold in
    :attr:`covered`; the rest is :attr:`owed`. A stream always gets room within its share;
    beyond it, only room that nobody is owed (``reserved + owed <= limit`` holds after every
    grant). So the first streams opened cannot take the room the ones the consumer needs
    next are owed, and room nobody needs is still used.

    Bytes already read and decoded may stay *held* (:meth:`hold`: the indexed engine's chunks
    from before their reads start until the consumer is done with their records): they count
    in ``reserved`` (and :attr:`peak`), so reads get only the room left beside them, but a read
    is still granted alone when no other read is in flight (the held chunk waits for it).

    Streams that stopped requesting for lack of room ask to be woken (:meth:`wake_on_release`)
    and are called back, in the order they asked, soon after bytes are released: the budget
    keeps being used while the stream that released the bytes runs first (it re-requests in
    the same step, before any callback runs).
    """

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"the prefetch budget must be positive, not {limit}")
        self.limit = limit
        self.reserved = 0
        self.peak = 0
        self.kept = 0  # the shares of all streams open at once (see the class docstring)
        self.covered = 0  # the part of their shares streams hold
        self.held = 0  # of reserved: decoded records not yet consumed (see hold)
        self.viewed = 0  # of held: record_views' chunks (see keep), the consumer's to give back
        self._released = asyncio.Event()
        self._wakers: dict[Callable[[], object], None] = {}  # ordered set
        self._wake_scheduled = False

    def _take(self, n: int) -> None:
        self.reserved += n
        self.peak = max(self.peak, self.reserved)

    @property
    def owed(self) -> int:
        """Bytes kept for streams' shares that they do not hold yet."""
        return max(0, self.kept - self.covered)

    def try_reserve(self, n: int, *, keep_free: int = 0) -> bool:
        """Reserve ``n`` bytes if that fits now, leaving ``keep_free`` bytes (what other
        streams are owed; less than none is none: streams whose shares add up to more than
        the limit are owed nothing beyond it); never waits."""
        in_flight = self.reserved - self.held
        if in_flight and self.reserved + n + max(0, keep_free) > self.limit:
            return False
        self._take(n)
        return True

    async def reserve(self, n: int, *, overdraw: bool = False) -> None:
        """Reserve ``n`` bytes, waiting for other streams to hand bytes on if needed.

        With ``overdraw`` (the caller is a stream the consumer waits for, holding nothing:
        nothing in flight, nothing received and not handed on), it is granted at once, beyond
        ``limit`` if need be. Such a stream holds that one block over the limit at most, until
        the consumer takes it, so ``reserved`` stays within ``limit`` plus one block per
        stream read side by side (one reading shards in turn; an interleave's cycle). Bytes
        other streams hold for later can never starve the stream the consumer needs: when
        a second overdraft had to wait for the first, an interleave whose consumer moved on
        from the first stream (its block partly decoded) waited for ever.
        """
        while not self.try_reserve(n):
            if overdraw:
                self._take(n)
                return
            self._released.clear()
            await self._released.wait()

    async def hold(self, n: int) -> None:
        """Reserve ``n`` bytes of records to be kept after their reads (until :meth:`unhold`),
        waiting until they fit beside everything reserved, or nothing is: so held bytes stay
        within ``limit`` unless one holder alone is larger. Holders are served in the order
        their caller asks (one at a time: the indexed engine's chunks, in reading order).
        Bytes views keep (:meth:`keep`) are not waited for: the consumer may keep every view
        it gets, so beside them alone a hold is granted, as a read is."""
        while self.reserved > self.viewed and self.reserved + n > self.limit:
            self._released.clear()
            await self._released.wait()
        self._take(n)
        self.held += n

    def keep(self, n: int) -> None:
        """Hold ``n`` bytes already in memory (``record_views``' chunks while their views
        live) at once, until :meth:`unkeep`: never waits (waiting could be for the views in
        the consumer's hand); the reads and holds get less room instead, one at a time when
        it is all held (see the class docstring)."""
        self._take(n)
        self.held += n
        self.viewed += n

    def unkeep(self, n: int) -> None:
        """Give back ``n`` bytes :meth:`keep` held (their views are gone)."""
        self.viewed -= n
        assert self.viewed >= 0, "unkept more than kept"
        self.unhold(n)

    def unhold(self, n: int) -> None:
        """Give back ``n`` held bytes (their records were consumed, or never will be)."""
        self.held -= n
        assert self.held >= 0, "unheld more than held"
        self.release(n)

    def release(self, n: int) -> None:
        """Give back ``n`` reserved bytes."""
        self.reserved -= n
        assert self.reserved >= 0, "released more than reserved"
        self._released.set()
        if self._wakers and not self._wake_scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (tests, teardown): wake now
                self._wake()
                return
            self._wake_scheduled = True
            loop.call_soon(self._wake)

    def wake_on_release(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once, soon after the next release (ordered, no duplicates)."""
        self._wakers[callback] = None

    def forget(self, callback: Callable[[], object]) -> None:
        """Drop ``callback`` from the streams waiting to be woken (closed or no longer hungry)."""
        self._wakers.pop(callback, None)

    def _wake(self) -> None:
        self._wake_scheduled = False
        wakers, self._wakers = list(self._wakers), {}
        for index, callback in enumerate(wakers):
            if self.reserved >= self.limit:
                # full again: the rest keep their place in the queue, ahead of newcomers
                self._wakers = {**dict.fromkeys(wakers[index:]), **self._wakers}
                return
            callback()  # a stream still short of room asks again (goes to the back)


class ReaderSizes(NamedTuple):
    """How a streaming reader is sized within the plan (``ObjectReader``'s arguments)."""

    block_bytes: int
    share_bytes: int | None
    """Room the budget keeps for the reader (``None``: none of its own)."""
    max_held_bytes: int | None
    """The most the reader holds at once (``None``: no cap but the budget)."""


class BudgetPlan:
    """How one iteration spends ``options.prefetch_bytes``, made once per iteration (a
    streaming or indexed engine's pass, a ``get()`` session, a command-line scan).

    It holds the iteration's one :class:`ByteBudget` (:attr:`budget`) and answers every
    question about the number: a stream's share when several are read side by side
    (:attr:`stream_share`, :meth:`reader_sizes`, :meth:`keep_shares`), the indexed engine's
    chunks (:attr:`chunk_bytes`, :meth:`chunk_records`) and ``get()``'s reads
    (:attr:`lookup_span_bytes`).
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.budget = ByteBudget(options.prefetch_bytes)
        self.stream_share = self._stream_share()
        """The part of the budget kept for one shard's reader when several are read at once
        (``None``: one shard at a time, no shares).

        An interleave consumes its open shards side by side, so each gets an equal share.
        Deterministic interleaving also starts the next ``cycle_length`` shards before their
        turn: those only need to bridge their first round trips and are kept a quarter share
        (``1 / READ_AHEAD_PART``) until they are opened."""

    def _stream_share(self) -> int | None:
        options = self.options
        if options.cycle_length == 1:
            return None
        streams = float(options.cycle_length)
        if options.deterministic:
            streams *= 1 + 1 / READ_AHEAD_PART
        return max(int(options.prefetch_bytes / streams), _MIN_STREAM_SHARE)

    def reader_sizes(self, ahead: bool = False) -> ReaderSizes:
        """The block size, share and cap of a streaming reader (``ahead``: a shard opened
        before its turn, kept a part of a share; up to a full share if nobody needs it)."""
        share = cap = self.stream_share
        block_bytes = self.options.block_bytes
        if share is not None:
            block_bytes = max(1, min(block_bytes, share // _BLOCKS_PER_SHARE))
            if ahead:
                share //= READ_AHEAD_PART
        return ReaderSizes(block_bytes, share, cap)

    @property
    def tuning_bytes(self) -> int:
        """The most bytes one stream's reads in flight may add up to when the read-ahead tuner
        cuts them (:mod:`streamrec.pipeline.stream.tune`): its share when several streams are
        read side by side, else the whole budget."""
        share = self.stream_share
        return self.options.prefetch_bytes if share is None else share

    @property
    def read_ahead_bytes(self) -> int:
        """The most bytes the shards a sequential read opens ahead of the next one hold
        together (their first blocks; ``1 / READ_AHEAD_PART`` of the budget): small shards'
        round trips overlap, and shards not reached yet never hold the room the current one
        needs."""
        return self.options.prefetch_bytes // READ_AHEAD_PART

    def keep_shares(self, num_shards: int) -> None:
        """Keep room in the budget for the shares of every stream open at once when reading
        ``num_shards`` shards (see :class:`ByteBudget`); nothing without shares."""
        share = self.stream_share
        if share is None:
            return
        options = self.options
        streams = min(options.cycle_length, num_shards)
        ahead = min(options.cycle_length, num_shards - streams)
        ahead = ahead if options.deterministic else 0
        # (more than the limit only with tiny budgets, where shares have a floor)
        kept = streams * share + ahead * (share // READ_AHEAD_PART)
        self.budget.kept = min(self.budget.limit, kept)

    @property
    def chunk_bytes(self) -> int:
        """The most framed bytes of records in one indexed read chunk (a larger record is a
        chunk alone)."""
        return max(1, self.options.prefetch_bytes // CHUNK_PART)

    def chunk_records(self, mean_bytes: float) -> int:
        """Records in an indexed read chunk of records of ``mean_bytes`` on average."""
        return max(1, int(self.options.prefetch_bytes // CHUNK_PART // mean_bytes))

    @property
    def lookup_span_bytes(self) -> int:
        """Most bytes one of ``get()``'s range reads covers: a read, within the budget."""
        return min(self.options.block_bytes, self.options.prefetch_bytes)
