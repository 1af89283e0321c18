"""The consumer's position, kept exact by applying the events of what it has taken.

The read pipeline runs ahead of its consumer (blocks in flight, the sync iterator's background
thread, chunks in queues), so its own variables never say where the *consumer* is. Each stage
hands on pieces ``(records, events)`` (:mod:`~streamrec.pipeline.position.events`); the consumer's
:class:`Cursor` applies the events of each piece it has actually taken to a tracker, so the
tracker always describes exactly the consumer's position, as the typed values of
:mod:`~streamrec.pipeline.position.state`. ``state_dict()`` applies the piece in hand up to the
record last taken, on a copy.
"""

from __future__ import annotations

import copy
import operator
import random
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from streamrec.format.framing import OVERHEAD_BYTES, framed_bytes
from streamrec.format.payload import RecordSpans
from streamrec.pipeline.listing.plan import seeded_random
from streamrec.pipeline.position.done import Done, add_done
from streamrec.pipeline.position.draws import Draws, restore
from streamrec.pipeline.position.events import (
    Advance,
    Begin,
    Drain,
    Event,
    Open,
    Piece,
    Rounds,
    ShuffleIn,
    Take,
    turns,
)
from streamrec.pipeline.position.state import (
    CycleState,
    DatasetState,
    IndexedState,
    Location,
    ReadState,
    ReadyState,
    ShardPosition,
    ShuffleState,
)

if TYPE_CHECKING:
    from streamrec.pipeline.listing.plan import ShardPlan
    from streamrec.pipeline.options import ReadOptions
    from streamrec.storage.base import ObjectInfo

__all__ = [
    "Countdown",
    "Cursor",
    "CycleTracker",
    "Locate",
    "Place",
    "ReadyTracker",
    "Remaining",
    "Reported",
    "ShuffleTracker",
    "Tracker",
    "Where",
    "tracker_for",
    "where_from",
]


class Tracker(Protocol):
    """Applies pieces' events; describes the consumer's position."""

    def apply(self, events: Sequence[Event], records: Sequence[bytes], limit: int | None) -> None:
        """Apply the events of the piece ``records`` for its first ``limit`` records (all
        when ``None``)."""

    def copy(self) -> Tracker:
        """An independent copy."""

    def position(self) -> tuple[ReadState | None, ShuffleState | None]:
        """The position: of the read stage, and of the shuffle buffer (if there is one)."""

    def locate(self, events: Sequence[Event], records: Sequence[bytes], k: int) -> Place | None:
        """Where record ``k`` of the piece ``records`` comes from (applying the piece's events
        up to it: call it on a copy); None where the tracker does not know."""


#: ``(shard ordinal, record index in the shard, byte offset of its header)``
Place = tuple[int, int, int]


