"""What the read pipeline says about the records it hands on: typed events, one per block.

The pipeline runs ahead of its consumer, so its own variables never say where the *consumer*
is. Instead each stage hands on *pieces* ``(records, events)``, where the events say where the
records came from; the consumer's :class:`~streamrec.pipeline.position.trackers.Cursor` applies the
events of what it has taken (see :mod:`streamrec.pipeline.position.trackers`). Events are made per
block of records, never per record.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

from streamrec.format.framing import framed_bytes

__all__ = [
    "Advance",
    "Begin",
    "Drain",
    "Event",
    "Open",
    "Piece",
    "Rounds",
    "ShuffleIn",
    "Take",
    "rounds_event",
    "take_event",
    "turns",
]


class Open(NamedTuple):
    """Shard ``ordinal`` of the epoch's shard plan is opened into ``slot``, resuming after
    ``records`` records at (uncompressed) stream ``offset``."""

    slot: int
    ordinal: int
    records: int
    offset: int


class Take(NamedTuple):
    """The next ``records`` records came from the shard in ``slot``: one interleave turn.
    ``ended``: that shard has no more records; ``nbytes``: their bytes in the shard's stream,
    framing included."""

    slot: int
    records: int
    ended: bool
    nbytes: int


class Rounds(NamedTuple):
    """``rounds`` whole rounds of the interleave cycle: one turn of ``block_length`` records
    from each slot in ``order`` (the open slots, in turn order) per round; ``nbytes[k]``: the
    stream bytes taken from slot ``order[k]``. Deterministic interleaving takes whole rounds
    at once when every open slot has them decoded (one event instead of one per turn)."""

    order: tuple[int, ...]
    block_length: int
    rounds: int
    nbytes: tuple[int, ...]


class ShuffleIn(NamedTuple):
    """Input records of the given ``lengths``, described by the upstream ``events``, went
    through the shuffle buffer."""

    events: Sequence[Event]
    lengths: Sequence[int]


class Drain(NamedTuple):
    """The shuffle's input ended; its buffer (shuffled first when ``reshuffle``) is handed on."""

    reshuffle: bool


class Begin(NamedTuple):
    """Indexed reading starts: this consumer (``consumer`` of ``consumers``) reads its part of
    the positions ``remaining`` of an epoch of ``records`` records, after the first ``taken``
    (see :mod:`streamrec.pipeline.order`)."""

    records: int
    consumers: int
    consumer: int
    remaining: tuple[tuple[int, int], ...]
    taken: int


class Advance(NamedTuple):
    """Indexed reading: the next ``records`` positions of the consumer's part."""

    records: int


Event = Open | Take | Rounds | ShuffleIn | Drain | Begin | Advance
Piece = tuple[Sequence[bytes], list[Event]]


def take_event(slot: int, records: Sequence[bytes], ended: bool) -> Take:
    """The :class:`Take` event of ``records``, all from the shard in ``slot``. (Counted where
    the records were just made: in the consumer's thread, reading every record's length again
    costs more than decoding them did.)"""
    return Take(slot, len(records), ended, framed_bytes(records))


def rounds_event(
    order: Sequence[int], block_length: int, rounds: int, nbytes: Sequence[int]
) -> Rounds:
    """The :class:`Rounds` event of whole rounds of turns over the slots ``order``."""
    return Rounds(tuple(order), block_length, rounds, tuple(nbytes))


def turns(events: Sequence[Event]) -> Iterator[Event]:
    """``events`` with each :class:`Rounds` event spelled out as its :class:`Take` events
    (whose ``nbytes`` are then 0: for consumers that count bytes record by record)."""
    for event in events:
        if type(event) is Rounds:
            for _ in range(event.rounds):
                for slot in event.order:
                    yield Take(slot, event.block_length, False, 0)
        else:
            yield event
