"""``s3://`` through one door: every read signed here, the aiobotocore client for writes.

Every range GET, listing page and first-bytes read of a store goes through its door
(:mod:`streamrec.storage.s3.door`), signed with the credentials botocore's resolver gives,
on streamrec's own connections, with ``If-Match`` pinned to the listed ETag and no retry but
streamrec's own. The door serves the store when its options say nothing it does not follow
(:mod:`streamrec.storage.s3.settings`); else the store reads through the client
(``get_object``, ``list_objects_v2``) for its whole life: chosen once, at set-up, never per
request. Either way a body longer than the range asked for is an error before the extra
bytes are kept, and listing pages are parsed within bounds
(:mod:`streamrec.storage.s3.listing`), each checked against the ones before
(:mod:`streamrec.storage.pages`).

The client (s3fs's aiobotocore client, made on first use) serves multipart uploads, open
uploads, globs s3fs lists itself and the reads of a store the door does not serve. It is
sized for streaming: botocore's connection pool (``max_pool_connections``, default 10) is
sized from ``max_connections``; its own retries are off; it follows no redirect
(:mod:`streamrec.storage.s3.session`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

from streamrec._portal import cancel_and_wait, owned_generator
from streamrec.errors import ObjectNotFoundError, StorageError, TransientStorageError
from streamrec.storage import timing, warmup
from streamrec.storage.base import Leftover, ObjectInfo, first_bytes, has_glob, split_scheme
from streamrec.storage.fsspec_store import FsspecStore
from streamrec.storage.http.body import (
    AnswerTooLong,
    parse_content_range,
    read_pieces_within,
    too_long,
)
from streamrec.storage.pages import GlobPrefix, PageTrail, glob_prefix
from streamrec.storage.s3.door import S3Door
from streamrec.storage.s3.listing import HostilePage, refuse_hostile_page
from streamrec.storage.s3.params import RequestParams, extra_params
from streamrec.storage.s3.session import sender_for
from streamrec.storage.s3.settings import DoorSettings, door_settings
from streamrec.storage.s3.tls import start_tls_context
from streamrec.storage.translate import translate

if TYPE_CHECKING:
    from streamrec.storage.retry import RetryPolicy
    from streamrec.storage.s3.sink import S3MultipartSink
    from streamrec.storage.sink_base import SinkContext

__all__ = ["DEFAULT_MAX_CONNECTIONS", "S3Store"]

DEFAULT_MAX_CONNECTIONS = 64
"""botocore's pool size when neither the caller nor ``config_kwargs`` says (botocore's own
default, 10, caps a dataset's range GETs in flight)."""
DIRECTORY_BUCKET = "--x-s3"
"""How S3 Express directory buckets' names end: they list keys unsorted."""
_LISTINGS = ("ListObjectsV2", "ListObjects", "ListObjectVersions", "ListMultipartUploads")
"""The client's listing operations: their pages refused past a page's bounds
(:func:`~streamrec.storage.s3.listing.refuse_hostile_page`)."""


