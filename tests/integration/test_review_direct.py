"""Review of the S3 door (storage/s3/door.py: S3 reads without the client): connections,
TLS context and close, each a test that failed on its first version."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest

from streamrec.storage.base import ObjectInfo
from streamrec.storage.s3.store import S3Store

BODY = b"abcd"


class HeldServer:
    """A loopback S3 stand-in whose GET answers (206, ``BODY``) wait for ``release``; counts
    the connections it sees closed by the client."""

    def __init__(self, tls: ssl.SSLContext | None = None, hold: bool = True) -> None:
        self.tls = tls
        self.hold = hold
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()
        self.closed_by_client = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self.endpoint = ""

    async def __aenter__(self) -> HeldServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        port = self._server.sockets[0].getsockname()[1]
        self.endpoint = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
                self.closed_by_client += 1
                return
            self.arrived.set()
            if self.hold:
                await self.release.wait()
            writer.write(
                b"HTTP/1.1 206 Partial Content\r\nContent-Length: 4\r\n"
                b'Content-Range: bytes 0-3/10\r\nETag: "e"\r\n\r\n' + BODY
            )
            await writer.drain()


def _options(endpoint: str) -> dict[str, Any]:
    return {"key": "AKID", "secret": "SECRET", "client_kwargs": {"endpoint_url": endpoint}}


def _live(store_direct: Any) -> list[Any]:
    client = store_direct._client
    return [] if client is None else [c for cs in client._idle.values() for c in cs if not c.closed]


async def test_a_get_in_flight_when_the_store_closes_leaves_no_open_connection() -> None:
    """S3Store.close() closes the direct requests' RangeClient; a range GET in flight on it
    then finishes and RangeClient.get puts its connection back into the closed client's idle
    pool (``_put`` does not look at ``_closed``): nobody ever closes it (a leaked socket per
    read in flight at close; the server never sees the connection end)."""
    async with HeldServer() as server:
        store = S3Store(_options(server.endpoint))
        direct = store._door_reads()
        assert direct is not None  # the options name everything: no client
        obj = ObjectInfo("s3://bucket/key", 10, '"e"')
        reading = asyncio.ensure_future(store.read_range(obj, 0, 4))
        await server.arrived.wait()
        ranges = direct._client  # the connections of the read in flight
        await store.close()
        server.release.set()
        assert await reading == BODY
        kept = [c for cs in ranges._idle.values() for c in cs if not c.closed]
        assert kept == [], "a closed store's connection is kept open in its closed pool"


def _self_signed(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context for 127.0.0.1 and a client context that trusts it (openssl CLI)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))


async def test_a_read_cancelled_while_the_tls_context_builds_does_not_poison_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DirectS3 keeps ONE asyncio future for the TLS context (asyncio.wrap_future of the
    process's build) and awaits it in the first request's task. Cancelling that task (a
    dropped reader, a closed dataset) cancels the kept future itself, and every later
    request of the store awaits the cancelled future: a CancelledError out of a read that
    nobody cancelled (listing too: _direct_page catches Exception only)."""
    server_tls, client_tls = _self_signed(tmp_path)
    build: concurrent.futures.Future[ssl.SSLContext] = concurrent.futures.Future()
    build.set_running_or_notify_cancel()  # as storage/s3/tls.py hands it out
    monkeypatch.setattr(
        "streamrec.storage.s3.store.start_tls_context",
        lambda verify: asyncio.wrap_future(build),
    )
    async with HeldServer(server_tls, hold=False) as server:
        store = S3Store(_options(server.endpoint))
        try:
            obj = ObjectInfo("s3://bucket/key", 10, '"e"')
            first = asyncio.ensure_future(store.read_range(obj, 0, 4))
            await asyncio.sleep(0)  # (a yield, not a wait: its first step ends at the context)
            assert not first.done() and store._door is not None
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            build.set_result(client_tls)  # the context is built after all
            assert await store.read_range(obj, 0, 4) == BODY
        finally:
            await store.close()


async def test_closing_while_the_tls_context_builds_makes_no_client_after_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read whose first door request waits for the TLS context when the store closes: no
    aiobotocore client is made for the closed store (nothing would close it)."""
    server_tls, client_tls = _self_signed(tmp_path)
    build: concurrent.futures.Future[ssl.SSLContext] = concurrent.futures.Future()
    build.set_running_or_notify_cancel()
    monkeypatch.setattr(
        "streamrec.storage.s3.store.start_tls_context",
        lambda verify: asyncio.wrap_future(build),
    )
    async with HeldServer(server_tls, hold=False) as server:
        store = S3Store(_options(server.endpoint))
        obj = ObjectInfo("s3://bucket/key", 10, '"e"')
        reading = asyncio.ensure_future(store.read_range(obj, 0, 4))
        await asyncio.sleep(0)  # (a yield, not a wait: its first step ends at the context)
        assert not reading.done()
        await store.close()
        build.set_result(client_tls)
        with contextlib.suppress(Exception):  # (an error: fair for a read in flight at close)
            await reading
        made_after_close = store._client is not None
        if made_after_close:
            await store.close()  # (the test's own clean-up)
        assert not made_after_close, "a closed store made its aiobotocore client"


async def test_the_first_bytes_error_names_what_the_client_path_names(
    s3_server: Any, s3_bucket: str
) -> None:
    """A missing object's first read: the client path says 'reading its first bytes', the
    direct path 'reading bytes 0-N' (the brief: the same error as the client path)."""
    url = f"s3://{s3_bucket}/missing.tfrecord"
    messages = []
    for options in (s3_server.storage_options, s3_server.client_storage_options):
        store = S3Store(options)
        try:
            with pytest.raises(Exception) as info:
                await store.expand(url)
            messages.append((type(info.value).__name__, str(info.value)))
        finally:
            await store.close()
    assert messages[0] == messages[1]
