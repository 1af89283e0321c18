"""Interleaving shards: tf.data's deterministic order, or first-ready.

Both take ``open_shard(shard) -> async generator of record chunks`` and hand on chunks.

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
from typing import TypeVar

__all__ = ["interleave_deterministic", "interleave_first_ready"]

S = TypeVar("S")
Chunks = AsyncGenerator[list[bytes], None]
# Interleaving small blocks makes small lists; hand them on in batches of about this many.
_OUTPUT_RECORDS = 1024


class _Slot:
    """One open shard in the cycle: its chunk stream and the unread part of its chunk."""

    def __init__(self, chunks: Chunks) -> None:
        self.chunks = chunks
        self.buf: list[bytes] = []
        self.pos = 0
        self.done = False

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


async def interleave_deterministic(
    shards: Sequence[S],
    open_shard: Callable[[S], Chunks],
    cycle_length: int,
    block_length: int,
) -> Chunks:
    """Chunks of records in tf.data's ``interleave(cycle_length, block_length)`` order."""
    slots: list[_Slot | None] = [None] * cycle_length
    inputs = iter(shards)
    end_of_input = False
    num_open = 0
    index = 0
    out: list[bytes] = []
    try:
        while not end_of_input or num_open > 0:
            slot = slots[index]
            if slot is not None:
                out += await slot.take(block_length)
                if slot.done:
                    await slot.chunks.aclose()
                    slots[index] = None
                    num_open -= 1
                index = (index + 1) % cycle_length
                if len(out) >= _OUTPUT_RECORDS:
                    yield out
                    out = []
            elif not end_of_input:
                shard = next(inputs, None)
                if shard is None:
                    end_of_input = True
                else:
                    slots[index] = _Slot(open_shard(shard))
                    num_open += 1
            else:
                index = (index + 1) % cycle_length
        if out:
            yield out
    finally:
        for slot in slots:
            if slot is not None:
                await slot.chunks.aclose()


async def interleave_first_ready(
    shards: Sequence[S],
    open_shard: Callable[[S], Chunks],
    cycle_length: int,
) -> Chunks:
    """Chunks from up to ``cycle_length`` open shards, in the order they are decoded."""
    ready: asyncio.Queue[tuple[int, list[bytes] | None]] = asyncio.Queue(maxsize=cycle_length)
    inputs = iter(enumerate(shards))
    tasks: dict[int, asyncio.Task[None]] = {}

    async def pump(slot: int, shard: S) -> None:
        async with aclosing(open_shard(shard)) as chunks:
            async for chunk in chunks:
                await ready.put((slot, chunk))
        await ready.put((slot, None))

    def start_next() -> None:
        item = next(inputs, None)
        if item is not None:
            tasks[item[0]] = asyncio.ensure_future(pump(*item))

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
            slot, chunk = getter.result()
            getter = None
            if chunk is None:
                await tasks.pop(slot)
                start_next()
            elif chunk:
                yield chunk
    finally:
        if getter is not None:
            getter.cancel()
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
