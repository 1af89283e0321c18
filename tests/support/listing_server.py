"""A small S3 server whose listing pages a test writes: what a broken or hostile store sends.

It answers ``ListObjectsV2`` (``GET /bucket?list-type=2...``) with the pages of
:attr:`ListingServer.pages` (a function of the prefix, the continuation token and
``max-keys``: the keys of the page and its next token), or with :attr:`ListingServer.raw`'s
bytes where that returns some, and range GETs of its objects (``206`` with
``Content-Range`` and an ETag). Every object GET and every answer to one is logged in order
(:attr:`ListingServer.gets`), and :meth:`ListingServer.hold` keeps an object's answers back
until the log shows what a test waits for. Every listing request is recorded (its
continuation token);
:attr:`ListingServer.fail` makes chosen ones answer 503, and ``delay_s`` slows every page (a
slow link). It is a real HTTP peer for the store's direct requests and its aiobotocore
client alike (nothing is checked of the signature).

    with ListingServer({"d/a.tfrecord": data}) as server:
        server.pages = lambda prefix, token, max_keys: (["d/a.tfrecord"], None)
        open_dataset("s3://bkt/d/*", storage_options=server.storage_options)
"""

from __future__ import annotations

import contextlib
import hashlib
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from support.servers import LOOPBACK

__all__ = ["BUCKET", "ListingServer", "honest_pages"]

BUCKET = "bkt"
Pages = Callable[[str, "str | None", int], "tuple[list[str], str | None]"]


def honest_pages(keys: list[str]) -> Pages:
    """The pages a correct store lists: ``keys`` under the prefix in order, ``max-keys`` a
    page, the next page's token the index it starts at."""

    def pages(prefix: str, token: str | None, max_keys: int) -> tuple[list[str], str | None]:
        under = sorted(k for k in keys if k.startswith(prefix))
        start = int(token or 0)
        end = start + max_keys
        return under[start:end], (str(end) if end < len(under) else None)

    return pages


