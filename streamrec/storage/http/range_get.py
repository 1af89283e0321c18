"""HTTP/1.1 range GETs whose bodies land straight in the ``bytes`` pieces they are handed out as.

Why: aiohttp reads each socket chunk into a fresh ``bytes``, its parser copies the body out of
that, and every chunk is a round of Python (``feed_data``, ``readany``); on loopback that was
~0.33 s of CPU per GB before a record was decoded, half of the reader's cost. Here a range
GET's body is received with asyncio's ``BufferedProtocol`` straight into :data:`PIECE_BYTES`
pieces: the kernel copies each byte once, into the ``bytes`` object the decoder gets (the C
``Receiver``; without the C accelerator a ``bytearray`` copied once more), with one Python call
per socket read (measured in benchmarks/README.md, bench_cpu.py).

What it does, and nothing more: a GET with the caller's (signed) headers on a pooled
keep-alive connection (plain or TLS with the caller's ``SSLContext``), one request per
connection at a time; a status line and headers of at most :data:`HEAD_BYTES`; a success body
(2xx) of at most the ``limit`` asked for, by Content-Length (more is :class:`BodyTooLong`
before a byte of it is kept); an error body of at most ``error_limit`` bytes. A body is the
bytes sent (a stored ``Content-Encoding`` is not undone: the object's bytes, as the session's
reads give them).

A chunked body (AWS S3's listing pages) is decoded as it arrives by
:mod:`streamrec.storage.http.chunked` (bounds and memory stated there: at most the decoded
bytes + :data:`PIECE_BYTES` + 2 * :data:`HEAD_BYTES`), received into the header buffer (grown
to :data:`HEAD_BYTES`), bounded by the same limits; another transfer coding of a success body
is :class:`BadAnswer` (an error body's is not read). Content-Length bodies never take that path.

Everything the server sends is checked before it is followed: a malformed status line or
header, a second Content-Length that disagrees, headers past :data:`HEAD_BYTES`, an interim
(1xx) answer are :class:`BadAnswer`; a connection closed or cut mid-answer is
``ConnectionResetError``; no byte for ``read_timeout_s`` (checked every ``read_timeout_s``, so
a stall is noticed within twice that) or no connection within ``connect_timeout_s`` is
``TimeoutError``. A connection whose answer was not read to its end exactly (an error, a
cancel, bytes past the body, ``Connection: close``) is closed, never reused.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from streamrec.format.accel import load_accelerator
from streamrec.storage.http.body import too_long
from streamrec.storage.http.chunked import ChunkedBody, ChunkError, ChunkTooLong

__all__ = [
    "HEAD_BYTES",
    "PIECE_BYTES",
    "Answer",
    "BadAnswer",
    "BodyTooLong",
    "RangeClient",
]

PIECE_BYTES = 1 << 20
"""Most bytes of a body piece: big enough that a piece costs little Python, small enough that
malloc reuses its memory (fresh 4 MiB objects were page faults: +0.15 s of CPU per GB)."""
HEAD_BYTES = 64 << 10
"""Most bytes of a status line and headers."""
FIRST_HEAD_BYTES = 4 << 10
"""What a connection's header buffer starts at (grown up to :data:`HEAD_BYTES` for an answer
whose headers need it): a read of many shards side by side keeps hundreds of connections."""
MAX_IDLE = 64
"""Most idle connections kept per host."""
MAX_KEPT = 96
"""Most :data:`PIECE_BYTES` pieces kept to be filled again once nothing else refers to them
(the C ``Receiver``): malloc hands fresh megabytes out as fresh pages, a page fault per 4 KiB
(+0.1 s of CPU per GB measured). A piece is kept only when every kept one is in use, so they
are never more than were alive at once (what the reads' budget allowed: 64 at the default
``prefetch_bytes``); :meth:`RangeClient.close` drops them."""

_cread = load_accelerator("_cread", "streamrec.storage")
_DEFAULT_PORTS = {"http": 80, "https": 443}


class BadAnswer(Exception):
    """The server's answer is not HTTP/1.1 as this client reads it (the caller names the
    object: a transient storage error)."""


class BodyTooLong(Exception):
    """A success body longer than the range asked for (the caller names the object: a storage
    error, not retried)."""


@dataclass
class Answer:
    """A server's answer: its status, headers (names lower-cased) and body pieces (an error
    answer's: its first ``error_limit`` bytes)."""

    status: int
    headers: dict[str, str]
    pieces: list[bytes]
    head_s: float = 0.0
    """Seconds from asking (a new connection's set-up included) to the answer's headers."""


