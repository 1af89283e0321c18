"""S3 range GETs at a fraction of botocore's CPU cost per request: presigned once per object,
sent through the client's own HTTP session.

A ``get_object`` call costs ~1.1 ms of CPU in aiobotocore (parameter validation, endpoint
rules, ~20 event hooks, signing, response parsing) whatever the size of the range; at 4 MiB
blocks that was a fifth of the reader's CPU per byte on loopback. :class:`RangeGetter` asks
botocore once per object (and again after :data:`URL_REUSE_S`) for a presigned ``GetObject``
url (``generate_presigned_url``: the same endpoint resolution, addressing style, credentials
and signature version as ``get_object``; refreshable credentials are refreshed by it), and
sends each range GET of that object on it, with ``Range`` and ``If-Match`` as plain headers,
through the client's aiobotocore HTTP session (its connection pool, TLS settings, proxies and
timeouts): ~0.3 ms per request.

What stays as it was: one attempt per call (streamrec's retry policy above decides), the
version pinned with ``If-Match`` (412 -> ObjectChangedError), errors translated by type -
transport errors are aiobotocore's (``send`` raises botocore's exception types), S3 error
answers by their ``<Code>`` (:func:`~streamrec.storage.translate.from_error_code`, as
botocore's ClientError would be). A client this cannot serve (not aiobotocore's, a directory
bucket) goes on with ``get_object``.
"""

from __future__ import annotations

import re
import time
from typing import Any

from streamrec.errors import StorageError
from streamrec.storage.body import read_pieces
from streamrec.storage.translate import from_error_code

__all__ = ["ERROR_BODY_BYTES", "URL_EXPIRES_S", "URL_REUSE_S", "RangeGetter"]

URL_EXPIRES_S = 3600
"""How long a presigned url is valid."""
URL_REUSE_S = 300
"""How long one presigned url serves an object's reads: well within its validity and within
botocore's refresh margin of temporary credentials (10 minutes before they expire, a url
signed now carries a token valid for 10 more), so no url in use outlives its credentials."""
MAX_URLS = 4096
"""Most objects' urls kept (all dropped when full: a url costs one presign to make again)."""
ERROR_BODY_BYTES = 64 << 10
"""Most bytes of an error answer read (for its Code and Message)."""

_CODE = re.compile(rb"<Code>([^<]{1,100})</Code>")
_MESSAGE = re.compile(rb"<Message>([^<]{0,400})</Message>")


class RangeGetter:
    """Range GETs of one S3 client's objects on presigned urls (see the module docstring)."""

    def __init__(self) -> None:
        self._urls: dict[tuple[str, str], tuple[str, float]] = {}
        self.presigned = 0  # how many urls were made (for tests)

    @staticmethod
    def serves(client: Any, bucket: str) -> bool:
        """True when ``client``'s range GETs of ``bucket`` can go this way."""
        endpoint = getattr(client, "_endpoint", None)
        return (
            hasattr(getattr(endpoint, "http_session", None), "send")
            and hasattr(client, "generate_presigned_url")
            and not bucket.endswith("--x-s3")  # directory buckets sign with session tokens
        )

    async def url(self, client: Any, bucket: str, key: str) -> str:
        """A presigned GetObject url for ``bucket/key``, made at most :data:`URL_REUSE_S` ago."""
        now = time.monotonic()
        kept = self._urls.get((bucket, key))
        if kept is not None and now - kept[1] < URL_REUSE_S:
            return kept[0]
        url: str = await client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=URL_EXPIRES_S
        )
        if len(self._urls) >= MAX_URLS:
            self._urls.clear()
        self._urls[(bucket, key)] = (url, now)
        self.presigned += 1
        return url

    def forget(self, bucket: str, key: str) -> None:
        """Make the next read of ``bucket/key`` presign again (after an error answer: a retry
        then goes with fresh credentials and a fresh signing time)."""
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
    ) -> list[bytes]:
        """Bytes ``start:end`` of ``bucket/key`` (named ``name`` in errors) as pieces, the
        read pinned to ``version`` (an ETag) when given. Raises botocore's and aiohttp's
        exceptions for the transport, streamrec errors for error answers."""
        from botocore.awsrequest import AWSPreparedRequest

        headers = {"Range": f"bytes={start}-{end - 1}"}
        if version:
            headers["If-Match"] = version
        url = await self.url(client, bucket, key)
        request = AWSPreparedRequest("GET", url, headers, None, True)
        response = await client._endpoint.http_session.send(request)
        raw = response.raw
        try:
            if response.status_code in (200, 206):
                pieces = await read_pieces(raw.content)
                raw.release()
                return pieces
            body: bytes = await raw.content.read(ERROR_BODY_BYTES)
        finally:
            raw.close()  # no-op once released; drops a connection left mid-body
        self.forget(bucket, key)  # a refused, expired or skewed url is not used again
        raise _error(response.status_code, body, name, f"reading bytes {start}-{end - 1}")


def _error(status: int, body: bytes, name: str, action: str) -> StorageError:
    code = _CODE.search(body)
    message = _MESSAGE.search(body)
    return from_error_code(
        code.group(1).decode("utf-8", "replace") if code else "",
        status,
        name,
        action,
        message.group(1).decode("utf-8", "replace") if message else "",
    )
