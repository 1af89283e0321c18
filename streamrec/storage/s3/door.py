"""The one request path of S3 reads: range GETs, listing pages and first bytes, signed here.

A store whose options the door follows (:func:`~streamrec.storage.s3.settings.door_settings`,
decided once at set-up) sends all three through :class:`S3Door`: the url as botocore builds it
(tested equal to botocore's), SigV4 headers from :mod:`streamrec.storage.s3.sigv4` with the
credentials :mod:`streamrec.storage.s3.credentials` gives (the options', or botocore's
resolver's, refreshed as botocore refreshes them), the caller's request parameters as their
headers (requester pays, SSE-C), sent on streamrec's own connections
(:mod:`streamrec.storage.http.range_get`: bodies received straight into their pieces) with the
client's timeouts and a TLS context built once per process and ``verify``.

Why one door: a signed GET here costs a fraction of ``get_object``'s CPU (~1.1 ms per request)
and needs no client (~40-90 ms of set-up per process: every DataLoader worker is one).

Answers: a success body longer than asked for is an error before the extra bytes are kept; an
S3 error answer raises what the client's path raises for its ``<Code>``
(:func:`~streamrec.storage.translate.from_error_code`); a redirect is never followed (the
credentials would go along). A bucket whose region was not named is signed for ``us-east-1``
first; S3's answer names the bucket's region (``x-amz-bucket-region``), which the door then
keeps for that bucket and signs the request again for (botocore's region redirector does the
same), once per bucket.
"""

from __future__ import annotations

import asyncio
import functools
import re
import ssl
from collections.abc import Callable
from typing import Any

from streamrec.errors import StorageError, TransientStorageError
from streamrec.storage import timing
from streamrec.storage.http.body import parse_content_range
from streamrec.storage.http.range_get import Answer, BadAnswer, BodyTooLong, RangeClient
from streamrec.storage.s3.credentials import credential_source
from streamrec.storage.s3.listing import PAGE_BYTES, HostilePage, list_query, parse_page
from streamrec.storage.s3.settings import DoorSettings, param_headers
from streamrec.storage.s3.sigv4 import SigV4Signer
from streamrec.storage.translate import REDIRECT_STATUSES, from_error_code, redirected

__all__ = [
    "ERROR_BODY_BYTES",
    "DoorClosed",
    "S3Door",
    "check_range",
    "error_code",
    "range_headers",
]

ERROR_BODY_BYTES = 64 << 10
"""Most bytes of an error answer read (for its Code and Message)."""
_WARM_KEY = "streamrec-warm-up"  # any key: only the url's host is used
_REGION_CODES = frozenset(
    {
        "PermanentRedirect",
        "TemporaryRedirect",
        "AuthorizationHeaderMalformed",
        "IllegalLocationConstraintException",
    }
)
_CODE = re.compile(rb"<Code>([^<]{1,100})</Code>")
_MESSAGE = re.compile(rb"<Message>([^<]{0,400})</Message>")
_REGION = re.compile(r"[a-z0-9-]{1,40}")


class DoorClosed(StorageError):
    """A request of an :class:`S3Door` that was closed (the store was closed under it)."""


class _LookUp(Exception):
    """The first bytes of an object cannot say its size (an empty object: 416 InvalidRange;
    an answer longer than asked for): the object is looked up instead."""


def range_headers(start: int, end: int, version: str | None) -> dict[str, str]:
    """The headers of a GET of bytes ``start:end``, pinned to ``version`` (an ETag) if given."""
    headers = {"Range": f"bytes={start}-{end - 1}"}
    if version:
        headers["If-Match"] = version
    return headers


def error_code(body: bytes) -> tuple[str, str]:
    """The ``Code`` and ``Message`` of an S3 error answer's ``body`` (``""`` where absent)."""
    code = _CODE.search(body)
    message = _MESSAGE.search(body)
    return (
        code.group(1).decode("utf-8", "replace") if code else "",
        message.group(1).decode("utf-8", "replace") if message else "",
    )


def check_range(status: int, length: str | None, start: int, end: int, name: str) -> None:
    """A 200 is the range only when the range is the whole object (a server that ignored
    ``Range`` sent the whole object instead)."""
    if status == 200 and (start != 0 or (length is not None and int(length) != end)):
        raise StorageError(
            f"{name}: the server ignored the Range header (asked for bytes "
            f"{start}-{end - 1}, it answered 200 with {length} bytes)"
        )


