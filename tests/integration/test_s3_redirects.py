"""No S3 request follows a redirect, on any path: an answer 301/302/307 whose ``Location``
names another host is an error naming that host, the other host gets no request (so none of
the request's credentials: ``X-Amz-Security-Token``, ``X-Amz-Date``...), and none of its
records is yielded. The redirects are injected by a proxy in front of moto; the other host is
a recording server that would serve a valid shard of foreign records."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import streamrec
from streamrec.errors import StorageError
from streamrec.format.encoder import RecordEncoder
from streamrec.storage.registry import open_store
from streamrec.storage.retry import RetryPolicy
from support.fault_proxy import FaultProxy
from support.s3_paths import RANGE_GET_PATHS, force_range_get_path
from support.servers import MotoS3Server

FOREIGN = RecordEncoder().encode_many([b"foreign record"] * 3)
OURS = RecordEncoder().encode_many([b"our record"] * 3)
FAST = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=10)


class _Recording(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, dict[str, str]]]

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
        self.send_response(200)
        self.send_header("Content-Length", str(len(FOREIGN)))
        self.send_header("ETag", '"foreign"')
        self.end_headers()
        self.wfile.write(FOREIGN)

    do_HEAD = do_PUT = do_POST = do_GET

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def foreign() -> Iterator[tuple[str, list[tuple[str, str, dict[str, str]]]]]:
    """A server on another host:port that would answer anything with a valid shard."""
    seen: list[tuple[str, str, dict[str, str]]] = []
    handler = type("Handler", (_Recording,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture(params=RANGE_GET_PATHS)
def s3_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each way an S3 read goes: through the store's door (storage/s3/door.py), or through
    the client (a store whose options the door does not follow)."""
    force_range_get_path(request.param, monkeypatch)
    return str(request.param)


def _options(proxy: FaultProxy, path: str) -> dict[str, Any]:
    options: dict[str, Any] = {
        "key": "testing",
        "secret": "testing",
        "token": "session-token-to-keep",
        "client_kwargs": {"endpoint_url": proxy.url, "region_name": "us-east-1"},
    }
    return options


def _check_refused(caught: pytest.ExceptionInfo[StorageError], host: str, url: str) -> None:
    message = str(caught.value)
    assert f"redirected the request to {host}" in message, message
    assert url in message, message
    assert "session-token-to-keep" not in message


@pytest.mark.parametrize("status", [301, 302, 307])
@pytest.mark.parametrize("reading", ["whole", "ranges"])
def test_a_read_redirected_elsewhere_is_refused(
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[..., FaultProxy],
    foreign: tuple[str, list[Any]],
    s3_path: str,
    status: int,
    reading: str,
) -> None:
    host, seen = foreign
    s3_server.put(s3_bucket, "data.tfrecord", OURS)
    proxy = fault_proxy(s3_server.endpoint_url, flavor="s3")
    location = f"http://{host}/{s3_bucket}/data.tfrecord"
    url = f"s3://{s3_bucket}/data.tfrecord"
    options = _options(proxy, s3_path)
    if reading == "ranges":  # the object looked up first: every read is a range GET
        proxy.status(status, method="GET", path="data.tfrecord", headers={"Location": location})
        with pytest.raises(StorageError) as caught:
            asyncio.run(_read_ranges(url, options))
    else:  # its first bytes read at once (no lookup), then the rest
        proxy.status(status, method="GET", path="data.tfrecord", headers={"Location": location})
        with pytest.raises(StorageError) as caught:
            list(streamrec.open_dataset(url, storage_options=options, retry=FAST))
    assert seen == []  # not a request, so no credential header and no foreign record
    _check_refused(caught, host, url)


async def _read_ranges(url: str, options: dict[str, Any]) -> list[bytes]:
    store = open_store(url, options)
    try:
        (obj,) = await store.expand(url.rsplit("/", 1)[0] + "/data.tf*")  # (a listing)
        return [await store.read_range(obj, 0, 10), await store.read_range(obj, 10, 20)]
    finally:
        await store.close()


@pytest.mark.parametrize("status", [301, 302, 307])
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "client"])
def test_a_listing_redirected_elsewhere_is_refused(
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[..., FaultProxy],
    foreign: tuple[str, list[Any]],
    status: int,
    direct: bool,
) -> None:
    host, seen = foreign
    s3_server.put(s3_bucket, "data.tfrecord", OURS)
    proxy = fault_proxy(s3_server.endpoint_url, flavor="s3")
    proxy.status(status, method="GET", path="list-type=2", headers={"Location": f"http://{host}/"})
    pattern = f"s3://{s3_bucket}/data*.tfrecord"
    options = _options(proxy, "direct" if direct else "client")
    with pytest.raises(StorageError) as caught:
        list(streamrec.open_dataset(pattern, storage_options=options, retry=FAST))
    assert seen == []
    _check_refused(caught, host, pattern)


@pytest.mark.parametrize("status", [301, 302, 307])
def test_an_upload_redirected_elsewhere_is_refused(
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[..., FaultProxy],
    foreign: tuple[str, list[Any]],
    status: int,
) -> None:
    host, seen = foreign
    proxy = fault_proxy(s3_server.endpoint_url, flavor="s3")
    proxy.status(status, method="PUT", headers={"Location": f"http://{host}/x"})
    url = f"s3://{s3_bucket}/out.tfrecord"
    options = _options(proxy, "client")
    with (
        pytest.raises(StorageError) as caught,
        streamrec.sync.open_writer(url, storage_options=options, retry=FAST) as writer,
    ):
        writer.write(b"record")  # (uploaded as the writer closes)
    assert seen == []
    assert f"redirected the request to {host}" in str(caught.value), str(caught.value)
