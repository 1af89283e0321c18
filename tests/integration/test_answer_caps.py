"""An answer a client reads whole is read within bounds (storage/http/body.py
``capped_answers``, storage/s3/session.py, storage/azure/listing.py), against a small server
of the test's that streams hostile listing pages, and Azurite:

* a listing page far longer than any page (128 MiB, with its length or chunked) through S3's
  client and through Azure's SDK: refused once a page's most has arrived (not all of it read,
  not all of it held), a StorageError naming the url and the page, not asked for again;
* the same through S3's client behind an ``http://`` proxy (config_kwargs ``proxies``):
  sent through it by streamrec's session (aiobotocore's read every answer whole);
* an error answer (500) of 128 MiB: its first 64 KiB read, the rest dropped with the
  connection, still an error of its status (retried, as a 500 is);
* an Azure page the SDK cannot decode: its error quotes a few hundred characters of it;
* an Azure page of more elements, or deeper, than a page of the blobs asked for: refused while
  it is counted, before the SDK builds its tree;
* with a cap far smaller than its blobs, Azure's range reads (which stream) and listings are
  untouched, and the store's session is closed with it.
"""

from __future__ import annotations

import gc
import http.client
import threading
import tracemalloc
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import streamrec
from streamrec.errors import RetriesExhaustedError, StorageError
from streamrec.format.framing import RecordEncoder
from streamrec.storage.azure import listing as azure_listing
from streamrec.storage.azure.store import AzureStore
from streamrec.storage.pages import list_glob
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.s3.session import ANSWER_BYTES as S3_ANSWER_BYTES
from streamrec.storage.s3.store import S3Store
from support.azurite import AzuriteServer
from support.listing_server import ListingServer
from support.servers import LOOPBACK

pytestmark = pytest.mark.slow  # ~1 s each (128 MiB streamed, traced allocations)

SIG = "SECRETSIGNATURE"
PADDED_BYTES = 128 << 20
"""How long a padded page would be, were it read to its end."""
RETRY = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=30)
_ENDS = {  # a page's head and tail: a well-formed page, whatever comes between
    "s3": (
        b'<?xml version="1.0"?><ListBucketResult><Name>bkt</Name><Prefix>d/</Prefix>',
        b"<IsTruncated>false</IsTruncated></ListBucketResult>",
    ),
    "azure": (
        b'<?xml version="1.0" encoding="utf-8"?><EnumerationResults><Blobs>',
        b"</Blobs><NextMarker/></EnumerationResults>",
    ),
}


