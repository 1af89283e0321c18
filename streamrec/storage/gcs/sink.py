"""``gs://`` sink: a resumable upload that runs while the bytes arrive.

The JSON API's resumable protocol, spoken directly on the store's authenticated aiohttp session
(``gcsfs.core.initiate_upload`` / ``upload_chunk`` go through ``GCSFileSystem._call``, which
retries every request 6 times over ~35 s whatever streamrec's policy says). The sink is given
what it uses of its store (:class:`GCSAccess`: the session, the location, the headers, the
requester-pays billing), not the store:

- the session is initiated with the first full chunk (``POST ...?uploadType=resumable``);
- chunks are ``part_bytes`` rounded up to a multiple of 256 KiB, sent in order with
  ``Content-Range: bytes a-b/*``; one chunk is in flight while the next one fills;
- the last request carries the total size (``bytes a-b/total``, or ``bytes */total`` when
  nothing is left) and makes the object appear; its answer is checked (size, CRC32C);
- an object no bigger than one chunk is a single media upload instead;
- ``abort()`` cancels the session (``DELETE`` on the session url; GCS answers 499).

A chunk that fails with a transient error is retried by streamrec's :class:`RetryPolicy`. On
Google's endpoint the sink first asks how much the server kept (an empty ``PUT`` with
``Content-Range: bytes */*``) and resends from there, as GCS asks clients to. Against any other
endpoint (emulators) it resends the whole chunk: fake-gcs-server finalizes the object on such a
status query and appends chunks without checking their offsets, so there a query would publish a
partial object; a resend is exact whenever the failed request never reached the server.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import aiohttp

from streamrec._portal import cancel_and_wait
from streamrec.errors import StorageError, TransientStorageError
from streamrec.storage.http.body import ERROR_DETAIL_BYTES, read_at_most
from streamrec.storage.sink_base import ObjectSink, PartBuffer, SinkContext
from streamrec.storage.translate import from_status, translate

__all__ = [
    "ANSWER_BYTES",
    "CHUNK_ALIGN",
    "GCSAccess",
    "GCSResumableSink",
    "chunk_size",
    "next_offset",
]

logger = logging.getLogger("streamrec")

CHUNK_ALIGN = 256 << 10  # every chunk but the last must be a multiple of this
ANSWER_BYTES = 1 << 20
"""Most bytes of a success answer read (an object's metadata: a few hundred bytes)."""
_RANGE = re.compile(r"bytes=(\d+)-(\d+)")


def chunk_size(part_bytes: int) -> int:
    """``part_bytes`` rounded up to a multiple of 256 KiB."""
    return max(CHUNK_ALIGN, -(-part_bytes // CHUNK_ALIGN) * CHUNK_ALIGN)


def next_offset(range_header: str | None) -> int:
    """The first byte the server has not kept, from a 308's ``Range: bytes=0-N`` (or none)."""
    if not range_header:
        return 0
    match = _RANGE.search(range_header)
    if match is None:
        raise StorageError(f"unexpected Range header in a resumable upload: {range_header!r}")
    return int(match.group(2)) + 1


@dataclasses.dataclass(frozen=True)
class GCSAccess:
    """What a sink uses to send its requests (its store makes it); the ``str`` argument of
    the coroutines is the url a request is for (named in an error)."""

    session: Callable[[str], Awaitable[aiohttp.ClientSession]]
    """The authenticated session."""
    location: Callable[[str], Awaitable[str]]
    """The JSON API's ``scheme://host`` (Google's, or an emulator's)."""
    headers: Callable[[dict[str, str]], dict[str, str]]
    """The given headers with the credentials' (call once the session is made)."""
    billed: Callable[[str], str]
    """A request url with ``userProject`` added where the options ask for requester pays."""


class GCSResumableSink(ObjectSink):
    """One GCS object, uploaded in chunks while it is written; it appears on commit only."""

    def __init__(
        self,
        access: GCSAccess,
        url: str,
        bucket: str,
        key: str,
        context: SinkContext | None = None,
    ) -> None:
        super().__init__(url, context)
        self._access = access
        self.bucket, self.key = bucket, key
        self.chunk_bytes = chunk_size(self.part_bytes)
        self._buffer = PartBuffer()
        self.session_url: str | None = None
        self._sent = 0  # bytes handed to chunk requests so far
        self._inflight: asyncio.Task[None] | None = None
        self._metadata: dict[str, Any] | None = None

    async def _queries_status(self) -> bool:
        """Only Google's own service is trusted with status queries (see the module
        docstring)."""
        return "googleapis.com" in await self._location()

    async def _location(self) -> str:
        return await self._access.location(self.url)

    async def _upload_url(self, kind: str) -> str:
        """The JSON API url that starts an upload of ``kind`` (resumable, media)."""
        return (
            f"{await self._location()}/upload/storage/v1/b/{quote(self.bucket, safe='')}/o"
            f"?uploadType={kind}&name={quote(self.key, safe='')}"
        )

    async def _request(
        self, method: str, url: str, action: str, data: Any = None, headers: Any = None
    ) -> tuple[int, Any, bytes]:
        session = await self._access.session(self.url)
        try:
            async with session.request(
                method,
                self._access.billed(url),  # every request of a requester-pays upload
                data=data,
                headers=self._access.headers(headers or {}),
                allow_redirects=False,
            ) as response:
                # never a whole answer of any size: an error's start, a success's metadata
                limit = ANSWER_BYTES if response.status < 300 else ERROR_DETAIL_BYTES
                body = await read_at_most(response.content, limit)
                return response.status, response.headers, body
        except Exception as exc:
            raise translate(exc, self.url, action) from exc

    def _fail(self, status: int, action: str, body: bytes) -> StorageError:
        return from_status(status, self.url, action, body[:300].decode("utf-8", "replace"))

    # -- requests ---------------------------------------------------------------------------
    async def _initiate(self) -> str:
        action = "starting the resumable upload"
        start = time.perf_counter()

        async def attempt() -> str:
            status, headers, body = await self._request(
                "POST",
                await self._upload_url("resumable"),
                action,
                data=json.dumps({"name": self.key}),
                headers={
                    "Content-Type": "application/json; charset=UTF-8",
                    "X-Upload-Content-Type": "application/octet-stream",
                },
            )
            if status not in (200, 201) or not headers.get("Location"):
                raise self._fail(status, action, body)
            return str(headers["Location"])

        location = await self.context.retry.run(attempt, describe=f"{self.url}: {action}")
        self.context.controlled(time.perf_counter() - start)
        return location

    async def _simple_upload(self, data: bytes) -> None:
        action = f"uploading {len(data)} bytes"

        async def attempt() -> None:
            status, _, body = await self._request(
                "POST",
                await self._upload_url("media"),
                action,
                data=data,
                headers={"Content-Type": "application/octet-stream"},
            )
            if status not in (200, 201):
                raise self._fail(status, action, body)
            self._metadata = _json(body)

        await self.context.retry.run(attempt, describe=f"{self.url}: {action}")

    async def _query(self, total: int | None) -> int | None:
        """How many bytes the server kept; None when the upload is already complete."""
        action = "asking for the resumable upload's status"
        assert self.session_url is not None
        status, headers, body = await self._request(
            "PUT",
            self.session_url,
            action,
            data=b"",
            headers={"Content-Range": f"bytes */{'*' if total is None else total}"},
        )
        if status == 308:
            return next_offset(headers.get("Range"))
        if status in (200, 201):
            self._metadata = _json(body)
            return None
        raise self._fail(status, action, body)

    async def _upload_chunk(self, data: bytes, offset: int, total: int | None) -> None:
        """Send ``data`` (stream bytes ``offset...``); ``total`` only with the last request."""
        end = offset + len(data)
        what = "the last chunk" if total is not None else "a chunk"
        action = f"uploading {what} (bytes {offset}-{end - 1})"
        confirmed = offset  # bytes before this one are known to be on the server
        tried = False
        assert self.session_url is not None
        session_url = self.session_url
        start = time.perf_counter()

        async def attempt() -> None:
            nonlocal confirmed, tried
            if tried and await self._queries_status():
                kept = await self._query(total)
                if kept is None:
                    return  # the last request had completed the upload before the fault
                if not offset <= kept <= end:
                    raise StorageError(
                        f"{self.url}: the server kept {kept} bytes of a resumable upload, "
                        f"outside the chunk {offset}-{end} being sent"
                    )
                confirmed = kept
            tried = True
            while True:
                piece = memoryview(data)[confirmed - offset :]
                if piece.nbytes:
                    content_range = f"bytes {confirmed}-{end - 1}/{'*' if total is None else total}"
                else:
                    content_range = f"bytes */{total}"
                status, headers, body = await self._request(
                    "PUT", session_url, action, data=piece, headers={"Content-Range": content_range}
                )
                if status in (200, 201):
                    if total is None:
                        raise StorageError(f"{self.url}: the upload ended before its last chunk")
                    self._metadata = _json(body)
                    return
                if status != 308:
                    raise self._fail(status, action, body)
                kept = next_offset(headers.get("Range"))
                if kept >= end and total is None:
                    return
                if not confirmed < kept <= end:
                    raise TransientStorageError(
                        f"{self.url}: {action}: the server kept bytes up to {kept}"
                    )
                confirmed = kept  # GCS kept less than was sent: send the rest

        await self.context.retry.run(attempt, describe=f"{self.url}: {action}")
        self.context.uploaded(len(data), time.perf_counter() - start)

    # -- the data path --------------------------------------------------------------------
    async def _write(self, data: bytes) -> None:
        self.context.raise_failure()
        self._buffer.append(data)
        size = self.chunk_bytes
        while len(self._buffer) > size:  # an object of exactly one chunk stays one request
            # Wait for the chunk in flight (in order) and for upload capacity first: meanwhile
            # the bytes wait in the buffer, not in yet another copy.
            await self._ready(size)
            self._launch(self._cut(size), final=False)

    def _cut(self, size: int) -> bytes:
        return self._buffer.take(size)  # one copy, of exactly its size

    async def _ready(self, nbytes: int) -> None:
        """The session exists, the previous chunk is done, and an upload slot is ours."""
        if self.session_url is None:
            self.session_url = await self._initiate()
        if self._inflight is not None:
            await self._inflight  # in order: one chunk in flight, the next one filling
        await self.context.window.acquire(nbytes)

    def _launch(self, chunk: bytes, *, final: bool) -> None:
        window = self.context.window
        offset = self._sent
        self._sent += len(chunk)
        task = asyncio.ensure_future(
            self._upload_chunk(chunk, offset, self._sent if final else None)
        )
        size = len(chunk)
        task.add_done_callback(lambda _: window.release(size))
        self.context.track(task)
        self._inflight = task

    async def _seal(self) -> None:
        if self.session_url is None:
            window = self.context.window
            size = len(self._buffer)
            await window.acquire(size)
            task = asyncio.ensure_future(self._simple_upload(self._cut(size)))
            task.add_done_callback(lambda _: window.release(size))
            self.context.track(task)
            self._inflight = task
        else:
            await self._ready(len(self._buffer))
            self._launch(self._cut(len(self._buffer)), final=True)
        self._buffer.clear()

    async def _commit(self) -> None:
        assert self._inflight is not None
        await self._inflight
        metadata = self._metadata or {}
        size = metadata.get("size")
        if size is not None and int(size) != self.bytes_written:
            await self._delete_object()
            raise StorageError(
                f"{self.url}: the server stored {size} bytes, not the {self.bytes_written} sent"
            )
        generation = metadata.get("generation")
        self.version = str(generation) if generation else None
        stored_crc = metadata.get("crc32c")
        if stored_crc is not None:
            ours = base64.b64encode(self.crc32c.to_bytes(4, "big")).decode()
            if stored_crc != ours:
                await self._delete_object()
                raise StorageError(
                    f"{self.url}: the server's CRC32C ({stored_crc}) differs from the bytes "
                    f"sent ({ours})"
                )

    async def _delete_object(self) -> None:
        """Remove an object that was stored wrong (best effort)."""
        try:
            url = (
                f"{await self._location()}/storage/v1/b/{quote(self.bucket, safe='')}"
                f"/o/{quote(self.key, safe='')}"
            )
            await self._request("DELETE", url, "removing the damaged object")
        except StorageError as exc:
            logger.warning("%s: could not remove the damaged object: %s", self.url, exc)

    async def _abort(self) -> None:
        task, self._inflight = self._inflight, None
        if task is not None:
            await cancel_and_wait([task])
        self._buffer.clear()
        session_url, self.session_url = self.session_url, None
        if session_url is None:
            return
        action = "cancelling the resumable upload"

        async def attempt() -> None:
            status, _, body = await self._request("DELETE", session_url, action)
            # 499: cancelled (GCS's answer); 404/410: the session is gone already
            if status not in (200, 204, 404, 410, 499):
                raise self._fail(status, action, body)

        try:
            await self.context.retry.run(attempt, describe=f"{self.url}: {action}")
        except StorageError as exc:
            logger.warning("%s: could not cancel the resumable upload: %s", self.url, exc)


def _json(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body) if body else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
