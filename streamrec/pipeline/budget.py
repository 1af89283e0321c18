"""The prefetch budget: a hard bound on bytes read ahead, shared by every stream of a dataset."""

from __future__ import annotations

import asyncio

__all__ = ["ByteBudget"]


class ByteBudget:
    """Bytes fetched (or being fetched) and not yet handed to the consumer.

    A stream reserves a block's bytes before requesting it and releases them when it hands the
    block on. The total never exceeds ``limit``, except that one reservation is always granted
    when nothing is reserved, so a block larger than the whole budget still makes progress
    (the bound is therefore ``limit`` plus at most one block).
    """

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"the prefetch budget must be positive, not {limit}")
        self.limit = limit
        self.reserved = 0
        self.peak = 0
        self._released = asyncio.Event()

    def try_reserve(self, n: int) -> bool:
        """Reserve ``n`` bytes if that fits now; never waits."""
        if self.reserved and self.reserved + n > self.limit:
            return False
        self.reserved += n
        self.peak = max(self.peak, self.reserved)
        return True

    async def reserve(self, n: int) -> None:
        """Reserve ``n`` bytes, waiting for other streams to hand bytes on if needed."""
        while not self.try_reserve(n):
            self._released.clear()
            await self._released.wait()

    def release(self, n: int) -> None:
        """Give back ``n`` reserved bytes."""
        self.reserved -= n
        assert self.reserved >= 0, "released more than reserved"
        self._released.set()
