"""S3 reads without the aiobotocore client, for stores whose options name everything a request
needs: listing pages, range GETs and an object's first bytes, signed here.

Why: a process's first S3 client costs ~40 ms of CPU (botocore's models, the client, its
endpoint rules; :mod:`streamrec.storage.s3.client`), and every DataLoader worker is a fresh
process. With an explicit ``endpoint_url`` and credentials (what
:func:`~streamrec.storage.s3.listing.early_listing` accepts: MinIO, SeaweedFS, R2, a test
server...) botocore addresses every bucket path-style on the endpoint and signs with those
credentials, so each request is known without it: the url as botocore builds it (tested equal
to botocore's), SigV4 headers from :mod:`streamrec.storage.s3.sigv4`, sent on streamrec's own
connections (:mod:`streamrec.storage.http.range_get`) with the client's timeouts and TLS context.

What it can change: nothing but the time. A listing page that fails in any way is listed
through the store's client, whose errors the caller sees. A GET's answer that may be the
request's own doing raises :class:`UseClient`: a redirect, a chunked body, an answer that
says the signature, region, credentials or endpoint were wrong (:data:`CLIENT_CODES`, any
400, a 4xx without a code). The store then sends the request again through its client,
whose answer the caller sees, and goes on with the client from then on. Other error answers
of a GET (a missing object, access denied, a changed object, a busy server) say the same
whoever sent the request: they raise the error the client's path raises
(:func:`~streamrec.storage.translate.from_error_code`, as :mod:`streamrec.storage.s3.signed_get`
does), and no request is sent twice. What the transport raises (a refused or reset
connection, a timeout) is raised as on the client's path (the store translates it; the
retry policy decides), and a success body longer than the range asked for is an error.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any
from urllib.parse import quote

from streamrec.errors import StorageError, TransientStorageError
from streamrec.storage.http.body import parse_content_range
from streamrec.storage.http.range_get import BadAnswer, BodyTooLong, RangeClient, Unsupported
from streamrec.storage.s3.listing import PAGE_BYTES, EarlyListing, HostilePage, list_url, parse_page
from streamrec.storage.s3.signed_get import ERROR_BODY_BYTES, check_range, error_code, range_headers
from streamrec.storage.s3.sigv4 import SigV4Signer
from streamrec.storage.translate import REDIRECT_STATUSES, from_error_code

__all__ = ["CLIENT_CODES", "DirectClosed", "DirectS3", "UseClient", "object_url"]

CLIENT_CODES = frozenset(
    {
        "AuthorizationHeaderMalformed",
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
        "InvalidToken",
        "ExpiredToken",
        "TokenRefreshRequired",
        "InvalidRegion",
        "IncorrectEndpoint",
        "PermanentRedirect",
        "TemporaryRedirect",
        "InvalidRequest",
        "InvalidArgument",
    }
)
"""Error codes of a GET that the client may not get for the same read (its credentials,
region or addressing differ from these): the read goes again through the client."""

_WARM_KEY = "streamrec-warm-up"  # any key: only the url's host is used


class UseClient(Exception):
    """This request (and every later one of the store) is to go through the client."""


class DirectClosed(StorageError):
    """A request of a :class:`DirectS3` that was closed (the store was closed under it)."""


class _EmptyObject(Exception):
    """The first bytes of an empty object were asked for (S3: 416 InvalidRange)."""


def object_url(endpoint: str, bucket: str, key: str) -> str:
    """The url of ``bucket/key`` as botocore sends ``get_object`` on an explicit endpoint."""
    return f"{endpoint}/{quote(bucket, safe='')}/{quote(key, safe='/~')}"


class DirectS3:
    """Requests of one store, signed with its static settings (see the module docstring).
    ``tls``: the context the client would use, for an https endpoint."""

    def __init__(
        self, listing: EarlyListing, tls: asyncio.Future[ssl.SSLContext] | None = None
    ) -> None:
        self._listing = listing
        self._tls = tls
        self._signer = SigV4Signer(listing.region, "s3")
        self._client: RangeClient | None = None
        self._closed = False

    async def _connections(self) -> RangeClient:
        if self._closed:
            raise DirectClosed("the store was closed")
        if self._client is None:
            context = None
            if self._listing.tls:
                if self._tls is None:
                    raise UseClient("no TLS context")
                # shielded: a request cancelled while it waits must not cancel the context
                # every later request waits for
                context = await asyncio.shield(self._tls)
            if self._closed:
                raise DirectClosed("the store was closed")
            if self._client is None:
                # the read timeout checked every half of the client's: a stall is given up
                # on within the client's (http_range notices one within twice its timeout)
                listing = self._listing
                self._client = RangeClient(
                    context, listing.connect_timeout_s, listing.read_timeout_s / 2
                )
        return self._client

    def _signed(self, url: str, headers: dict[str, str]) -> dict[str, str]:
        credentials = self._listing.credentials
        if credentials is None:  # anon: sent unsigned, as botocore's UNSIGNED client does
            return headers
        return self._signer.sign_get(url, headers, *credentials)

    async def list_page(
        self,
        bucket: str,
        prefix: str,
        max_keys: int,
        token: str | None = None,
        warm: str | None = None,
    ) -> dict[str, Any]:
        """A ``ListObjectsV2`` page of ``bucket/prefix*`` (``/`` as delimiter), as botocore's
        ``list_objects_v2`` returns it (see :func:`~streamrec.storage.s3.listing.parse_page`;
        :class:`~streamrec.storage.s3.listing.HostilePage` for a page no listing can be).
        ``warm``: a bucket whose first GET's connection opens once the request is written
        (beside the page's round trip, not before it: the page would wait for it)."""
        url = list_url(self._listing.endpoint, bucket, prefix, "/", max_keys, token)
        client = await self._connections()
        on_sent = None
        if warm is not None:
            warm_url = object_url(self._listing.endpoint, warm, _WARM_KEY)
            on_sent = lambda: client.warm(warm_url)  # noqa: E731
        try:
            answer = await client.get(url, self._signed(url, {}), PAGE_BYTES, 0, on_sent)
        except BodyTooLong:  # (the client would read all of it)
            raise HostilePage(f"a listing page of more than {PAGE_BYTES:,} bytes") from None
        except (BadAnswer, Unsupported) as exc:
            raise UseClient(str(exc)) from None
        if answer.status != 200:
            raise UseClient(f"HTTP {answer.status}")
        page = parse_page(b"".join(answer.pieces), bucket, prefix, max_keys)
        if page is None:
            raise UseClient("not a listing page")
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
        request; None for an empty object (no byte to ask for: looked up instead)."""
        try:
            action = "reading its first bytes"  # (as the client's path names it)
            pieces, headers = await self._get(bucket, key, 0, length, None, name, action)
        except _EmptyObject:
            return None
        content_range = parse_content_range(headers.get("content-range"))
        got = sum(map(len, pieces))
        if content_range is None:  # a 200: the whole object, no longer than asked
            size = got
        elif content_range[0] == 0 and content_range[2] is not None:
            size = content_range[2]
        else:
            raise UseClient("an answer without the object's size")
        if got != min(length, size):
            raise UseClient("an answer of another length")
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
        (named so in errors): an empty object, or one answered whole, is looked up instead."""
        whole_ok = head is not None
        action = head or f"reading bytes {start}-{end - 1}"
        url = object_url(self._listing.endpoint, bucket, key)
        headers = range_headers(start, end, version)
        client = await self._connections()
        try:
            answer = await client.get(
                url, self._signed(url, headers), end - start, ERROR_BODY_BYTES
            )
        except Unsupported as exc:
            raise UseClient(str(exc)) from None
        except BodyTooLong as exc:
            if whole_ok:  # the range ignored: the client's path looks the object up
                raise UseClient(str(exc)) from None
            raise StorageError(f"{name}: {action}: {exc}") from None
        except BadAnswer as exc:
            raise TransientStorageError(f"{name}: {action}: {exc}") from None
        if answer.status not in (200, 206):
            code, detail = error_code(b"".join(answer.pieces))
            if whole_ok and answer.status == 416 and code == "InvalidRange":
                raise _EmptyObject()
            if (
                answer.status in (*REDIRECT_STATUSES, 400)  # (a redirect: never followed)
                or code in CLIENT_CODES
                or (not code and answer.status < 500)
            ):
                raise UseClient(f"HTTP {answer.status} {code}")  # the client's answer counts
            raise from_error_code(code, answer.status, name, action, detail)
        if not whole_ok:  # (a 200 to the first bytes is the whole object: head() sizes it)
            check_range(answer.status, answer.headers.get("content-length"), start, end, name)
        return answer.pieces, answer.headers

    def close(self) -> None:
        """Close the idle connections (and open no more)."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def opening(self) -> list[asyncio.Future[Any]]:
        """The connections still opening (for a close that waits for them)."""
        return [] if self._client is None else list(self._client.opening())