class S3Store(FsspecStore):
    """Objects in S3 or an S3-compatible server (``endpoint_url`` in ``client_kwargs``).

    ``max_connections``: the most requests the caller will have in flight at once (the pool
    is sized to it, at least 10); ``config_kwargs={"max_pool_connections": n}`` wins over it.
    """

    scheme = "s3"

    def __init__(
        self, storage_options: dict[str, Any] | None = None, *, max_connections: int | None = None
    ) -> None:
        import s3fs

        options = dict(storage_options or {})
        config = dict(options.pop("config_kwargs", None) or {})
        # botocore: total_max_attempts counts the first try (its max_attempts counts retries)
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        pool = DEFAULT_MAX_CONNECTIONS if max_connections is None else max(10, max_connections)
        config.setdefault("max_pool_connections", pool)
        options.setdefault("skip_instance_cache", True)
        fs = s3fs.S3FileSystem(asynchronous=True, config_kwargs=config, **options)
        fs.retries = 1  # listing too: the retry policy is ours
        # (from the filesystem's options: the caller's with fsspec's configured defaults)
        timeouts = (float(fs.connect_timeout), float(fs.read_timeout))
        # requester pays, SSE-C...: on every request sent here too (s3/params.py)
        params = extra_params(fs)
        self._params = RequestParams(params)
        self.door_settings: DoorSettings | None = door_settings(
            fs.storage_options, os.environ, timeouts, params
        )
        """How the door reads (None: the client reads; decided here, once)."""
        self._door: S3Door | None = None
        # the client's requests follow no redirect: credentials would go along (session.py)
        self._sender = sender_for(fs.storage_options, os.environ, pool, timeouts)
        super().__init__(fs)
        self._client: Any = None

    async def client(self) -> Any:
        """The aiobotocore S3 client (its session set up on first use), for sinks and tools
        that send their own requests: they get the client, not the store's internals."""
        if self._client is None:
            await warmup.settled()  # what open_dataset started, not done twice
            client = await self.fs.set_session()
            events = client.meta.events
            if self._sender is not None:
                events.register_first("before-send.s3", self._sender)
            for operation in _LISTINGS:  # bounded before botocore parses them whole
                # (a wildcard in the middle: called before botocore's own handlers of
                # "before-parse.s3.*", which parse a 200's whole body to look for an error)
                events.register_first(f"before-parse.*.{operation}", refuse_hostile_page)
            self._client = client
        return self._client

    def request_params(self, client: Any, method: str) -> dict[str, Any]:
        """The parameters the caller asked every request to carry (``requester_pays``,
        ``s3_additional_kwargs``: SSE-C...) that ``client.<method>`` accepts, for sinks and
        tools that send their own requests."""
        return self._params.for_call(client, method)

    async def _connect(self) -> None:
        await self.client()

    async def expand(self, pattern: str) -> list[ObjectInfo]:
        if has_glob(pattern) or self._door_reads() is None:
            await self.client()  # (an object's first bytes may not need it: _read_head)
        return await super().expand(pattern)

    async def _info(self, path: str) -> dict[str, Any]:
        await self.client()
        return await super()._info(path)

    def _door_reads(self, bucket: str = "") -> S3Door | None:
        """The store's door (None: the client reads; S3 Express directory buckets too: their
        endpoints and session auth are the client's)."""
        settings = self.door_settings
        if settings is None or bucket.endswith(DIRECTORY_BUCKET):
            return None
        if self._door is None:
            tls = start_tls_context(settings.verify) if settings.tls else None
            self._door = S3Door(settings, tls)
        return self._door

    list_page_keys = 1000
    """Keys per listing page (S3's maximum; tests make it small to list in many pages)."""

    def glob_pages(
        self,
        pattern: str,
        retry: RetryPolicy | None = None,
        on_retry: Callable[[TransientStorageError], None] | None = None,
        *,
        warm: bool = True,
    ) -> AsyncGenerator[list[ObjectInfo], None] | None:
        """A glob listed as s3fs's glob lists it (``ListObjectsV2`` of the prefix up to the
        first wildcard, fsspec's pattern on the names: :func:`~streamrec.storage.pages.
        glob_prefix`; ``/`` as delimiter for a wildcard in the last component only, no
        delimiter, every key below the prefix, for ``**`` or a wildcard above the last level)
        but handed on page by page, each page checked against the ones before
        (:class:`~streamrec.storage.pages.PageTrail`) and, with ``retry``, each one request
        of its own: timed and retried alone, from its own continuation token. ``warm``: the
        first GET's connection opens beside the first page (for a listing whose objects are
        read next). Globs with a wildcard in the bucket, and version-aware filesystems:
        None."""
        glob = glob_prefix(self.path_of(pattern))
        if glob is None or getattr(self.fs, "version_aware", False):
            return None
        return self._glob_pages(pattern, glob, retry, on_retry, warm)

    @owned_generator
    async def _glob_pages(
        self,
        pattern: str,
        glob: GlobPrefix,
        retry: RetryPolicy | None,
        on_retry: Callable[[TransientStorageError], None] | None,
        warm: bool,
    ) -> AsyncGenerator[list[ObjectInfo], None]:
        bucket, prefix, matches, delimiter = glob
        trail = PageTrail(pattern, ordered=not bucket.endswith(DIRECTORY_BUCKET))
        token: str | None = None
        while True:
            first = warm and trail.pages == 0
            attempt = functools.partial(
                self._list_page,
                pattern,
                bucket,
                prefix,
                token,
                trail.pages,
                delimiter=delimiter,
                warm=first,
            )
            if retry is None:
                page = await attempt()
            else:
                page = await retry.run(
                    attempt,
                    describe=f"listing {pattern} (page {trail.pages + 1})",
                    on_retry=on_retry,
                )
            timing.listed_page()
            contents = page.get("Contents", [])
            token = trail.take(
                [item["Key"] for item in contents],
                bool(page.get("IsTruncated")),
                page.get("NextContinuationToken"),
            )
            found = []
            for item in contents:
                name = f"{bucket}/{item['Key']}"
                if matches(name):
                    etag = item.get("ETag")
                    found.append(ObjectInfo(self.url_of(name), int(item["Size"]), etag or None))
            yield found
            if token is None:
                return

    async def _list_page(
        self,
        pattern: str,
        bucket: str,
        prefix: str,
        token: str | None,
        before: int,
        *,
        delimiter: str = "/",
        warm: bool = False,
    ) -> dict[str, Any]:
        """One listing page (after ``before`` pages; ``delimiter`` ``""``: every key below
        ``prefix``), without the client where the store may, else through it; one attempt,
        errors translated. ``warm``: the first GET's connection opens beside it."""
        try:
            door = self._door_reads(bucket)
            if door is not None:
                opens = bucket if warm else None  # the first GET's connection opens beside it
                keys = self.list_page_keys
                action = f"listing (page {before + 1})"
                return await door.list_page(
                    bucket, prefix, keys, token, opens, pattern, action, delimiter
                )
            client = await self.client()
            markers = {} if token is None else {"ContinuationToken": token}
            if delimiter:
                markers["Delimiter"] = delimiter
            listed: dict[str, Any] = await client.list_objects_v2(
                Bucket=bucket,
                Prefix=prefix,
                MaxKeys=self.list_page_keys,
                **self._params.for_call(client, "list_objects_v2"),
                **markers,
            )
            return listed
        except (HostilePage, AnswerTooLong) as exc:
            raise StorageError(f"{pattern}: listing page {before + 1} refused: {exc}") from None
        except Exception as exc:
            raise translate(exc, pattern, f"listing (page {before + 1})") from exc

    def version_of(self, info: dict[str, Any]) -> str | None:
        etag = info.get("ETag") or info.get("etag")
        return str(etag) if etag else None

    async def _read_head(self, url: str, length: int) -> tuple[ObjectInfo, list[bytes]] | None:
        bucket, key, version_id = self.fs.split_path(url)
        if not key or version_id:
            return None
        door = self._door_reads(bucket)
        if door is not None:
            try:
                head = await door.head(bucket, key, length, url)
            except Exception as exc:
                raise translate(exc, url, "reading its first bytes") from exc
            if head is None:
                return None  # an empty object: looked up
            size, etag, got = head
            return ObjectInfo(url, size, etag), first_bytes(got, length)
        client = await self.client()
        try:
            response = await client.get_object(
                Bucket=bucket,
                Key=key,
                Range=f"bytes=0-{length - 1}",
                **self._params.for_call(client, "get_object"),
            )
            pieces = await _body_pieces_within(response["Body"], length)
        except Exception as exc:
            if _error_code(exc) in ("InvalidRange", "416"):
                return None  # an empty object: no byte to ask for; look it up instead
            raise translate(exc, url, "reading its first bytes") from exc
        if pieces is None:
            return None  # more than was asked (the range ignored): look it up instead
        etag = response.get("ETag")
        content_range = parse_content_range(response.get("ContentRange"))
        if content_range is not None and content_range[2] is not None:
            size = content_range[2]
        elif content_range is None:  # the whole object, the range ignored
            size = sum(map(len, pieces))
        else:
            return None
        return ObjectInfo(url, size, str(etag) if etag else None), first_bytes(pieces, length)

    async def _fetch_pieces(self, obj: ObjectInfo, start: int, end: int) -> list[bytes]:
        bucket, key, _ = self.fs.split_path(obj.url)
        action = f"reading bytes {start}-{end - 1}"
        door = self._door_reads(bucket)
        if door is not None:
            try:
                return await door.get(bucket, key, start, end, obj.version, obj.url)
            except Exception as exc:
                raise translate(exc, obj.url, action) from exc
        client = await self.client()
        extra = self._params.for_call(client, "get_object")
        if obj.version:
            extra["IfMatch"] = obj.version
        try:
            response = await client.get_object(
                Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **extra
            )
            return await _body_pieces(response["Body"], end - start, f"{obj.url}: {action}")
        except Exception as exc:
            raise translate(exc, obj.url, action) from exc

    async def read_range(self, obj: ObjectInfo, start: int, end: int) -> bytes:
        return await self._read_joined(obj, start, end)

    def open_sink(self, url: str, context: SinkContext | None = None) -> S3MultipartSink:
        """A multipart upload that runs while bytes arrive; the object appears on commit."""
        from streamrec.storage.s3.sink import S3MultipartSink

        return S3MultipartSink(self, url, context)

    async def unfinished_writes(self, prefix: str) -> list[Leftover]:
        """The open multipart uploads under ``prefix`` (invisible, but billed)."""
        scheme = split_scheme(prefix)[0]
        bucket, key_prefix = _bucket_key(prefix)
        client = await self.client()
        found: list[Leftover] = []
        markers: dict[str, str] = {}
        while True:
            try:
                page = await client.list_multipart_uploads(
                    Bucket=bucket,
                    Prefix=key_prefix,
                    **self._params.for_call(client, "list_multipart_uploads"),
                    **markers,
                )
            except Exception as exc:
                raise translate(exc, prefix, "listing open multipart uploads") from exc
            for upload in page.get("Uploads", []):
                found.append(
                    Leftover(
                        f"{scheme}://{bucket}/{upload['Key']}",
                        "multipart upload",
                        upload["Initiated"].timestamp(),
                        upload["UploadId"],
                    )
                )
            if not page.get("IsTruncated"):
                return found
            markers = {
                "KeyMarker": page["NextKeyMarker"],
                "UploadIdMarker": page["NextUploadIdMarker"],
            }

    async def abort_unfinished(self, leftover: Leftover) -> None:
        client = await self.client()
        bucket, key = _bucket_key(leftover.url)
        try:
            await client.abort_multipart_upload(
                Bucket=bucket,
                Key=key,
                UploadId=leftover.handle,
                **self._params.for_call(client, "abort_multipart_upload"),
            )
        except Exception as exc:
            error = translate(exc, leftover.url, "aborting a multipart upload")
            if not isinstance(error, ObjectNotFoundError):  # gone meanwhile: the goal holds
                raise error from exc

    async def close(self) -> None:
        self._heads.clear()
        door, self._door = self._door, None
        if door is not None:
            opening = door.opening()
            door.close()
            await cancel_and_wait(opening)
        client, self._client = self._client, None
        if client is not None:
            await client.__aexit__(None, None, None)
        if self._sender is not None:
            await self._sender.close()


async def _body_pieces(body: Any, limit: int | None = None, what: str = "") -> list[bytes]:
    """A get_object body as pieces: straight off aiohttp's stream when it is a plain body
    (not one that verifies a checksum as it is read), else through ``read()``; with
    ``limit``, more bytes than that is an error (:func:`read_pieces`)."""
    pieces = await _body_pieces_within(body, limit)
    if pieces is None:
        raise StorageError(f"{what}: {too_long(limit)}")
    return pieces


async def _body_pieces_within(body: Any, limit: int | None) -> list[bytes] | None:
    """:func:`_body_pieces`, but None once the body goes past ``limit`` bytes."""
    from aiobotocore.response import AioStreamingBody  # type: ignore[import-untyped]

    try:
        content = getattr(body.raw_stream, "content", None)
        if type(body) is AioStreamingBody and hasattr(content, "readany"):
            return await read_pieces_within(content, limit)
        data: bytes = await body.read()
        if limit is not None and len(data) > limit:
            return None
        return [data] if data else []
    finally:
        body.close()


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code or str(status or "")


def _bucket_key(url: str) -> tuple[str, str]:
    _, rest = split_scheme(url)
    bucket, _, key = rest.partition("/")
    return bucket, key
