"""Every store keeps no more of an answer than it asked for: a range GET answered with the
whole object (200, the Range header ignored) or with a body longer than the range is an error
before the extra bytes are kept, and a probe of an object's first bytes answered with more than
it asked for gives up (the store looks the object up instead), whatever the server sends.

The servers are plain asyncio sockets on loopback that answer every request the same way; the
stores are streamrec's own (http, gs, az; s3's range reads: test_s3_get_faults.py)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from streamrec.errors import StorageError, TransientStorageError
from streamrec.storage.base import ObjectInfo, ObjectStore
from streamrec.storage.registry import open_store
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.sink_base import SinkContext
from support.azurite import AzuriteServer

SIZE = 1_000_000
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _answering(status: str, headers: str, body: bytes) -> Handler:
    """A server answering every request with ``status``, ``headers`` and ``body``."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                head = f"HTTP/1.1 {status}\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
                writer.write(head.encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return handler


def _store_and_url(scheme: str, port: int) -> tuple[ObjectStore, str]:
    base = f"http://127.0.0.1:{port}"
    if scheme == "http":
        return open_store(f"{base}/shard-1"), f"{base}/shard-1"
    if scheme == "gs":
        options = {"token": "anon", "project": "test", "endpoint_url": base}
        return open_store("gs://bucket/shard-1", options), "gs://bucket/shard-1"
    options = {"connection_string": AzuriteServer.connection_string_for(base)}
    return open_store("az://container/shard-1", options), "az://container/shard-1"


def _serving(
    handler: Handler, scheme: str, job: Callable[[ObjectStore, str], Awaitable[Any]]
) -> Any:
    async def run() -> Any:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        store, url = _store_and_url(scheme, port)
        try:
            return await job(store, url)
        finally:
            await store.close()
            server.close()
            await server.wait_closed()

    return asyncio.run(run())


def _read(start: int, end: int) -> Callable[[ObjectStore, str], Awaitable[list[bytes]]]:
    async def job(store: ObjectStore, url: str) -> list[bytes]:
        return await store.read_range_pieces(ObjectInfo(url, SIZE, None), start, end)

    return job


SCHEMES = ["http", "gs", "az"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_whole_object_for_a_range_is_an_error(scheme: str) -> None:
    whole = _answering("200 OK", "", b"w" * SIZE)
    with pytest.raises(StorageError) as caught:
        _serving(whole, scheme, _read(100, 200))
    assert not isinstance(caught.value, TransientStorageError)  # asking again will not help
    assert "shard-1" in str(caught.value) and "ignored the Range header" in str(caught.value)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_body_longer_than_the_range_is_an_error(scheme: str) -> None:
    longer = _answering(
        "206 Partial Content", f"Content-Range: bytes 0-99/{SIZE}\r\n", b"l" * 300_000
    )
    with pytest.raises(StorageError) as caught:
        _serving(longer, scheme, _read(0, 100))
    assert type(caught.value) is StorageError
    assert "shard-1" in str(caught.value) and "more than the 100 bytes asked for" in str(
        caught.value
    )


@pytest.mark.parametrize("scheme", SCHEMES)
def test_an_exact_range_is_read(scheme: str) -> None:
    exact = _answering("206 Partial Content", f"Content-Range: bytes 0-99/{SIZE}\r\n", b"e" * 100)
    assert b"".join(_serving(exact, scheme, _read(0, 100))) == b"e" * 100


@pytest.mark.parametrize("scheme", [*SCHEMES, "s3"])
def test_a_probe_answered_with_more_than_it_asked_gives_up(scheme: str) -> None:
    """The first-bytes probe (a glob-free url opened without a listing) reads no more than it
    asked for: None, and the store looks the object up instead."""
    longer = _answering(
        "206 Partial Content", f"Content-Range: bytes 0-99/{SIZE}\r\n", b"p" * 300_000
    )

    async def probe(store: ObjectStore, url: str) -> Any:
        return await store._read_head(url, 100)  # type: ignore[attr-defined]

    if scheme == "s3":

        async def run() -> Any:
            server = await asyncio.start_server(longer, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            options = {
                "key": "k",
                "secret": "s",
                "client_kwargs": {
                    "endpoint_url": f"http://127.0.0.1:{port}",
                    "region_name": "us-east-1",
                },
            }
            store = open_store("s3://bucket/shard-1", options)
            try:
                return await probe(store, "s3://bucket/shard-1")
            finally:
                await store.close()
                server.close()
                await server.wait_closed()

        assert asyncio.run(run()) is None
    else:
        assert _serving(longer, scheme, probe) is None


ERROR_BODY = 64 << 20  # what the server would send, generated as it goes
ERROR_BODY_SEEN = 4 << 20  # the most it may send before the client drops the connection


@pytest.mark.parametrize(
    ("scheme", "path"),
    [("http", "probe"), ("http", "range"), ("gs", "probe"), ("gs", "range"), ("gs", "upload")],
)
def test_a_huge_error_body_is_not_read(scheme: str, path: str) -> None:
    """An error answer's body is quoted from its first few KiB: the rest is never read, the
    connection is dropped (a 500 may come with any body; the server counts what it sent)."""
    sent: list[int] = []
    done: asyncio.Future[None] | None = None

    async def huge_error(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        count = 0
        try:
            writer.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10
            )
            writer.transport.set_write_buffer_limits(high=64 << 10)
            await reader.readuntil(b"\r\n\r\n")
            head = (
                f"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
                f"Content-Length: {ERROR_BODY}\r\n\r\n"
            )
            writer.write(head.encode())
            chunk = b"internal error, " * 4096  # 64 KiB
            while count < ERROR_BODY:
                writer.write(chunk)
                await writer.drain()
                count += len(chunk)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            sent.append(count)
            writer.close()
            if done is not None and not done.done():
                done.set_result(None)

    async def job(store: ObjectStore, url: str) -> None:
        nonlocal done
        done = asyncio.get_running_loop().create_future()
        with pytest.raises(StorageError) as caught:
            if path == "probe":
                await store.expand(url)
            elif path == "range":
                await store.read_range_pieces(ObjectInfo(url, SIZE, None), 100, 200)
            else:
                sink = store.open_sink(url, SinkContext(retry=RetryPolicy(max_attempts=1)))
                await sink.write(b"data")
                await sink.commit()
        message = str(caught.value)
        assert "shard-1" in message and "HTTP 500" in message, message
        assert "internal error" in message  # the excerpt of its start
        await asyncio.wait_for(done, 30)  # (the server saw the connection end)

    _serving(huge_error, scheme, job)
    assert sent and sent[0] <= ERROR_BODY_SEEN, sent
