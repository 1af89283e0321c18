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
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing

from streamrec._portal import cancel_and_wait, owned_generator
from streamrec.format.framing import framed_bytes
from streamrec.pipeline.position.events import Event, Open, Piece, rounds_event, take_event
from streamrec.pipeline.position.state import CycleState

__all__ = ["OpenShard", "Pieces", "interleave_deterministic", "interleave_first_ready"]

Chunks = AsyncGenerator[list[bytes], None]
Pieces = AsyncGenerator[Piece, None]
# open_shard(ordinal, records, offset): a shard's chunks, resumed after `records` records
OpenShard = Callable[[int, int, "int | None"], Chunks]
# Interleaving small blocks makes small lists; hand them on in batches of about this many.
_OUTPUT_RECORDS = 1024


class _Slot:
    """One open shard in the cycle: its chunk stream and the unread part of its chunk."""

    def __init__(self, chunks: Chunks) -> None:
        self.chunks = chunks
        self.buf: list[bytes] = []
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


@owned_generator
async def interleave_first_ready(
    jobs: Sequence[tuple[int, int, int | None]],
    open_shard: OpenShard,
    cycle_length: int,
) -> Pieces:
    """Pieces from up to ``cycle_length`` open shards, in the order they are decoded.

    ``jobs`` are ``(ordinal, records, offset)``: the shards to read and where to resume each.
    """
    # Each open shard has at most one chunk decoded and not yet handed on: its pump waits
    # until that chunk is taken before it asks its shard for the next one (whose reader then
    # gives back the first one's bytes: ObjectReader.settle). A queue of decoded chunks, and
    # one more chunk in each pump's hands, would wait outside the prefetch budget.
    ready: asyncio.Queue[tuple[int, list[bytes] | None]] = asyncio.Queue()
    taken: dict[int, asyncio.Event] = {}  # of the open shards
    inputs = iter(jobs)
    tasks: dict[int, asyncio.Task[None]] = {}

    closing = False

    async def pump(ordinal: int, records: int, offset: int | None) -> None:
        async with aclosing(open_shard(ordinal, records, offset)) as chunks:
            async for chunk in chunks:
                if closing:  # a cancellation some library swallowed must not leave us here
                    return
                taken[ordinal].clear()
                ready.put_nowait((ordinal, chunk))
                await taken[ordinal].wait()
        ready.put_nowait((ordinal, None))

    def start_next() -> None:
        job = next(inputs, None)
        if job is not None:
            taken[job[0]] = asyncio.Event()
            tasks[job[0]] = asyncio.ensure_future(pump(*job))

    try:
        for _ in range(cycle_length):
            start_next()
        getter: asyncio.Task[tuple[int, list[bytes] | None]] | None = None
        while tasks:
            if getter is None:
                getter = asyncio.ensure_future(ready.get())
            # Wake on a chunk, or on a pump that failed: its error must surface, not hang.
            running = [task for task in tasks.values() if not task.done()]
            await asyncio.wait([getter, *running], return_when=asyncio.FIRST_COMPLETED)
            for task in tasks.values():
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            if not getter.done():
                continue
            ordinal, chunk = getter.result()
            getter = None
            taken[ordinal].set()
            if chunk is None:
                await tasks.pop(ordinal)
                del taken[ordinal]
                start_next()
                yield [], [take_event(ordinal, [], True)]
            elif chunk:
                yield chunk, [take_event(ordinal, chunk, False)]
    finally:
        closing = True
        if getter is not None:
            getter.cancel()
        for task in tasks.values():
            task.cancel()
        while not all(task.done() for task in tasks.values()):
            for event in taken.values():  # wake pumps waiting for their chunk to be taken
                event.set()
            running = [task for task in tasks.values() if not task.done()]
            await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        await cancel_and_wait(tasks.values())  # all ended: collects their outcomes
