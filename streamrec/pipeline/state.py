"""Exact resume: the consumer's position as a small JSON-serialisable state.

The read pipeline runs ahead of its consumer (blocks in flight, the sync iterator's background
thread, chunks in queues), so its own variables never say where the *consumer* is. Instead each
stage hands on *pieces*: ``(records, events)``, where the events say where the records came
from. The consumer's :class:`Cursor` applies the events of what it has actually taken to a
tracker, so the tracker always describes exactly the consumer's position; ``state_dict()``
applies the piece in hand up to the record last taken, on a copy.

Events are tuples, one per block of records (never one per record):

* ``("open", slot, ordinal, records, offset)``: shard ``ordinal`` of the epoch's shard plan is
  opened into ``slot``, resuming after ``records`` records at stream ``offset``;
* ``("take", slot, count, ended, nbytes)``: the next ``count`` records came from the shard in
  ``slot``, one interleave turn; ``ended``: that shard has no more records; ``nbytes``: their
  bytes in the shard's stream, framing included (:func:`take_event` counts them where the
  records were just made: in the consumer's thread, reading every record's length again
  costs more than decoding them did);
* ``("rounds", order, block_length, rounds, nbytes)``: ``rounds`` whole rounds of the
  interleave cycle, one turn of ``block_length`` records from each slot in ``order`` (the
  open slots, in turn order) per round; ``nbytes[k]``: the stream bytes taken from slot
  ``order[k]``. Deterministic interleaving takes whole rounds at once when every open slot
  has them decoded (one event instead of one per turn: with ``block_length=1``, one per
  record);
* ``("in", events, lengths)`` (shuffle): input records of the given ``lengths``, described by
  the upstream ``events``, went through the shuffle buffer;
* ``("drain", reshuffle)`` (shuffle): the input ended; the buffer (shuffled first when
  ``reshuffle``) is handed on.

A shard's position is ``[ordinal, records, offset]``: records handed on from it, and the byte
offset after them in its uncompressed stream. The offset is only used where it can be trusted
(an uncompressed shard, no skipped corrupt records, no record-level splitting); other shards
resume by reading and dropping their first ``records`` records. The shuffle buffer is kept as
record *locations* ``[ordinal, index, offset, length]``, never as data (in the state, packed
into one string: see :mod:`~streamrec.pipeline.buffer_codec`); resuming fetches those records
again.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from streamrec.errors import StateError
from streamrec.format.framing import OVERHEAD_BYTES
from streamrec.pipeline.buffer_codec import encode_buffer, unpacked_shuffle

__all__ = [
    "STATE_VERSION",
    "Cursor",
    "CycleTracker",
    "Event",
    "rounds_event",
    "take_event",
    "turns",
    "ReadyTracker",
    "ShuffleTracker",
    "Tracker",
    "rng_from_state",
    "rng_state",
]

STATE_VERSION = 2
"""Version 2 packs the shuffle buffer's locations into one string (see buffer_codec); states of
version 1 (the buffer as a list of locations) are still loaded."""
HEADER_AND_CRCS = OVERHEAD_BYTES  # framing around every payload: length, its CRC, payload CRC

Event = tuple[Any, ...]


def take_event(slot: int, records: Sequence[bytes], ended: bool) -> Event:
    """The ``take`` event of ``records``, all from the shard in ``slot``."""
    return (
        "take",
        slot,
        len(records),
        ended,
        sum(map(len, records)) + HEADER_AND_CRCS * len(records),
    )


def rounds_event(
    order: Sequence[int], block_length: int, rounds: int, nbytes: Sequence[int]
) -> Event:
    """The ``rounds`` event of whole rounds of turns over the slots ``order``."""
    return ("rounds", tuple(order), block_length, rounds, tuple(nbytes))


def turns(events: Sequence[Event]) -> Iterator[Event]:
    """``events`` with each ``rounds`` event spelled out as its ``take`` events (whose
    ``nbytes`` are then 0: for consumers that count bytes record by record)."""
    for event in events:
        if event[0] == "rounds":
            _, order, block_length, rounds, _ = event
            for _ in range(rounds):
                for slot in order:
                    yield ("take", slot, block_length, False, 0)
        else:
            yield event


Position = list[Any]  # [ordinal, records, offset]
Location = list[Any]  # [ordinal, index, offset, length]


class Tracker(Protocol):
    """Applies pieces' events; describes the consumer's position."""

    def apply(self, events: Sequence[Event], records: Sequence[bytes], limit: int | None) -> None:
        """Apply the events of the piece ``records`` for its first ``limit`` records (all
        when ``None``)."""

    def copy(self) -> Tracker:
        """An independent copy."""

    def state(self) -> dict[str, Any]:
        """The position, JSON-serialisable."""


class _ReadTracker:
    """Shared part of the trackers of the read stage (which shard each record came from)."""

    kind = ""

    def position(self, slot: int) -> Position:
        raise NotImplementedError

    def open(self, slot: int, ordinal: int, records: int, offset: int | None) -> None:
        raise NotImplementedError

    def end_turn(self, slot: int, ended: bool) -> None:
        raise NotImplementedError

    def copy(self) -> _ReadTracker:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    def partial_turn(self, count: int) -> None:
        """The consumer stopped ``count`` records into a turn."""

    def apply(self, events: Sequence[Event], records: Sequence[bytes], limit: int | None) -> None:
        pos = 0
        for event in events:
            if event[0] == "open":
                self.open(*event[1:])
                continue
            if event[0] == "rounds":
                pos = self._rounds(event, records, pos, limit)
                if pos < 0:
                    return
                continue
            _, slot, count, ended, nbytes = event
            partial = limit is not None and pos + count > limit
            taken = limit - pos if partial else count  # type: ignore[operator]
            if taken:
                position = self.position(slot)
                position[1] += taken
                if partial:
                    nbytes = sum(map(len, records[pos : pos + taken])) + HEADER_AND_CRCS * taken
                position[2] += nbytes
            if partial:
                self.partial_turn(taken)
                return
            self.end_turn(slot, ended)
            pos += count

    def _rounds(self, event: Event, records: Sequence[bytes], pos: int, limit: int | None) -> int:
        """Apply a ``rounds`` event starting at record ``pos`` of the piece; the position
        after it, or -1 when the consumer stopped inside it. The calls are those the same
        records as ``take`` events would make."""
        _, order, block_length, rounds, nbytes = event
        step = len(order) * block_length
        count = rounds * step
        if limit is None or pos + count <= limit:
            for slot, n in zip(order, nbytes, strict=True):
                position = self.position(slot)
                position[1] += rounds * block_length
                position[2] += n
            self.end_turn(order[-1], False)
            return pos + int(count)
        taken = limit - pos
        end = pos + taken
        for k, slot in enumerate(order):
            first = pos + k * block_length
            mine = [records[first + j : end : step] for j in range(block_length)]
            n = sum(map(len, mine))
            if n:
                position = self.position(slot)
                position[1] += n
                position[2] += sum(sum(map(len, m)) for m in mine) + HEADER_AND_CRCS * n
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

    kind = "cycle"

    def __init__(self, cycle_length: int, state: dict[str, Any] | None = None) -> None:
        self.cycle_length = cycle_length
        self.next = 0  # ordinal of the next shard to open
        self.index = 0  # the slot whose turn it is
        self.within = 0  # records already taken in this turn
        self.slots: list[Position | None] = [None] * cycle_length
        if state is not None:
            _expect(state, "kind", self.kind)
            self.next, self.index, self.within = state["next"], state["index"], state["within"]
            slots = state["slots"]
            if len(slots) != cycle_length:
                raise StateError(f"state has {len(slots)} interleave slots, not {cycle_length}")
            self.slots = [list(s) if s is not None else None for s in slots]

    def position(self, slot: int) -> Position:
        position = self.slots[slot]
        assert position is not None, "records from an empty slot"
        return position

    def open(self, slot: int, ordinal: int, records: int, offset: int | None) -> None:
        self.slots[slot] = [ordinal, records, offset]
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
        other.slots = [list(s) if s is not None else None for s in self.slots]
        return other

    def state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "next": self.next,
            "index": self.index,
            "within": self.within,
            "slots": [list(s) if s is not None else None for s in self.slots],
        }


class ReadyTracker(_ReadTracker):
    """Position in first-ready reading: which shards are finished, where the open ones are.

    Shards the pipeline opened but the consumer has not taken a record from are neither: they
    are read again from their start after a resume, so each record comes exactly once.
    """

    kind = "ready"

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        self.open_shards: dict[int, Position] = {}
        self.done: set[int] = set()
        if state is not None:
            _expect(state, "kind", self.kind)
            self.open_shards = {int(p[0]): list(p) for p in state["open"]}
            self.done = set(state["done"])

    def position(self, slot: int) -> Position:
        position = self.open_shards.get(slot)
        if position is None:
            position = self.open_shards[slot] = [slot, 0, 0]
        return position

    def open(self, slot: int, ordinal: int, records: int, offset: int | None) -> None:
        self.open_shards[ordinal] = [ordinal, records, offset]

    def end_turn(self, slot: int, ended: bool) -> None:
        if ended:
            self.open_shards.pop(slot, None)
            self.done.add(slot)

    def copy(self) -> ReadyTracker:
        other = copy.copy(self)
        other.open_shards = {k: list(v) for k, v in self.open_shards.items()}
        other.done = set(self.done)
        return other

    def state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "open": [list(self.open_shards[k]) for k in sorted(self.open_shards)],
            "done": sorted(self.done),
        }


class ShuffleTracker:
    """Mirror of the shuffle buffer over record locations, driven by the same generator."""

    def __init__(
        self,
        upstream: _ReadTracker,
        buffer_size: int,
        rng: random.Random,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.upstream = upstream
        self.buffer_size = buffer_size
        self.rng = rng
        self.buffer: list[Location] = []
        self.draining = False
        if state is not None:
            unpacked = unpacked_shuffle(state)
            assert unpacked is not None
            self.buffer = [list(loc) for loc in unpacked["buffer"]]
            self.draining = bool(state["draining"])
            self.rng.setstate(rng_from_state(state["rng"]))

    def apply(self, events: Sequence[Event], records: Sequence[bytes], limit: int | None) -> None:
        produced = 0
        for event in events:
            if event[0] == "in":
                produced = self._inputs(event[1], event[2], produced, limit)
                if produced < 0:
                    return
            else:  # ("drain", reshuffle)
                if event[1]:
                    self.rng.shuffle(self.buffer)
                self.draining = True
                del self.buffer[: len(self.buffer) if limit is None else limit - produced]

    def _inputs(
        self, events: Sequence[Event], lengths: Sequence[int], produced: int, limit: int | None
    ) -> int:
        """Push input records through the mirror; -1 once ``limit`` outputs are reached."""
        upstream, buffer, size, pick = self.upstream, self.buffer, self.buffer_size, self.rng
        li = 0
        for event in turns(events):
            if event[0] == "open":
                upstream.open(*event[1:])
                continue
            _, slot, count, ended, _ = event
            position = upstream.position(slot) if count else None
            for taken in range(count):
                if len(buffer) >= size and limit is not None and produced >= limit:
                    upstream.partial_turn(taken)
                    return -1
                assert position is not None
                length = lengths[li]
                li += 1
                location = [position[0], position[1], position[2], length]
                position[1] += 1
                position[2] += length + HEADER_AND_CRCS
                if len(buffer) < size:
                    buffer.append(location)
                else:
                    buffer[pick.randrange(size)] = location
                    produced += 1
            upstream.end_turn(slot, ended)
        return produced

    def copy(self) -> ShuffleTracker:
        other = copy.copy(self)
        other.upstream = self.upstream.copy()
        other.buffer = [list(loc) for loc in self.buffer]
        other.rng = random.Random()
        other.rng.setstate(self.rng.getstate())
        return other

    def state(self) -> dict[str, Any]:
        return {
            "upstream": self.upstream.state(),
            "buffer": encode_buffer(self.buffer),
            "rng": rng_state(self.rng),
            "draining": self.draining,
        }


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
        self._it: Any = None
        self._settled = 0  # records of the pieces consumed before the one in hand

    def take(self, records: Sequence[bytes], events: Sequence[Event], it: Any = None) -> None:
        self.settle()
        self._records, self._events, self._it = records, events, it

    def settle(self) -> None:
        """The piece in hand is fully consumed."""
        if self._events:
            self.tracker.apply(self._events, self._records, None)
        self._settled += len(self._records)
        self._records, self._events, self._it = (), (), None

    def handed_out(self) -> int:
        """Records handed to the consumer so far (the one last handed out included)."""
        in_hand = len(self._records)
        if self._it is not None:
            in_hand -= self._it.__length_hint__()
        return self._settled + in_hand

    def state(self) -> dict[str, Any]:
        """The position after the record last handed out."""
        tracker = self.tracker.copy()
        if self._events:
            limit = None
            if self._it is not None:
                limit = len(self._records) - self._it.__length_hint__()
            tracker.apply(self._events, self._records, limit)
        return tracker.state()


def rng_state(rng: random.Random) -> list[Any]:
    """``rng``'s state as JSON-friendly lists."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def rng_from_state(state: Sequence[Any]) -> tuple[Any, ...]:
    """The argument for ``Random.setstate`` from :func:`rng_state`'s output."""
    try:
        version, internal, gauss = state
        return (version, tuple(int(x) for x in internal), gauss)
    except (TypeError, ValueError) as exc:
        raise StateError(f"bad shuffle generator state in the resume state: {exc}") from None


def _expect(state: dict[str, Any], key: str, value: object) -> None:
    if state.get(key) != value:
        raise StateError(f"resume state has {key}={state.get(key)!r}, expected {value!r}")