class _ReadTracker:
    """Shared part of the trackers of the read stage (which shard each record came from)."""

    def at(self, slot: int) -> ShardPosition:
        """The position of the shard in ``slot``."""
        raise NotImplementedError

    def open(self, slot: int, ordinal: int, records: int, offset: int) -> None:
        raise NotImplementedError

    def end_turn(self, slot: int, ended: bool) -> None:
        raise NotImplementedError

    def copy(self) -> _ReadTracker:
        raise NotImplementedError

    def state(self) -> ReadState:
        raise NotImplementedError

    def position(self) -> tuple[ReadState | None, ShuffleState | None]:
        return self.state(), None

    def partial_turn(self, count: int) -> None:
        """The consumer stopped ``count`` records into a turn."""

    def locate(self, events: Sequence[Event], records: Sequence[bytes], k: int) -> Place | None:
        pos = 0
        for event in turns(events):
            if isinstance(event, Open):
                self.open(*event)
            elif isinstance(event, Take):
                slot, count, ended, _ = event
                if count:
                    position = self.at(slot)
                    if k < pos + count:
                        offset = position.offset + framed_bytes(records[pos:k])
                        return position.ordinal, position.records + k - pos, offset
                    position.records += count
                    position.offset += framed_bytes(records[pos : pos + count])
                self.end_turn(slot, ended)
                pos += count
        return None

    def apply(self, events: Sequence[Event], records: Sequence[bytes], limit: int | None) -> None:
        pos = 0
        for event in events:
            if isinstance(event, Take):
                slot, count, ended, nbytes = event
                partial = limit is not None and pos + count > limit
                taken = limit - pos if partial else count  # type: ignore[operator]
                if taken:
                    position = self.at(slot)
                    position.records += taken
                    if partial:
                        nbytes = framed_bytes(records[pos : pos + taken])
                    position.offset += nbytes
                if partial:
                    self.partial_turn(taken)
                    return
                self.end_turn(slot, ended)
                pos += count
            elif isinstance(event, Rounds):
                pos = self._rounds(event, records, pos, limit)
                if pos < 0:
                    return
            elif isinstance(event, Open):
                self.open(*event)

    def _rounds(self, event: Rounds, records: Sequence[bytes], pos: int, limit: int | None) -> int:
        """Apply a :class:`Rounds` event starting at record ``pos`` of the piece; the position
        after it, or -1 when the consumer stopped inside it. The calls are those the same
        records as :class:`Take` events would make."""
        order, block_length, rounds, nbytes = event
        step = len(order) * block_length
        count = rounds * step
        if limit is None or pos + count <= limit:
            for slot, n in zip(order, nbytes, strict=True):
                position = self.at(slot)
                position.records += rounds * block_length
                position.offset += n
            self.end_turn(order[-1], False)
            return pos + count
        taken = limit - pos
        end = pos + taken
        for k, slot in enumerate(order):
            first = pos + k * block_length
            mine = [records[first + j : end : step] for j in range(block_length)]
            n = sum(map(len, mine))
            if n:
                position = self.at(slot)
                position.records += n
                position.offset += sum(map(framed_bytes, mine))
        whole, within = divmod(taken % step, block_length)
        if whole:
            self.end_turn(order[whole - 1], False)
        elif taken >= step:
            self.end_turn(order[-1], False)
        self.partial_turn(within)
        return -1


class CycleTracker(_ReadTracker):
    """Position in a (deterministic) interleave of ``cycle_length`` slots; sequential reading
    is the case ``cycle_length == 1``."""

    def __init__(self, cycle_length: int, state: CycleState | None = None) -> None:
        self.cycle_length = cycle_length
        self.next = 0  # ordinal of the next shard to open
        self.index = 0  # the slot whose turn it is
        self.within = 0  # records already taken in this turn
        self.slots: list[ShardPosition | None] = [None] * cycle_length
        if state is not None:  # (parse_state checked it against the configuration)
            self.next, self.index, self.within = state.next, state.index, state.within
            self.slots = [s.copy() if s is not None else None for s in state.slots]

    def at(self, slot: int) -> ShardPosition:
        position = self.slots[slot]
        assert position is not None, "records from an empty slot"
        return position

    def open(self, slot: int, ordinal: int, records: int, offset: int) -> None:
        self.slots[slot] = ShardPosition(ordinal, records, offset)
        self.next = ordinal + 1

    def end_turn(self, slot: int, ended: bool) -> None:
        if ended:
            self.slots[slot] = None
        self.index = (slot + 1) % self.cycle_length
        self.within = 0

    def partial_turn(self, count: int) -> None:
        self.within += count

    def copy(self) -> CycleTracker:
        other = copy.copy(self)
        other.slots = [s.copy() if s is not None else None for s in self.slots]
        return other

    def state(self) -> CycleState:
        slots = [s.copy() if s is not None else None for s in self.slots]
        return CycleState(self.next, self.index, self.within, slots)


