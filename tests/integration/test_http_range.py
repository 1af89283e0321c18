"""streamrec.storage.http.range_get's range GETs against scripted loopback servers: bodies exact in
``bytes`` pieces of at most PIECE_BYTES, keep-alive reuse (and when a connection must not be
reused: ``Connection: close``, HTTP/1.0, an error body cut short, bytes past the body, a read
timeout, a cancel), the retry of a stale idle connection, the limits (BodyTooLong at once,
bodies ending with the connection), malformed answers (BadAnswer), chunked bodies (decoded
whatever the split, bounded, malformed framing, keep-alive), header injection, the safety of
refilled pieces (C ``Receiver``; plain ``bytes`` in pure-Python mode), and S3Store's use of it
(chunked answers, too-long bodies).

The servers are plain asyncio sockets on 127.0.0.1 port 0 that count their connections, record
every request and play one scripted handler per request, in order; nothing waits on a sleep."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any

import pytest

from streamrec.errors import StorageError, TransientStorageError
from streamrec.storage.base import ObjectInfo
from streamrec.storage.http import range_get as http_range
from streamrec.storage.http.chunked import FRAMING_BYTES, LINE_BYTES
from streamrec.storage.http.range_get import (
    HEAD_BYTES,
    PIECE_BYTES,
    BadAnswer,
    BodyTooLong,
    RangeClient,
)
from streamrec.storage.s3.store import S3Store

GUARD_S = 10.0  # a bound on every wait (a hang fails the test), never a synchronisation
LIMIT = 8 << 20
ERROR_LIMIT = 1000
PARTIAL = "206 Partial Content"


def pattern(n: int, seed: int) -> bytes:
    """``n`` bytes that differ from every other seed's."""
    return random.Random(seed).randbytes(n)


