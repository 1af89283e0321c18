"""A prefetching range reader of one object: concurrent block reads, handed on in order.

Blocks of ``block_bytes`` are requested up to ``max_concurrency`` at a time, each only once the
shared :class:`~streamrec.pipeline.budget.ByteBudget` has room for it, and are handed on in
object order. A block that fails transiently is retried per the :class:`RetryPolicy` from the
exact byte where it stopped: bytes already received are kept, so a short 206 or a body cut off
mid-way costs only the missing part and no byte is repeated or dropped.

A block arrives as *pieces* (bodies read off the network are kept in the chunks they come in,
never joined into one more copy), and the reader hands on one piece at a time - or, through
:meth:`ObjectReader.take_ready`, the pieces that have already arrived, up to a limit. Their
bytes stay reserved until the decoder asks for the next piece (:meth:`ObjectReader.settle`,
at the start of ``__anext__``): the records decoded from them replace them in the budget until
the consumer has taken those records and the decoder goes on. So what waits decoded between
the reader and the consumer (one chunk per shard read side by side: an interleave's cycle)
is inside the budget too, not one more chunk per stream beside it.

With a local cache (:mod:`streamrec.storage.cache.store`), the reader first asks it for the object
(``open_cache``): a copy there is read instead of the remote object; otherwise a block is
written to the cache's temporary file at its offset as soon as it arrives, while its bytes are
still reserved in the budget (no copy, no request of its own), and the copy is published by
:meth:`ObjectReader.finish` once the whole object was read and decoded clean.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable

from streamrec._portal import cancel_and_wait
from streamrec.errors import RetriesExhaustedError, TransientStorageError
from streamrec.pipeline.budget import ByteBudget
from streamrec.pipeline.stream.tune import ReadTuner
from streamrec.storage import timing
from streamrec.storage.base import ObjectInfo, ObjectStore, first_bytes
from streamrec.storage.cache.store import CacheFill, CacheHit
from streamrec.storage.retry import RetryPolicy

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "DEFAULT_FIRST_BLOCK_BYTES",
    "DEFAULT_MAX_CONCURRENCY",
    "ObjectReader",
    "OpenCache",
    "read_exact",
]

DEFAULT_BLOCK_BYTES = 4 << 20
"""Size of one range read once a stream has ramped up. Blocks are handed on in order, so a
finished block holds its budget until the ones before it arrive: for a given budget, smaller
blocks keep more requests in flight (measured on a 60 ms, 25 MB/s-per-connection link, 1 Gbit:
64 MiB in 4 MiB blocks reaches 0.98x of the link, in 8 MiB blocks 0.86-0.91x)."""
DEFAULT_MAX_CONCURRENCY = 16
"""Range reads in flight per object, at most (with the default 64 MiB budget and 4 MiB blocks,
the budget and this bound meet)."""
DEFAULT_FIRST_BLOCK_BYTES = 256 << 10
"""Size of an object's first range read (blocks double from it up to ``block_bytes``)."""

OpenCache = Callable[[], Awaitable[CacheHit | CacheFill | None]]
"""How a reader asks the local cache for its object (see the module docstring)."""