class ReadyTracker(_ReadTracker):
    """Position in first-ready reading: which shards are finished, where the open ones are.

    Shards the pipeline opened but the consumer has not taken a record from are neither: they
    are read again from their start after a resume, so each record comes exactly once.
    """

    def __init__(self, state: ReadyState | None = None) -> None:
        self.open_shards: dict[int, ShardPosition] = {}
        self.done: Done = []  # (as ranges: a state never expands them before they are checked)
        if state is not None:
            self.open_shards = {p.ordinal: p.copy() for p in state.open}
            self.done = list(state.done)

    def at(self, slot: int) -> ShardPosition:
        position = self.open_shards.get(slot)
        if position is None:
            position = self.open_shards[slot] = ShardPosition(slot, 0, 0)
        return position

    def open(self, slot: int, ordinal: int, records: int, offset: int) -> None:
        self.open_shards[ordinal] = ShardPosition(ordinal, records, offset)

    def end_turn(self, slot: int, ended: bool) -> None:
        if ended:
            self.open_shards.pop(slot, None)
            add_done(self.done, slot)

    def copy(self) -> ReadyTracker:
        other = copy.copy(self)
        other.open_shards = {k: v.copy() for k, v in self.open_shards.items()}
        other.done = list(self.done)
        return other

    def state(self) -> ReadyState:
        return ReadyState(
            [self.open_shards[k].copy() for k in sorted(self.open_shards)], list(self.done)
        )


class ShuffleTracker:
    """Mirror of the shuffle buffer over record locations, driven by the same generator."""

    def __init__(
        self,
        upstream: _ReadTracker,
        buffer_size: int,
        rng: random.Random,
        state: ShuffleState | None = None,
    ) -> None:
        self.upstream = upstream
        self.buffer_size = buffer_size
        self.draws = Draws(rng)
        self.buffer: list[Location] = []
        self.draining = False
        if state is not None:
            self.buffer = list(state.buffer)
            self.draining = state.draining
            self.draws = restore(rng, state.rng)

    def apply(self, events: Sequence[Event], records: Sequence[bytes], limit: int | None) -> None:
        produced = 0
        for event in events:
            if isinstance(event, ShuffleIn):
                produced = self._inputs(event.events, event.lengths, produced, limit)
                if produced < 0:
                    return
            elif isinstance(event, Drain):
                if event.reshuffle:
                    self.draws.shuffle(self.buffer)
                self.draining = True
                del self.buffer[: len(self.buffer) if limit is None else limit - produced]

    def _inputs(
        self,
        events: Sequence[Event],
        lengths: Sequence[int],
        produced: int,
        limit: int | None,
        outputs: list[Location] | None = None,
    ) -> int:
        """Push input records through the mirror; -1 once ``limit`` outputs are reached.
        ``outputs`` collects the location of each record the buffer hands out."""
        upstream, buffer, size = self.upstream, self.buffer, self.buffer_size
        pick = self.draws.below
        li = 0
        for event in _read_events(events):
            if isinstance(event, Open):
                upstream.open(*event)
                continue
            slot, count, ended, _ = event
            position = upstream.at(slot) if count else None
            for taken in range(count):
                if len(buffer) >= size and limit is not None and produced >= limit:
                    upstream.partial_turn(taken)
                    return -1
                assert position is not None
                length = lengths[li]
                li += 1
                location = (position.ordinal, position.records, position.offset, length)
                position.records += 1
                position.offset += length + OVERHEAD_BYTES
                if len(buffer) < size:
                    buffer.append(location)
                else:
                    out = pick(size)
                    if outputs is not None:
                        outputs.append(buffer[out])
                    buffer[out] = location
                    produced += 1
            upstream.end_turn(slot, ended)
        return produced

    def locate(self, events: Sequence[Event], records: Sequence[bytes], k: int) -> Place | None:
        outputs: list[Location] = []
        for event in events:
            if len(outputs) > k:
                break
            if isinstance(event, ShuffleIn):
                self._inputs(event.events, event.lengths, 0, None, outputs)
            elif isinstance(event, Drain):
                if event.reshuffle:
                    self.draws.shuffle(self.buffer)
                outputs += self.buffer
                self.buffer.clear()
        return outputs[k][:3] if len(outputs) > k else None

    def copy(self) -> ShuffleTracker:
        other = copy.copy(self)
        other.upstream = self.upstream.copy()
        other.buffer = list(self.buffer)
        other.draws = self.draws.copy()
        return other

    def position(self) -> tuple[ReadState | None, ShuffleState | None]:
        shuffle = ShuffleState(list(self.buffer), self.draining, self.draws.saved())
        return self.upstream.state(), shuffle


