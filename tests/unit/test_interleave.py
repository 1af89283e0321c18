"""First-ready interleaving (its task group and channel) on made-up shards: every record once,
at most one chunk per open shard taken ahead, errors raised, nothing left running on close."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from contextlib import aclosing

import pytest

from streamrec.pipeline.position.events import Take
from streamrec.pipeline.stream.interleave import interleave_first_ready


class Shards:
    """Shard ``n`` has ``sizes[n]`` chunks of 2 records; what was asked and closed is kept.
    ``fail`` names a shard whose chunk of that number raises; ``gate`` holds every chunk of
    the shards it names until set."""

    def __init__(self, sizes: list[int], fail: tuple[int, int] | None = None) -> None:
        self.sizes = sizes
        self.fail = fail
        self.asked: dict[int, int] = {}  # shard -> chunks asked for (and begun)
        self.open: set[int] = set()
        self.gate: dict[int, asyncio.Event] = {}

    async def open_shard(
        self, ordinal: int, records: int, offset: int | None
    ) -> AsyncGenerator[list[bytes], None]:
        self.open.add(ordinal)
        try:
            for k in range(self.sizes[ordinal]):
                self.asked[ordinal] = k + 1
                if ordinal in self.gate:
                    await self.gate[ordinal].wait()
                await asyncio.sleep(0)
                if self.fail == (ordinal, k):
                    raise OSError(f"shard {ordinal} chunk {k} failed")
                yield [f"{ordinal}:{k}:{j}".encode() for j in range(2)]
        finally:
            self.open.discard(ordinal)


def jobs(n: int) -> list[tuple[int, int, int | None]]:
    return [(ordinal, 0, 0) for ordinal in range(n)]


async def test_every_record_once_and_each_shard_ends_once() -> None:
    shards = Shards([3, 0, 2, 5, 1])
    records: list[bytes] = []
    ended: list[int] = []
    async with aclosing(interleave_first_ready(jobs(5), shards.open_shard, 2)) as pieces:
        async for chunk, events in pieces:
            records += chunk
            ended += [e.slot for e in events if isinstance(e, Take) and e.ended]
    sizes = enumerate(shards.sizes)
    expected = [f"{s}:{k}:{j}".encode() for s, n in sizes for k in range(n) for j in range(2)]
    assert sorted(records) == sorted(expected)
    assert sorted(ended) == [0, 1, 2, 3, 4]
    assert not shards.open


async def test_a_shard_is_asked_for_its_next_chunk_only_once_the_last_is_taken() -> None:
    shards = Shards([4, 4, 4])
    async with aclosing(interleave_first_ready(jobs(3), shards.open_shard, 2)) as pieces:
        first, _ = await pieces.__anext__()
        for _ in range(10):  # every lane runs as far as it can
            await asyncio.sleep(0)
        # shards 0 and 1 open (cycle_length 2); the one whose chunk was taken has asked for
        # its second, the other still holds its first: nothing piles up beyond one each
        assert sorted(shards.asked.values()) == [1, 2]
        assert 2 not in shards.asked
        assert first
    assert not shards.open


async def test_a_failing_shard_raises_and_closes_the_others() -> None:
    shards = Shards([5, 5, 5], fail=(1, 2))
    shards.gate[2] = asyncio.Event()  # shard 2 waits: it must be closed, not left waiting
    with pytest.raises(OSError, match="shard 1 chunk 2 failed"):
        async with aclosing(interleave_first_ready(jobs(3), shards.open_shard, 3)) as pieces:
            async for _ in pieces:
                pass
    assert not shards.open


async def test_a_consumer_that_stops_early_leaves_nothing_running() -> None:
    shards = Shards([50, 50, 50])
    before = asyncio.all_tasks()
    async with aclosing(interleave_first_ready(jobs(3), shards.open_shard, 3)) as pieces:
        async for _ in pieces:
            break
    assert not shards.open
    assert asyncio.all_tasks() == before


async def test_a_shard_that_swallows_its_cancellation_still_ends() -> None:
    closed = asyncio.Event()

    async def stubborn(
        ordinal: int, records: int, offset: int | None
    ) -> AsyncGenerator[list[bytes], None]:
        try:
            for k in range(1000):
                with contextlib.suppress(asyncio.CancelledError):  # as some libraries do
                    await asyncio.sleep(0)
                yield [f"{ordinal}:{k}".encode()]
        finally:
            closed.set()

    async with aclosing(interleave_first_ready(jobs(2), stubborn, 2)) as pieces:
        await pieces.__anext__()
    assert closed.is_set()
