"""S3 range GETs at a fraction of botocore's CPU cost per request: the object's url resolved
once, each request signed with SigV4 headers, sent on streamrec's own connections or through
the client's own HTTP session.

A ``get_object`` call costs ~1.1 ms of CPU in aiobotocore (parameter validation, endpoint
rules, ~20 event hooks, signing, response parsing) whatever the size of the range; at 4 MiB
blocks that was a fifth of the reader's CPU per byte on loopback. :class:`RangeGetter` asks
botocore once per object for the object's url (``generate_presigned_url``: the same endpoint
resolution and addressing style as ``get_object``; its query - the presigned signature - is
dropped, never sent nor kept), and sends each range GET of that object on it, signed the way
``get_object`` signs: SigV4 headers as botocore's ``S3SigV4Auth`` makes them (computed by
:mod:`streamrec.storage.s3.sigv4`, ~10x cheaper), with the client's region and signing name and
its current credentials (``get_frozen_credentials``: refreshable ones are refreshed),
``Range`` and ``If-Match`` among the signed headers.

The signature is never weaker than ``get_object``'s: a presigned url would be SigV2 unless the
client is configured for ``s3v4`` (botocore's presign default), which AWS refuses for SSE-KMS
objects and in newer regions. Only clients whose signature version is SigV4 (``s3v4``/``v4``,
the S3 default) or ``UNSIGNED`` (anonymous: sent unsigned) go this way; any other (SigV2
``s3``, SigV4a, S3 Express directory buckets, access-point ARNs) keeps ``get_object``. No
credential is in the url, so no error message or log line that quotes the url carries one.

The request goes out on streamrec's own connections (:mod:`streamrec.storage.http.range_get`:
bodies received straight into their pieces) when the session's settings allow it: no proxy
for the url, no socket option but ``TCP_NODELAY`` (botocore's default, asyncio's too), no
connector argument but the keep-alive timeout. Their TLS context is the session's own
(``_build_ssl_contexts``: verification, CA bundle, client certificate), their timeouts the
session's connect and read timeouts. Otherwise, and from an answer they do not read on (a
chunked success body), requests go through the client's aiobotocore HTTP session (its
connection pool, TLS settings, proxies and timeouts).

What stays as it was: one attempt per call (streamrec's retry policy above decides), the
version pinned with ``If-Match`` (412 -> ObjectChangedError), errors translated by type -
transport errors are aiobotocore's (``send`` raises botocore's exception types), S3 error
answers by their ``<Code>`` (:func:`~streamrec.storage.translate.from_error_code`, as
botocore's ClientError would be). An answer that sends a bucket elsewhere (wrong region:
301/307, ``AuthorizationHeaderMalformed``) makes the bucket go back to ``get_object``, whose
region redirector follows it (:class:`UseGetObject`). A body longer than the range asked for
(a server that ignored ``Range``) is an error before the extra bytes are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from streamrec._portal import cancel_and_wait
from streamrec.errors import StorageError, TransientStorageError
from streamrec.storage.http.body import read_pieces
from streamrec.storage.http.range_get import BadAnswer, BodyTooLong, RangeClient, Unsupported
from streamrec.storage.s3.sigv4 import SigV4Signer
from streamrec.storage.translate import REDIRECT_STATUSES, from_error_code, redirected

__all__ = [
    "ERROR_BODY_BYTES",
    "MAX_URLS",
    "RangeGetter",
    "UseGetObject",
    "check_range",
    "error_code",
    "range_headers",
]

MAX_URLS = 4096
"""Most objects' urls kept (all dropped when full: a url costs one presign to make again)."""
ERROR_BODY_BYTES = 64 << 10
"""Most bytes of an error answer read (for its Code and Message)."""
_SIGV4 = frozenset({"s3v4", "v4"})
_WARM_KEY = "streamrec-warm-up"  # any key: only the url's host is used
_NODELAY = (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # botocore's default (asyncio's too)
_ELSEWHERE_CODES = frozenset(
    {"PermanentRedirect", "TemporaryRedirect", "AuthorizationHeaderMalformed", "301", "307"}
)

_CODE = re.compile(rb"<Code>([^<]{1,100})</Code>")
_MESSAGE = re.compile(rb"<Message>([^<]{0,400})</Message>")


class UseGetObject(Exception):
    """This read (and every later one of the bucket) is to go through ``get_object``."""


class RangeGetter:
    """Range GETs of one S3 client's objects, signed per request (see the module docstring)."""

    def __init__(self) -> None:
        self._urls: dict[tuple[str, str], str] = {}
        self._elsewhere: set[str] = set()  # buckets get_object serves (region redirects)
        self.resolved = 0  # how many urls were resolved (for tests)
        self.direct = True  # own connections where the session allows (False: the session's)
        self._clients: dict[tuple[int, str], RangeClient] = {}  # (id(client), scheme)
        self._signers: dict[tuple[str, str], SigV4Signer] = {}  # (region, signing name)
        self._warming: asyncio.Future[None] | None = None

    def serves(self, client: Any, bucket: str) -> bool:
        """True when ``client``'s range GETs of ``bucket`` can go this way."""
        import botocore

        endpoint = getattr(client, "_endpoint", None)
        signer = getattr(client, "_request_signer", None)
        version = getattr(signer, "signature_version", None)
        return (
            hasattr(getattr(endpoint, "http_session", None), "send")
            and hasattr(client, "generate_presigned_url")
            and (
                version is botocore.UNSIGNED
                or (version in _SIGV4 and bool(getattr(signer, "region_name", None)))
            )
            and not bucket.endswith("--x-s3")  # directory buckets sign with session tokens
            and not bucket.startswith("arn:")  # access points, MRAP (SigV4a)
            and bucket not in self._elsewhere
        )

    async def url(self, client: Any, bucket: str, key: str) -> str:
        """The url of ``bucket/key`` as ``get_object`` would send it, without any query."""
        kept = self._urls.get((bucket, key))
        if kept is not None:
            return kept
        presigned: str = await client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=60
        )
        scheme, netloc, path, _, _ = urlsplit(presigned)
        url = urlunsplit((scheme, netloc, path, "", ""))  # the signature and token dropped
        if len(self._urls) >= MAX_URLS:
            self._urls.clear()
        self._urls[(bucket, key)] = url
        self.resolved += 1
        return url

    def _signer(self, client: Any) -> SigV4Signer | None:
        """The signer of ``client``'s requests (None: an anonymous client, unsigned)."""
        import botocore

        signer = client._request_signer
        if signer.signature_version is botocore.UNSIGNED:
            return None
        wanted = (signer.region_name, signer.signing_name)
        made = self._signers.get(wanted)
        if made is None:
            made = self._signers[wanted] = SigV4Signer(*wanted)
        return made

    def warm(self, client: Any, bucket: str) -> None:
        """Start opening the connection ``bucket``'s first range GET will use, if GETs go on
        own connections: called as a listing starts, its handshake hides behind the LIST's
        round trip. Once per getter; best effort (the first GET does it otherwise)."""
        if self._warming is None and self.direct and self.serves(client, bucket):
            self._warming = asyncio.ensure_future(self._warm(client, bucket))

    async def _warm(self, client: Any, bucket: str) -> None:
        with contextlib.suppress(Exception):  # (what failed here fails the first GET too)
            url = await self.url(client, bucket, _WARM_KEY)
            direct = await self._range_client(client, url)
            if direct is not None:
                direct.warm(url)

    def forget(self, bucket: str, key: str) -> None:
        """Make the next read of ``bucket/key`` resolve its url again (after an error answer)."""
        self._urls.pop((bucket, key), None)

    async def get(
        self,
        client: Any,
        bucket: str,
        key: str,
        start: int,
        end: int,
        version: str | None,
        name: str,
        extra: Mapping[str, str] | None = None,
    ) -> list[bytes]:
        """Bytes ``start:end`` of ``bucket/key`` (named ``name`` in errors) as pieces, the
        read pinned to ``version`` (an ETag) when given, with the ``extra`` headers (requester
        pays, SSE-C: signed with the rest). Raises botocore's and aiohttp's
        exceptions for the transport, streamrec errors for error answers, and
        :class:`UseGetObject` when the bucket is to be read with ``get_object``."""
        action = f"reading bytes {start}-{end - 1}"
        headers = range_headers(start, end, version)
        headers.update(extra or {})
        url = await self.url(client, bucket, key)
        signed = await _signed(client, url, headers, self._signer(client))
        direct = await self._range_client(client, url) if self.direct else None
        if direct is not None:
            try:
                answer = await direct.get(url, signed, end - start, ERROR_BODY_BYTES)
            except Unsupported:
                self.direct = False  # the session reads what these connections do not
            except BodyTooLong as exc:
                raise StorageError(f"{name}: {action}: {exc}") from None
            except BadAnswer as exc:
                raise TransientStorageError(f"{name}: {action}: {exc}") from None
            else:
                status, body = answer.status, answer.pieces
                if status in (200, 206):
                    check_range(status, answer.headers.get("content-length"), start, end, name)
                    return body
                location = answer.headers.get("location")
                return self._refused(status, b"".join(body), bucket, key, name, action, location)
        response = await client._endpoint.http_session.send(_prepared(url, signed))
        raw = response.raw
        try:
            status = response.status_code
            if status in (200, 206):
                check_range(status, response.headers.get("Content-Length"), start, end, name)
                pieces = await read_pieces(raw.content, limit=end - start, what=f"{name}: {action}")
                raw.release()
                return pieces
            error_body: bytes = await raw.content.read(ERROR_BODY_BYTES)
            location = response.headers.get("location")
        finally:
            raw.close()  # no-op once released; drops a connection left mid-body
        return self._refused(status, error_body, bucket, key, name, action, location)

    def _refused(
        self,
        status: int,
        body: bytes,
        bucket: str,
        key: str,
        name: str,
        action: str,
        location: str | None = None,
    ) -> list[bytes]:
        """Raise the error for an error answer (``status``, the start of its ``body``, its
        ``Location`` header)."""
        self.forget(bucket, key)
        code_text, detail = error_code(body)
        if status in (301, 307) or code_text in _ELSEWHERE_CODES:
            self._elsewhere.add(bucket)
            raise UseGetObject(bucket)  # (botocore's region redirector, or the error below)
        if status in REDIRECT_STATUSES:
            raise redirected(status, location, name, action)  # never followed
        raise from_error_code(code_text, status, name, action, detail)

    async def _range_client(self, client: Any, url: str) -> RangeClient | None:
        """The client's own connections for ``url``, or None when its session's settings are
        ones they do not follow (proxies, socket options, connector arguments)."""
        scheme = url.split(":", 1)[0]
        kept = self._clients.get((id(client), scheme))
        if kept is not None:
            return kept
        http = client._endpoint.http_session
        proxies = getattr(http, "_proxy_config", None)
        timeout = getattr(http, "_timeout", None)
        if (
            proxies is None
            or proxies.proxy_url_for(url)
            or any(option != _NODELAY for option in getattr(http, "_socket_options", None) or ())
            or set(getattr(http, "_connector_args", None) or {}) - {"keepalive_timeout"}
            or not hasattr(http, "_build_ssl_contexts")
            or timeout is None
        ):
            self.direct = False
            return None
        context = None
        if scheme == "https":
            context = (await asyncio.to_thread(http._build_ssl_contexts, None))[0]
        made = RangeClient(context, timeout.sock_connect, timeout.sock_read)
        if any(owner != id(client) for owner, _ in self._clients):
            self.close()  # the store's client was replaced: the old one's connections go
        self._clients[(id(client), scheme)] = made
        return made

    def close(self) -> None:
        """Close the idle connections of the range GETs (and stop opening any)."""
        warming, self._warming = self._warming, None
        if warming is not None:
            warming.cancel()
        clients, self._clients = self._clients, {}
        for made in clients.values():
            made.close()

    async def aclose(self) -> None:
        """:meth:`close`, and wait until what was opening has stopped."""
        opening: list[asyncio.Future[Any]] = [] if self._warming is None else [self._warming]
        for made in self._clients.values():
            opening += made.opening()
        self.close()
        await cancel_and_wait(opening)


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


async def _signed(
    client: Any, url: str, headers: dict[str, str], signer: SigV4Signer | None
) -> dict[str, str]:
    """``headers`` for a GET of ``url`` signed as the client signs (SigV4 headers with its
    current credentials, by ``signer``: see :mod:`streamrec.storage.s3.sigv4`), or as they are
    for an anonymous client (``signer`` None)."""
    from botocore.exceptions import NoCredentialsError

    if signer is None:
        return headers
    credentials = client._request_signer._credentials
    frozen = None if credentials is None else await credentials.get_frozen_credentials()
    if frozen is None or frozen.access_key is None:
        raise NoCredentialsError()
    return signer.sign_get(url, headers, frozen.access_key, frozen.secret_key, frozen.token)


def _prepared(url: str, headers: dict[str, str]) -> Any:
    """The GET as botocore's HTTP session sends it (as ``get_object``'s request would be)."""
    from botocore.awsrequest import AWSPreparedRequest, HeadersDict

    return AWSPreparedRequest("GET", url, HeadersDict(headers), None, True)