class IndexedTracker:
    """Position in indexed reading: how many positions of its part this consumer took (the
    part itself arrives with the first piece, as a :class:`Begin` event)."""

    def __init__(self, state: IndexedState | None = None) -> None:
        self.state = state

    def apply(self, events: Sequence[Event], records: Sequence[bytes], limit: int | None) -> None:
        pos = 0
        for event in events:
            if isinstance(event, Begin):
                self.state = IndexedState(
                    event.records,
                    event.consumers,
                    event.consumer,
                    [(a, b) for a, b in event.remaining],
                    event.taken,
                )
            elif isinstance(event, Advance):
                count = event.records
                if limit is not None and pos + count > limit:
                    count = limit - pos
                assert self.state is not None, "records before the part began"
                self.state.taken += count
                pos += count
                if limit is not None and pos >= limit:
                    return

    def locate(self, events: Sequence[Event], records: Sequence[bytes], k: int) -> Place | None:
        return None  # (positions in the epoch's order; the engine knows their records)

    def copy(self) -> IndexedTracker:
        state = self.state
        if state is None:
            return IndexedTracker()
        return IndexedTracker(
            IndexedState(
                state.records, state.consumers, state.consumer, list(state.remaining), state.taken
            )
        )

    def position(self) -> tuple[ReadState | None, ShuffleState | None]:
        return self.copy().state, None


def tracker_for(options: ReadOptions, epoch: int, resume: DatasetState | None) -> Tracker:
    """The tracker of an iteration of a dataset read with ``options`` in ``epoch``, starting
    at ``resume`` (None: at the epoch's start)."""
    read_state = resume.read if resume else None
    if options.indexed:
        assert read_state is None or isinstance(read_state, IndexedState)
        return IndexedTracker(read_state)
    assert not isinstance(read_state, IndexedState)  # (parse_state: by the configuration)
    upstream: CycleTracker | ReadyTracker
    if options.deterministic or options.cycle_length == 1:
        assert not isinstance(read_state, ReadyState)  # (parse_state: by the configuration)
        upstream = CycleTracker(options.cycle_length, read_state)
    else:
        assert not isinstance(read_state, CycleState)
        upstream = ReadyTracker(read_state)
    if not options.shuffle_buffer:
        return upstream
    rng = seeded_random(options.seed, epoch, "records")
    shuffle_state = resume.shuffle if resume else None
    return ShuffleTracker(upstream, options.shuffle_buffer, rng, shuffle_state)


def _read_events(events: Sequence[Event]) -> Iterator[Open | Take]:
    """The read stage's events, :class:`Rounds` spelled out as :class:`Take` events."""
    for event in turns(events):
        if isinstance(event, (Open, Take)):
            yield event


class Remaining(Protocol):
    """What the consumer still has of a piece: its iterator, or anything that says how many
    of its records are left."""

    def __length_hint__(self) -> int: ...