class HostileServer:
    """Answers every listing request (S3's ``list-type``, Azure's ``comp=list``) with the
    page ``kind`` names, streamed, and anything else with 404; counts the listing requests
    and the body bytes the socket took."""

    def __init__(self, store: str, kind: str) -> None:
        self.store, self.kind = store, kind
        self.listed = 0
        self.sent = 0
        self.answered = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if "list-type=" in self.path or "comp=list" in self.path:
                    owner._list(self)
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    def _pieces(self) -> Iterator[bytes]:
        head, tail = _ENDS[self.store]
        if self.kind != "error":
            yield head
        if self.kind == "error":  # an error document, padded to 128 MiB
            head = b"<?xml version='1.0'?><Error><Code>InternalError</Code><Message>m</Message>"
            tail = b"</Error>"
            yield head
        if self.kind == "garbage":  # a page cut off by 1 MiB of text: not well-formed
            yield b"<html>" + b"x" * (1 << 20)
            return
        if self.kind == "flat":  # 1M empty elements: 4 MiB
            yield b"<a/>" * (1 << 20)
        elif self.kind == "deep":
            yield b"<a>" * (1 << 16) + b"</a>" * (1 << 16)
        else:  # padding, 1 MiB a write, to 128 MiB in all
            left = PADDED_BYTES - len(head) - len(tail)
            while left > 0:
                yield b" " * min(left, 1 << 20)
                left -= 1 << 20
        yield tail

    def _list(self, handler: BaseHTTPRequestHandler) -> None:
        self.listed += 1
        try:
            handler.send_response(500 if self.kind == "error" else 200)
            handler.send_header("Content-Type", "application/xml")
            if self.kind == "error":
                handler.send_header("x-ms-error-code", "InternalError")
            chunked = self.kind in ("chunked", "error")
            if chunked:
                handler.send_header("Transfer-Encoding", "chunked")
            else:
                length = sum(map(len, self._pieces()))
                handler.send_header("Content-Length", str(length))
            handler.end_headers()
            for piece in self._pieces():
                framed = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
                handler.wfile.write(framed)
                self.sent += len(piece)
            if chunked:
                handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True  # (the client refused the page before its end)
        finally:
            self.answered.set()

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class ForwardProxy:
    """An ``http://`` forward proxy for plain-http targets: each request (its absolute url)
    sent on to its host, the answer streamed back in its own framing; records the targets
    and the ``Proxy-Authorization`` each came with."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                owner.seen.append((self.path, self.headers.get("Proxy-Authorization")))
                owner._forward(self)

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://user:secret@{LOOPBACK}:{self._server.server_address[1]}"

    def _forward(self, handler: BaseHTTPRequestHandler) -> None:
        host, _, path = handler.path.removeprefix("http://").partition("/")
        upstream = http.client.HTTPConnection(host, timeout=30)
        headers = {k: v for k, v in handler.headers.items() if not k.lower().startswith("proxy")}
        upstream.request("GET", "/" + path, headers=headers)
        answer = upstream.getresponse()
        try:
            handler.send_response(answer.status)
            chunked = answer.getheader("Content-Length") is None
            for name, value in answer.getheaders():
                if name.lower() not in ("transfer-encoding", "connection"):
                    handler.send_header(name, value)
            if chunked:
                handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            while piece := answer.read1(1 << 20):
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            if chunked:
                handler.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True
        finally:
            upstream.close()

    def __enter__(self) -> ForwardProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def _store(server: HostileServer, proxy: str | None = None) -> tuple[Any, str]:
    """The store of ``server`` (S3 through its aiobotocore client: a setting the door does
    not follow) and the glob it lists."""
    if server.store == "s3":
        options = {
            "key": "k",
            "secret": "s",
            "client_kwargs": {"endpoint_url": server.url},
            "config_kwargs": {"signature_version": "s3v4"},
        }
        if proxy is not None:
            options["config_kwargs"] = {"proxies": {"http": proxy}}
        return S3Store(options), "s3://bkt/d/*"
    # a SAS token: its signature rides in every request's url (never in an error)
    connection = f"BlobEndpoint={server.url}/acct;SharedAccessSignature=sv=2023-11-03&sig={SIG}"
    return AzureStore({"connection_string": connection}), "az://c/d/*"


async def _refused(
    server: HostileServer, match: str, proxy: str | None = None
) -> tuple[StorageError, int]:
    """The listing's error (with the page refused once) and its peak of traced memory."""
    store, url = _store(server, proxy)
    tracemalloc.start()
    try:
        with pytest.raises(StorageError, match=match) as raised:
            await list_glob(store, url, RETRY)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await store.close()
    assert f"{url}: listing page 1 refused" in str(raised.value)
    assert server.listed == 1  # refused, not asked for again
    assert SIG not in str(raised.value)
    return raised.value, peak


@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("kind", ["s3", "azure"])
async def test_a_page_far_longer_than_a_page_is_refused_unread(kind: str, framing: str) -> None:
    cap = S3_ANSWER_BYTES if kind == "s3" else azure_listing.ANSWER_BYTES
    with HostileServer(kind, framing) as server:
        error, peak = await _refused(server, "an answer of")
        assert server.answered.wait(10)
        assert f"{cap:,} bytes" in str(error)
        if framing == "length":
            assert f"{PADDED_BYTES:,} bytes" in str(error)  # refused by its length, unread
        # what the socket took before the client let go: the cap and the socket's buffers
        # (the whole page was read before, and held twice: ~2 x 128 MiB)
        assert server.sent < cap + (16 << 20), server.sent
        assert peak < 2 * cap + (8 << 20), peak