class ObjectReader:
    """Async iterator over the bytes of one object, from ``start`` to its end, in pieces.

    ``prime()`` requests the first blocks without waiting (used to hide the next shard's
    first-byte latency); when the budget is full it asks to be woken on the next release and
    requests more then, so a primed reader keeps its pipe full on its own. ``aclose()``
    cancels every request in flight and returns its budget. ``max_concurrency`` is capped by
    the store's ``concurrency_limit`` (local files: 4).

    Blocks start at ``first_block_bytes`` and double up to ``block_bytes``: the first records
    arrive after one small transfer instead of a full block, and the pipe still fills.

    ``share_bytes`` is room the budget keeps for this reader (see
    :class:`~streamrec.pipeline.budget.ByteBudget`); beyond it, up to ``max_held_bytes``
    (a hard cap on what it holds), it only takes room nobody else is owed. Streams consumed
    side by side (an interleave cycle) each get a share: without shares the first streams
    opened take the whole budget and the consumer, who needs every stream in turn, waits on
    the others one round trip at a time.

    ``open_cache`` asks the local cache for the object before the first read (see the module
    docstring); :meth:`finish` publishes what a whole read filled.

    A reader of a store with ``direct_reads`` (local files) and no cache starts by *probing*:
    it requests its first block alone, and only once that block's first piece was handed on
    does it request more. Its reader (:func:`~streamrec.pipeline.stream.read.read_shard`) looks at
    the first record there: a large one is read by :mod:`streamrec.pipeline.stream.direct` instead,
    after :meth:`pause` (no more blocks; the bytes held are given back), its bytes held
    through :meth:`try_hold` / :meth:`hold` / :meth:`unhold` (the same budget, share and cap
    as blocks), until :meth:`start_blocks` hands the rest back to blocks.
    """

    def __init__(
        self,
        store: ObjectStore,
        obj: ObjectInfo,
        budget: ByteBudget,
        *,
        start: int = 0,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        first_block_bytes: int = DEFAULT_FIRST_BLOCK_BYTES,
        share_bytes: int | None = None,
        max_held_bytes: int | None = None,
        policy: RetryPolicy | None = None,
        on_retry: Callable[[TransientStorageError], None] | None = None,
        open_cache: OpenCache | None = None,
        on_read: Callable[[float], None] | None = None,
        tuner: ReadTuner | None = None,
    ) -> None:
        if block_bytes <= 0 or max_concurrency <= 0:
            raise ValueError("block_bytes and max_concurrency must be positive")
        self.store = store
        self.obj = obj
        self.budget = budget
        self._block = min(max(first_block_bytes, 1), block_bytes)  # the next block's size
        self._next = start  # first byte not yet requested
        self._held = 0  # bytes reserved by this reader and not yet handed on
        self._unsettled = 0  # bytes handed on whose records the consumer may not have taken
        self.carries: Callable[[], int] | None = None
        """How many bytes handed on the decoder holds in a record it has not completed (set
        by the decoder through :meth:`track_carried`; see :meth:`settle`)."""
        self._covered = 0  # the part of its share this reader holds
        self._share: int | None = None
        self._closed = False
        self.block_bytes = block_bytes
        self._plan_block = block_bytes  # the plan's bound (a share's part): tuning stays below
        self.max_held_bytes = max_held_bytes  # a hard cap on what it holds
        self.set_share(share_bytes)
        self.max_concurrency = min(max_concurrency, store.concurrency_limit or max_concurrency)
        self.policy = policy or RetryPolicy()
        self._on_retry = on_retry
        self._on_read = on_read
        self._inflight: deque[tuple[int, asyncio.Future[list[bytes]]]] = deque()  # (length, task)
        self._ready: deque[bytes] = deque()  # pieces of the oldest block, not yet handed on
        self._open_cache = open_cache
        self._routing: asyncio.Future[CacheHit | CacheFill | None] | None = None
        self._remote_concurrency = self.max_concurrency
        # (see the class docstring: the first block alone until it is handed on)
        self.probing = getattr(store, "direct_reads", False) and open_cache is None
        self._first = start
        self._handed = False  # a piece was handed on
        self._paused = False  # no block requests: records are read directly
        self._ramp_held: int | None = None  # see hold_ramp: the concurrency to go back to
        self._limited: int | None = None  # see limit_concurrency: the concurrency to go back to
        self._pinned = False  # the store was asked to pin the object (first request on)
        self._tuner = tuner if tuner is not None and tuner.active else None
        if open_cache is not None:
            # until the cache answers, as few reads as a local copy wants (more preads at once
            # only compete with decoding for the cores: measured 10-30 % slower second
            # epochs); a remote object gets its full number as soon as the answer is known
            self.max_concurrency = min(self.max_concurrency, CacheHit.concurrency_limit)

    @property
    def share_bytes(self) -> int | None:
        """Room the budget keeps for this reader (``None``: none of its own; see
        :meth:`set_share`)."""
        return self._share

    def set_share(self, share_bytes: int | None) -> None:
        """Keep ``share_bytes`` of the budget for this reader from now on (a shard read ahead
        of its turn whose turn came gets a full share); :meth:`prime` to use it."""
        self._share = share_bytes
        self._hold(0)

    def _hold(self, change: int) -> None:
        """This reader now holds ``change`` more bytes of the budget."""
        self._held += change
        share = self._share
        if share is None or self._closed:
            covered = 0
        elif self.fully_requested:  # it will never need more: what it does not hold is spare
            covered = share
        else:
            covered = min(share, self._held)
        self.budget.covered += covered - self._covered
        self._covered = covered

    def hold_ramp(self) -> None:
        """Request the first block alone until a piece of it is handed on, then the rest of
        the ramp: the reader the consumer waits for first. Its first block would otherwise
        share the link with up to ``max_concurrency - 1`` larger ones sent at the same time
        (measured through a 1 Gbit link: its body took ~50 ms instead of ~10, the first
        record waited for it); the rest goes out one round trip later, once."""
        if not self._handed and self._ramp_held is None:
            self._ramp_held, self.max_concurrency = self.max_concurrency, 1

    def _release_ramp(self) -> None:
        held, self._ramp_held = self._ramp_held, None
        if held is not None:
            self.max_concurrency = max(self.max_concurrency, held)

    def limit_concurrency(self, limit: int) -> None:
        """Request at most ``limit`` blocks at once until :meth:`restore_concurrency` (a
        reader started while something else needs the link: a listing's next pages)."""
        if self._limited is None:
            self._limited = self.max_concurrency
        self.max_concurrency = limit

    def restore_concurrency(self) -> None:
        """Back to the concurrency :meth:`limit_concurrency` limited (or more, if the cache's
        answer has raised it meanwhile)."""
        held, self._limited = self._limited, None
        if held is not None:
            self.max_concurrency = max(self.max_concurrency, held)

    @property
    def fully_requested(self) -> bool:
        """True once every block has been requested (the next object may start)."""
        return self._next >= self.obj.size

    def prime(self) -> None:
        """Request as many blocks as the budget and the concurrency limit allow, now."""
        if self._paused:
            return
        self._follow_tuner()
        while (
            not self._closed
            and len(self._inflight) < self.max_concurrency
            and self._next < self.obj.size
            and not (self.probing and self._next != self._first)
        ):
            length = self._next_length()
            cap = self.max_held_bytes
            if cap is not None and self._held and self._held + length > cap:
                break  # handing a piece on primes again
            # within its share a reader may use what it is owed; beyond, only spare room
            mine = 0 if self._share is None else self._share - self._covered
            keep_free = self.budget.owed - min(mine, length)
            if not self.budget.try_reserve(length, keep_free=keep_free):
                self.budget.wake_on_release(self.prime)  # try again when bytes come back
                return
            self._request(length)
        self.budget.forget(self.prime)

    @property
    def probed(self) -> bool:
        """True while only the first piece of a probing reader was handed on (see the class
        docstring): it may :meth:`pause` and let its records be read directly."""
        return self.probing and self._handed and not self._paused

    async def pause(self) -> None:
        """Stop requesting blocks; cancel those in flight and give back what is held."""
        self._paused = True
        inflight, self._inflight = self._inflight, deque()
        ready, self._ready = self._ready, deque()
        await cancel_and_wait(task for _, task in inflight)
        held = sum(length for length, _ in inflight) + sum(map(len, ready)) + self._unsettled
        self._unsettled = 0
        self._hold(-held)
        self.budget.release(held)

    def start_blocks(self, start: int) -> None:
        """Read blocks again, from byte ``start`` on (a paused reader: the records before
        ``start`` were read directly)."""
        assert self._paused and not self._inflight and not self._ready
        self._paused = self.probing = False
        self._next = start
        self.prime()

    def try_hold(self, n: int) -> bool:
        """Reserve ``n`` bytes for this reader if the budget, its share and its cap allow it
        now (as a block request would be reserved)."""
        cap = self.max_held_bytes
        if self._closed or (cap is not None and self._held and self._held + n > cap):
            return False
        mine = 0 if self._share is None else self._share - self._covered
        if not self.budget.try_reserve(n, keep_free=self.budget.owed - min(mine, n)):
            return False
        self._hold(n)
        return True

    async def hold(self, n: int) -> None:
        """Reserve ``n`` bytes, waiting for room; the consumer waits for this reader, which
        holds nothing else: it may overdraw (see :meth:`ByteBudget.reserve`)."""
        await self.budget.reserve(n, overdraw=True)
        self._hold(n)

    def unhold(self, n: int) -> None:
        """Give back ``n`` bytes reserved by :meth:`try_hold` / :meth:`hold`."""
        self._hold(-n)
        self.budget.release(n)

    def _follow_tuner(self) -> None:
        """Take the store's tuned block size and concurrency (see :mod:`.tune`) while no
        ramp, limit or cache answer holds the concurrency down."""
        tuner = self._tuner
        if tuner is None:
            return
        self.block_bytes = min(self._plan_block, tuner.block_bytes)
        if self._ramp_held is None and self._limited is None and self._open_cache is None:
            limit = self.store.concurrency_limit or tuner.max_concurrency
            self.max_concurrency = min(tuner.max_concurrency, limit)

    def _next_length(self) -> int:
        return min(self._block, self.block_bytes, self.obj.size - self._next)

    def _request(self, length: int) -> None:
        if not self._pinned:  # every read of the object as it is now (see ObjectStore.pin)
            self._pinned = True
            self.store.pin(self.obj)
        start = self._next
        self._next += length
        self._hold(length)
        self._block = min(self._block * 2, self.block_bytes)
        task: asyncio.Future[list[bytes]]
        cached = None
        if self._open_cache is None:  # (else in the task: a cache copy is read instead)
            cached = self.store.read_range_cached(self.obj, start, start + length)
        if cached is not None:  # already here: no task to wait behind the other requests
            task = asyncio.get_running_loop().create_future()
            task.set_result(cached)
        else:
            task = asyncio.ensure_future(self._read_block(start, start + length))
        self._inflight.append((length, task))

    def __aiter__(self) -> ObjectReader:
        return self

    def track_carried(self, carries: Callable[[], int]) -> None:
        """Ask ``carries()`` at each :meth:`settle` how many bytes handed on the decoder
        still holds in a record it has not completed (see :attr:`carries`)."""
        self.carries = carries

    def settle(self) -> None:
        """Give back the bytes of the pieces handed on so far: the decoder asks for more, so
        the consumer has taken their records (see the module docstring), except what the
        decoder still :attr:`carries` (a record not complete yet: its bytes are held until it
        is)."""
        kept = min(self._unsettled, self.carries()) if self.carries is not None else 0
        n, self._unsettled = self._unsettled - kept, kept
        if n:
            self._hold(-n)
            self.budget.release(n)

    async def __anext__(self) -> bytes:
        if self._closed:
            raise StopAsyncIteration
        self.settle()
        if self._handed:
            self.probing = False
        if not self._ready:
            self.prime()
            if not self._inflight:
                if self._next >= self.obj.size:
                    raise StopAsyncIteration
                length = self._next_length()
                # Other streams hold the budget; the consumer waits for this one: overdraw.
                await self.budget.reserve(length, overdraw=True)
                if self._closed or self._inflight:
                    # closed while waiting, or its prime() (woken by a release meanwhile) has
                    # requested from that very byte on: this reservation would ask again
                    self.budget.release(length)
                    if self._closed:
                        raise StopAsyncIteration
                else:
                    self._request(length)
            pieces = await self._inflight[0][1]
            self._inflight.popleft()
            self._ready.extend(pieces)
        piece = self._ready.popleft()
        self._unsettled += len(piece)
        self._handed = True
        self._release_ramp()
        self.prime()
        return piece

    def take_ready(self, limit: int) -> list[bytes]:
        """The next pieces, as far as they have arrived (never waits), while they add up to
        at most ``limit`` bytes: handed on like ``__anext__``'s, so a decoder takes ~1 MiB
        in one step, not one chunk at a time."""
        ready = self._ready
        taken: list[bytes] = []
        size = 0
        while ready and size + len(ready[0]) <= limit:
            piece = ready.popleft()
            taken.append(piece)
            size += len(piece)
        self._unsettled += size
        return taken

    async def aclose(self) -> None:
        """Cancel what is in flight and give its budget back; a cache copy being filled is
        given up (see :meth:`finish`). Idempotent."""
        self._closed = True
        self._hold(-self._held)
        self.budget.forget(self.prime)
        inflight, self._inflight = self._inflight, deque()
        ready, self._ready = self._ready, deque()
        unsettled, self._unsettled = self._unsettled, 0
        try:
            await cancel_and_wait(task for _, task in inflight)
        finally:  # (a close cancelled meanwhile still gives every byte back)
            self.budget.release(
                sum(length for length, _ in inflight) + sum(map(len, ready)) + unsettled
            )
        if self._pinned:
            self._pinned = False
            self.store.unpin(self.obj)
        routing, self._routing = self._routing, None
        if routing is not None:
            await cancel_and_wait([routing])
            route = None if routing.cancelled() or routing.exception() else routing.result()
            if isinstance(route, CacheHit):
                await route.close()
            elif isinstance(route, CacheFill):
                await route.abort()

    @property
    def cache_hit(self) -> CacheHit | None:
        """The local cache's copy this reader reads, if it does."""
        route = self._route_now()
        return route if isinstance(route, CacheHit) else None

    def _route_now(self) -> CacheHit | CacheFill | None:
        routing = self._routing
        if routing is None or not routing.done() or routing.cancelled() or routing.exception():
            return None
        return routing.result()

    async def finish(self, clean: bool) -> None:
        """The object was read to its end and decoded (``clean``: without damage): publish
        the cache copy this reader filled; a damaged local copy is removed instead (the next
        read downloads the object again)."""
        route = self._route_now()
        if isinstance(route, CacheFill):
            if clean:
                await route.publish()
            else:
                await route.abort()
        elif isinstance(route, CacheHit) and not clean:
            await route.discard()

    async def _route(self) -> CacheHit | CacheFill | None:
        """The cache's answer for this object, asked once (every block waits for it)."""
        assert self._open_cache is not None
        if self._routing is None:
            self._routing = asyncio.ensure_future(self._open_cache())
        # shielded: one block's cancellation must not cancel the others' answer (aclose does)
        route = await asyncio.shield(self._routing)
        if self._ramp_held is not None:  # the rest once the first piece is handed on
            self._ramp_held = max(self._ramp_held, self._remote_concurrency)
        elif self._limited is not None:  # once the limit is lifted (restore_concurrency)
            if not isinstance(route, CacheHit):
                self._limited = max(self._limited, self._remote_concurrency)
        elif not isinstance(route, CacheHit) and self.max_concurrency < self._remote_concurrency:
            self.max_concurrency = self._remote_concurrency
            self.prime()  # the reads a remote object needs in flight
        return route

    async def _read_block(self, start: int, end: int) -> list[bytes]:
        store, obj = self.store, self.obj
        route = None if self._open_cache is None else await self._route()
        pieces = None
        if isinstance(route, CacheHit):
            store, obj = route.store, route.obj
        elif route is not None:  # bytes a listing already fetched are not fetched again
            pieces = store.read_range_cached(obj, start, end)
        if pieces is None:
            started = time.perf_counter()
            with timing.read_probe() as probe:
                pieces = await read_exact(
                    store,
                    obj,
                    start,
                    end,
                    policy=self.policy,
                    on_retry=self._on_retry,
                    on_read=self._on_read,
                )
            if self._tuner is not None:  # what the link did, for the next blocks' sizes
                self._tuner.record(end - start, time.perf_counter() - started, probe.first_byte_s)
        if isinstance(route, CacheFill):
            # written while the block is still reserved in the budget: no extra copy held
            await route.write(start, pieces)
        return pieces


