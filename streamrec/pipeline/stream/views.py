"""``ds.record_views()``: every payload as a zero-copy ``memoryview`` into the piece it arrived in.

The streaming engine reads in span mode (``ReadOptions.record_spans``): the C framing scan
checks each record's CRCs and leaves its payload where it arrived, a
:class:`~streamrec.format.payload.RecordSpans` over the received pieces. A view is a slice of
its piece; a record split across pieces was joined already (one copy), and so is a chunk of
small records that came as ``bytes`` objects (the pure-Python build, gzip, indexed reads):
a copy into one buffer costs less than a view-owner per small record. Large records of a
local file, read directly (``stream/direct.py``), are each their own buffer: a
:class:`~streamrec.storage.local.records.PayloadPool` object, given back once the chunk's views
are all gone and written into again by a later read (memory already mapped, no allocation per
record; at most a quarter of ``prefetch_bytes`` waits there).

Lifetime: a view holds its buffer (immutable ``bytes``), so one kept is never invalid; but a
view is meant to be used before the iterator moves past its chunk. Every buffer a chunk's
views point into is wrapped in a read-only numpy array (the views' exporter; it supports weak
references, ``bytes`` does not): the chunk's bytes are *held* in the iteration's prefetch
budget (:meth:`~streamrec.pipeline.budget.ByteBudget.keep`) from hand-out until the last view
into any of its buffers is gone, then given back (:meth:`~streamrec.pipeline.budget.ByteBudget.
unkeep`, on the loop's thread). Views kept make the reads wait, never the memory grow unbounded
by the reads (only by what the user keeps).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from streamrec._portal import iterate_ahead, iterate_blocking, owned, owned_generator, owning
from streamrec.format.payload import RecordSpans
from streamrec.pipeline.budget import ByteBudget
from streamrec.pipeline.position.events import Event, Piece
from streamrec.storage.local.records import PayloadPool, Pooled

if TYPE_CHECKING:
    from streamrec.pipeline.position.state import DatasetState
    from streamrec.pipeline.position.trackers import Cursor

__all__ = ["JOIN_BELOW_BYTES", "Chained", "ChunkHold", "RecordViews", "ViewSource", "chunk_views"]

JOIN_BELOW_BYTES = 64 << 10
"""A chunk of ``bytes`` records shorter than this on average is copied into one buffer (a
numpy array and a weak reference per record would cost more than the copy)."""

ViewPiece = tuple[Sequence[bytes], list[Event], list[memoryview]]


class ChunkHold:
    """One chunk's bytes held in ``budget`` until every buffer its views point into is gone
    (then :meth:`ByteBudget.unkeep` runs on ``loop``, whichever thread dropped the last view).

    ``live`` is the iteration's set of holds not yet given back: it keeps each hold (and its
    weak references, whose callbacks do the counting) alive however the views are dropped.
    """

    __slots__ = (
        "_buffers",
        "_dropped",
        "_live",
        "_loop",
        "_pool",
        "_pooled",
        "_refs",
        "_sizes",
        "budget",
        "nbytes",
    )

    def __init__(
        self, budget: ByteBudget | None, loop: asyncio.AbstractEventLoop, live: set[ChunkHold]
    ) -> None:
        self.budget = budget
        self.nbytes = 0
        self._loop = loop
        self._live = live
        self._refs: list[weakref.ref[np.ndarray[Any, Any]]] = []
        self._sizes: list[int] = []
        self._pool: PayloadPool | None = None
        self._pooled: list[bytes] = []
        self._buffers = 0
        self._dropped = itertools.count(1)  # next() is atomic: views die in any thread

    def export(self, buffer: bytes) -> memoryview:
        """A read-only view of ``buffer`` whose last slice's end is counted here."""
        array = np.frombuffer(buffer, dtype=np.uint8)
        self._refs.append(weakref.ref(array, self._gone))
        self._sizes.append(len(buffer))
        return array.data  # (its exporter: the array)

    def recycle(self, pool: PayloadPool, payloads: list[bytes]) -> None:
        """Give ``payloads`` (the chunk's own buffers) back to ``pool`` once the views are gone:
        kept alive until then (the views hold the arrays, not the payloads)."""
        self._pool, self._pooled = pool, payloads

    def start(self) -> None:
        """Hold the bytes of the exported buffers the views point into (called once every
        buffer is exported; one no record points into, a slice's parent's, is gone already)."""
        alive = [n for ref, n in zip(self._refs, self._sizes, strict=True) if ref() is not None]
        self._buffers, self.nbytes = len(alive), sum(alive)
        if not alive:
            return
        self._live.add(self)
        if self.budget is not None:
            self.budget.keep(self.nbytes)

    def _gone(self, _: object) -> None:
        if self not in self._live:
            return  # before start(): start() counts it
        if next(self._dropped) == self._buffers:
            self._give_back()

    def _give_back(self) -> None:
        self._live.discard(self)
        pool, pooled, self._pooled = self._pool, self._pooled, []
        while pool is not None and pooled:
            pool.give(pooled.pop())  # (then the pool's alone: take() checks nobody else has it)
        if self.budget is None:
            return
        # (a closed loop: the iteration and its budget are gone too)
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.budget.unkeep, self.nbytes)


