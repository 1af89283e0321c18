"""S3 clients with a client certificate, or behind an ``https://`` proxy, are sent by
streamrec's own session (storage/s3/session.py: no redirect followed, answers read whole
capped), against local TLS servers whose certificates a CA of the test's signs
(support/tls_certs.py):

* a store that requires a client certificate lists and reads with one (a PEM of both, or a
  certificate and key pair), and refuses a client without one;
* there, and behind an ``https://`` proxy, a listing page of 64 MiB is refused at the cap, by
  its length (aiobotocore's session, which served both before, read it whole);
* a key protected by a passphrase is a StorageError naming the url and the certificate;
* behind an ``https://`` forward proxy: listed and read through it, with the proxy url's
  credentials; a proxy whose certificate the store's trust does not vouch for is refused.
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.errors import StorageError
from streamrec.format.framing import RecordEncoder
from streamrec.storage.pages import list_glob
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.s3.session import ANSWER_BYTES
from streamrec.storage.s3.store import S3Store
from support.listing_server import ListingServer
from support.servers import LOOPBACK
from support.tls_certs import TestCA

pytestmark = pytest.mark.slow  # (TLS servers, a 64 MiB page: ~0.5-1 s each)

RECORDS = [bytes([i]) * 1000 for i in range(50)]
OBJECTS = {"d/a.tfrecord": RecordEncoder().encode_many(RECORDS)}
RETRY = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=30)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("ca"))


def _client_cert(ca: TestCA, form: str, passphrase: bytes | None = None) -> Any:
    issued = ca.issue(f"reader-{form}", server=False, passphrase=passphrase)
    if form == "pair":
        return (str(issued.cert), str(issued.key))
    both = ca.directory / f"reader-{form}-both.pem"
    both.write_bytes(issued.cert.read_bytes() + issued.key.read_bytes())
    return str(both)


def _options(endpoint: str, ca: TestCA, config: dict[str, Any]) -> dict[str, Any]:
    client = {"endpoint_url": endpoint, "verify": str(ca.bundle)}
    return {"key": "k", "secret": "s", "client_kwargs": client, "config_kwargs": config}


@pytest.mark.parametrize("form", ["one file", "pair"])
def test_a_store_requiring_a_client_certificate_lists_and_reads_with_one(
    ca: TestCA, form: str
) -> None:
    tls = ca.server_context(LOOPBACK, client_certs=True)
    with ListingServer(OBJECTS, tls=tls) as server:
        options = _options(server.endpoint_url, ca, {"client_cert": _client_cert(ca, form)})
        assert list(streamrec.open_dataset("s3://bkt/d/*", storage_options=options)) == RECORDS
        assert server.listed and ("get", "d/a.tfrecord") in server.gets


async def test_without_a_client_certificate_that_store_refuses(ca: TestCA) -> None:
    with ListingServer(OBJECTS, tls=ca.server_context(LOOPBACK, client_certs=True)) as server:
        store = S3Store(_options(server.endpoint_url, ca, {"signature_version": "s3v4"}))
        try:
            with pytest.raises(StorageError):
                await list_glob(store, "s3://bkt/d/*", RETRY)
        finally:
            await store.close()
        assert not server.listed  # (refused at the handshake)


def _padded_page() -> bytes:
    head = b'<?xml version="1.0"?><ListBucketResult><Name>bkt</Name><Prefix>d/</Prefix>'
    tail = b"<IsTruncated>false</IsTruncated></ListBucketResult>"
    return head + b" " * (64 << 20) + tail


async def _refused_at_the_cap(server: ListingServer, options: dict[str, Any]) -> None:
    page = _padded_page()
    server.raw = lambda token: page
    store = S3Store(options)
    try:
        with pytest.raises(StorageError, match="an answer of") as raised:
            await list_glob(store, "s3://bkt/d/*", RETRY)
    finally:
        await store.close()
    assert server.listed == [None]  # refused, not asked for again
    # by its length, before it was read (aiobotocore's session read it whole, and the
    # listing then refused a page of 64 MiB)
    assert f"an answer of {len(page):,} bytes" in str(raised.value)
    assert f"at most {ANSWER_BYTES:,} bytes" in str(raised.value)


async def test_with_a_client_certificate_a_page_of_64_mib_is_refused_at_the_cap(
    ca: TestCA,
) -> None:
    with ListingServer({}, tls=ca.server_context(LOOPBACK, client_certs=True)) as server:
        config = {"client_cert": _client_cert(ca, "pair")}
        await _refused_at_the_cap(server, _options(server.endpoint_url, ca, config))


async def test_a_key_protected_by_a_passphrase_is_an_error_naming_the_certificate(
    ca: TestCA,
) -> None:
    cert = _client_cert(ca, "locked", passphrase=b"secret")
    with ListingServer(OBJECTS, tls=ca.server_context(LOOPBACK, client_certs=True)) as server:
        store = S3Store(_options(server.endpoint_url, ca, {"client_cert": cert}))
        try:
            with pytest.raises(StorageError, match="passphrase") as raised:
                await list_glob(store, "s3://bkt/d/*", RETRY)
        finally:
            await store.close()
        assert not server.listed
        assert server.endpoint_url in str(raised.value) and cert in str(raised.value)


def _relay(client: socket.socket, upstream: socket.socket) -> None:
    """Bytes both ways between ``client`` (TLS to the proxy, or not) and ``upstream`` until
    either side closes."""
    while True:
        pending = isinstance(client, ssl.SSLSocket) and client.pending() > 0
        ready = [client] if pending else select.select([client, upstream], [], [], 30)[0]
        if not ready:
            return
        for source in ready:
            sink = upstream if source is client else client
            try:
                data = source.recv(1 << 16)
                if not data:
                    return
                sink.sendall(data)
            except OSError:
                return


class TlsForwardProxy:
    """A forward proxy, ``https://`` (``tls``) or ``http://``: a plain-http target's request
    (its absolute url) sent on to its host, the answer sent back whole; an https one's
    ``CONNECT`` tunnelled. Records the targets and the ``Proxy-Authorization`` each came
    with."""

    def __init__(self, tls: ssl.SSLContext | None) -> None:
        self.seen: list[tuple[str, str | None]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_CONNECT(self) -> None:  # a tunnel to an https:// endpoint
                owner.seen.append((self.path, self.headers.get("Proxy-Authorization")))
                host, _, port = self.path.rpartition(":")
                with socket.create_connection((host, int(port)), timeout=30) as upstream:
                    self.send_response(200, "Connection established")
                    self.end_headers()
                    _relay(self.connection, upstream)
                self.close_connection = True

            def do_GET(self) -> None:
                owner.seen.append((self.path, self.headers.get("Proxy-Authorization")))
                host, _, path = self.path.removeprefix("http://").partition("/")
                upstream = http.client.HTTPConnection(host, timeout=30)
                headers = {
                    k: v for k, v in self.headers.items() if not k.lower().startswith("proxy")
                }
                try:
                    upstream.request("GET", "/" + path, headers=headers)
                    answer = upstream.getresponse()
                    body = answer.read()
                finally:
                    upstream.close()
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):  # (the client may refuse it before its end)
                    self.wfile.write(body)

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self.scheme = "http" if tls is None else "https"
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://user:secret@{LOOPBACK}:{self._server.server_address[1]}"

    def __enter__(self) -> TlsForwardProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def test_behind_an_https_proxy_a_store_lists_and_reads_through_it(ca: TestCA) -> None:
    proxy_tls = ca.server_context(LOOPBACK, client_certs=False)
    with ListingServer(OBJECTS) as server, TlsForwardProxy(proxy_tls) as proxy:
        endpoint = server.endpoint_url
        options = _options(endpoint, ca, {"proxies": {"http": proxy.url}})
        assert list(streamrec.open_dataset("s3://bkt/d/*", storage_options=options)) == RECORDS
    targets = [target for target, _ in proxy.seen]
    assert any(t.startswith(f"{endpoint}/bkt?") and "list-type=2" in t for t in targets)
    assert f"{endpoint}/bkt/d/a.tfrecord" in targets
    assert {auth for _, auth in proxy.seen} == {"Basic dXNlcjpzZWNyZXQ="}  # user:secret


async def test_an_https_proxy_the_stores_trust_does_not_vouch_for_is_refused(
    ca: TestCA, tmp_path: Path
) -> None:
    stranger = TestCA(tmp_path)  # (the store trusts ca's bundle, not this one's)
    with (
        ListingServer(OBJECTS) as server,
        TlsForwardProxy(stranger.server_context(LOOPBACK, client_certs=False)) as proxy,
    ):
        store = S3Store(_options(server.endpoint_url, ca, {"proxies": {"http": proxy.url}}))
        try:
            with pytest.raises(StorageError, match=r"(?i)certificate"):
                await list_glob(store, "s3://bkt/d/*", RETRY)
        finally:
            await store.close()
    assert not proxy.seen and not server.listed


async def test_behind_an_https_proxy_a_page_of_64_mib_is_refused_at_the_cap(ca: TestCA) -> None:
    proxy_tls = ca.server_context(LOOPBACK, client_certs=False)
    with ListingServer({}) as server, TlsForwardProxy(proxy_tls) as proxy:
        config = {"proxies": {"http": proxy.url}}
        await _refused_at_the_cap(server, _options(server.endpoint_url, ca, config))
        assert len(proxy.seen) == 1


@pytest.mark.parametrize("proxy_scheme", ["https", "http"])
def test_an_https_store_requiring_a_client_certificate_is_reached_through_a_tunnel(
    ca: TestCA, proxy_scheme: str
) -> None:
    # TLS to the store inside the proxy's (aiohttp's TLS in TLS); the certificate offered
    # to the store alone: with an https:// proxy, there is none (aiobotocore's session)
    proxy_tls = ca.server_context(LOOPBACK, client_certs=False) if proxy_scheme == "https" else None
    store_tls = ca.server_context(LOOPBACK, client_certs=proxy_scheme == "http")
    with ListingServer(OBJECTS, tls=store_tls) as server, TlsForwardProxy(proxy_tls) as proxy:
        config: dict[str, Any] = {"proxies": {"https": proxy.url}}
        if proxy_scheme == "http":
            config["client_cert"] = _client_cert(ca, "tunnelled")
        options = _options(server.endpoint_url, ca, config)
        assert list(streamrec.open_dataset("s3://bkt/d/*", storage_options=options)) == RECORDS
        assert server.listed and ("get", "d/a.tfrecord") in server.gets
        port = server.endpoint_url.rpartition(":")[2]
    assert {target for target, _ in proxy.seen} == {f"{LOOPBACK}:{port}"}
    assert {auth for _, auth in proxy.seen} == {"Basic dXNlcjpzZWNyZXQ="}