async def read_exact(
    store: ObjectStore,
    obj: ObjectInfo,
    start: int,
    end: int,
    *,
    policy: RetryPolicy,
    on_retry: Callable[[TransientStorageError], None] | None = None,
    on_read: Callable[[float], None] | None = None,
) -> list[bytes]:
    """Exactly bytes ``start:end`` of ``obj`` (as pieces), each attempt retried per
    ``policy``, resuming after short reads at the exact offset (a short body counts as a
    retry: ``on_retry`` is called for it too). ``on_read(seconds)`` is told how long the
    read took, retries included, once it has all its bytes."""
    started = time.perf_counter()
    pieces: list[bytes] = []
    have = 0
    short_reads = 0
    url = obj.url
    while start + have < end:
        offset = start + have

        async def attempt(offset: int = offset) -> list[bytes]:
            return await store.read_range_pieces(obj, offset, end)

        got = await policy.run(
            attempt, describe=f"{url} bytes {offset}-{end - 1}", on_retry=on_retry
        )
        want = end - offset
        size = sum(map(len, got))
        if size > want:  # a server that ignored the range end
            got, size = first_bytes(got, want), want
        if size < want:
            # s3fs and gcsfs pass such bodies on silently; we keep them and ask for the rest
            short_reads += 1
            error = TransientStorageError(
                f"{url}: asked for bytes {offset}-{end - 1}, got {size} bytes"
            )
            if short_reads >= policy.max_attempts:
                raise RetriesExhaustedError(
                    f"{url}: the server kept returning short bodies "
                    f"({short_reads} in a row for bytes {start}-{end - 1})"
                ) from error
            if on_retry is not None:
                on_retry(error)
        pieces.extend(piece for piece in got if piece)
        have += size
    if on_read is not None:
        on_read(time.perf_counter() - started)
    return pieces
