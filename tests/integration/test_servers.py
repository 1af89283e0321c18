"""The test infrastructure itself: real servers, real clients, and every fault of the proxy.

These tests prove that the fixtures in support/server_fixtures.py behave as the storage tests
assume: moto, fake-gcs-server and the range file server answer s3fs, gcsfs and fsspec's HTTP client
(lists, globs, info, range and suffix-range reads), and FaultProxy injects each fault so that a
client observes it. They also pin down the client quirks the storage layer must handle (s3fs
and gcsfs pass short 206 responses on silently; both retry some faults internally).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aiohttp
import botocore.exceptions  # type: ignore[import-untyped]
import pytest

from support.fault_proxy import FaultProxy
from support.server_fixtures import HttpDir
from support.servers import (
    AWS_PART_MIN_SIZE,
    FakeGcsServer,
    MotoS3Server,
    RangeHTTPServer,
    http_request,
    parse_range,
)

DATA = bytes(range(256)) * 256  # 64 KiB, every byte knows its offset modulo 256
MakeProxy = Callable[..., FaultProxy]
# What aiohttp raises when the connection is reset mid-body (ClientPayloadError in practice).
RESET_ERRORS = (aiohttp.ClientPayloadError, aiohttp.ClientOSError, aiohttp.ServerDisconnectedError)


# --------------------------------------------------------------------------------------------
# clients, opened and closed properly (no "Unclosed client session" at exit)


@contextlib.asynccontextmanager
async def s3fs_client(endpoint_url: str, **kwargs: Any) -> AsyncIterator[Any]:
    import s3fs

    fs = s3fs.S3FileSystem(
        asynchronous=True,
        key="testing",
        secret="testing",
        client_kwargs={"endpoint_url": endpoint_url},
        skip_instance_cache=True,
        **kwargs,
    )
    client = await fs.set_session()
    try:
        yield fs
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def gcsfs_client(endpoint_url: str, **kwargs: Any) -> AsyncIterator[Any]:
    import gcsfs

    fs = gcsfs.GCSFileSystem(
        asynchronous=True,
        token="anon",
        project="test",
        endpoint_url=endpoint_url,
        skip_instance_cache=True,
        **kwargs,
    )
    session = await fs._set_session()
    try:
        yield fs
    finally:
        await session.close()


@contextlib.asynccontextmanager
async def http_fs() -> AsyncIterator[Any]:
    from fsspec.implementations.http import HTTPFileSystem

    fs = HTTPFileSystem(asynchronous=True, skip_instance_cache=True)
    session = await fs.set_session()
    try:
        yield fs
    finally:
        await session.close()


async def fetch(
    url: str, headers: dict[str, str] | None = None, *, sock_read: float | None = 10.0
) -> tuple[int, Mapping[str, str], bytes]:
    timeout = aiohttp.ClientTimeout(total=30, sock_read=sock_read)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(url, headers=headers or {}) as response,
    ):
        # headers.copy(): a case-insensitive multidict, like the response's own
        return response.status, response.headers.copy(), await response.read()


# --------------------------------------------------------------------------------------------
# RangeHTTPServer


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        ("bytes=0-9", 100, (0, 9)),
        ("bytes=90-200", 100, (90, 99)),
        ("bytes=10-", 100, (10, 99)),
        ("bytes=-10", 100, (90, 99)),
        ("bytes=-500", 100, (0, 99)),
        ("bytes=100-", 100, "unsatisfiable"),
        ("bytes=-0", 100, "unsatisfiable"),
        ("bytes=-1", 0, "unsatisfiable"),
        ("bytes=5-2", 100, None),
        ("bytes=0-1,5-6", 100, None),
        ("items=0-1", 100, None),
    ],
)
def test_parse_range(header: str, size: int, expected: object) -> None:
    assert parse_range(header, size) == expected


async def test_http_server_ranges_and_headers(http_dir: HttpDir) -> None:
    url = http_dir.write("data.bin", DATA)
    status, headers, body = await fetch(url)
    assert (status, body) == (200, DATA)
    assert headers["Content-Length"] == str(len(DATA))
    assert headers["Accept-Ranges"] == "bytes"
    etag, last_modified = headers["ETag"], headers["Last-Modified"]
    assert etag.startswith('"') and last_modified.endswith("GMT")

    cases = {
        "bytes=10-19": (10, 19),
        "bytes=65000-": (65000, len(DATA) - 1),
        "bytes=-10": (len(DATA) - 10, len(DATA) - 1),
        "bytes=65530-99999": (65530, len(DATA) - 1),
    }
    for header, (first, last) in cases.items():
        status, headers, body = await fetch(url, {"Range": header})
        assert status == 206, header
        assert body == DATA[first : last + 1], header
        assert headers["Content-Range"] == f"bytes {first}-{last}/{len(DATA)}"
        assert headers["Content-Length"] == str(last - first + 1)
        assert headers["ETag"] == etag

    status, headers, body = await fetch(url, {"Range": f"bytes={len(DATA)}-"})
    assert (status, body, headers["Content-Range"]) == (416, b"", f"bytes */{len(DATA)}")
    # If-Range with another validator: the whole (changed) representation, 200.
    status, _, body = await fetch(url, {"Range": "bytes=0-0", "If-Range": '"other"'})
    assert (status, len(body)) == (200, len(DATA))
    status, _, body = await fetch(url, {"Range": "bytes=0-0", "If-Range": etag})
    assert (status, body) == (206, DATA[:1])

    head = http_request("HEAD", url)
    assert (head.status, head.body, head.headers["Content-Length"]) == (200, b"", str(len(DATA)))
    assert http_request("GET", f"{http_dir.url}/missing.bin").status == 404


def test_http_server_keeps_connections_alive(
    http_server: RangeHTTPServer, http_dir: HttpDir
) -> None:
    http_dir.write("a.bin", DATA)
    connection = http.client.HTTPConnection(http_server.host, http_server.port, timeout=5)
    try:
        for start in (0, 100, 1000):
            connection.request(
                "GET",
                f"/{http_dir.path.name}/a.bin",
                headers={"Range": f"bytes={start}-{start + 9}"},
            )
            if start == 0:
                first_socket = connection.sock
            response = connection.getresponse()
            assert (response.status, response.read()) == (206, DATA[start : start + 10])
            assert connection.sock is first_socket  # the same TCP connection every time
    finally:
        connection.close()


async def test_fsspec_http_lists_globs_and_reads(
    http_server: RangeHTTPServer, http_dir: HttpDir
) -> None:
    http_dir.write("train-0.bin", DATA)
    http_dir.write("train-1.bin", DATA[:1000])
    http_dir.write("eval-0.bin", b"x")
    http_dir.write("sub/deep.bin", b"deep")
    base = http_dir.url
    async with http_fs() as fs:
        listed = await fs._ls(base + "/", detail=False)
        assert sorted(listed) == [
            f"{base}/eval-0.bin",
            f"{base}/sub/",
            f"{base}/train-0.bin",
            f"{base}/train-1.bin",
        ]
        assert await fs._glob(base + "/train-*.bin") == [
            f"{base}/train-0.bin",
            f"{base}/train-1.bin",
        ]
        assert f"{base}/sub/deep.bin" in await fs._find(base)
        info = await fs._info(f"{base}/train-1.bin")
        assert info["size"] == 1000 and info["ETag"]
        assert await fs._cat_file(f"{base}/train-0.bin", start=100, end=200) == DATA[100:200]
        assert await fs._cat_file(f"{base}/train-0.bin", start=-16) == DATA[-16:]
        assert await fs._cat_file(f"{base}/train-0.bin") == DATA
    assert any(r.range == "bytes=-16" and r.status == 206 for r in http_server.requests)


# --------------------------------------------------------------------------------------------
# moto (S3)


def test_moto_helpers(s3_server: MotoS3Server, s3_bucket: str) -> None:
    s3_server.put(s3_bucket, "a/one.bin", DATA)
    s3_server.put(s3_bucket, "a/two.bin", b"two")
    s3_server.put(s3_bucket, "b/three.bin", b"three")
    assert s3_server.list(s3_bucket) == ["a/one.bin", "a/two.bin", "b/three.bin"]
    assert s3_server.list(s3_bucket, prefix="a/") == ["a/one.bin", "a/two.bin"]
    assert s3_server.get(s3_bucket, "a/one.bin") == DATA
    assert s3_server.get(s3_bucket, "a/one.bin", range="bytes=10-19") == DATA[10:20]
    assert s3_server.get(s3_bucket, "a/one.bin", range="bytes=-7") == DATA[-7:]
    s3_server.delete(s3_bucket, "a/two.bin")
    assert s3_server.list(s3_bucket) == ["a/one.bin", "b/three.bin"]


def test_moto_multipart_and_part_size(
    s3_server: MotoS3Server, s3_bucket: str, s3_small_parts: int
) -> None:
    client = s3_server.client
    assert s3_server.part_min_size == s3_small_parts == 1024

    def upload(key: str) -> str:
        upload_id: str = client.create_multipart_upload(Bucket=s3_bucket, Key=key)["UploadId"]
        for number in (1, 2):
            part = DATA[(number - 1) * 2048 : number * 2048]
            client.upload_part(
                Bucket=s3_bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=part
            )
        return upload_id

    def complete(key: str, upload_id: str) -> None:
        parts = client.list_parts(Bucket=s3_bucket, Key=key, UploadId=upload_id)["Parts"]
        client.complete_multipart_upload(
            Bucket=s3_bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={
                "Parts": [{"PartNumber": p["PartNumber"], "ETag": p["ETag"]} for p in parts]
            },
        )

    small = upload("small.bin")
    assert [u["UploadId"] for u in s3_server.list_multipart_uploads(s3_bucket)] == [small]
    complete("small.bin", small)
    assert s3_server.get(s3_bucket, "small.bin") == DATA[:4096]
    assert s3_server.list_multipart_uploads(s3_bucket) == []

    refused = upload("refused.bin")
    previous = s3_server.set_part_min_size(AWS_PART_MIN_SIZE)
    try:
        with pytest.raises(botocore.exceptions.ClientError, match="EntityTooSmall"):
            complete("refused.bin", refused)
    finally:
        s3_server.set_part_min_size(previous)
    client.abort_multipart_upload(Bucket=s3_bucket, Key="refused.bin", UploadId=refused)
    assert s3_server.list_multipart_uploads(s3_bucket) == []


def test_moto_reset(s3_server: MotoS3Server) -> None:
    s3_server.create_bucket("reset-me")
    s3_server.put("reset-me", "k", b"v")
    s3_server.reset()  # note: moto's state is process-wide; every bucket goes
    buckets = s3_server.client.list_buckets()["Buckets"]
    assert "reset-me" not in [b["Name"] for b in buckets]


async def test_s3fs_against_moto(s3_server: MotoS3Server, s3_bucket: str) -> None:
    s3_server.put(s3_bucket, "d/train-0.bin", DATA)
    s3_server.put(s3_bucket, "d/train-1.bin", DATA[:1000])
    s3_server.put(s3_bucket, "d/eval.bin", b"e")
    async with s3fs_client(s3_server.endpoint_url) as fs:
        assert sorted(await fs._ls(f"{s3_bucket}/d", detail=False)) == [
            f"{s3_bucket}/d/eval.bin",
            f"{s3_bucket}/d/train-0.bin",
            f"{s3_bucket}/d/train-1.bin",
        ]
        assert await fs._glob(f"s3://{s3_bucket}/d/train-*.bin") == [
            f"{s3_bucket}/d/train-0.bin",
            f"{s3_bucket}/d/train-1.bin",
        ]
        info = await fs._info(f"{s3_bucket}/d/train-1.bin")
        assert info["size"] == 1000 and info["ETag"]
        path = f"{s3_bucket}/d/train-0.bin"
        assert await fs._cat_file(path, start=100, end=200) == DATA[100:200]
        assert await fs._cat_file(path, start=-16) == DATA[-16:]
        assert await fs._cat_file(path) == DATA
        await fs._pipe_file(f"{s3_bucket}/written.bin", b"written by s3fs")
        await fs._mkdir("made-by-s3fs-" + s3_bucket[-8:])  # bucket creation works (no region)
    assert s3_server.get(s3_bucket, "written.bin") == b"written by s3fs"


# --------------------------------------------------------------------------------------------
# fake-gcs-server (GCS)


def test_fake_gcs_helpers(gcs_server: FakeGcsServer, gcs_bucket: str) -> None:
    assert gcs_bucket in gcs_server.buckets()
    metadata = gcs_server.put(gcs_bucket, "a/one.bin", DATA)
    assert metadata["size"] == str(len(DATA))
    gcs_server.put(gcs_bucket, "a/two.bin", b"two")
    gcs_server.put(gcs_bucket, "b/three.bin", b"three")
    assert gcs_server.list(gcs_bucket) == ["a/one.bin", "a/two.bin", "b/three.bin"]
    assert gcs_server.list(gcs_bucket, prefix="a/") == ["a/one.bin", "a/two.bin"]
    assert gcs_server.get(gcs_bucket, "a/one.bin") == DATA
    assert gcs_server.get(gcs_bucket, "a/one.bin", range="bytes=10-19") == DATA[10:20]
    assert gcs_server.get(gcs_bucket, "a/one.bin", range="bytes=-7") == DATA[-7:]
    assert gcs_server.stat(gcs_bucket, "b/three.bin")["size"] == "5"
    gcs_server.delete(gcs_bucket, "a/two.bin")
    assert gcs_server.list(gcs_bucket) == ["a/one.bin", "b/three.bin"]
    gcs_server.delete_bucket(gcs_bucket)
    assert gcs_bucket not in gcs_server.buckets()
    assert gcs_server.log_path.exists()


async def test_gcsfs_against_fake_gcs(gcs_server: FakeGcsServer, gcs_bucket: str) -> None:
    gcs_server.put(gcs_bucket, "d/train-0.bin", DATA)
    gcs_server.put(gcs_bucket, "d/train-1.bin", DATA[:1000])
    gcs_server.put(gcs_bucket, "d/eval.bin", b"e")
    async with gcsfs_client(gcs_server.endpoint_url) as fs:
        assert sorted(await fs._ls(f"{gcs_bucket}/d", detail=False)) == [
            f"{gcs_bucket}/d/eval.bin",
            f"{gcs_bucket}/d/train-0.bin",
            f"{gcs_bucket}/d/train-1.bin",
        ]
        assert await fs._glob(f"gs://{gcs_bucket}/d/train-*.bin") == [
            f"{gcs_bucket}/d/train-0.bin",
            f"{gcs_bucket}/d/train-1.bin",
        ]
        info = await fs._info(f"{gcs_bucket}/d/train-1.bin")
        assert info["size"] == 1000 and info["md5Hash"]
        path = f"{gcs_bucket}/d/train-0.bin"
        assert await fs._cat_file(path, start=100, end=200) == DATA[100:200]
        assert await fs._cat_file(path, start=-16) == DATA[-16:]
        assert await fs._cat_file(path) == DATA
        await fs._pipe_file(f"{gcs_bucket}/written.bin", b"written by gcsfs")
    assert gcs_server.get(gcs_bucket, "written.bin") == b"written by gcsfs"


# --------------------------------------------------------------------------------------------
# FaultProxy against the range server, observed with plain aiohttp


@pytest.fixture
def data_url(http_dir: HttpDir) -> str:
    """Path (on the HTTP server) of a 64 KiB file."""
    http_dir.write("data.bin", DATA)
    return f"/{http_dir.path.name}/data.bin"


@pytest.fixture
def proxy(http_server: RangeHTTPServer, fault_proxy: MakeProxy) -> FaultProxy:
    return fault_proxy(http_server.base_url)


async def test_proxy_passes_requests_through(proxy: FaultProxy, data_url: str) -> None:
    url = proxy.url + data_url
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for start in range(0, 5000, 1000):  # keep-alive: one client connection, many requests
            headers = {"Range": f"bytes={start}-{start + 99}"}
            async with session.get(url, headers=headers) as response:
                assert response.status == 206
                assert await response.read() == DATA[start : start + 100]
        async with session.get(url) as response:
            assert await response.read() == DATA
        async with session.head(url) as response:
            assert response.headers["Content-Length"] == str(len(DATA))
    records = proxy.records
    assert [r.method for r in records] == ["GET"] * 6 + ["HEAD"]
    assert [r.status for r in records] == [206] * 5 + [200, 200]
    assert all(r.fault is None for r in records)
    assert proxy.count("GET", "data.bin") == 6


async def test_proxy_reset_mid_body(proxy: FaultProxy, data_url: str) -> None:
    fault = proxy.reset_mid_body(1000, path="data.bin", times=1)
    # aiohttp: ClientPayloadError("Response payload is not completed ... ConnectionResetError")
    with pytest.raises(RESET_ERRORS, match="reset by peer"):
        await fetch(proxy.url + data_url)
    assert fault.fired == 1
    status, _, body = await fetch(proxy.url + data_url)  # times=1: the next one is clean
    assert (status, body) == (200, DATA)
    assert [r.fault for r in proxy.records] == ["reset_mid_body", None]


async def test_proxy_truncate_body(proxy: FaultProxy, data_url: str) -> None:
    fault = proxy.truncate_body(1000, path="data.bin", range_only=True)
    # aiohttp: ClientPayloadError("... Not enough data to satisfy content length header")
    with pytest.raises(aiohttp.ClientPayloadError, match="1000 of 5000") as info:
        await fetch(proxy.url + data_url, {"Range": "bytes=0-4999"})
    assert "reset" not in str(info.value)  # a clean FIN, not an RST
    status, _, body = await fetch(proxy.url + data_url)  # no Range header: not matched
    assert (status, body, fault.fired) == (200, DATA, 1)


async def test_proxy_short_206(proxy: FaultProxy, data_url: str) -> None:
    fault = proxy.short_206(7, path="data.bin")
    status, headers, body = await fetch(proxy.url + data_url, {"Range": "bytes=100-199"})
    assert (status, body) == (206, DATA[100:107])
    assert headers["Content-Range"] == f"bytes 100-106/{len(DATA)}"
    assert headers["Content-Length"] == "7"
    status, _, body = await fetch(proxy.url + data_url)  # a 200 is left alone
    assert (status, body, fault.fired) == (200, DATA, 1)
    status, _, body = await fetch(proxy.url + data_url, {"Range": "bytes=-3"})  # not longer
    assert (status, body, fault.fired) == (206, DATA[-3:], 1)


async def test_proxy_status(proxy: FaultProxy, data_url: str) -> None:
    fault = proxy.status(503, times=2, headers={"Retry-After": "0"}, method="GET")
    for _ in range(2):
        status, headers, body = await fetch(proxy.url + data_url)
        assert (status, headers["Retry-After"]) == (503, "0")
        assert b"503 Service Unavailable" in body
    status, _, body = await fetch(proxy.url + data_url)
    assert (status, body, fault.fired) == (200, DATA, 2)
    assert http_request("GET", proxy.url + data_url).body == DATA  # urllib agrees
    assert http_request("HEAD", proxy.url + data_url).status == 200


async def test_proxy_status_bodies_by_flavor(
    http_server: RangeHTTPServer, fault_proxy: MakeProxy, data_url: str
) -> None:
    s3_proxy = fault_proxy(http_server.base_url, flavor="s3")
    s3_proxy.status(503)
    response = http_request("GET", s3_proxy.url + data_url)
    assert response.status == 503
    assert b"<Code>SlowDown</Code>" in response.body
    assert response.headers["Content-Type"] == "application/xml"
    gcs_proxy = fault_proxy(http_server.base_url, flavor="gcs")
    gcs_proxy.status(429, body=b"custom")
    response = http_request("GET", gcs_proxy.url + data_url)
    assert (response.status, response.body) == (429, b"custom")


async def test_proxy_stall_times_out_the_client_and_stop_is_prompt(
    http_server: RangeHTTPServer, data_url: str
) -> None:
    proxy = FaultProxy("127.0.0.1", http_server.port).start()
    try:
        fault = proxy.stall(60, path="data.bin")
        with pytest.raises(asyncio.TimeoutError):
            await fetch(proxy.url + data_url, sock_read=0.3)
        # (the client may give up before the proxy's thread has got to its request)
        assert proxy.wait_until(lambda records: any(r.fault == "stall" for r in records))
        assert fault.fired == 1
        assert proxy.records[0].status is None  # nothing was sent
    finally:
        started = time.monotonic()
        proxy.stop()  # the 60 s stall is still pending inside the proxy
        elapsed = time.monotonic() - started
    assert elapsed < 2.0
    assert not proxy.running
    assert not [t for t in threading.enumerate() if t.name.startswith("FaultProxy")]
    assert proxy.errors == []


async def test_proxy_stall_mid_body(proxy: FaultProxy, data_url: str) -> None:
    stuck = proxy.stall(60, after_bytes=100, path="data.bin", times=1)
    with pytest.raises(asyncio.TimeoutError):
        await fetch(proxy.url + data_url, sock_read=0.3)
    short = proxy.stall(0.2, after_bytes=100, path="data.bin", times=1)
    started = time.monotonic()
    status, _, body = await fetch(proxy.url + data_url)  # a short stall is only slow
    assert (status, body) == (200, DATA)
    assert time.monotonic() - started >= 0.2
    assert (stuck.fired, short.fired) == (1, 1)


async def test_proxy_delay_combines_with_other_faults(proxy: FaultProxy, data_url: str) -> None:
    delay = proxy.delay(0.2, times=1)
    fault = proxy.status(500, times=1)
    started = time.monotonic()
    status, _, _ = await fetch(proxy.url + data_url)
    assert status == 500
    assert time.monotonic() - started >= 0.2
    assert (delay.fired, fault.fired) == (1, 1)


async def test_proxy_matching_and_clearing(proxy: FaultProxy, http_dir: HttpDir) -> None:
    http_dir.write("a.bin", DATA)
    http_dir.write("b.bin", DATA)
    base = f"{proxy.url}/{http_dir.path.name}"
    by_regex = proxy.status(500, path=re.compile(r"/a\.bin$"), method="GET")
    by_method = proxy.status(501, method="HEAD")
    assert (await fetch(f"{base}/a.bin"))[0] == 500
    assert (await fetch(f"{base}/b.bin"))[0] == 200
    assert http_request("HEAD", f"{base}/b.bin").status == 501
    assert (by_regex.fired, by_method.fired) == (1, 1)
    assert proxy.faults == [by_regex, by_method]
    proxy.clear()  # while the proxy runs
    assert (await fetch(f"{base}/a.bin"))[0] == 200
    assert http_request("HEAD", f"{base}/a.bin").status == 200
    proxy.remove(by_regex)  # removing what is gone is harmless
    assert proxy.faults == []


async def test_proxy_answers_502_when_upstream_is_down(fault_proxy: MakeProxy) -> None:
    with socket.socket() as placeholder:  # a port nobody listens on
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
        proxy = fault_proxy(f"http://127.0.0.1:{port}")
        response = http_request("GET", proxy.url + "/anything")
    assert response.status == 502
    assert proxy.records[0].status == 502


# --------------------------------------------------------------------------------------------
# FaultProxy with chunked bodies, read-until-close bodies and Expect: 100-continue


class _OddHandler(BaseHTTPRequestHandler):
    """Responses the range server never sends: chunked, close-delimited, and an echo PUT."""

    protocol_version = "HTTP/1.1"
    timeout = 10

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _chunked(self, status: int, body: bytes, extra: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Transfer-Encoding", "chunked")
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()
        for start in range(0, len(body), 1000):
            piece = body[start : start + 1000]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\n\r\n")

    def do_GET(self) -> None:
        if self.path == "/chunked":
            self._chunked(200, DATA, {})
        elif self.path == "/chunked-range":
            first, last = 100, 4099
            extra = {"Content-Range": f"bytes {first}-{last}/{len(DATA)}"}
            self._chunked(206, DATA[first : last + 1], extra)
        elif self.path == "/until-close":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(DATA)
            self.close_connection = True
        else:
            self.send_error(404)

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        reply = f"{len(body)} {self.headers.get('Expect')}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients hung up on purpose (the proxy resets them)


@pytest.fixture(scope="module")
def odd_server() -> Iterator[str]:
    server = _QuietServer(("127.0.0.1", 0), _OddHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


async def test_proxy_handles_chunked_close_delimited_and_continue(
    odd_server: str, fault_proxy: MakeProxy
) -> None:
    proxy = fault_proxy(odd_server)
    status, headers, body = await fetch(proxy.url + "/chunked")
    assert (status, body, headers["Transfer-Encoding"]) == (200, DATA, "chunked")
    status, _, body = await fetch(proxy.url + "/until-close")
    assert (status, body) == (200, DATA)
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.put(proxy.url + "/echo", data=DATA, expect100=True) as response,
    ):
        # The proxy answered 100 Continue itself and did not forward the Expect header.
        assert (response.status, await response.read()) == (200, f"{len(DATA)} None".encode())

    short = proxy.short_206(10)
    status, headers, body = await fetch(proxy.url + "/chunked-range")
    assert (status, body) == (206, DATA[100:110])
    assert headers["Content-Range"] == f"bytes 100-109/{len(DATA)}"
    assert short.fired == 1
    proxy.clear()
    proxy.reset_mid_body(5000, path="/chunked")
    with pytest.raises(RESET_ERRORS):
        await fetch(proxy.url + "/chunked")


# --------------------------------------------------------------------------------------------
# FaultProxy in front of moto and fake-gcs-server, with the real clients


async def test_s3fs_through_the_proxy(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: MakeProxy
) -> None:
    s3_server.put(s3_bucket, "d/x.bin", DATA)
    proxy = fault_proxy(s3_server.endpoint_url)
    assert proxy.flavor == "s3"
    path = f"{s3_bucket}/d/x.bin"
    async with s3fs_client(proxy.url) as fs:
        assert await fs._ls(f"{s3_bucket}/d", detail=False) == [path]
        assert (await fs._info(path))["size"] == len(DATA)
        assert await fs._cat_file(path, start=-10) == DATA[-10:]

        # s3fs retries a reset body itself and returns the right bytes.
        reset = proxy.reset_mid_body(100, method="GET", path="/d/x.bin", times=1)
        before = proxy.count("GET", "/d/x.bin")
        assert await fs._cat_file(path, start=0, end=5000) == DATA[:5000]
        assert reset.fired == 1
        assert proxy.count("GET", "/d/x.bin") - before == 2

        # SlowDown is retried too.
        slow = proxy.status(503, method="GET", path="/d/x.bin", times=1)
        assert await fs._cat_file(path, start=10, end=20) == DATA[10:20]
        assert slow.fired == 1

        # A valid short 206 is passed on silently: the caller must check lengths.
        proxy.short_206(5, path="/d/x.bin", times=1)
        assert await fs._cat_file(path, start=1000, end=2000) == DATA[1000:1005]

        await fs._pipe_file(f"{s3_bucket}/d/up.bin", DATA)  # uploads pass through too
    assert s3_server.get(s3_bucket, "d/up.bin") == DATA


async def test_gcsfs_through_the_proxy(
    gcs_server: FakeGcsServer, gcs_bucket: str, fault_proxy: MakeProxy
) -> None:
    import gcsfs.core

    gcs_server.put(gcs_bucket, "d/x.bin", DATA)
    proxy = fault_proxy(gcs_server.endpoint_url)
    assert proxy.flavor == "gcs"
    path = f"{gcs_bucket}/d/x.bin"
    async with gcsfs_client(proxy.url) as fs:
        assert await fs._ls(f"{gcs_bucket}/d", detail=False) == [path]
        assert (await fs._info(path))["size"] == len(DATA)
        assert await fs._cat_file(path, start=-10) == DATA[-10:]

        # A valid short 206 is passed on silently: the caller must check lengths.
        short = proxy.short_206(5, path="x.bin", times=1)
        assert await fs._cat_file(path, start=1000, end=2000) == DATA[1000:1005]
        assert short.fired == 1

        # gcsfs retries a reset body itself (after a 1-2 s back-off).
        reset = proxy.reset_mid_body(100, method="GET", path="x.bin", times=1)
        assert await fs._cat_file(path, start=0, end=5000) == DATA[:5000]
        assert reset.fired == 1

        # A resumable upload: the session URL (Location) is rewritten to go through the proxy.
        location = await gcsfs.core.initiate_upload(fs, gcs_bucket, "d/resumable.bin")
        assert location.startswith(proxy.url)
        chunk = 256 * 1024
        payload = DATA * 5  # 320 KiB: one full 256 KiB chunk and the rest
        headers = {"Content-Range": f"bytes 0-{chunk - 1}/*", "Content-Length": str(chunk)}
        await fs._call("POST", location, headers=headers, data=payload[:chunk])
        kind = "application/octet-stream"
        await gcsfs.core.upload_chunk(fs, location, payload[chunk:], chunk, len(payload), kind)
    assert gcs_server.get(gcs_bucket, "d/resumable.bin") == payload
    uploads = [r for r in proxy.records if "upload_id=" in r.target]
    assert [(r.method, r.status) for r in uploads] == [("POST", 308), ("POST", 200)]
