"""``az://`` sink: a block blob staged while the bytes arrive, committed in one step.

The Azure counterpart of S3's multipart upload. Bytes are cut into blocks of exactly
``part_bytes`` (the context's when the sink opens; the last one may be shorter); each block is
sent by its own task as soon as it is full (``Put Block``), within the writer's upload window
(``write()`` waits for room: that bounds memory). ``commit()`` sends the block
list (``Put Block List``): the blob appears, complete, in that one request. A blob no bigger
than one block is a single ``Put Blob`` instead.

Staged blocks are invisible: readers and listings see the old blob (or none) until the commit.
``abort()`` cancels the block uploads and leaves what was staged uncommitted; Azure has no call
that discards uncommitted blocks (a later commit of the same blob does, and the service drops
them 7 days after the last one was staged), so nothing visible remains
(:meth:`~streamrec.storage.azure.store.AzureStore.unfinished_writes` lists such blobs, ``streamrec
cleanup`` deletes them).

Block ids are the block number and a per-sink random tag, all of one length (Azure
requires that within a blob): two writers of one blob never commit each other's blocks.
Every request (each block, the block list, the single put) is one attempt with the SDK's
retries off, retried by streamrec's :class:`RetryPolicy` alone. Committing the same block list
twice is harmless (``Latest`` finds the blocks committed), so a commit whose answer was lost
is simply retried.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from streamrec._portal import cancel_and_wait, run_all
from streamrec.storage.sink_base import ObjectSink, PartBuffer, SinkContext
from streamrec.storage.translate import translate

__all__ = ["AzureBlockSink"]

NO_RETRIES: dict[str, Any] = {"retry_total": 0}


class AzureBlockSink(ObjectSink):
    """One block blob, staged in blocks while it is written; it appears on commit only."""

    def __init__(
        self,
        blob_client: Callable[[str], Any],
        url: str,
        container: str,
        blob: str,
        context: SinkContext | None = None,
    ) -> None:
        """``blob_client(url)``: the SDK's ``BlobClient`` of the blob (its store's, with the
        SDK's retries off); ``container`` and ``blob``: the url's parts."""
        super().__init__(url, context)
        self._blob_client = blob_client
        self.container, self.blob = container, blob
        self._tag = uuid.uuid4().hex[:17]
        self._buffer = PartBuffer()
        self._blocks: list[asyncio.Task[str]] = []  # block i -> its id, once staged
        self._put: asyncio.Task[None] | None = None  # the single Put Blob of a small blob

    # -- requests ---------------------------------------------------------------------------
    async def _call(self, action: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """One request through the retry policy; errors translated, with the url."""

        async def attempt() -> Any:
            client = self._blob_client(self.url)
            try:
                return await getattr(client, method)(*args, **kwargs, **NO_RETRIES)
            except Exception as exc:
                raise translate(exc, self.url, action) from exc

        return await self.context.retry.run(attempt, describe=f"{self.url}: {action}")

    def _block_id(self, number: int) -> str:
        # 24 characters (the SDK sends them base64-encoded, 32 without padding); the number
        # first, so a block can be told by its id
        return f"{number:06d}-{self._tag}"

    async def _stage(self, number: int, data: bytes) -> str:
        block_id = self._block_id(number)
        start = time.perf_counter()
        await self._call(
            f"staging block {number} ({len(data)} bytes)",
            "stage_block",
            block_id,
            data,
            length=len(data),
        )
        self.context.uploaded(len(data), time.perf_counter() - start)
        return block_id

    async def _put_blob(self, data: bytes) -> None:
        response = await self._call(
            f"uploading {len(data)} bytes", "upload_blob", data, length=len(data), overwrite=True
        )
        self.version = _etag(response)

    # -- the data path --------------------------------------------------------------------
    async def _write(self, data: bytes) -> None:
        self.context.raise_failure()
        self._buffer.append(data)
        size = self.part_bytes
        while len(self._buffer) > size:  # a blob of exactly one block stays a single put
            # Wait for upload room first: meanwhile the bytes wait in the buffer, not in yet
            # another copy (memory: the window's room in flight + this buffer).
            await self.context.window.acquire(size)
            self._launch_block(self._cut(size))

    def _cut(self, size: int) -> bytes:
        return self._buffer.take(size)  # one copy, of exactly its size

    def _launch_block(self, data: bytes) -> None:
        window = self.context.window
        task = asyncio.ensure_future(self._stage(len(self._blocks), data))
        task.add_done_callback(lambda _: window.release(len(data)))
        self.context.track(task)
        self._blocks.append(task)

    async def _seal(self) -> None:
        window = self.context.window
        size = len(self._buffer)
        if not self._blocks:
            await window.acquire(size)
            self._put = asyncio.ensure_future(self._put_blob(self._cut(size)))
            self._put.add_done_callback(lambda _: window.release(size))
            self.context.track(self._put)
        elif self._buffer:
            await window.acquire(size)
            self._launch_block(self._cut(size))
        self._buffer.clear()

    async def _commit(self) -> None:
        if self._put is not None:
            await self._put
            return
        from azure.storage.blob import BlobBlock

        ids = await run_all(self._blocks)
        response = await self._call(
            f"committing the list of {len(ids)} blocks",
            "commit_block_list",
            [BlobBlock(block_id) for block_id in ids],
        )
        self.version = _etag(response)

    async def _abort(self) -> None:
        # Staged blocks stay uncommitted: invisible, discarded by the service (see above).
        await cancel_and_wait(t for t in (self._put, *self._blocks) if t is not None)
        self._buffer.clear()


def _etag(response: Any) -> str | None:
    """The ETag of the blob a response describes (as a read answers it), if it says."""
    etag = response.get("etag") if isinstance(response, dict) else None
    return str(etag) if etag else None