class Cursor:
    """The consumer's position: the events of each piece are applied as it is taken.

    ``take(records, events, it)``: the consumer now reads ``records`` through the iterator
    ``it`` (``None``: the whole piece is taken at once). Records still left in ``it`` are
    not consumed; the one last handed out is.
    """

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self._records: Sequence[bytes] = ()
        self._events: Sequence[Event] = ()
        self._it: Remaining | Iterator[bytes] | None = None
        self._settled = 0  # records of the pieces consumed before the one in hand

    def take(
        self,
        records: Sequence[bytes],
        events: Sequence[Event],
        it: Remaining | Iterator[bytes] | None = None,
    ) -> None:
        self.settle()
        self._records, self._events, self._it = records, events, it

    def settle(self) -> None:
        """The piece in hand is fully consumed."""
        if self._events:
            self.tracker.apply(self._events, self._records, None)
        self._settled += len(self._records)
        self._records, self._events, self._it = (), (), None

    def _left(self) -> int:
        return operator.length_hint(self._it) if self._it is not None else 0

    def handed_out(self) -> int:
        """Records handed to the consumer so far (the one last handed out included)."""
        return self._settled + len(self._records) - self._left()

    def locate(self, pieces: Sequence[Piece], payload: object) -> Place | None:
        """Where ``payload`` (the very object) comes from, among the records of ``pieces``:
        the pieces not yet settled, in order, the one in hand first. An equal payload found
        earlier would have failed the same way first, so the first one is the one."""
        tracker = self.tracker.copy()
        for records, events in pieces:
            if isinstance(records, RecordSpans):  # (payload: a RecordRef)
                k = records.find(payload)
                if k is not None:
                    return tracker.locate(events, records, k)
            for k, record in enumerate(records):
                if record is payload:
                    return tracker.locate(events, records, k)
            tracker.apply(events, records, None)
        return None

    def position(self) -> tuple[ReadState | None, ShuffleState | None]:
        """The position after the record last handed out."""
        tracker = self.tracker.copy()
        if self._events:
            limit = None
            if self._it is not None:
                limit = len(self._records) - self._left()
            tracker.apply(self._events, self._records, limit)
        return tracker.position()


#: ``(shard url, record index in it, byte offset of its header)``; the last two None where
#: they are not exact (records split every n-th across consumers, damage skipped)
Where = tuple[str, int | None, int | None]

#: ``locate(pending, payload)``: where a record of the pieces not yet consumed comes from
Locate = Callable[[Sequence[Piece], object], Where | None]


def where_from(
    cursor: Cursor | None,
    pending: Sequence[Piece],
    plan: ShardPlan[ObjectInfo] | Locate | None,
    payload: object,
    on_corrupt: str,
) -> Where | None:
    """Where ``payload``, a record of the ``pending`` pieces (not settled yet, the one in hand
    first) read by ``plan``, comes from (reads by index: ``plan`` is the engine's
    :data:`Locate`); None where that is not known."""
    if callable(plan):
        return plan(pending, payload)
    place = None if cursor is None or plan is None else cursor.locate(pending, payload)
    if place is None or plan is None:
        return None
    url = plan.shards[place[0]].url
    if plan.record_stride != 1 or on_corrupt != "raise":
        return url, None, None
    return url, place[1], place[2]


class Countdown:
    """Stands in for a piece's iterator: how many of its records are not consumed yet."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __length_hint__(self) -> int:
        return self.n


class Reported:
    """A :class:`Cursor` moved by what a consumer reports consumed after it was handed on:
    the account of a dataset's :class:`~streamrec.pipeline.transforms.ledger.Consumption` of
    pieces. The piece in hand is taken with a :class:`Countdown` of its records left."""

    __slots__ = ("_left", "cursor")

    def __init__(self, cursor: Cursor) -> None:
        self.cursor = cursor
        self._left = Countdown(0)

    def size(self, piece: Piece) -> int:
        return len(piece[0])

    def opened(self, piece: Piece) -> None:
        records, events = piece
        self._left = Countdown(len(records))
        self.cursor.take(records, events, self._left)

    def consumed(self, piece: Piece, start: int, stop: int) -> None:
        self._left.n = len(piece[0]) - stop

    def closed(self, piece: Piece) -> None:
        self.cursor.settle()