def _buffer(length: int, kept: list[bytes]) -> tuple[Any, memoryview]:
    """A piece of ``length`` bytes to receive into (one of ``kept`` that nothing else refers
    to, or a fresh one), and a writable view of it."""
    if _cread is not None:
        if length == PIECE_BYTES:
            receiver = _cread.Receiver(length, kept, MAX_KEPT)
        else:
            receiver = _cread.Receiver(length)
        return receiver, memoryview(receiver)
    target = bytearray(length)
    return target, memoryview(target)


def _finished(target: Any) -> bytes:
    payload: bytes = target.payload if _cread is not None else bytes(target)
    return payload


class _Connection(asyncio.BufferedProtocol):
    """One HTTP/1.1 connection: one answer read at a time, straight into its pieces."""

    def __init__(self, kept: list[bytes]) -> None:
        self._kept = kept
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.received = 0  # bytes received in all (the read timeout's progress)
        self.head_at = 0.0  # the clock when the last answer's headers were read
        self._head = bytearray(FIRST_HEAD_BYTES)
        self._head_view = memoryview(self._head)
        self._head_len = 0
        self._waiter: asyncio.Future[Answer] | None = None
        self._limit = 0
        self._error_limit = 0
        self._answer: Answer | None = None
        self._reusable = False
        self._to_eof = False
        self._left = 0  # body bytes still to come
        self._target: Any = None
        self._view: memoryview | None = None
        self._chunks: ChunkedBody | None = None  # a chunked body being read
        self._chunks_reusable = False
        self._filled = 0
        self._watch: asyncio.TimerHandle | None = None

    # ---------------------------------------------------------------- asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._view is not None:
            return self._view[self._filled :]
        return self._head_view[self._head_len :]

    def buffer_updated(self, nbytes: int) -> None:
        self.received += nbytes
        if self._waiter is None or self._waiter.done():
            self._head_len = 0  # bytes nobody asked for: this connection is done
            self.close()
            return
        if self._view is not None:
            self._body_received(nbytes)
            return
        self._head_len += nbytes
        try:
            if self._chunks is not None:  # (received into the header buffer)
                self._read_chunks(0)
            else:
                self._read_head(self._head_len - nbytes)
        except (BadAnswer, BodyTooLong) as exc:
            self._fail(exc)

    def eof_received(self) -> bool:
        if self._answer is not None and self._to_eof and self._waiter is not None:
            self._reusable = False
            self._finish_piece()
            self._complete()
        else:
            self._fail(ConnectionResetError("the server closed the connection mid-answer"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        error = ConnectionResetError("the connection was closed mid-answer")
        error.__cause__ = exc
        self._fail(error)

    # ---------------------------------------------------------------- the client's side

    def request(
        self, data: bytes, limit: int, error_limit: int, read_timeout_s: float | None
    ) -> asyncio.Future[Answer]:
        """Send ``data`` (a whole request); the answer's future (TimeoutError when no byte
        arrives for ``read_timeout_s``)."""
        assert self.transport is not None and self._waiter is None
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self._limit, self._error_limit = limit, error_limit
        if read_timeout_s is not None:
            self._watch = loop.call_later(read_timeout_s, self._check, read_timeout_s, -1)
        self.transport.write(data)
        return self._waiter

    def _check(self, timeout_s: float, seen: int) -> None:
        """The read timeout: no byte since the last check fails the answer."""
        if self.received == seen:
            self._fail(TimeoutError(f"no byte received for {timeout_s} s"))
            return
        self._watch = asyncio.get_running_loop().call_later(
            timeout_s, self._check, timeout_s, self.received
        )

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # ---------------------------------------------------------------- reading an answer

    def _read_head(self, searched: int) -> None:
        end = self._head.find(b"\r\n\r\n", max(0, searched - 3), self._head_len)
        if end < 0:
            if self._head_len >= HEAD_BYTES:
                raise BadAnswer(f"the answer's headers are longer than {HEAD_BYTES} bytes")
            if self._head_len == len(self._head):  # full: room for longer headers (a new
                # buffer: the transport may still hold a view of this one)
                grown = bytearray(min(2 * len(self._head), HEAD_BYTES))
                grown[: self._head_len] = self._head_view[: self._head_len]
                self._head, self._head_view = grown, memoryview(grown)
            return
        status, headers, keep_alive = _parse_head(bytes(self._head_view[:end]))
        extra = self._head_view[end + 4 : self._head_len]
        self._answer = Answer(status, headers, [])
        self.head_at = time.perf_counter()
        success = 200 <= status < 300
        length = _content_length(headers)
        limit = self._limit if success else self._error_limit
        if status in (204, 304):
            length = 0
        elif "transfer-encoding" in headers:
            if _chunked(headers["transfer-encoding"], success):
                # (a Content-Length beside it is overridden, and the connection not trusted)
                self._start_chunks(limit, success, keep_alive and length is None, end + 4)
                return
            length, keep_alive = 0, False  # an error body of unknown length: not read
        if success and length is not None and length > limit:
            raise BodyTooLong(too_long(limit))
        if length is None:  # the body ends with the connection (a success body: one byte
            # more than the limit is the error, so its room is limit + 1)
            self._to_eof, keep_alive = True, False
            length = limit + 1 if success else limit
        elif length > limit:  # an error body: its start is enough
            length, keep_alive = limit, False
        self._left = length
        self._head_len = 0
        if not length:
            self._reusable = keep_alive and not extra
            self._advance()
            return
        self._new_piece()
        assert self._view is not None
        taken = min(len(extra), length)  # fits: <= min(length, HEAD_BYTES) <= the piece
        self._view[:taken] = extra[:taken]
        self._reusable = keep_alive and taken == len(extra)
        self._body_received(taken)

    def _start_chunks(self, limit: int, success: bool, keep_alive: bool, start: int) -> None:
        """Read a chunked body, its first bytes at ``start`` in the header buffer."""
        self._chunks = ChunkedBody(
            limit, cut=not success, piece_bytes=PIECE_BYTES, trailer_bytes=HEAD_BYTES
        )
        self._chunks_reusable = keep_alive
        if not self._read_chunks(start) and len(self._head) < HEAD_BYTES:
            # a new buffer (the transport may still hold a view of this one), empty now
            self._head = bytearray(HEAD_BYTES)
            self._head_view = memoryview(self._head)

    def _read_chunks(self, start: int) -> bool:
        """Decode the header buffer's bytes from ``start``; True once the body has ended."""
        assert self._chunks is not None and self._answer is not None
        try:
            ended = self._chunks.feed(self._head, start, self._head_len)
        except ChunkTooLong:
            raise BodyTooLong(too_long(self._limit)) from None
        except ChunkError as exc:
            raise BadAnswer(str(exc)) from None
        if ended < 0:
            self._head_len = 0  # all used: receive into the whole buffer again
            return False
        chunks, self._chunks = self._chunks, None
        self._answer.pieces = chunks.pieces()
        # reused only when the answer ended exactly at its end (nothing after, nothing left)
        self._reusable = self._chunks_reusable and ended == self._head_len and not chunks.cut_short
        self._head_len = 0
        if len(self._head) > FIRST_HEAD_BYTES:  # (back to a small one for the next answer)
            self._head = bytearray(FIRST_HEAD_BYTES)
            self._head_view = memoryview(self._head)
        self._complete()
        return True

    def _body_received(self, nbytes: int) -> None:
        self._filled += nbytes
        self._left -= nbytes
        self._advance()

    def _advance(self) -> None:
        if self._view is not None and self._filled == len(self._view):
            self._finish_piece()
            if self._left > 0:
                self._new_piece()
        if self._left > 0:
            return  # more to come
        if self._to_eof and self._answer is not None and 200 <= self._answer.status < 300:
            self._fail(BodyTooLong(too_long(self._limit)))  # a byte past the limit arrived
            return
        self._complete()

    def _new_piece(self) -> None:
        self._target, self._view = _buffer(min(self._left, PIECE_BYTES), self._kept)
        self._filled = 0

    def _finish_piece(self) -> None:
        if self._view is None:
            return
        view, self._view = self._view, None
        view.release()
        if self._answer is not None and self._filled:
            payload = _finished(self._target)
            if self._filled < len(payload):
                payload = payload[: self._filled]
            self._answer.pieces.append(payload)
        self._target = None

    def _stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def _complete(self) -> None:
        self._stop_watch()
        waiter, answer = self._waiter, self._answer
        self._waiter = self._answer = None
        self._to_eof = False
        if waiter is not None and not waiter.done() and answer is not None:
            waiter.set_result(answer)
        if not self._reusable:
            self.close()

    def _fail(self, error: BaseException) -> None:
        self._stop_watch()
        waiter = self._waiter
        self._waiter = self._answer = None
        self._view = self._target = None
        self._chunks = None
        self._reusable = False
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        self.close()


def _parse_head(head: bytes) -> tuple[int, dict[str, str], bool]:
    """``(status, headers, keep_alive)`` of a status line and headers (CRLF-separated)."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if (
        version not in ("HTTP/1.1", "HTTP/1.0")
        or not (code.isascii() and code.isdigit())
        or rest[3:4] not in ("", " ")
    ):
        raise BadAnswer(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
    status = int(code)
    if status < 200:
        raise BadAnswer(f"an unexpected interim answer: HTTP {status}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or not name.isascii():
            raise BadAnswer(f"a malformed header line: {line[:80]!r}")
        name, value = name.lower(), value.strip()
        if name in headers:
            if name == "content-length" and headers[name] != value:
                raise BadAnswer("two different Content-Length headers")
            value = headers[name] if name == "content-length" else f"{headers[name]}, {value}"
        headers[name] = value
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    keep_alive = "keep-alive" in tokens if version == "HTTP/1.0" else "close" not in tokens
    return status, headers, keep_alive


def _chunked(value: str, success: bool) -> bool:
    """True for a body in the chunked transfer coding alone (``value``: its
    Transfer-Encoding); a success body in another is a :class:`BadAnswer` (one this client does
    not undo), an error body's is not read (False)."""
    if [coding.strip().lower() for coding in value.split(",")] == ["chunked"]:
        return True
    if success:
        raise BadAnswer(f"a transfer coding this client does not read: {value[:80]!r}")
    return False


def _content_length(headers: Mapping[str, str]) -> int | None:
    value = headers.get("content-length")
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise BadAnswer(f"a malformed Content-Length: {value[:40]!r}")
    return int(value)


def _quiet(conn: _Connection) -> bool:
    """True when nothing waits on an idle connection's socket: bytes past its last answer
    (still unread when the body ended exactly at a read's end) or its end make it unusable."""
    transport = conn.transport
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None:
        return True
    probe = socket.socket(fileno=sock.fileno())  # a peek; the descriptor stays the transport's
    try:
        probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        probe.detach()
    return False


class RangeClient:
    """Pooled keep-alive connections for range GETs (see the module docstring). Bound to the
    event loop it is first used on; :meth:`close` closes every idle connection."""

    def __init__(
        self,
        ssl_context: ssl.SSLContext | None,
        connect_timeout_s: float | None,
        read_timeout_s: float | None,
    ) -> None:
        self._ssl = ssl_context
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._warming: dict[tuple[str, str, int], asyncio.Future[_Connection]] = {}
        self._kept: list[bytes] = []
        self._pid = os.getpid()
        self._closed = False

    def warm(self, url: str) -> None:
        """Open a connection to ``url``'s server ahead of the first GET, pooled for it: its
        handshake (TCP, TLS) goes on beside what the caller waits for meanwhile (a listing).
        Best effort: a connection that fails to open is the first GET's to open. Once a
        connection is pooled or opening for the server, nothing more."""
        split = urlsplit(url)
        scheme, host = split.scheme, split.hostname
        port = split.port or _DEFAULT_PORTS.get(scheme)
        if host is None or port is None or scheme not in _DEFAULT_PORTS or self._closed:
            return
        key = (scheme, host, port)
        if key in self._warming or self._idle.get(key):
            return
        opening = asyncio.ensure_future(self._connect(scheme, host, port))
        self._warming[key] = opening
        opening.add_done_callback(lambda done: self._warmed(key, done))

    def opening(self) -> list[asyncio.Future[_Connection]]:
        """The connections :meth:`warm` is still opening."""
        return list(self._warming.values())

    def _warmed(self, key: tuple[str, str, int], opening: asyncio.Future[_Connection]) -> None:
        if self._warming.get(key) is opening:
            del self._warming[key]
        if opening.cancelled() or opening.exception() is not None:
            return  # (its error is the first GET's to meet, if it persists)
        conn = opening.result()
        if self._closed or os.getpid() != self._pid:
            conn.close()
        else:
            self._put(key, conn)

    async def get(
        self,
        url: str,
        headers: Mapping[str, str],
        limit: int,
        error_limit: int,
        on_sent: Callable[[], object] | None = None,
    ) -> Answer:
        """GET ``url`` with ``headers`` (``Host`` added), its success body of at most
        ``limit`` bytes, an error body's first ``error_limit``; ``on_sent`` is called once the
        request is written."""
        split = urlsplit(url)
        scheme, netloc, path, query = split.scheme, split.netloc, split.path, split.query
        host, port = split.hostname, split.port or _DEFAULT_PORTS.get(scheme)
        if host is None or port is None or scheme not in _DEFAULT_PORTS:
            raise ValueError(f"not an http(s) url: {url}")
        if split.port == _DEFAULT_PORTS[scheme]:
            netloc = netloc.rsplit(":", 1)[0]  # as the request was signed: no default port
        lines = [f"GET {path or '/'}{'?' + query if query else ''} HTTP/1.1", f"Host: {netloc}"]
        for name, value in headers.items():
            if any(c in name or c in value for c in "\r\n\0"):
                raise ValueError(f"a header with a line break: {name!r}")
            lines.append(f"{name}: {value}")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        key = (scheme, host, port)
        asked = time.perf_counter()
        opening = self._warming.get(key)
        if opening is not None:  # warm(): its connection is pooled once open (or failed)
            await asyncio.wait([opening])
        stale = False
        while True:
            conn, reused = (None if stale else self._take(key)), True
            if conn is None:
                conn, reused = await self._connect(scheme, host, port), False
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                if stale:  # closed by the server before a request went out, twice
                    raise ConnectionResetError("the server closed the connection at once")
                stale = True  # (an overloaded server's early answer or hang-up): once more
                continue
            received = conn.received
            try:
                answering = conn.request(data, limit, error_limit, self._read_timeout_s)
                if on_sent is not None:
                    on_sent()
                answer = await answering
            except ConnectionResetError:
                if reused and conn.received == received:
                    stale = True  # an idle connection the server had closed: a fresh one
                    continue
                raise
            except BaseException:
                conn.close()  # cancelled or failed mid-answer: never reused
                raise
            if not conn.closed:
                self._put(key, conn)
            answer.head_s = conn.head_at - asked
            return answer

    def close(self) -> None:
        """Close every idle connection (of this process: a forked child's are its parent's)
        and give up those still opening (:meth:`warm`)."""
        self._closed = True
        warming, self._warming = self._warming, {}
        idle, self._idle = self._idle, {}
        self._kept.clear()
        if os.getpid() != self._pid:
            return
        for opening in warming.values():
            opening.cancel()  # (its done callback closes a connection that opened anyway)
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def _take(self, key: tuple[str, str, int]) -> _Connection | None:
        if os.getpid() != self._pid:  # forked: the parent's sockets are not ours to use
            self._idle, self._pid = {}, os.getpid()
        conns = self._idle.get(key)
        while conns:
            conn = conns.pop()
            if not conn.closed and _quiet(conn):
                return conn
            conn.close()
        return None

    def _put(self, key: tuple[str, str, int], conn: _Connection) -> None:
        conns = self._idle.setdefault(key, [])
        if len(conns) >= MAX_IDLE or self._closed:  # (an answer read after close: not kept)
            conn.close()
        else:
            conns.append(conn)

    async def _connect(self, scheme: str, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = self._ssl if scheme == "https" else None
        if scheme == "https" and tls is None:
            tls = ssl.create_default_context()
        connecting = loop.create_connection(
            lambda: _Connection(self._kept),
            host,
            port,
            ssl=tls,
            server_hostname=host if tls else None,
        )
        if self._connect_timeout_s is None:
            _, conn = await connecting
        elif sys.version_info >= (3, 11):  # wait_for of 3.10 and 3.11 can swallow a cancel
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await connecting
        else:  # pragma: no cover - Python 3.10
            _, conn = await asyncio.wait_for(connecting, self._connect_timeout_s)
        return conn