def chunk_views(records: Sequence[bytes], hold: ChunkHold) -> list[memoryview]:
    """A view of each payload of ``records`` (a chunk), its buffers exported through
    ``hold`` (see the module docstring); ``hold.start()`` is the caller's."""
    if isinstance(records, RecordSpans):
        buffers, spans = records.buffers, records.spans.tolist()
    elif records and sum(map(len, records)) < JOIN_BELOW_BYTES * len(records):
        joined = b"".join(records)  # one copy of small records: one buffer
        lengths = np.fromiter(map(len, records), dtype=np.int64, count=len(records))
        starts = (np.cumsum(lengths) - lengths).tolist()
        buffers = [joined]
        spans = [[0, o, n] for o, n in zip(starts, lengths.tolist(), strict=True)]
    else:
        buffers, spans = list(records), [[b, 0, len(r)] for b, r in enumerate(records)]
        if isinstance(records, Pooled) and records.pool is not None:
            hold.recycle(records.pool, buffers)
    whole = [hold.export(buffer) for buffer in buffers]
    return [whole[b][o : o + n] for b, o, n in spans]


@owned_generator
async def _viewed(
    pieces: Callable[..., AsyncGenerator[Piece, None]],
    resume: DatasetState | None,
    live: set[ChunkHold],
    *,
    timed: bool = True,
) -> AsyncGenerator[ViewPiece, None]:
    """The iteration's pieces (``pieces(resume, ...)``) with each chunk's views, made on the
    loop's thread (a blocking ``for`` gets them made while it consumes the chunk before),
    each chunk held in this iteration's budget; ``live``: where the holds not given back are
    kept."""
    loop = asyncio.get_running_loop()
    budgets: list[ByteBudget] = []
    read = pieces(resume, timed=timed, in_place=True, on_budget=budgets.append)
    async with aclosing(read) as source:
        async for records, events in source:
            hold = ChunkHold(budgets[0] if budgets else None, loop, live)
            views = chunk_views(records, hold)
            hold.start()
            yield records, events, views
            del views, hold


class ViewSource(NamedTuple):
    """What the dataset lends a :class:`RecordViews`: its iteration's steps, as it runs
    them for ``for`` and ``async for``."""

    begin: Callable[[], tuple[Cursor, DatasetState | None]]
    """A new iteration: the consumer's cursor, and the state it resumes from."""
    pieces: Callable[..., AsyncGenerator[Piece, None]]
    """``pieces(resume, timed=..., in_place=True, on_budget=...)``: the epoch's pieces, and
    their iteration's prefetch budget."""
    end: Callable[[Cursor], None]
    """The iteration ran to its end."""
    add_wait: Callable[[float], None]
    """Seconds a blocking consumer waited."""
    blocking: bool
    """Hand pieces over one at a time, none read ahead (indexed reads)."""


class RecordViews:
    """What :meth:`Dataset.record_views() <streamrec.pipeline.dataset.Dataset.record_views>`
    returns: iterate it with ``for`` or ``async for`` (one pass per iteration, like the
    dataset itself); the payloads, in the dataset's order, as read-only ``memoryview``s."""

    def __init__(self, source: ViewSource) -> None:
        self._source = source
        self._live: set[ChunkHold] = set()

    @property
    def held_bytes(self) -> int:
        """Bytes of the chunks that views from this object still point into (held in their
        iteration's prefetch budget until the last one is gone)."""
        return sum(hold.nbytes for hold in list(self._live))

    def __iter__(self) -> Iterator[memoryview]:
        return Chained.from_iterable(self._view_lists())

    def _view_lists(self) -> Generator[Iterator[memoryview], None, None]:
        ds = self._source
        cursor, resume = ds.begin()
        iterate = iterate_blocking if ds.blocking else iterate_ahead

        def viewed() -> AsyncIterator[ViewPiece]:
            return owned(_viewed(ds.pieces, resume, self._live, timed=False))

        pieces = iterate(viewed, ds.add_wait)
        for records, events, views in pieces:
            it: Iterator[Any] = iter(views)  # (the cursor counts what is left in it)
            cursor.take(records, events, it)  # (consumed as dataset.__iter__ counts)
            yield it
            cursor.settle()
            del records, events, views, it  # our references: the user's views keep theirs
        ds.end(cursor)

    def __aiter__(self) -> AsyncIterator[memoryview]:
        return self._async_views()

    async def _async_views(self) -> AsyncGenerator[memoryview, None]:
        ds = self._source
        cursor, resume = ds.begin()
        pieces = _viewed(ds.pieces, resume, self._live)
        view: memoryview | None = None
        async with owning(pieces) as viewed:
            async for records, events, views in viewed:
                it: Iterator[Any] = iter(views)
                cursor.take(records, events, it)
                for view in it:
                    yield view
                del views, it
                view = None  # (the chunk's last view: ours no longer keeps it)
        ds.end(cursor)


class Chained(itertools.chain):  # type: ignore[type-arg]
    """A blocking ``for``'s iterator: the items of every chunk's iterator, one after another,
    stepped through in C (a generator's ``yield from`` costs a frame resumption per record,
    which at 1 KiB records was a measurable part of the whole loop). ``close()`` closes the
    chunks' generator (and with it the background thread), as a generator's would."""

    _lists: Generator[Iterator[Any], None, None]

    @classmethod
    def from_iterable(cls, lists: Any) -> Chained:
        self = cast(Chained, super().from_iterable(lists))  # an instance of cls
        self._lists = lists
        return self

    def close(self) -> None:
        """Stop reading: close the pipeline and join its thread."""
        self._lists.close()