async def test_behind_an_http_proxy_s3s_client_reads_within_the_cap_too() -> None:
    with HostileServer("s3", "chunked") as server, ForwardProxy() as proxy:
        error, peak = await _refused(server, "an answer of", proxy.url)
        assert server.answered.wait(10)
    assert f"{S3_ANSWER_BYTES:,} bytes" in str(error)
    # through the proxy, with the credentials of its url, as botocore sends them
    [(target, _)] = proxy.seen
    url, _, query = target.partition("?")
    assert url == f"{server.url}/bkt"
    assert sorted(query.split("&")) == sorted(
        ["list-type=2", "prefix=d%2F", "delimiter=%2F", "max-keys=1000", "encoding-type=url"]
    )
    assert proxy.seen[0][1] == "Basic dXNlcjpzZWNyZXQ="  # user:secret
    assert server.sent < S3_ANSWER_BYTES + (16 << 20), server.sent
    assert peak < 2 * S3_ANSWER_BYTES + (8 << 20), peak


@pytest.mark.parametrize("kind", ["s3", "azure"])
async def test_an_error_answer_of_128_mib_is_read_to_its_first_64_kib(kind: str) -> None:
    with HostileServer(kind, "error") as server:
        store, url = _store(server)
        tracemalloc.start()
        try:
            with pytest.raises(RetriesExhaustedError, match="500") as raised:
                await list_glob(store, url, RETRY)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            await store.close()
        assert server.answered.wait(10)
    assert url in str(raised.value) and server.listed == RETRY.max_attempts  # (transient)
    # each answer dropped after its first 64 KiB: what the socket took, not 3 x 128 MiB
    assert server.sent < RETRY.max_attempts * (16 << 20), server.sent
    assert peak < 16 << 20, peak


async def test_an_azure_page_the_sdk_cannot_decode_is_quoted_in_a_few_hundred_characters() -> None:
    with HostileServer("azure", "garbage") as server:
        store, url = _store(server)
        try:
            with pytest.raises(StorageError, match="DecodeError") as raised:
                await list_glob(store, url, RETRY)
        finally:
            await store.close()
    assert url in str(raised.value) and len(str(raised.value)) < 500  # (was ~2,100)


def test_behind_an_http_proxy_s3s_client_lists_and_reads() -> None:
    records = [bytes([i]) * 1000 for i in range(50)]
    objects = {"d/a.tfrecord": RecordEncoder().encode_many(records)}
    with ListingServer(objects) as server, ForwardProxy() as proxy:
        config = {"proxies": {"http": proxy.url}}
        options = {**server.storage_options, "config_kwargs": config}
        assert list(streamrec.open_dataset("s3://bkt/d/*", storage_options=options)) == records
    targets = [target for target, _ in proxy.seen]
    assert any("list-type=2" in t for t in targets)
    assert any("/bkt/d/a.tfrecord" in t for t in targets)


@pytest.mark.parametrize(
    ("kind", "problem"), [("flat", "more elements"), ("deep", "nested more than 8 deep")]
)
async def test_an_azure_page_of_too_many_elements_is_refused_before_the_sdk_parses_it(
    kind: str, problem: str
) -> None:
    with HostileServer("azure", kind) as server:
        error, peak = await _refused(server, problem)
    assert "comp=list" in str(error) and "sig=***" in str(error)  # its request, redacted
    # the page once or twice, not a tree of a million elements (~150 MB before)
    assert peak < 32 << 20, peak


async def test_azure_reads_and_lists_past_a_small_cap_and_closes_its_session(
    azure_server: AzuriteServer, azure_container: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(azure_listing, "ANSWER_BYTES", 64 << 10)
    records = [bytes([i]) * (100 << 10) for i in range(20)]  # 2 MB in a blob
    azure_server.put(azure_container, "capped/a.tfrecord", RecordEncoder().encode_many(records))
    url = f"az://{azure_container}/capped/*"
    dataset = streamrec.open_dataset(url, storage_options=azure_server.storage_options)
    assert [record async for record in dataset] == records
    store = AzureStore(azure_server.storage_options)
    try:
        listed = await list_glob(store, url, RETRY)
        assert [obj.size for obj in listed] == [sum(len(r) + 16 for r in records)]
        # adlfs's whole reads stream too
        whole = await store.fs._cat_file(f"{azure_container}/capped/a.tfrecord")
        assert whole == RecordEncoder().encode_many(records)
    finally:
        await store.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del store
        gc.collect()
    assert not [w for w in caught if "Unclosed" in str(w.message)]
