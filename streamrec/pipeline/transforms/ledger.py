"""Counting what a consumer took: :class:`Consumption` (pieces handed on -> how far the
consumer got in them: the one implementation every link of a chain uses), :class:`Ledger`
(a transform's items consumed -> records of its source consumed) and :class:`Handout` (items
handed out by an iterator).

Every link hands on pieces and later learns "``n`` more items consumed", in order: the
:class:`~streamrec.pipeline.dataset.Dataset` hands on pieces of records (its account moves the
cursor over their events: :class:`~streamrec.pipeline.position.trackers.Reported`), a
transform pieces of items (its account, :class:`Ledger`, adds up what they cost in source
records), a mix runs of draws (its account marks each source with its own records).
:class:`Consumption` walks the pieces for all of them; an :class:`Account` says what
consuming part of a piece means.

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
from typing import Any, Generic, Protocol, TypeVar, cast

from streamrec._portal import iterate_blocking, owned, owning

__all__ = [
    "Account",
    "Consumption",
    "Handout",
    "ItemPiece",
    "Ledger",
    "handed_out_async",
    "handed_out_blocking",
]

T = TypeVar("T")
P = TypeVar("P")
P_in = TypeVar("P_in", contravariant=True)

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


class Account(Protocol[P_in]):
    """What consuming the pieces of a :class:`Consumption` means to the link that keeps it."""

    def size(self, piece: P_in) -> int:
        """Items in ``piece``."""
        ...

    def opened(self, piece: P_in) -> None:
        """``piece`` is now the first not fully consumed: the next items consumed are its."""
        ...

    def consumed(self, piece: P_in, start: int, stop: int) -> None:
        """Items ``start:stop`` of ``piece`` (the first) were consumed."""
        ...

    def closed(self, piece: P_in) -> None:
        """Every item of ``piece`` was consumed: it leaves."""
        ...


class Consumption(Generic[P]):
    """Pieces handed on, in order, and how many of their items the consumer took: "``n``
    more items consumed" becomes, through ``account``, the source's position advanced.

    A piece is opened once it is the first not fully consumed (at once if it is added
    then), and closed (then dropped) once all its items are; ``end(then)`` says no piece
    follows: ``then()`` runs once every piece handed on is closed. ``pieces`` (the one in
    hand first) and ``pos`` (its items consumed) are for reading only.
    """

    __slots__ = ("_account", "_open", "_then", "pieces", "pos")

    def __init__(self, account: Account[P]) -> None:
        self._account = account
        self.pieces: deque[P] = deque()
        self.pos = 0  # items of the first piece consumed
        self._open = False  # the first piece was opened
        self._then: Callable[[], None] | None = None

    def add(self, piece: P) -> None:
        """``piece`` was handed on (after every piece added before it)."""
        self.pieces.append(piece)
        self._settle()

    def end(self, then: Callable[[], None]) -> None:
        """No piece follows: ``then()`` once every piece is consumed (now, if they are)."""
        self._then = then
        self._settle()

    def pending(self) -> int:
        """Items handed on and not consumed yet."""
        return sum(self._account.size(piece) for piece in self.pieces) - self.pos

    def consume(self, n: int) -> None:
        """``n`` more items were consumed, in order."""
        pieces, account = self.pieces, self._account
        while n > 0:
            if not pieces:
                raise ValueError("more items marked consumed than were handed on")
            head = pieces[0]
            size = account.size(head)
            take = min(n, size - self.pos)
            account.consumed(head, self.pos, self.pos + take)
            self.pos += take
            n -= take
            if self.pos == size:
                self._settle()

    def _settle(self) -> None:
        """Open the first piece; close and drop consumed ones; at the end, ``then()``."""
        pieces, account = self.pieces, self._account
        while pieces:
            head = pieces[0]
            if not self._open:
                account.opened(head)
                self._open = True
            if self.pos < account.size(head):
                return
            account.closed(head)
            pieces.popleft()
            self.pos, self._open = 0, False
        if self._then is not None:
            then, self._then = self._then, None
            then()


class Ledger:
    """A transform's pieces handed on, and how many of their items were consumed: in source
    records (the :class:`Account` of a :class:`Consumption` of :data:`ItemPiece` parts).

    ``add`` and ``consume`` return the source records newly consumed (the caller marks them
    on the source). ``items``: items consumed; ``upstream``: source records consumed;
    ``tail``: items consumed after the last one that cost source records (for ``unbatch``:
    the items of the current batch already handed out), starting from ``tail``.
    """

    __slots__ = ("_cost", "_pieces", "items", "tail", "upstream")

    def __init__(self, tail: int = 0) -> None:
        # each piece: [count, sizes, skipped not yet applied]
        self._pieces: Consumption[list[Any]] = Consumption(self)
        self._cost = 0  # source records consumed, not yet returned
        self.items = 0
        self.upstream = 0
        self.tail = tail

    def add(self, count: int, sizes: list[int] | None, skipped: int) -> int:
        """A piece of ``count`` items was handed on."""
        self._pieces.add([count, sizes, skipped])
        return self._newly()

    def consume(self, n: int) -> int:
        """``n`` more items were consumed, in order."""
        self.items += n
        self._pieces.consume(n)
        return self._newly()

    def pending(self) -> int:
        """Items handed on and not consumed yet."""
        return self._pieces.pending()

    def _newly(self) -> int:
        cost, self._cost = self._cost, 0
        self.upstream += cost
        return cost

    def peek(self, n: int) -> int:
        """Source records that ``n`` more consumed items would cost (no side effect)."""
        total, pos = 0, self._pieces.pos
        for count, sizes, skipped in tuple(self._pieces.pieces):  # (a copy: any thread may ask)
            if n <= 0:
                break
            total += skipped
            take = min(n, count - pos)
            total += take if sizes is None else sum(sizes[pos : pos + take])
            n -= take
            pos = 0
        return total

    # ---------------------------------------------------------------- the account

    def size(self, piece: list[Any]) -> int:
        return int(piece[0])

    def opened(self, piece: list[Any]) -> None:
        # its skipped records are consumed once the items before them are
        self._cost += piece[2]
        piece[2] = 0  # (applied: peek no longer counts them)

    def consumed(self, piece: list[Any], start: int, stop: int) -> None:
        sizes: list[int] | None = piece[1]
        take = stop - start
        if sizes is None:
            self._cost += take
            self.tail = 0
            return
        part = sizes[start:stop]
        part_cost = sum(part)
        if part_cost:
            last = len(part) - 1
            while not part[last]:
                last -= 1
            self.tail = take - 1 - last
        else:
            self.tail += take
        self._cost += part_cost

    def closed(self, piece: list[Any]) -> None:
        pass


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
