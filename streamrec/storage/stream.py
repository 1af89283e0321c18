"""A prefetching range reader of one object: concurrent block reads, handed on in order.

Blocks of ``block_bytes`` are requested up to ``max_concurrency`` at a time, each only once the
shared :class:`~streamrec.pipeline.budget.ByteBudget` has room for it, and are handed on in
object order. A block that fails transiently is retried per the :class:`RetryPolicy` from the
exact byte where it stopped: bytes already received are kept, so a short 206 or a body cut off
mid-way costs only the missing part and no byte is repeated or dropped.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from streamrec.errors import RetriesExhaustedError, TransientStorageError
from streamrec.pipeline.budget import ByteBudget
from streamrec.storage.base import ObjectInfo, ObjectStore
from streamrec.storage.retry import RetryPolicy

__all__ = ["ObjectReader"]


class ObjectReader:
    """Async iterator over the blocks of one object, from ``start`` to its end.

    ``prime()`` requests the first blocks without waiting (used to hide the next shard's
    first-byte latency); ``aclose()`` cancels every request in flight and returns its budget.

    Blocks start at ``first_block_bytes`` and double up to ``block_bytes``: the first records
    arrive after one small transfer instead of a full block, and the pipe still fills.
    """

    def __init__(
        self,
        store: ObjectStore,
        obj: ObjectInfo,
        budget: ByteBudget,
        *,
        start: int = 0,
        block_bytes: int = 8 << 20,
        max_concurrency: int = 4,
        first_block_bytes: int = 256 << 10,
        policy: RetryPolicy | None = None,
        on_retry: Callable[[TransientStorageError], None] | None = None,
    ) -> None:
        if block_bytes <= 0 or max_concurrency <= 0:
            raise ValueError("block_bytes and max_concurrency must be positive")
        self.store = store
        self.obj = obj
        self.budget = budget
        self.block_bytes = block_bytes
        self.max_concurrency = max_concurrency
        self.policy = policy or RetryPolicy()
        self._on_retry = on_retry
        self._next = start  # first byte not yet requested
        self._block = min(max(first_block_bytes, 1), block_bytes)  # the next block's size
        self._inflight: deque[tuple[int, asyncio.Task[bytes]]] = deque()  # (length, task)
        self._closed = False

    @property
    def fully_requested(self) -> bool:
        """True once every block has been requested (the next object may start)."""
        return self._next >= self.obj.size

    def prime(self) -> None:
        """Request as many blocks as the budget and the concurrency limit allow, now."""
        while (
            not self._closed
            and len(self._inflight) < self.max_concurrency
            and self._next < self.obj.size
        ):
            length = self._next_length()
            if not self.budget.try_reserve(length):
                return
            self._request(length)

    def _next_length(self) -> int:
        return min(self._block, self.obj.size - self._next)

    def _request(self, length: int) -> None:
        start = self._next
        self._next += length
        self._block = min(self._block * 2, self.block_bytes)
        task = asyncio.ensure_future(self._read_block(start, start + length))
        self._inflight.append((length, task))

    def __aiter__(self) -> ObjectReader:
        return self

    async def __anext__(self) -> bytes:
        if self._closed:
            raise StopAsyncIteration
        self.prime()
        if not self._inflight:
            if self._next >= self.obj.size:
                raise StopAsyncIteration
            length = self._next_length()
            await self.budget.reserve(length)  # other streams hold the budget: wait for them
            self._request(length)
        length, task = self._inflight[0]
        data = await task
        self._inflight.popleft()
        self.budget.release(length)
        self.prime()
        return data

    async def aclose(self) -> None:
        """Cancel what is in flight and give its budget back. Idempotent."""
        self._closed = True
        inflight, self._inflight = self._inflight, deque()
        for _, task in inflight:
            task.cancel()
        if inflight:
            await asyncio.gather(*(task for _, task in inflight), return_exceptions=True)
        for length, _ in inflight:
            self.budget.release(length)

    async def _read_block(self, start: int, end: int) -> bytes:
        """Exactly bytes ``start:end``, resuming after short reads at the exact offset."""
        pieces: list[bytes] = []
        have = 0
        short_reads = 0
        url = self.obj.url
        while start + have < end:
            offset = start + have

            async def attempt(offset: int = offset) -> bytes:
                return await self.store.read_range(self.obj, offset, end)

            data = await self.policy.run(
                attempt, describe=f"{url} bytes {offset}-{end - 1}", on_retry=self._on_retry
            )
            if len(data) > end - offset:
                data = data[: end - offset]  # a server that ignored the range end
            if len(data) < end - offset:
                # s3fs and gcsfs pass such bodies on silently; we keep them and ask for the rest
                short_reads += 1
                error = TransientStorageError(
                    f"{url}: asked for bytes {offset}-{end - 1}, got {len(data)} bytes"
                )
                if short_reads >= self.policy.max_attempts:
                    raise RetriesExhaustedError(
                        f"{url}: the server kept returning short bodies "
                        f"({short_reads} in a row for bytes {start}-{end - 1})"
                    ) from error
                if self._on_retry is not None:
                    self._on_retry(error)
            pieces.append(data)
            have += len(data)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)