class S3Door:
    """The reads of one store (see the module docstring). ``tls``: the TLS context for an
    https endpoint (a future: built in a worker thread while the first request waits)."""

    def __init__(
        self, settings: DoorSettings, tls: asyncio.Future[ssl.SSLContext] | None = None
    ) -> None:
        self._settings = settings
        self._tls = tls
        self._credentials = credential_source(settings.credentials, settings.profile)
        self._signers: dict[str, SigV4Signer] = {}
        self._regions: dict[str, str] = {}  # bucket -> its region, learnt from S3's answers
        self._get_headers = param_headers(settings.params, "GetObject")
        self._list_headers = param_headers(settings.params, "ListObjectsV2")
        self._client: RangeClient | None = None
        self._closed = False

    async def _connections(self) -> RangeClient:
        if self._closed:
            raise DoorClosed("the store was closed")
        if self._client is None:
            context = None
            if self._settings.tls:
                if self._tls is None:
                    raise StorageError("no TLS context for an https endpoint")
                # shielded: a request cancelled while it waits must not cancel the context
                # every later request waits for
                context = await asyncio.shield(self._tls)
            if self._closed:
                raise DoorClosed("the store was closed")
            if self._client is None:
                # the read timeout checked every half of the client's: a stall is given up
                # on within the client's (range_get notices one within twice its timeout)
                settings = self._settings
                self._client = RangeClient(
                    context, settings.connect_timeout_s, settings.read_timeout_s / 2
                )
        return self._client

    def region_of(self, bucket: str) -> str:
        """The region ``bucket``'s requests are signed for."""
        return self._settings.region or self._regions.get(bucket, "us-east-1")

    async def _send(
        self,
        bucket: str,
        url_of: Callable[[str], str],
        headers: dict[str, str],
        limit: int,
        name: str,
        action: str,
        on_sent: Callable[[RangeClient], object] | None = None,
    ) -> Answer:
        """One request, signed for the bucket's region; sent once more for the region S3's
        answer names, when the bucket's region was not known (see the module docstring)."""
        client = await self._connections()
        for _ in range(2):
            region = self.region_of(bucket)
            url = url_of(region)
            signed = await self._signed(url, headers, region)
            sent = None if on_sent is None else functools.partial(on_sent, client)
            try:
                answer = await client.get(url, signed, limit, ERROR_BODY_BYTES, sent)
            except BadAnswer as exc:
                raise TransientStorageError(f"{name}: {action}: {exc}") from None
            if answer.status in (200, 206) or not self._learn_region(bucket, answer, region):
                return answer
            on_sent = None
        return answer

    def _learn_region(self, bucket: str, answer: Answer, region: str) -> bool:
        """Whether the answer named the region of a bucket whose region was not given (and
        it is another than ``region``): kept for the bucket's later requests."""
        if self._settings.region is not None or answer.status not in (*REDIRECT_STATUSES, 400):
            return False
        named = answer.headers.get("x-amz-bucket-region", "")
        if named == region or not _REGION.fullmatch(named) or named.startswith("cn-"):
            return False
        self._regions[bucket] = named
        return True

    async def _signed(self, url: str, headers: dict[str, str], region: str) -> dict[str, str]:
        frozen = await self._credentials.get()
        if frozen is None:  # anon: sent unsigned, as botocore's UNSIGNED client does
            return headers
        signer = self._signers.get(region)
        if signer is None:
            signer = self._signers[region] = SigV4Signer(region, "s3")
        return signer.sign_get(url, headers, frozen.key, frozen.secret, frozen.token)

    async def list_page(
        self,
        bucket: str,
        prefix: str,
        max_keys: int,
        token: str | None = None,
        warm: str | None = None,
        name: str = "",
        action: str = "listing",
        delimiter: str = "/",
    ) -> dict[str, Any]:
        """A ``ListObjectsV2`` page of ``bucket/prefix*`` (``delimiter`` ``""``: every key
        below the prefix, at any depth), as botocore's ``list_objects_v2`` returns it (see
        :func:`~streamrec.storage.s3.listing.parse_page`;
        :class:`~streamrec.storage.s3.listing.HostilePage` for a page no listing can be).
        ``warm``: a bucket whose first GET's connection opens once the request is written
        (beside the page's round trip, not before it: the page would wait for it)."""
        query = list_query(prefix, delimiter, max_keys, token)

        def url_of(region: str) -> str:
            return self._settings.list_url(bucket, region, query)

        on_sent = None
        if warm is not None:

            def on_sent(client: RangeClient) -> None:
                client.warm(self._settings.object_url(warm, _WARM_KEY, self.region_of(warm)))

        try:
            answer = await self._send(
                bucket, url_of, dict(self._list_headers), PAGE_BYTES, name, action, on_sent
            )
        except BodyTooLong:
            raise HostilePage(f"a listing page of more than {PAGE_BYTES:,} bytes") from None
        if answer.status != 200:
            raise self._error(answer, name or f"s3://{bucket}/{prefix}", action)
        page = parse_page(b"".join(answer.pieces), bucket, prefix, max_keys)
        if page is None:
            raise StorageError(f"{name}: {action}: the answer is not a ListObjectsV2 page")
        return page

    async def get(
        self, bucket: str, key: str, start: int, end: int, version: str | None, name: str
    ) -> list[bytes]:
        """Bytes ``start:end`` of ``bucket/key`` (named ``name`` in errors) as pieces, pinned
        to ``version`` (an ETag) when given."""
        pieces, _ = await self._get(bucket, key, start, end, version, name)
        return pieces

    async def head(
        self, bucket: str, key: str, length: int, name: str
    ) -> tuple[int, str | None, list[bytes]] | None:
        """The object's size, ETag and first ``length`` bytes (fewer if it is shorter), in one
        request; None for an empty object (no byte to ask for) or an answer longer than asked
        for: looked up instead."""
        action = "reading its first bytes"
        try:
            pieces, headers = await self._get(bucket, key, 0, length, None, name, action)
        except _LookUp:
            return None
        content_range = parse_content_range(headers.get("content-range"))
        got = sum(map(len, pieces))
        if content_range is None:  # a 200: the whole object, no longer than asked
            size = got
        elif content_range[0] == 0 and content_range[2] is not None:
            size = content_range[2]
        else:
            raise StorageError(f"{name}: {action}: an answer without the object's size")
        if got != min(length, size):
            raise StorageError(f"{name}: {action}: {got} bytes, not {min(length, size)}")
        return size, headers.get("etag") or None, pieces

    async def _get(
        self,
        bucket: str,
        key: str,
        start: int,
        end: int,
        version: str | None,
        name: str,
        head: str | None = None,
    ) -> tuple[list[bytes], dict[str, str]]:
        """A GET's pieces and headers; ``head``: the first bytes of an object are asked for
        (named so in errors): an empty object is looked up instead."""
        action = head or f"reading bytes {start}-{end - 1}"
        headers = {**range_headers(start, end, version), **self._get_headers}

        def url_of(region: str) -> str:
            return self._settings.object_url(bucket, key, region)

        try:
            answer = await self._send(bucket, url_of, headers, end - start, name, action)
        except BodyTooLong as exc:
            if head is not None:  # (not kept: looked up instead)
                raise _LookUp() from None
            raise StorageError(f"{name}: {action}: {exc}") from None
        if answer.status not in (200, 206):
            code = error_code(b"".join(answer.pieces))[0]
            if head is not None and answer.status == 416 and code == "InvalidRange":
                raise _LookUp()
            raise self._error(answer, name, action)
        if head is None:  # (a 200 to the first bytes is the whole object: head() sizes it)
            check_range(answer.status, answer.headers.get("content-length"), start, end, name)
            timing.first_byte(answer.head_s)
        return answer.pieces, answer.headers

    def _error(self, answer: Answer, name: str, action: str) -> StorageError:
        if answer.status in REDIRECT_STATUSES:
            return redirected(answer.status, answer.headers.get("location"), name, action)
        code, detail = error_code(b"".join(answer.pieces))
        if code in _REGION_CODES:
            named = answer.headers.get("x-amz-bucket-region")
            where = f"the bucket is in {named!r}" if named else "the bucket is in another region"
            return StorageError(
                f"{name}: {action} failed: {code}: {where}; set "
                "client_kwargs={'region_name': ...} (or leave the region unnamed to learn it)"
            )
        return from_error_code(code, answer.status, name, action, detail)

    def close(self) -> None:
        """Close the idle connections (and open no more)."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def opening(self) -> list[asyncio.Future[Any]]:
        """The connections still opening (for a close that waits for them)."""
        return [] if self._client is None else list(self._client.opening())
