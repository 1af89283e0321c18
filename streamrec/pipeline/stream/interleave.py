"""Interleaving shards: tf.data's deterministic order, or first-ready.

Both take ``open_shard(ordinal, records, offset) -> async generator of record chunks`` and
hand on *pieces* ``(records, events)`` whose events say which shard each run of records came
from (see :mod:`streamrec.pipeline.position.events`), so the consumer's position can be saved
exactly.

* :func:`interleave_deterministic` reproduces ``Dataset.from_tensor_slices(files).interleave(
  TFRecordDataset, cycle_length, block_length)`` exactly: ``cycle_length`` slots visited in turn,
  ``block_length`` records from each; a slot whose shard ends is refilled with the next shard
  the next time the cycle reaches it (empty shards included, as in TensorFlow's
  InterleaveDatasetOp).
* :func:`interleave_first_ready` keeps ``cycle_length`` shards open and hands on whichever chunk
  is decoded first, so one slow shard never stalls the rest; every record still comes exactly
  once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from typing import Generic, TypeVar

from streamrec._portal import cancel_and_wait, owned_generator, run_all
from streamrec.format.framing import Records, framed_bytes
from streamrec.pipeline.position.events import Event, Open, Piece, rounds_event, take_event
from streamrec.pipeline.position.state import CycleState

__all__ = ["OpenShard", "Pieces", "interleave_deterministic", "interleave_first_ready"]

Chunks = AsyncGenerator[Records, None]
Pieces = AsyncGenerator[Piece, None]
# open_shard(ordinal, records, offset): a shard's chunks, resumed after `records` records
OpenShard = Callable[[int, int, "int | None"], Chunks]
# Interleaving small blocks makes small lists; hand them on in batches of about this many.
_OUTPUT_RECORDS = 1024
T = TypeVar("T")


class _Slot:
    """One open shard in the cycle: its chunk stream and the unread part of its chunk."""

    def __init__(self, chunks: Chunks) -> None:
        self.chunks = chunks
        self.buf: Records = []
        self.pos = 0
        self.done = False

    def has(self, n: int) -> bool:
        """True when ``n`` records are decoded already (taking them will not wait)."""
        return self.pos + n <= len(self.buf)

    async def take(self, n: int) -> list[bytes]:
        """Up to ``n`` records; fewer means the shard ended (``done`` is then set)."""
        out: list[bytes] = []
        while len(out) < n:
            if self.pos >= len(self.buf):
                try:
                    self.buf = await self.chunks.__anext__()
                except StopAsyncIteration:
                    self.done = True
                    break
                self.pos = 0
                continue
            k = min(n - len(out), len(self.buf) - self.pos)
            out += self.buf[self.pos : self.pos + k]
            self.pos += k
        return out


@owned_generator
async def interleave_deterministic(
    num_shards: int,
    open_shard: OpenShard,
    cycle_length: int,
    block_length: int,
    start: CycleState | None = None,
    *,
    prefetch: Callable[[int], None] | None = None,
) -> Pieces:
    """Pieces of records in tf.data's ``interleave(cycle_length, block_length)`` order.

    Shards are the ordinals ``0 .. num_shards - 1``; ``open_shard(ordinal, records, offset)``
    opens one, resumed after ``records`` records at stream ``offset``. ``start`` is a
    :class:`~streamrec.pipeline.position.state.CycleState` to continue from. ``prefetch(
    ordinal)`` (optional) starts reading a shard before its turn: the next ``cycle_length``
    shards are kept reading, so that when a generation of shards ends together (equal sizes)
    the next one is already under way instead of opening one round trip at a time.
    Records already decoded are handed on before any wait for more.
    """
    slots: list[_Slot | None] = [None] * cycle_length
    next_input, index, within = 0, 0, 0
    events: list[Event] = []
    if start is not None:
        next_input, index, within = start.next, start.index, start.within
        for number, position in enumerate(start.slots):
            if position is not None:
                ordinal, records, offset = position.ordinal, position.records, position.offset
                slots[number] = _Slot(open_shard(ordinal, records, offset))
                events.append(Open(number, ordinal, records, offset))
    num_open = sum(slot is not None for slot in slots)
    end_of_input = next_input >= num_shards
    out: list[bytes] = []
    prefetched = next_input  # shards below this were opened or prefetched

    def read_ahead() -> None:
        nonlocal prefetched
        if prefetch is not None:
            wanted = min(num_shards, next_input + cycle_length)
            while prefetched < wanted:
                prefetch(prefetched)
                prefetched += 1

    try:
        read_ahead()
        while not end_of_input or num_open > 0:
            slot = slots[index]
            if slot is not None:
                if out and not slot.has(block_length - within):
                    yield out, events  # hand on what is decoded before waiting for more
                    out, events = [], []
                whole = None
                if not within and slot.has(block_length):
                    whole = _whole_rounds(slots, index, block_length, next_input >= num_shards)
                if whole is not None:
                    out += whole[0]
                    events.append(whole[1])
                    if len(out) >= _OUTPUT_RECORDS:
                        yield out, events
                        out, events = [], []
                    continue
                taken = await slot.take(block_length - within)
                within = 0
                out += taken
                events.append(take_event(index, taken, slot.done))
                if slot.done:
                    await slot.chunks.aclose()
                    slots[index] = None
                    num_open -= 1
                index = (index + 1) % cycle_length
                if len(out) >= _OUTPUT_RECORDS:
                    yield out, events
                    out, events = [], []
            elif not end_of_input:
                if next_input >= num_shards:
                    end_of_input = True
                else:
                    slots[index] = _Slot(open_shard(next_input, 0, 0))
                    events.append(Open(index, next_input, 0, 0))
                    next_input += 1
                    num_open += 1
                    read_ahead()
            else:
                index = (index + 1) % cycle_length
        if out or events:
            yield out, events
    finally:
        for slot in slots:
            if slot is not None:
                await slot.chunks.aclose()


def _whole_rounds(
    slots: Sequence[_Slot | None], first: int, block_length: int, inputs_done: bool
) -> tuple[list[bytes], Event] | None:
    """As many whole rounds of the cycle (turns from slot ``first`` on) as every open slot has
    decoded already: the records in interleave order and their ``rounds`` event. ``None``
    when not one round is (a slot must wait for records, or open a shard on its turn)."""
    if not inputs_done and None in slots:
        return None
    cycle = len(slots)
    turns = [(n, s) for k in range(cycle) if (s := slots[n := (first + k) % cycle]) is not None]
    rounds = min((len(s.buf) - s.pos) // block_length for _, s in turns)
    if not rounds:
        return None
    step, count = len(turns) * block_length, rounds * block_length
    merged: list[bytes] = [b""] * (rounds * step)
    nbytes: list[int] = []
    for k, (_, slot) in enumerate(turns):
        part = slot.buf[slot.pos : slot.pos + count]
        slot.pos += count
        # slot k's j-th record of round r goes to r * step + k * block_length + j
        for j in range(block_length):
            merged[k * block_length + j :: step] = part[j::block_length]
        nbytes.append(framed_bytes(part))
    order = [n for n, _ in turns]
    return merged, rounds_event(order, block_length, rounds, nbytes)


class _ChannelClosed(Exception):
    """Sending on a channel its receiver closed (it stopped reading)."""


class _Channel(Generic[T]):
    """A channel without a buffer (trio's ``open_memory_channel(0)``) from a task group's
    senders to one receiver: ``send`` returns once the receiver has taken the item, so each
    sender holds at most one item not yet taken and nothing piles up between them.

    ``close(error)``: the senders' group ended (``None``: ``receive`` ends the iteration) or
    failed (``receive`` raises its error at once, not after the items still offered). Every
    ``send`` waiting or to come then raises :class:`_ChannelClosed`: a receiver that stops
    closes it too, so that even a sender that swallowed its cancellation stops there."""

    def __init__(self) -> None:
        self._senders: deque[tuple[T, asyncio.Future[None]]] = deque()
        self._wake: asyncio.Future[None] | None = None  # the receiver waiting for a sender
        self._closed = False
        self._error: BaseException | None = None

    async def send(self, item: T) -> None:
        if self._closed:
            raise _ChannelClosed
        taken = asyncio.get_running_loop().create_future()
        self._senders.append((item, taken))
        self._notify()
        await taken  # cancelled while waiting: the receiver skips the item

    def close(self, error: BaseException | None = None) -> None:
        if self._closed:
            return
        self._closed, self._error = True, error
        for _, taken in self._senders:
            if not taken.done():
                taken.set_exception(_ChannelClosed())
        self._senders.clear()
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def receive(self) -> T:
        """The next item sent; StopAsyncIteration once closed (or its error)."""
        while True:
            if self._error is not None:
                raise self._error
            while self._senders:
                item, taken = self._senders.popleft()
                if not taken.done():
                    taken.set_result(None)
                    return item
            if self._closed:
                raise StopAsyncIteration
            self._wake = asyncio.get_running_loop().create_future()
            try:
                await self._wake
            finally:
                self._wake = None


@owned_generator
async def interleave_first_ready(
    jobs: Sequence[tuple[int, int, int | None]],
    open_shard: OpenShard,
    cycle_length: int,
) -> Pieces:
    """Pieces from up to ``cycle_length`` open shards, in the order they are decoded.

    ``jobs`` are ``(ordinal, records, offset)``: the shards to read and where to resume each.
    """
    # One lane per open shard, in a task group (run_all) feeding a channel without a buffer:
    # a lane asks its shard for the next chunk only once the last one is taken (whose reader
    # then gives back the first one's bytes: ObjectReader.settle). A queue of decoded chunks,
    # and one more chunk in each lane's hands, would wait outside the prefetch budget.
    channel: _Channel[tuple[int, Records | None]] = _Channel()
    inputs = iter(jobs)  # shared: a lane whose shard ends takes the next job

    async def lane() -> None:
        for ordinal, records, offset in inputs:
            async with aclosing(open_shard(ordinal, records, offset)) as chunks:
                async for chunk in chunks:
                    await channel.send((ordinal, chunk))
            await channel.send((ordinal, None))  # its end: the next job starts once taken

    async def lanes() -> None:
        try:
            await run_all(lane() for _ in range(min(cycle_length, len(jobs))))
        except BaseException as exc:  # the first lane's error, raised to the consumer
            channel.close(exc)
            raise
        channel.close()

    group = asyncio.ensure_future(lanes())
    try:
        while True:
            try:
                ordinal, chunk = await channel.receive()
            except StopAsyncIteration:
                break
            if chunk is None:
                yield [], [take_event(ordinal, [], True)]
            elif chunk:
                yield chunk, [take_event(ordinal, chunk, False)]
    finally:
        channel.close()  # a lane that swallowed its cancellation stops at its next send
        await cancel_and_wait([group])
