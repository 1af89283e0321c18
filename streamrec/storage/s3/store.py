"""``s3://`` through s3fs (aiobotocore): listing via s3fs, range GETs on its client directly.

Range reads are sent by us, with ``If-Match`` pinned to the listed ETag and botocore's own
retries off, so that streamrec's retry policy is the only one (s3fs and botocore would
otherwise retry for ~10 s underneath, and pass short bodies on): signed with SigV4 headers
on the object's url resolved once, through the client's HTTP session
(:mod:`streamrec.storage.s3.signed_get`: a fraction of ``get_object``'s CPU per request), else with
the client's ``get_object``. Either way a body longer than the range asked for is an error
before the extra bytes are kept.
Bodies are read off aiohttp's stream in pieces (:func:`~streamrec.storage.http.body.read_pieces`),
never gathered and joined into a second copy.

Client set-up, sized for streaming unless ``storage_options`` say otherwise:

* botocore's connection pool (``max_pool_connections``, default 10) would cap the range GETs
  in flight across all shards; it is sized from ``max_connections`` (what the dataset may have
  in flight), through ``config_kwargs``.
* botocore's shared data loader, the process's TLS context and the start-up work done ahead
  for them: :mod:`streamrec.storage.s3.client`.
* listing pages, the client's too, parsed within bounds (:mod:`streamrec.storage.s3.listing`),
  each page checked against the ones before (:mod:`streamrec.storage.pages`).
* where the options name everything a request needs (an explicit endpoint and credentials:
  :func:`~streamrec.storage.s3.listing.early_listing`), listing pages, range GETs and first
  bytes go without the client (:mod:`streamrec.storage.s3.direct`), which is made only if an
  answer sends the store back to it (or for what the direct requests do not do: multipart
  uploads, listing uploads, a HEAD of an empty object).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

from streamrec._portal import cancel_and_wait, owned_generator
from streamrec.errors import ObjectNotFoundError, StorageError, TransientStorageError
from streamrec.storage import warmup
from streamrec.storage.base import Leftover, ObjectInfo, first_bytes, has_glob, split_scheme
from streamrec.storage.fsspec_store import FsspecStore
from streamrec.storage.http.body import parse_content_range, read_pieces_within, too_long
from streamrec.storage.pages import PageTrail
from streamrec.storage.s3.client import share_loader, start_tls_context, use_tls_context
from streamrec.storage.s3.direct import DirectClosed, DirectS3, UseClient
from streamrec.storage.s3.listing import HostilePage, early_listing, refuse_hostile_page
from streamrec.storage.s3.params import RequestParams, extra_params
from streamrec.storage.s3.signed_get import RangeGetter, UseGetObject
from streamrec.storage.translate import translate

if TYPE_CHECKING:
    from streamrec.storage.retry import RetryPolicy
    from streamrec.storage.s3.sink import S3MultipartSink
    from streamrec.storage.sinks import SinkContext

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

        from streamrec.storage.s3.session import NoRedirectSession

        options = dict(storage_options or {})
        config = dict(options.pop("config_kwargs", None) or {})
        # no redirect followed: credentials would go along to any host (s3_session.py)
        config.setdefault("http_session_cls", NoRedirectSession)
        # botocore: total_max_attempts counts the first try (its max_attempts counts retries)
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        pool = DEFAULT_MAX_CONNECTIONS if max_connections is None else max(10, max_connections)
        config.setdefault("max_pool_connections", pool)
        options.setdefault("skip_instance_cache", True)
        fs = s3fs.S3FileSystem(asynchronous=True, config_kwargs=config, **options)
        fs.retries = 1  # listing too: the retry policy is ours
        # (from the filesystem's options: the caller's with fsspec's configured defaults)
        timeouts = (float(fs.connect_timeout), float(fs.read_timeout))
        self._early_listing = early_listing(_as_given(fs.storage_options), os.environ, timeouts)
        self.early_pages = 0  # first pages listed without the client (for tests)
        # requester pays, SSE-C...: on every request sent here too (storage/s3_params.py)
        self._params = RequestParams(extra_params(fs))
        self._direct: DirectS3 | None = None  # requests without the client (s3_direct.py)
        self._direct_off = self._early_listing is None or bool(self._params)
        super().__init__(fs)
        self._session_ready = False
        self._getter = RangeGetter()  # signed range GETs (storage/s3_get.py)

    async def client(self) -> Any:
        """The aiobotocore S3 client (its session set up on first use), for sinks and tools
        that send their own requests: they get the client, not the store's internals."""
        if not self._session_ready:
            await warmup.settled()  # what open_dataset started, not done twice
            share_loader(self.fs)
            tls = start_tls_context(self.fs)
            await self.fs.set_session()
            if tls is not None:
                await use_tls_context(self.fs._s3, *tls)
            events = self.fs._s3.meta.events
            for operation in _LISTINGS:  # bounded before botocore parses them whole
                # (a wildcard in the middle: called before botocore's own handlers of
                # "before-parse.s3.*", which parse a 200's whole body to look for an error)
                events.register_first(f"before-parse.*.{operation}", refuse_hostile_page)
            self._session_ready = True
        return self.fs._s3

    def request_params(self, client: Any, method: str) -> dict[str, Any]:
        """The parameters the caller asked every request to carry (``requester_pays``,
        ``s3_additional_kwargs``: SSE-C...) that ``client.<method>`` accepts, for sinks and
        tools that send their own requests."""
        return self._params.for_call(client, method)

    async def _connect(self) -> None:
        await self.client()

    async def expand(self, pattern: str) -> list[ObjectInfo]:
        if has_glob(pattern) or self._direct_reads() is None:
            await self.client()  # (an object's first bytes may not need it: _read_head)
        return await super().expand(pattern)

    async def _info(self, path: str) -> dict[str, Any]:
        await self.client()
        return await super()._info(path)

    def _direct_reads(self) -> DirectS3 | None:
        """The store's requests without the client, while they may go that way."""
        if self._direct_off or self._early_listing is None:
            return None
        if self._direct is None:
            tls = start_tls_context(self.fs) if self._early_listing.tls else None
            self._direct = DirectS3(self._early_listing, None if tls is None else tls[1])
        return self._direct

    def _use_client(self) -> None:
        """An answer sent the store back to its client: every later request goes there (the
        direct connections close with the store: reads in flight still use them)."""
        self._direct_off = True

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
        """A glob whose wildcards are all in its last component (``bucket/dir/shard-*``),
        listed as s3fs's glob lists it (one ``ListObjectsV2`` of the prefix up to the first
        wildcard, ``/`` as delimiter, fsspec's pattern on the names) but handed on page by
        page, each page checked against the ones before (:class:`~streamrec.storage.pages.
        PageTrail`) and, with ``retry``, each one request of its own: timed and retried
        alone, from its own continuation token. ``warm``: the first GET's connection opens
        beside the first page (for a listing whose objects are read next). Other globs, and
        version-aware filesystems: None."""
        path = self.fs._strip_protocol(pattern)
        head, _, last = path.rpartition("/")
        if not head or not has_glob(last) or has_glob(head) or "**" in last:
            return None
        if getattr(self.fs, "version_aware", False):
            return None
        return self._glob_pages(pattern, path, head, last, retry, on_retry, warm)

    @owned_generator
    async def _glob_pages(
        self,
        pattern: str,
        path: str,
        head: str,
        last: str,
        retry: RetryPolicy | None,
        on_retry: Callable[[TransientStorageError], None] | None,
        warm: bool,
    ) -> AsyncGenerator[list[ObjectInfo], None]:
        from fsspec.utils import glob_translate

        matches = re.compile(glob_translate(path)).match
        bucket, _, key = head.partition("/")
        stem = last[: min(i for i in (last.find(c) for c in "*?[") if i >= 0)]
        prefix = f"{key}/{stem}" if key else stem
        trail = PageTrail(pattern, ordered=not bucket.endswith(DIRECTORY_BUCKET))
        token: str | None = None
        while True:
            first = warm and trail.pages == 0
            attempt = functools.partial(
                self._list_page, pattern, bucket, prefix, token, trail.pages, warm=first
            )
            if retry is None:
                page = await attempt()
            else:
                page = await retry.run(
                    attempt,
                    describe=f"listing {pattern} (page {trail.pages + 1})",
                    on_retry=on_retry,
                )
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
        warm: bool = False,
    ) -> dict[str, Any]:
        """One listing page (after ``before`` pages), without the client where the store may,
        else through it; one attempt, errors translated. ``warm``: the first GET's
        connection opens beside it."""
        try:
            page = await self._direct_page(pattern, bucket, prefix, token, warm)
            if before == 0:
                self.early_pages += page is not None
            if page is not None:
                return page
            client = await self.client()
            if warm:
                self._getter.warm(client, bucket)  # the first GET's connection opens beside it
            markers = {} if token is None else {"ContinuationToken": token}
            listed: dict[str, Any] = await client.list_objects_v2(
                Bucket=bucket,
                Prefix=prefix,
                Delimiter="/",
                MaxKeys=self.list_page_keys,
                **self._params.for_call(client, "list_objects_v2"),
                **markers,
            )
            return listed
        except HostilePage as exc:
            raise StorageError(f"{pattern}: listing page {before + 1} refused: {exc}") from None
        except Exception as exc:
            raise translate(exc, pattern, f"listing (page {before + 1})") from exc

    async def _direct_page(
        self, pattern: str, bucket: str, prefix: str, token: str | None, warm: bool = True
    ) -> dict[str, Any] | None:
        """A listing page of ``pattern`` without the client (None: the client lists it)."""
        direct = self._direct_reads()
        if direct is None:
            return None
        try:
            opens = bucket if warm and token is None else None  # the first GET's connection
            return await direct.list_page(bucket, prefix, self.list_page_keys, token, opens)
        except (DirectClosed, HostilePage):  # (the client would get that page too)
            raise
        except Exception:  # refused, cut, stalled, not a page...: the client's listing says
            self._use_client()
            return None

    def version_of(self, info: dict[str, Any]) -> str | None:
        etag = info.get("ETag") or info.get("etag")
        return str(etag) if etag else None

    async def _read_head(self, url: str, length: int) -> tuple[ObjectInfo, list[bytes]] | None:
        bucket, key, version_id = self.fs.split_path(url)
        if not key or version_id:
            return None
        direct = self._direct_reads()
        if direct is not None:
            try:
                head = await direct.head(bucket, key, length, url)
                if head is None:
                    return None  # an empty object: looked up through the client
                size, etag, got = head
                return ObjectInfo(url, size, etag), first_bytes(got, length)
            except UseClient:
                self._use_client()
            except Exception as exc:
                raise translate(exc, url, "reading its first bytes") from exc
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
        direct = self._direct_reads()
        if direct is not None:
            try:
                return await direct.get(bucket, key, start, end, obj.version, obj.url)
            except UseClient:
                self._use_client()
            except Exception as exc:
                raise translate(exc, obj.url, action) from exc
        client = await self.client()
        headers = self._params.get_headers(client)  # (None: get_object sends them)
        if headers is not None and self._getter.serves(client, bucket):  # a fraction of its CPU
            try:
                return await self._getter.get(
                    client, bucket, key, start, end, obj.version, obj.url, headers
                )
            except UseGetObject:
                pass  # the bucket is elsewhere: get_object's region redirector follows it
            except Exception as exc:
                raise translate(exc, obj.url, action) from exc
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
        await self._getter.aclose()
        direct, self._direct = self._direct, None
        if direct is not None:
            opening = direct.opening()
            direct.close()
            await cancel_and_wait(opening)
        if self._session_ready:
            self._session_ready = False
            client = self.fs._s3
            if client is not None:
                await client.__aexit__(None, None, None)


def _as_given(storage_options: dict[str, Any]) -> dict[str, Any]:
    """The filesystem's options without the HTTP session class the store chose (the direct
    requests follow no redirect either: storage/http_range.py)."""
    from streamrec.storage.s3.session import NoRedirectSession

    config = dict(storage_options.get("config_kwargs") or {})
    if config.get("http_session_cls") is NoRedirectSession:
        del config["http_session_cls"]
    return {**storage_options, "config_kwargs": config}


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