class ListingServer:
    """See the module docstring. ``objects``: key -> bytes."""

    def __init__(self, objects: dict[str, bytes], tls: ssl.SSLContext | None = None) -> None:
        self.objects = dict(objects)
        self.tls = tls
        """A server context: answered over TLS (``https://``)."""
        self.pages: Pages = honest_pages(list(self.objects))
        self.raw: Callable[[str | None], bytes | None] = lambda token: None
        self.fail: Callable[[str | None, int], bool] = lambda token, seen: False
        """``fail(token, n)``: answer the ``n``-th request (from 1) of that page with 503."""
        self.delay_s = 0.0
        self.listed: list[str | None] = []  # the continuation token of each listing request
        self.delimiters: list[str | None] = []  # the delimiter each one asked for (None: none)
        self._lock = threading.Lock()
        self.gets: list[tuple[str, str]] = []
        """``("get", key)`` as each object GET arrives, ``("answer", key)`` as its answer
        goes out, in order."""
        self._held: dict[str, tuple[Callable[[list[tuple[str, str]]], bool], float]] = {}
        self.hold_timeouts: list[str] = []  # keys whose answers were let go by the deadline
        self._changed = threading.Condition(self._lock)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        assert self._server is not None
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{LOOPBACK}:{self._server.server_address[1]}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """Options with which the store lists and reads without its client."""
        return {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": self.endpoint_url}}

    @property
    def client_storage_options(self) -> dict[str, Any]:
        """Options with which the store lists and reads through its aiobotocore client (a
        setting the direct requests do not follow)."""
        return {**self.storage_options, "config_kwargs": {"signature_version": "s3v4"}}

    def hold(
        self, key: str, until: Callable[[list[tuple[str, str]]], bool], timeout: float = 5.0
    ) -> None:
        """Answer GETs of ``key`` only once ``until(gets)`` holds (checked as each GET
        arrives); after ``timeout`` seconds they are answered anyway and the key noted in
        :attr:`hold_timeouts` (a deadline, so that a reader that never sends what is waited
        for fails the test instead of hanging it)."""
        with self._lock:
            self._held[key] = (until, timeout)

    def _log_get(self, key: str) -> None:
        with self._changed:
            self.gets.append(("get", key))
            self._changed.notify_all()
            held = self._held.get(key)
            if held is not None:
                until, timeout = held
                if not self._changed.wait_for(lambda: until(self.gets), timeout=timeout):
                    self.hold_timeouts.append(key)
            self.gets.append(("answer", key))

    def start(self) -> ListingServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                owner._answer(self)

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        if self.tls is not None:  # (a failed handshake: an error of accept(), dropped)
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> ListingServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ answers

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        split = urlsplit(handler.path)
        query = {k: v[0] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        bucket, _, key = unquote(split.path).lstrip("/").partition("/")
        if bucket != BUCKET:
            return _send(handler, 404, _error("NoSuchBucket"))
        if "list-type" in query:
            return self._list(handler, query)
        data = self.objects.get(key)
        if data is None:
            return _send(handler, 404, _error("NoSuchKey"))
        self._log_get(key)
        etag = f'"{hashlib.md5(data).hexdigest()}"'
        start, end = 0, len(data)
        ranged = handler.headers.get("Range", "")
        if ranged.startswith("bytes="):
            first, _, last = ranged[6:].partition("-")
            start, end = int(first), min(int(last) + 1 if last else len(data), len(data))
        headers = {"ETag": etag}
        if ranged:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        _send(handler, 206 if ranged else 200, data[start:end], headers)

    def _list(self, handler: BaseHTTPRequestHandler, query: dict[str, str]) -> None:
        token = query.get("continuation-token")
        with self._lock:
            self.listed.append(token)
            self.delimiters.append(query.get("delimiter"))
            seen = self.listed.count(token)
        if self.delay_s:
            time.sleep(self.delay_s)  # (the server's own pace: a slow link)
        if self.fail(token, seen):
            return _send(handler, 503, _error("SlowDown"))
        raw = self.raw(token)
        if raw is not None:
            return _send(handler, 200, raw)
        prefix = query.get("prefix", "")
        max_keys = int(query.get("max-keys", "1000"))
        keys, after = self.pages(prefix, token, max_keys)
        encode = quote if query.get("encoding-type") == "url" else (lambda text: text)
        fields = [
            ("Name", BUCKET),
            ("Prefix", encode(prefix)),
            ("Delimiter", encode(query.get("delimiter", ""))),
            ("MaxKeys", str(max_keys)),
            ("KeyCount", str(len(keys))),
            ("IsTruncated", "true" if after is not None else "false"),
        ]
        if query.get("encoding-type") == "url":
            fields.append(("EncodingType", "url"))
        if token is not None:
            fields.append(("ContinuationToken", token))
        if after is not None:
            fields.append(("NextContinuationToken", after))
        body = "".join(f"<{name}>{value}</{name}>" for name, value in fields)
        for key in keys:
            data = self.objects.get(key, b"")
            etag = f"&quot;{hashlib.md5(data).hexdigest()}&quot;"
            body += (
                f"<Contents><Key>{encode(key)}</Key><Size>{len(data)}</Size>"
                f"<ETag>{etag}</ETag><StorageClass>STANDARD</StorageClass></Contents>"
            )
        _send(
            handler,
            200,
            (
                '<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult '
                f'xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{body}</ListBucketResult>'
            ).encode(),
        )


def _error(code: str) -> bytes:
    return f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>m</Message></Error>".encode()


def _send(
    handler: BaseHTTPRequestHandler,
    status: int,
    body: bytes,
    headers: dict[str, str] | None = None,
) -> None:
    handler.send_response(status)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.send_header("Content-Type", "application/xml")
    handler.end_headers()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError, ssl.SSLError):
        handler.wfile.write(body)  # (the client may refuse a page before its end)