Play = Callable[["Fake", bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


class Fake:
    """A loopback server: counts connections, records ``(connection, request head)`` and plays
    the n-th handler for the n-th request (True: read the connection's next request)."""

    def __init__(self, *plays: Play) -> None:
        self.plays = list(plays)
        self.connections = 0
        self.requests: list[tuple[int, bytes]] = []
        self.release = asyncio.Event()  # what stalled handlers wait for (set at cleanup)
        self.sent = asyncio.Event()  # a stalling handler has sent its bytes
        self.eof: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.url = ""
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Fake:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/bucket/key"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()

    def on(self, connection: int) -> list[int]:
        """Which requests (by position) came on ``connection``."""
        return [i for i, (number, _) in enumerate(self.requests) if number == connection]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number, self.connections = self.connections, self.connections + 1
        self._writers.append(writer)
        try:
            while len(self.requests) < len(self.plays):
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append((number, head))
                if not await self.plays[len(self.requests) - 1](self, head, reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def raw(data: bytes, then: str = "keep") -> Play:
    """Send ``data``; then read the next request (keep), close (close), reset (reset), hold
    the connection open until cleanup (stall) or until the client closes it (eof: noted in
    ``fake.eof``)."""

    async def play(
        fake: Fake, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        with contextlib.suppress(ConnectionError):
            writer.write(data)
            await writer.drain()
            fake.sent.set()
            if then == "stall":
                await fake.release.wait()
            elif then == "eof":
                await reader.read()
            elif then == "reset":
                writer.transport.abort()
        if then == "eof" and not fake.eof.done():
            fake.eof.set_result(None)
        return then == "keep"

    return play


def head_of(status: str = PARTIAL, headers: str = "", length: int | None = None) -> bytes:
    size = "" if length is None else f"Content-Length: {length}\r\n"
    return f"{status}\r\n{headers}{size}\r\n".encode()


def answer(body: bytes, *, status: str = PARTIAL, headers: str = "", extra: bytes = b"",
           then: str = "keep", length: bool = True) -> Play:  # fmt: skip
    """An answer with ``body`` (and its Content-Length unless not ``length``), then ``extra``."""
    if not status.startswith("HTTP/"):
        status = "HTTP/1.1 " + status
    return raw(head_of(status, headers, len(body) if length else None) + body + extra, then)


@pytest.fixture
async def client() -> AsyncIterator[RangeClient]:
    made = RangeClient(None, 5.0, None)  # no read timeout: no test depends on one
    yield made
    made.close()


@contextlib.contextmanager
def guard() -> Iterator[None]:
    """Cancel the current task after GUARD_S (a hang fails the test), without a task of its
    own in between (``wait_for`` would change the order the loop runs callbacks in)."""
    task = asyncio.current_task()
    assert task is not None
    handle = asyncio.get_running_loop().call_later(GUARD_S, task.cancel)
    try:
        yield
    finally:
        handle.cancel()


async def fetch(
    client: RangeClient, fake: Fake, limit: int = LIMIT, error_limit: int = ERROR_LIMIT
) -> http_range.Answer:
    with guard():  # awaited directly, as storage/s3/door.py does (wait_for adds a task hop)
        got = await client.get(fake.url, {"Range": "bytes=0-"}, limit, error_limit)
    assert all(type(piece) is bytes and 0 < len(piece) <= PIECE_BYTES for piece in got.pieces)
    return got


async def body(client: RangeClient, fake: Fake, limit: int = LIMIT) -> bytes:
    got = await fetch(client, fake, limit)
    assert got.status == 206
    return b"".join(got.pieces)


async def test_a_multi_piece_body_arrives_exact_in_bytes_pieces(client: RangeClient) -> None:
    data = pattern(5 * PIECE_BYTES // 2, 1)
    async with Fake(answer(data, headers="Content-Range: bytes 0-2621439/9999999\r\n")) as fake:
        got = await fetch(client, fake)
        request = fake.requests[0][1]
    assert [len(piece) for piece in got.pieces] == [PIECE_BYTES, PIECE_BYTES, PIECE_BYTES // 2]
    assert b"".join(got.pieces) == data
    assert got.headers["content-range"] == "bytes 0-2621439/9999999"
    port = fake.url.split(":")[2].split("/")[0]
    assert request == f"GET /bucket/key HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode() + (
        b"Range: bytes=0-\r\n\r\n"
    )


@pytest.mark.parametrize(
    ("status", "headers", "connections"),
    [
        ("HTTP/1.1 206 Partial Content", "", 1),
        ("HTTP/1.1 206 Partial Content", "Connection: close\r\n", 2),
        ("HTTP/1.0 206 Partial Content", "", 2),
        ("HTTP/1.0 206 Partial Content", "Connection: keep-alive\r\n", 1),
    ],
)
async def test_keep_alive_reuses_a_connection_only_when_the_answer_allows(
    client: RangeClient, status: str, headers: str, connections: int
) -> None:
    first, second = pattern(300_000, 2), pattern(200_000, 3)
    async with Fake(answer(first, status=status, headers=headers), answer(second)) as fake:
        assert await body(client, fake) == first
        assert await body(client, fake) == second
    assert fake.connections == connections
    assert [number for number, _ in fake.requests] == [0, connections - 1]


async def test_a_content_length_past_the_limit_fails_before_the_body(client: RangeClient) -> None:
    after = pattern(100, 4)
    async with Fake(raw(head_of("HTTP/1.1 206 OK", length=1000), "stall"), answer(after)) as fake:
        with pytest.raises(BodyTooLong):  # the body never comes, the connection stays open
            await fetch(client, fake, limit=999)
        assert await body(client, fake, limit=100) == after  # not on the refused connection
    assert fake.connections == 2


@pytest.mark.parametrize("past", [0, 1])
async def test_a_body_without_length_ends_with_the_connection(
    client: RangeClient, past: int
) -> None:
    limit = PIECE_BYTES + 1000
    data = pattern(limit + past, 5)
    then = "close" if past == 0 else "stall"  # one byte too many fails without the close
    async with Fake(answer(data, length=False, then=then), answer(b"next")) as fake:
        if past:
            with pytest.raises(BodyTooLong):
                await fetch(client, fake, limit=limit)
        else:
            got = await fetch(client, fake, limit=limit)
            assert [len(piece) for piece in got.pieces] == [PIECE_BYTES, 1000]
            assert b"".join(got.pieces) == data
        assert await body(client, fake) == b"next"
    assert fake.connections == 2


@pytest.mark.parametrize(
    "data",
    [
        head_of("HTTP/1.1 206 Partial Content", length=200_000) + b"h" * 100_000,  # mid-body
        b"HTTP/1.1 206 Partial Content\r\nContent-Len",  # mid-head
        b"",  # before any byte (a fresh connection: not retried)
    ],
    ids=["mid-body", "mid-head", "no-byte"],
)
async def test_a_connection_closed_mid_answer_is_a_reset(client: RangeClient, data: bytes) -> None:
    async with Fake(raw(data, "close")) as fake:
        with pytest.raises(ConnectionResetError):
            await fetch(client, fake)
    assert fake.connections == 1 and len(fake.requests) == 1


BAD_HEADS = {
    "too-long": b"HTTP/1.1 206 Partial Content\r\n"
    + b"".join(b"X-Pad-%05d: %s\r\n" % (i, b"p" * 100) for i in range(HEAD_BYTES // 100)),
    "garbage": b"SPDY/9 what\r\n\r\n",
    "no-code": b"HTTP/1.1 2x6 Partial\r\nContent-Length: 1\r\n\r\nx",
    "interim": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 206 Partial Content\r\n"
    b"Content-Length: 1\r\n\r\nx",
    "two-lengths": b"HTTP/1.1 206 Partial Content\r\nContent-Length: 1\r\n"
    b"Content-Length: 2\r\n\r\nxx",
    "non-digit-length": b"HTTP/1.1 206 Partial Content\r\nContent-Length: 1x\r\n\r\nx",
    "negative-length": b"HTTP/1.1 206 Partial Content\r\nContent-Length: -1\r\n\r\n",
    "no-colon": b"HTTP/1.1 206 Partial Content\r\nContent-Length 1\r\n\r\nx",
    "folded": b"HTTP/1.1 206 Partial Content\r\nX-A: 1\r\n X-B: 2\r\nContent-Length: 1\r\n\r\nx",
}


@pytest.mark.parametrize("name", list(BAD_HEADS))
async def test_a_malformed_head_is_a_bad_answer(client: RangeClient, name: str) -> None:
    async with Fake(raw(BAD_HEADS[name], "stall"), answer(b"after")) as fake:
        with pytest.raises(BadAnswer):
            await fetch(client, fake)
        assert await body(client, fake) == b"after"
    assert fake.connections == 2


CHUNKED = "Transfer-Encoding: chunked\r\n"


def encode(
    chunks: list[bytes], ext: bytes = b"", trailers: bytes = b"", upper: bool = False
) -> bytes:
    """``chunks`` in the chunked coding (each size line with ``ext``), then ``trailers``."""
    size = b"%X" if upper else b"%x"
    lines = [size % len(chunk) + ext + b"\r\n" + chunk + b"\r\n" for chunk in chunks]
    return b"".join(lines) + b"0" + ext + b"\r\n" + trailers + b"\r\n"


def split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def chunked_head(status: str = "HTTP/1.1 206 Partial Content", headers: str = "") -> bytes:
    return head_of(status, CHUNKED + headers)


TRAILERS = b"X-Checksum: abc\r\nX-Other: 1\r\n"
EXT = b';name=value;q="a b" ; x'
CHUNKINGS = {
    "one": (pattern(5000, 50), 5000, b"", b""),
    "several": (pattern(300_000, 51), 70_000, b"", b""),
    "tiny": (pattern(2000, 52), 1, b"", b""),
    "extensions-trailers": (pattern(10_000, 53), 999, EXT, TRAILERS),
    "multi-piece": (pattern(2 * PIECE_BYTES + 1000, 54), 300_000, b"", b""),
    "empty": (b"", 1, b"", TRAILERS),
}


@pytest.mark.parametrize("name", list(CHUNKINGS))
@pytest.mark.parametrize("upper", [False, True], ids=["hex", "HEX"])
async def test_a_chunked_body_is_decoded_and_its_connection_reused(
    client: RangeClient, name: str, upper: bool
) -> None:
    data, size, ext, trailers = CHUNKINGS[name]
    encoded = encode(split(data, size), ext, trailers, upper)
    async with Fake(raw(chunked_head() + encoded), answer(b"after")) as fake:
        got = await fetch(client, fake)
        assert (got.status, b"".join(got.pieces)) == (206, data)
        assert got.headers["transfer-encoding"] == "chunked"
        assert await body(client, fake) == b"after"  # the next GET, on the same connection
    assert fake.connections == 1 and [number for number, _ in fake.requests] == [0, 0]


def deliver(stream: bytes, cuts: Iterable[int], limit: int = LIMIT) -> tuple[Any, Recorder, int]:
    """``stream`` given to a connection in reads that end at each of ``cuts``: the answer's
    future, the transport and the bytes given."""
    conn = http_range._Connection([])
    transport = Recorder()
    conn.connection_made(transport)
    waiter = conn.request(b"GET / HTTP/1.1\r\n\r\n", limit, ERROR_LIMIT, None)
    sent, ends = 0, sorted(set(cuts) | {len(stream)})
    for end in ends:
        while sent < end and not transport.aborted:
            buffer = conn.get_buffer(-1)
            taken = min(len(buffer), end - sent)
            buffer[:taken] = stream[sent : taken + sent]
            conn.buffer_updated(taken)
            sent += taken
    return waiter, transport, sent


SMALL = pattern(40, 55)
SMALL_STREAM = chunked_head() + encode([SMALL[:1], SMALL[1:17], SMALL[17:]], EXT, TRAILERS)


async def test_a_chunked_body_split_anywhere_is_read_exactly() -> None:
    for cuts in [range(len(SMALL_STREAM))] + [[cut] for cut in range(len(SMALL_STREAM))]:
        waiter, transport, sent = deliver(SMALL_STREAM, cuts)
        got = waiter.result()
        assert (got.status, b"".join(got.pieces), sent) == (206, SMALL, len(SMALL_STREAM)), cuts
        assert not transport.aborted  # ended exactly at its end: kept for the next request


@pytest.mark.parametrize("apart", [False, True], ids=["same-read", "next-read"])
async def test_bytes_past_a_chunked_body_drop_the_connection(apart: bool) -> None:
    stream = SMALL_STREAM + b"JUNK"
    waiter, transport, sent = deliver(stream, [len(SMALL_STREAM)] if apart else [])
    assert b"".join(waiter.result().pieces) == SMALL and sent == len(stream)
    assert transport.aborted


def trickle(data: bytes) -> Play:
    """Send ``data`` one byte per write; then read the next request."""

    async def play(
        fake: Fake, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
        return True

    return play


async def test_a_chunked_body_sent_a_byte_at_a_time_is_read(client: RangeClient) -> None:
    async with Fake(trickle(SMALL_STREAM), answer(b"after")) as fake:
        assert await body(client, fake) == SMALL
        assert await body(client, fake) == b"after"
    assert fake.connections == 1


@pytest.mark.parametrize("past", [0, 1])
async def test_a_chunked_body_past_the_limit_is_too_long(client: RangeClient, past: int) -> None:
    data = pattern(1000 + past, 56)
    async with Fake(raw(chunked_head() + encode(split(data, 300))), answer(b"after")) as fake:
        if past:
            with pytest.raises(BodyTooLong):
                await fetch(client, fake, limit=1000)
        else:
            assert await body(client, fake, limit=1000) == data
        assert await body(client, fake) == b"after"
    assert fake.connections == 1 + past


async def test_a_chunk_past_the_limit_fails_before_its_data(client: RangeClient) -> None:
    start = chunked_head() + encode([b"x" * 600])[:-5] + b"%x\r\n" % 500  # then nothing
    async with Fake(raw(start, "stall"), answer(b"after")) as fake:
        with pytest.raises(BodyTooLong):  # the chunk's data never comes
            await fetch(client, fake, limit=1000)
        assert await body(client, fake) == b"after"
    assert fake.connections == 2


FLOOD = b"".join(b"1;%s\r\nx\r\n" % (b"e" * 3000) for _ in range(100))  # framing >> 100 + 64 KiB
BAD_CHUNKS = {
    "not-hex": b"zz\r\nhello\r\n0\r\n\r\n",
    "0x": b"0x5\r\nhello\r\n0\r\n\r\n",
    "plus": b"+5\r\nhello\r\n0\r\n\r\n",
    "underscore": b"1_0\r\n" + b"h" * 16 + b"\r\n0\r\n\r\n",
    "leading-space": b" 5\r\nhello\r\n0\r\n\r\n",
    "empty-size": b"\r\nhello\r\n0\r\n\r\n",
    "17-digits": b"0" * 16 + b"5\r\nhello\r\n0\r\n\r\n",
    "no-crlf-after-data": b"5\r\nhelloXX0\r\n\r\n",
    "cr-only-after-data": b"5\r\nhello\r0\r\n\r\n",
    "lf-only-size-line": b"5\nhello\r\n0\r\n\r\n",
    "lf-only-trailer": b"5\r\nhello\r\n0\r\nX-T: 1\n\r\n",
    "long-size-line": b"5;" + b"e" * LINE_BYTES + b"\r\nhello\r\n0\r\n\r\n",
    "framing-flood": FLOOD + b"0\r\n\r\n",
    "long-trailers": b"0\r\n" + b"X-T: %s\r\n" % (b"t" * 1000) * (HEAD_BYTES // 1000 + 1) + b"\r\n",
}


@pytest.mark.parametrize("name", list(BAD_CHUNKS))
async def test_malformed_chunks_are_a_bad_answer(client: RangeClient, name: str) -> None:
    async with Fake(raw(chunked_head() + BAD_CHUNKS[name], "stall"), answer(b"after")) as fake:
        with pytest.raises(BadAnswer):
            await fetch(client, fake, limit=100)
        assert await body(client, fake) == b"after"
    assert fake.connections == 2


def test_the_framing_flood_is_past_its_bound() -> None:
    assert len(FLOOD) > 100 + FRAMING_BYTES  # (what the test above relies on)


@pytest.mark.parametrize("coding", ["gzip", "gzip, chunked", "chunked, identity", "identity"])
async def test_a_success_body_in_another_transfer_coding_is_a_bad_answer(
    client: RangeClient, coding: str
) -> None:
    head = head_of("HTTP/1.1 206 Partial Content", f"Transfer-Encoding: {coding}\r\n")
    async with Fake(raw(head + encode([b"hello"]), "stall"), answer(b"after")) as fake:
        with pytest.raises(BadAnswer):
            await fetch(client, fake)
        assert await body(client, fake) == b"after"
    assert fake.connections == 2


@pytest.mark.parametrize(
    "cut",
    [
        b"",
        b"5",
        b"5\r\nhel",
        b"5\r\nhello\r",
        b"5\r\nhello\r\n0\r\n",
        b"5\r\nhello\r\n0\r\nX: 1\r\n",
    ],
    ids=["no-chunk", "size", "data", "data-end", "last-chunk", "trailer"],
)
async def test_a_connection_closed_mid_chunked_body_is_a_reset(
    client: RangeClient, cut: bytes
) -> None:
    async with Fake(raw(chunked_head() + cut, "close")) as fake:
        with pytest.raises(ConnectionResetError):
            await fetch(client, fake)
    assert fake.connections == 1 and len(fake.requests) == 1


@pytest.mark.parametrize(
    "headers", ["Connection: close\r\n", "Content-Length: 5\r\n"], ids=["close", "with-length"]
)
async def test_a_chunked_answer_that_forbids_reuse_drops_its_connection(
    client: RangeClient, headers: str
) -> None:
    data = pattern(3000, 57)
    async with Fake(raw(chunked_head(headers=headers) + encode(split(data, 1000))),
                    answer(b"after")) as fake:  # fmt: skip
        assert await body(client, fake) == data  # (the chunks, not the Content-Length)
        assert await body(client, fake) == b"after"
    assert fake.connections == 2 and fake.on(1) == [1]


async def test_a_chunked_error_body_is_read_and_its_connection_reused(
    client: RangeClient,
) -> None:
    head = chunked_head("HTTP/1.1 404 Not Found", "Content-Type: application/xml\r\n")
    async with Fake(raw(head + encode(split(XML, 10), EXT, TRAILERS)), answer(b"after")) as fake:
        got = await fetch(client, fake)
        assert (got.status, b"".join(got.pieces)) == (404, XML)
        assert await body(client, fake) == b"after"
    assert fake.connections == 1


@pytest.mark.parametrize("error_limit", [0, 7, ERROR_LIMIT])
async def test_a_long_chunked_error_body_is_cut_and_its_connection_dropped(
    client: RangeClient, error_limit: int
) -> None:
    error = pattern(5 * ERROR_LIMIT, 58)
    head = chunked_head("HTTP/1.1 500 Internal")
    async with Fake(raw(head + encode(split(error, 7))), answer(b"after")) as fake:
        got = await fetch(client, fake, error_limit=error_limit)
        assert (got.status, b"".join(got.pieces)) == (500, error[:error_limit])
        assert await body(client, fake) == b"after"
    assert fake.connections == 2 and fake.on(1) == [1]


async def test_an_error_body_in_another_transfer_coding_is_not_read(client: RangeClient) -> None:
    head = head_of("HTTP/1.1 500 Internal", "Transfer-Encoding: gzip\r\n")
    async with Fake(raw(head + b"zzzz", "stall"), answer(b"after")) as fake:
        got = await fetch(client, fake)
        assert (got.status, got.pieces) == (500, [])
        assert await body(client, fake) == b"after"
    assert fake.connections == 2


async def test_a_stored_content_encoding_is_read_as_the_bytes_sent(client: RangeClient) -> None:
    # S3 answers with an object's stored Content-Encoding whatever was asked; the session's
    # reads give its bytes unchanged too, so one such object does not turn the path off
    data = head_of("HTTP/1.1 206 Partial Content", "Content-Encoding: gzip\r\n", 5) + b"zzzzz"
    async with Fake(raw(data), answer(b"after")) as fake:
        assert b"".join((await fetch(client, fake)).pieces) == b"zzzzz"
        assert await body(client, fake) == b"after"
    assert fake.connections == 1


async def test_a_connection_closed_before_the_request_is_retried_once(
    client: RangeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an overloaded server answering or hanging up as it accepts closes the connection before
    # the request goes out: it is not written into a closed transport and left unanswered
    connect = RangeClient._connect
    made: list[Any] = []

    async def closing_first(self: RangeClient, *args: Any) -> Any:
        conn = await connect(self, *args)
        if not made:
            conn.close()
        made.append(conn)
        return conn

    monkeypatch.setattr(RangeClient, "_connect", closing_first)
    async with Fake(answer(b"after")) as fake:
        assert await body(client, fake) == b"after"
    assert len(made) == 2 and made[0].closed


XML = b'<?xml version="1.0"?><Error><Code>NoSuchKey</Code><Message>no</Message></Error>'


async def test_an_error_answer_is_returned_with_its_body(client: RangeClient) -> None:
    plays = answer(XML, status="404 Not Found", headers="Content-Type: application/xml\r\n")
    async with Fake(plays) as fake:
        got = await fetch(client, fake)
    assert (got.status, b"".join(got.pieces)) == (404, XML)
    assert got.headers["content-type"] == "application/xml"


@pytest.mark.parametrize("length", [True, False])
async def test_a_long_error_body_is_cut_and_its_connection_dropped(
    client: RangeClient, length: bool
) -> None:
    error = pattern(5 * ERROR_LIMIT, 6)
    then = "keep" if length else "stall"  # without a length: no wait for the close
    async with Fake(
        answer(error, status="500 Internal", length=length, then=then), answer(b"after")
    ) as fake:
        got = await fetch(client, fake)
        assert (got.status, b"".join(got.pieces)) == (500, error[:ERROR_LIMIT])
        assert await body(client, fake) == b"after"
    assert fake.connections == 2 and fake.on(1) == [1]


async def test_an_idle_connection_closed_after_its_answer_is_replaced(client: RangeClient) -> None:
    first, second = pattern(1000, 7), pattern(PIECE_BYTES + 7, 8)
    async with Fake(answer(first, then="close"), answer(second)) as fake:
        assert await body(client, fake) == first
        assert await body(client, fake) == second
    assert fake.connections == 2 and fake.on(1) == [1]


@pytest.mark.parametrize("then", ["close", "reset"])
async def test_a_reused_connection_hung_up_before_a_byte_is_retried(
    client: RangeClient, then: str
) -> None:
    first, second = pattern(1000, 9), pattern(3000, 10)
    async with Fake(answer(first), raw(b"", then), answer(second)) as fake:
        assert await body(client, fake) == first
        assert await body(client, fake) == second  # the request went again, on a new one
    assert fake.connections == 2
    assert [number for number, _ in fake.requests] == [0, 0, 1]
    assert fake.requests[1][1] == fake.requests[2][1]


async def test_a_reused_connection_cut_mid_head_is_not_retried(client: RangeClient) -> None:
    async with Fake(answer(b"one"), raw(b"HTTP/1.1 206 Part", "close"), answer(b"x")) as fake:
        assert await body(client, fake) == b"one"
        with pytest.raises(ConnectionResetError):
            await fetch(client, fake)
    assert fake.connections == 1 and len(fake.requests) == 2


@pytest.mark.parametrize(
    "data", [b"", head_of("HTTP/1.1 206 OK", length=100) + b"t" * 10], ids=["no-byte", "head"]
)
async def test_a_stalled_answer_times_out_and_its_connection_is_dropped(data: bytes) -> None:
    timed = RangeClient(None, 5.0, 0.2)
    after = pattern(100, 11)
    try:
        async with Fake(raw(data, "stall"), answer(after)) as fake:
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(TimeoutError):
                await fetch(timed, fake)
            assert 0.2 <= loop.time() - started < 2.0  # noticed within twice 0.2 s (+ slack)
            assert await body(timed, fake) == after
    finally:
        timed.close()
    assert fake.connections == 2 and fake.on(1) == [1]


async def test_a_cancelled_get_closes_its_connection(
    client: RangeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    arrived = asyncio.Event()
    updated = http_range._Connection.buffer_updated

    def spy(self: http_range._Connection, nbytes: int) -> None:
        updated(self, nbytes)
        if self.received > 100_000:  # well into the body
            arrived.set()

    monkeypatch.setattr(http_range._Connection, "buffer_updated", spy)
    after = pattern(PIECE_BYTES + 5, 12)
    start = head_of("HTTP/1.1 206 OK", length=2 * PIECE_BYTES) + b"c" * 300_000
    async with Fake(raw(start, "eof"), answer(after)) as fake:
        task = asyncio.create_task(fetch(client, fake))
        await asyncio.wait_for(arrived.wait(), GUARD_S)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(fake.eof, GUARD_S)  # the server saw the connection end
        assert await body(client, fake) == after
    assert fake.connections == 2 and fake.on(1) == [1]


@pytest.mark.parametrize(
    "size", [1000, 70_000, PIECE_BYTES + 500_000], ids=["small", "past-the-head", "multi-piece"]
)
async def test_bytes_past_the_body_drop_the_connection(client: RangeClient, size: int) -> None:
    first, second = pattern(size, 13), pattern(2000, 14)
    async with Fake(answer(first, extra=b"JUNK"), answer(second)) as fake:
        assert await body(client, fake) == first
        assert await body(client, fake) == second
    assert fake.connections == 2 and fake.on(1) == [1]


@pytest.mark.parametrize(
    "headers",
    [
        {"X-A": "v\r\nEvil: 1"},
        {"X-A": "v\nEvil: 1"},
        {"X-A": "v\rx"},
        {"X-A\r\nEvil": "1"},
        {"X-A": "v\0"},
    ],
)
async def test_a_header_with_a_line_break_is_refused_before_sending(
    client: RangeClient, headers: dict[str, str]
) -> None:
    async with Fake(answer(b"clean")) as fake:
        with pytest.raises(ValueError):
            await client.get(fake.url, headers, LIMIT, ERROR_LIMIT)
        assert await body(client, fake) == b"clean"  # the first request the server saw
    assert fake.connections == 1 and len(fake.requests) == 1
    assert b"Evil" not in fake.requests[0][1]


async def test_held_pieces_never_change_and_dropped_ones_are_refilled(
    client: RangeClient,
) -> None:
    one, two, three = (pattern(2 * PIECE_BYTES, seed) for seed in (15, 16, 17))
    async with Fake(answer(one), answer(two), answer(three)) as fake:
        first = await fetch(client, fake)
        held = first.pieces[0]
        refill_hash = hash(first.pieces[1])  # hashed, then only the client refers to it
        first_ids = {id(piece) for piece in first.pieces}
        del first
        second = await fetch(client, fake)
        assert held == one[:PIECE_BYTES]  # not refilled while the test holds it
        assert b"".join(second.pieces) == two
        assert all(piece is not held for piece in second.pieces)
        for piece in second.pieces:  # a refilled piece's hash is its new content's
            assert hash(piece) == hash(bytes(bytearray(piece)))
        assert refill_hash == hash(one[PIECE_BYTES:])
        second_ids = {id(piece) for piece in second.pieces}
        del second, held
        third = await fetch(client, fake)
        assert b"".join(third.pieces) == three
    if http_range._cread is not None:  # the C Receiver fills kept pieces again
        assert first_ids & second_ids and {id(piece) for piece in third.pieces} & (
            first_ids | second_ids
        )


async def test_hashed_pieces_kept_in_a_dict_never_change(client: RangeClient) -> None:
    datas = [pattern(2 * PIECE_BYTES, seed) for seed in range(20, 25)]
    async with Fake(*(answer(data) for data in datas)) as fake:
        got = await fetch(client, fake)
        digests = {piece: hashlib.sha256(piece).hexdigest() for piece in got.pieces}
        hashes = {piece: hash(piece) for piece in got.pieces}
        previous = got.pieces
        del got
        for data in datas[1:]:
            later = await fetch(client, fake)
            assert b"".join(later.pieces) == data
            assert all(a is not b for a in later.pieces for b in previous)  # across answers
            assert all(type(piece) is bytes for piece in later.pieces)
            previous = later.pieces
            del later
    assert [len(piece) for piece in digests] == [PIECE_BYTES, PIECE_BYTES]
    for piece, digest in digests.items():
        assert hashlib.sha256(piece).hexdigest() == digest
        assert hash(piece) == hashes[piece] == hash(bytes(bytearray(piece)))
    assert b"".join(digests) == datas[0]


async def test_concurrent_gets_fill_their_own_pieces(client: RangeClient) -> None:
    datas = [pattern(2 * PIECE_BYTES + 300, seed) for seed in (30, 31)]
    async with Fake(*(answer(data) for data in datas)) as fake:
        got = await asyncio.gather(body(client, fake), body(client, fake))
    assert sorted(got) == sorted(datas)
    assert fake.connections == 2


class Recorder(asyncio.Transport):
    """A transport that keeps what is written and notes an abort."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.aborted = False

    def write(self, data: Any) -> None:
        self.written += data

    def abort(self) -> None:
        self.aborted = True


@pytest.mark.parametrize("split", range(-6, 3))
async def test_an_answer_cut_anywhere_around_the_head_end_is_read_exactly(split: int) -> None:
    data = pattern(PIECE_BYTES + 3000, 32)
    head = head_of("HTTP/1.1 206 Partial Content", "X-A: b\r\n", len(data))
    stream = head + data
    conn = http_range._Connection([])
    transport = Recorder()
    conn.connection_made(transport)
    waiter = conn.request(b"GET / HTTP/1.1\r\n\r\n", LIMIT, ERROR_LIMIT, None)
    sent, cuts = 0, [len(head) + split - 1, len(head) + split, len(head) + split + 1]
    while not waiter.done() and sent < len(stream):  # one byte either side of the cut, too
        end = min([cut for cut in cuts if cut > sent] + [len(stream)])
        buffer = conn.get_buffer(-1)
        taken = min(len(buffer), end - sent)
        buffer[:taken] = stream[sent : sent + taken]
        conn.buffer_updated(taken)
        sent += taken
    got = waiter.result()
    assert (got.status, b"".join(got.pieces), sent) == (206, data, len(stream))
    assert got.headers == {"x-a": "b", "content-length": str(len(data))}
    assert not transport.aborted  # read to its end exactly: kept for the next request


# ---------------------------------------------------------------- through S3Store

OBJECT_BYTES = pattern(3_000_000, 40)
OBJECT = ObjectInfo("s3://bucket/dir/shard-1.bin", len(OBJECT_BYTES), '"etag-1"')


def s3_range(chunked: bool, extra: int = 0) -> Play:
    """A fake S3 answering the range asked for (chunked, or its Content-Length ``extra`` bytes
    longer, then held open without a body)."""

    async def play(
        fake: Fake, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        found = re.search(rb"(?i)\r\nrange: bytes=(\d+)-(\d+)\r\n", head)
        assert found is not None, head
        start, end = int(found[1]), int(found[2]) + 1
        data = OBJECT_BYTES[start:end]
        fields = f'Content-Range: bytes {start}-{end - 1}/{len(OBJECT_BYTES)}\r\nETag: "etag-1"\r\n'
        if not chunked:
            return await raw(head_of("HTTP/1.1 206 Partial Content", fields, len(data) + extra),
                             "stall")(fake, head, reader, writer)  # fmt: skip
        chunks = [data[i : i + 65536] for i in range(0, len(data), 65536)]
        encoded = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks)
        fields += "Transfer-Encoding: chunked\r\n"
        return await raw(head_of("HTTP/1.1 206 Partial Content", fields) + encoded + b"0\r\n\r\n")(
            fake, head, reader, writer
        )

    return play


def s3_options(fake: Fake) -> dict[str, Any]:
    endpoint = fake.url.rsplit("/", 2)[0]
    return {
        "key": "AKIDTEST",
        "secret": "SECRETTEST",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }


@pytest.mark.parametrize("door", [True, False], ids=["door", "client"])
async def test_s3_reads_a_chunked_answer_either_way(door: bool) -> None:
    async with Fake(*[s3_range(chunked=True)] * 2) as fake:
        options = s3_options(fake)
        if not door:  # (a setting the door does not follow: the store reads through its client)
            options = {**options, "config_kwargs": {"signature_version": "s3v4"}}
        store = S3Store(options)
        try:
            assert (store.door_settings is not None) == door
            with guard():
                first = await store.read_range_pieces(OBJECT, 1000, 2_600_000)
            assert b"".join(first) == OBJECT_BYTES[1000:2_600_000]
            with guard():
                later = await store.read_range_pieces(OBJECT, 5, 70_000)
            assert b"".join(later) == OBJECT_BYTES[5:70_000]
        finally:
            await store.close()
    assert len(fake.requests) == 2  # one request per read: no second path
    assert fake.connections == (1 if door else fake.connections)
    assert all(b"/bucket/dir/shard-1.bin " in head for _, head in fake.requests)
    assert all(b"AWS4-HMAC-SHA256" in head for _, head in fake.requests)


async def test_s3_a_content_length_past_the_range_is_a_storage_error() -> None:
    async with Fake(s3_range(chunked=False, extra=1)) as fake:
        store = S3Store(s3_options(fake))
        try:
            with pytest.raises(StorageError) as caught, guard():
                await store.read_range_pieces(OBJECT, 100, 200)
        finally:
            await store.close()
    assert not isinstance(caught.value, TransientStorageError)
    assert OBJECT.url in str(caught.value) and "100 bytes asked for" in str(caught.value)
    assert len(fake.requests) == 1


async def test_a_warmed_connection_carries_the_first_get(client: RangeClient) -> None:
    data = pattern(100_000, 41)
    async with Fake(answer(data), answer(data)) as fake:
        client.warm(fake.url)
        client.warm(fake.url)  # opening already: nothing more
        assert len(client.opening()) == 1
        assert await body(client, fake) == data  # waits for it, then uses it
        client.warm(fake.url)  # pooled already: nothing more
        assert client.opening() == []
        assert await body(client, fake) == data
    assert fake.connections == 1
    assert [number for number, _ in fake.requests] == [0, 0]


async def test_closing_while_warming_leaves_no_connection() -> None:
    made = RangeClient(None, 5.0, None)
    async with Fake(answer(b"never asked")) as fake:
        made.warm(fake.url)
        opening = made.opening()
        made.close()
        with guard():
            await asyncio.wait(opening)
        assert made.opening() == [] and made._idle == {}
        made.warm(fake.url)  # closed: nothing
        assert made.opening() == []
    assert fake.requests == []


@pytest.mark.parametrize("pad_bytes", [3_000, 5_000, 20_000, HEAD_BYTES - 2_000])
async def test_long_heads_are_read_whole(client: RangeClient, pad_bytes: int) -> None:
    # a connection's header buffer starts small and grows, up to HEAD_BYTES
    pad = "".join(f"X-Pad-{i:05d}: {'p' * 90}\r\n" for i in range(pad_bytes // 105))
    data = head_of("HTTP/1.1 206 Partial Content", pad, 40_000) + b"b" * 40_000
    async with Fake(raw(data), answer(b"after")) as fake:
        assert b"".join((await fetch(client, fake, limit=40_000)).pieces) == b"b" * 40_000
        assert await body(client, fake) == b"after"
    assert fake.connections == 1
