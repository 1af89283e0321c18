"""S3 range reads against servers that misbehave at the transport level (a closed port, a
connection dropped before or during the answer, a body longer than the range asked for), on
both ways a read can go (signed range GETs, storage/s3/door.py, and ``get_object`` for clients
configured for another signature): no credential in any error, no body kept past the range."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from streamrec.errors import StorageError, TransientStorageError
from streamrec.storage.base import ObjectInfo
from streamrec.storage.s3.store import S3Store
from support.servers import free_port

KEY, SECRET, TOKEN = "AKIDLEAKCHECK", "SECRETLEAKCHECK", "TOKENLEAKCHECK"
SECRETS = (KEY, SECRET, TOKEN, "Signature", "Credential", "Security-Token")
OBJECT = ObjectInfo("s3://bucket/dir/shard-1.bin", 1_000_000, '"etag-1"')
WAYS = [{}, {"config_kwargs": {"signature_version": "s3"}}]  # signed GETs, get_object

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _options(port: int, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "key": KEY,
        "secret": SECRET,
        "token": TOKEN,
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"},
        **extra,
    }


async def _read(options: dict[str, Any], start: int, end: int) -> list[bytes]:
    store = S3Store(options)
    try:
        return await store.read_range_pieces(OBJECT, start, end)
    finally:
        await store.close()


def _serving(handler: Handler, options: dict[str, Any], start: int, end: int) -> list[bytes]:
    async def run() -> list[bytes]:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await _read(_options(port, options), start, end)
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(run())


def _messages(error: BaseException) -> str:
    """Every message in ``error``'s chain (causes and contexts), and their reprs."""
    seen: list[str] = []
    current: BaseException | None = error
    while current is not None and len(seen) < 40:
        seen += [str(current), repr(current), *map(str, current.args)]
        current = current.__cause__ or current.__context__
    return "\n".join(seen)


def _assert_no_credentials(error: BaseException) -> None:
    text = _messages(error)
    for secret in SECRETS:
        assert secret not in text, (secret, text)


async def _head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


@pytest.mark.parametrize("way", WAYS)
def test_a_closed_port_is_transient_and_names_no_credential(way: dict[str, Any]) -> None:
    port = free_port()
    with pytest.raises(TransientStorageError) as caught:
        asyncio.run(_read(_options(port, way), 0, 100))
    assert OBJECT.url in str(caught.value)
    _assert_no_credentials(caught.value)


async def _hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _head(reader)
    writer.close()


async def _cut_mid_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _head(reader)
    writer.write(
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-99/1000000\r\n"
        b"Content-Length: 100\r\n\r\n" + b"x" * 50
    )
    await writer.drain()
    writer.close()


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("handler", [_hang_up, _cut_mid_body])
def test_a_dropped_connection_names_no_credential(handler: Handler, way: dict[str, Any]) -> None:
    try:
        got = _serving(handler, way, 0, 100)
    except StorageError as error:
        assert OBJECT.url in str(error)
        _assert_no_credentials(error)
    else:  # a short body is handed on short: the reader asks again from the exact byte
        assert handler is _cut_mid_body and sum(map(len, got)) < 100


def _answering(status: str, headers: str, body: bytes) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        head = f"HTTP/1.1 {status}\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
        writer.close()

    return handler


@pytest.mark.parametrize("way", WAYS)
def test_a_server_that_ignores_the_range_is_an_error_not_the_whole_object(
    way: dict[str, Any],
) -> None:
    whole = _answering("200 OK", "", b"w" * 1_000_000)
    with pytest.raises(StorageError) as caught:
        _serving(whole, way, 100, 200)
    assert not isinstance(caught.value, TransientStorageError)  # asking again will not help
    assert OBJECT.url in str(caught.value) and "100-199" in str(caught.value)


@pytest.mark.parametrize("way", WAYS)
def test_a_body_longer_than_the_range_is_an_error_before_it_is_kept(
    way: dict[str, Any],
) -> None:
    longer = _answering(
        "206 Partial Content", "Content-Range: bytes 0-99/1000000\r\n", b"l" * 300_000
    )
    with pytest.raises(StorageError) as caught:
        _serving(longer, way, 0, 100)
    assert type(caught.value) is StorageError  # asking again will not help
    assert OBJECT.url in str(caught.value) and "reading bytes 0-99" in str(caught.value)
    assert "more than the 100 bytes asked for" in str(caught.value)


@pytest.mark.parametrize("way", WAYS)
def test_an_exact_body_at_the_start_is_read_whatever_the_status(way: dict[str, Any]) -> None:
    exact = _answering("200 OK", "", b"e" * 100)  # the whole object is the range asked for
    assert b"".join(_serving(exact, way, 0, 100)) == b"e" * 100
