"""``s3://`` sink: a multipart upload that runs while the bytes arrive.

Bytes are cut into parts of exactly ``part_bytes`` (the context's when the sink opens; the last
one may be shorter); each part is uploaded by its own task as soon as it is full, within the
writer's upload window (``write()`` waits for room: that bounds memory). The
multipart upload is created with the first part and completed by ``commit()``; an object no
bigger than one part is a single ``PutObject`` instead. ``abort()`` cancels the part uploads and
aborts the multipart upload, so neither an object nor an orphaned upload (with its stored parts)
is left behind.

Requests go to s3fs's aiobotocore client directly, with botocore's retries off: every request
(create, each part, complete, abort) is retried by streamrec's :class:`RetryPolicy` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time
from typing import TYPE_CHECKING, Any

from streamrec._portal import cancel_and_wait, run_all
from streamrec.errors import ObjectNotFoundError, StorageError
from streamrec.storage.sink_base import ObjectSink, PartBuffer, SinkContext, bucket_and_key
from streamrec.storage.translate import translate

if TYPE_CHECKING:
    from streamrec.storage.s3.store import S3Store

__all__ = ["S3MultipartSink"]

logger = logging.getLogger("streamrec")


class _Body(io.BytesIO):
    """A request body that owns its bytes and survives being sent.

    botocore turns a ``bytes`` Body into ``io.BytesIO(body)``, which shares the bytes until
    aiohttp calls ``getbuffer()`` on it: that copies them, doubling the memory of every part in
    flight. A BytesIO that owns its buffer from the start is sent without a copy. aiohttp also
    closes a BytesIO body once sent; a retry sends this one again, so ``close()`` does nothing.
    """

    def __init__(self, buffer: PartBuffer, size: int) -> None:
        super().__init__()
        self.size = buffer.take_into(size, self)

    def close(self) -> None:
        pass


class S3MultipartSink(ObjectSink):
    """One S3 object, uploaded in parts while it is written; it appears on commit only."""

    def __init__(self, store: S3Store, url: str, context: SinkContext | None = None) -> None:
        super().__init__(url, context)
        self._store = store
        self.bucket, self.key = bucket_and_key(store.fs, url, "an S3 object url")
        self._buffer = PartBuffer()
        self._create: asyncio.Task[str] | None = None  # CreateMultipartUpload -> UploadId
        self._parts: list[asyncio.Task[str]] = []  # part i+1 -> its ETag
        self._put: asyncio.Task[None] | None = None  # the single PutObject of a small object
        self.upload_id: str | None = None

    # -- requests ---------------------------------------------------------------------------
    async def _call(
        self, action: str, method: str, body: _Body | None = None, **kwargs: Any
    ) -> Any:
        """One request through the retry policy; errors translated, with the url."""

        async def attempt() -> Any:
            client = await self._store.client()
            if body is not None:
                body.seek(0)  # a retry sends the whole body again
                kwargs["Body"] = body
            try:
                # (requester pays, SSE-C...: what the caller asked every request to carry)
                extra = self._store.request_params(client, method)
                return await getattr(client, method)(
                    Bucket=self.bucket, Key=self.key, **{**extra, **kwargs}
                )
            except Exception as exc:
                raise translate(exc, self.url, action) from exc

        return await self.context.retry.run(attempt, describe=f"{self.url}: {action}")

    async def _create_upload(self) -> str:
        start = time.perf_counter()
        response = await self._call("creating the multipart upload", "create_multipart_upload")
        self.context.controlled(time.perf_counter() - start)
        upload_id: str = response["UploadId"]
        self.upload_id = upload_id
        return upload_id

    async def _upload_part(self, number: int, body: _Body) -> str:
        assert self._create is not None
        # shielded: cancelling this part must not cancel the creation, which abort() awaits
        # to learn the UploadId of an upload the server may already have created
        upload_id = await asyncio.shield(self._create)
        start = time.perf_counter()
        response = await self._call(
            f"uploading part {number} ({body.size} bytes)",
            "upload_part",
            body,
            UploadId=upload_id,
            PartNumber=number,
        )
        self.context.uploaded(body.size, time.perf_counter() - start)
        etag: str = response["ETag"]
        return etag

    async def _put_object(self, body: _Body) -> None:
        response = await self._call(f"uploading {body.size} bytes", "put_object", body)
        self.version = _etag(response)

    # -- the data path --------------------------------------------------------------------
    async def _write(self, data: bytes) -> None:
        self.context.raise_failure()
        self._buffer.append(data)
        size = self.part_bytes
        while len(self._buffer) > size:  # an object of exactly one part stays a single PUT
            # Wait for upload room first: meanwhile the bytes wait in the buffer, not in yet
            # another copy (memory: the window's room in flight + this buffer).
            await self._reserve(size)
            self._launch_part(self._cut(size))

    def _cut(self, size: int) -> _Body:
        return _Body(self._buffer, size)

    async def _reserve(self, nbytes: int) -> None:
        if self._create is None:
            self._create = asyncio.ensure_future(self._create_upload())
            self.context.track(self._create)
        await self.context.window.acquire(nbytes)

    def _launch_part(self, body: _Body) -> None:
        window = self.context.window
        task = asyncio.ensure_future(self._upload_part(len(self._parts) + 1, body))
        task.add_done_callback(lambda _: window.release(body.size))
        self.context.track(task)
        self._parts.append(task)

    async def _seal(self) -> None:
        size = len(self._buffer)
        if self._create is None:
            window = self.context.window
            await window.acquire(size)
            self._put = asyncio.ensure_future(self._put_object(self._cut(size)))
            self._put.add_done_callback(lambda _: window.release(size))
            self.context.track(self._put)
        elif self._buffer:
            await self._reserve(size)
            self._launch_part(self._cut(size))
        self._buffer.clear()

    async def _commit(self) -> None:
        if self._put is not None:
            await self._put
            return
        assert self._create is not None
        upload_id = await asyncio.shield(self._create)
        etags = await run_all(self._parts)
        parts = [{"PartNumber": i + 1, "ETag": etag} for i, etag in enumerate(etags)]
        try:
            response = await self._call(
                f"completing the upload of {len(parts)} parts",
                "complete_multipart_upload",
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )
            self.version = _etag(response)
        except ObjectNotFoundError:
            # NoSuchUpload after a retry: the first attempt may have completed the upload and
            # lost its answer. Accept only if the object is there with the size we wrote.
            if not await self._exists_with_our_size():
                raise

    async def _exists_with_our_size(self) -> bool:
        try:
            head = await self._call("checking the completed object", "head_object")
        except StorageError:
            return False
        self.version = _etag(head)
        return int(head.get("ContentLength", -1)) == self.bytes_written

    async def _abort(self) -> None:
        await cancel_and_wait(t for t in (self._put, *self._parts) if t is not None)
        self._buffer.clear()
        if self._create is None:
            return
        with contextlib.suppress(BaseException):
            await self._create  # it may have succeeded on the server: abort it then
        upload_id = self.upload_id
        if upload_id is None:
            return
        try:
            await self._call(
                "aborting the multipart upload", "abort_multipart_upload", UploadId=upload_id
            )
        except ObjectNotFoundError:
            pass  # NoSuchUpload: already aborted (or completed) by an earlier attempt
        except StorageError as exc:
            logger.warning(
                "%s: could not abort multipart upload %s (it keeps its parts until a bucket "
                "lifecycle rule removes it): %s",
                self.url,
                upload_id,
                exc,
            )


def _etag(response: Any) -> str | None:
    """The ETag of the object a response describes (as GET answers it), if it says."""
    etag = response.get("ETag") if isinstance(response, dict) else None
    return str(etag) if etag else None
