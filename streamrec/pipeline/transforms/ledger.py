"""Counting what a consumer took: :class:`Handout` (items handed out by an iterator) and
:class:`Ledger` (items a link handed on -> records of its source consumed).

A transform turns its source's records into items piece by piece: each piece is a list of
items, what each item costs in source records (``sizes``: a batch costs its records, a kept
item of a filter the records dropped before it and itself, an item of an unbatched batch
nothing but the batch's last item, which costs the batch) and source records consumed before
its first item without an item of their own (``skipped``: ``skip``'s dropped records, a
dropped remainder, records filtered out at the end). The ledger turns "``n`` more items
consumed" into "``m`` more source records consumed", chunk by chunk, never per item.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any, Protocol, TypeVar, cast

from streamrec._portal import iterate_blocking, owned, owning

__all__ = ["Handout", "Ledger", "ItemPiece", "handed_out_async", "handed_out_blocking"]

T = TypeVar("T")

#: A piece of a transform's items (the read pipeline's pieces of records and events are
#: :data:`~streamrec.pipeline.position.events.Piece`): the items, each item's cost in source
#: records (None: one each), and source records consumed before the first item without an item.
ItemPiece = tuple[list[Any], list[int] | None, int]


class Handout:
    """Counts the items a consumer's iterator handed out and reports them with ``mark(n)``.

    The chunk in hand is read through the list iterator ``it``; the items it has already
    produced are handed out (``__length_hint__`` says how many are left), so no per-item
    bookkeeping is needed. ``flush()`` reports what was handed out since the last report.
    """

    __slots__ = ("_count", "_done", "_it", "_mark", "_marked")

    def __init__(self, mark: Callable[[int], None] | None) -> None:
        self._mark = mark
        self._marked = 0  # items reported so far
        self._done = 0  # items of the chunks before the one in hand
        self._count = 0  # items in the chunk in hand
        self._it: Any = None

    def take(self, count: int, it: Iterator[Any]) -> None:
        """The consumer now reads a chunk of ``count`` items through ``it``."""
        self._done += self._handed()
        self._count, self._it = count, it
        self.flush()

    def _handed(self) -> int:
        return 0 if self._it is None else self._count - self._it.__length_hint__()

    def total(self) -> int:
        """Items handed out so far (no side effect: any thread may ask)."""
        return self._done + self._handed()

    def flush(self) -> None:
        """Report every item handed out so far."""
        total = self._done + self._handed()
        if self._mark is not None and total > self._marked:
            self._mark(total - self._marked)
            self._marked = total


class Ledger:
    """Pieces handed on, and how many of their items were consumed: in source records.

    ``add`` and ``consume`` return the source records newly consumed (the caller marks them
    on the source). ``items``: items consumed; ``upstream``: source records consumed;
    ``tail``: items consumed after the last one that cost source records (for ``unbatch``:
    the items of the current batch already handed out), starting from ``tail``.
    """

    __slots__ = ("_pieces", "_pos", "items", "tail", "upstream")

    def __init__(self, tail: int = 0) -> None:
        self._pieces: deque[list[Any]] = deque()  # [count, sizes, skipped not yet applied]
        self._pos = 0  # items of the head piece consumed
        self.items = 0
        self.upstream = 0
        self.tail = tail

    def add(self, count: int, sizes: list[int] | None, skipped: int) -> int:
        """A piece of ``count`` items was handed on."""
        self._pieces.append([count, sizes, skipped])
        return self._settle()

    def pending(self) -> int:
        """Items handed on and not consumed yet."""
        return sum(int(piece[0]) for piece in self._pieces) - self._pos

    def _settle(self) -> int:
        """Apply the head's skipped records; drop consumed pieces."""
        consumed = 0
        pieces = self._pieces
        while pieces:
            head = pieces[0]
            if head[2]:
                consumed += head[2]
                head[2] = 0
            if self._pos < head[0]:
                break
            pieces.popleft()
            self._pos = 0
        self.upstream += consumed
        return consumed

    def consume(self, n: int) -> int:
        """``n`` more items were consumed, in order."""
        cost = settled = 0
        pieces = self._pieces
        self.items += n
        while n > 0:
            if not pieces:
                raise ValueError("more items marked consumed than were handed on")
            count, sizes, _ = pieces[0]
            take = min(n, count - self._pos)
            if sizes is None:
                cost += take
                self.tail = 0
            else:
                part = sizes[self._pos : self._pos + take]
                part_cost = sum(part)
                if part_cost:
                    last = len(part) - 1
                    while not part[last]:
                        last -= 1
                    self.tail = take - 1 - last
                else:
                    self.tail += take
                cost += part_cost
            self._pos += take
            n -= take
            if self._pos == count:
                settled += self._settle()  # (counts itself in upstream)
        self.upstream += cost
        return cost + settled

    def peek(self, n: int) -> int:
        """Source records that ``n`` more consumed items would cost (no side effect)."""
        total, pos = 0, self._pos
        for count, sizes, skipped in tuple(self._pieces):  # (a copy: any thread may ask)
            if n <= 0:
                break
            total += skipped
            take = min(n, count - pos)
            total += take if sizes is None else sum(sizes[pos : pos + take])
            n -= take
            pos = 0
        return total


class _Counted(Protocol[T]):
    """A source read item by item: its chunks, counted consumed as its consumer takes them."""

    def record_chunks(
        self,
        *,
        auto_consume: bool = ...,
        report_consumed: Callable[[], None] | None = ...,
        handed_out: Callable[[], int] | None = ...,
    ) -> AsyncGenerator[list[T], None]: ...

    def mark_consumed(self, n: int) -> None: ...


async def handed_out_async(source: _Counted[T]) -> AsyncGenerator[T, None]:
    """``async for`` over ``source`` item by item: its chunks read with
    ``auto_consume=False``, each item counted consumed once it is handed out (a
    :class:`Handout`), so ``state_dict()`` is exact between any two items."""
    handout = Handout(source.mark_consumed)
    chunks = source.record_chunks(
        auto_consume=False, report_consumed=handout.flush, handed_out=handout.total
    )
    async with owning(chunks) as pieces:  # (owning makes it Owned)
        try:
            async for items in pieces:
                it = iter(items)
                handout.take(len(items), it)
                for item in it:
                    yield item
        finally:
            handout.flush()  # before the source's iteration closes


def handed_out_blocking(source: _Counted[T]) -> Iterator[T]:
    """:func:`handed_out_async` for plain ``for``: the chunks come from the background loop
    (``_portal.iterate_blocking``), the counting happens in the consumer's thread, between
    hand-overs."""
    handout = Handout(source.mark_consumed)

    def chunks() -> AsyncGenerator[list[T], None]:
        return owned(
            source.record_chunks(
                auto_consume=False, report_consumed=handout.flush, handed_out=handout.total
            )
        )

    lists = cast(Any, iterate_blocking(chunks))
    try:
        for items in lists:
            it = iter(items)
            handout.take(len(items), it)
            yield from it
    finally:
        handout.flush()  # before the source's iteration closes
        lists.close()
