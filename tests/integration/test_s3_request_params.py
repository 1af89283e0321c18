"""What the caller asks every S3 request to carry (``requester_pays=True``, SSE-C's keys in
``s3_additional_kwargs``) reaches every request streamrec sends: listing pages, range GETs
(each way they go: streamrec's own connections, the client's HTTP session, ``get_object``),
first bytes, sidecars, multipart and single uploads, open uploads. A recording proxy in front
of moto sees every request (moto serves them, but enforces neither)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import streamrec
from streamrec.storage.registry import open_store
from support.fault_proxy import FaultProxy, ProxyRecord
from support.s3_paths import RANGE_GET_PATHS, force_range_get_path
from support.servers import MotoS3Server

SSE_KEY = bytes(range(32))
SSE_HEADERS = {
    "x-amz-server-side-encryption-customer-algorithm": "AES256",
    "x-amz-server-side-encryption-customer-key": base64.b64encode(SSE_KEY).decode(),
    "x-amz-server-side-encryption-customer-key-md5": base64.b64encode(
        hashlib.md5(SSE_KEY).digest()
    ).decode(),
}
# the requests whose operations take the SSE-C key (GET/HEAD/PUT of an object, a part, the
# creation and completion of an upload); listings and aborts take none
_SSE_TAKEN = ("GET", "HEAD", "PUT", "POST")


@pytest.fixture(params=RANGE_GET_PATHS)
def range_gets(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each way a range GET of the client's path goes."""
    force_range_get_path(request.param, monkeypatch)
    yield request.param


def _through(proxy: FaultProxy, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": proxy.url, "region_name": "us-east-1"},
        **extra,
    }


def _write_and_read(bucket: str, options: dict[str, Any]) -> None:
    data = [bytes([i % 251]) * (i % 300) for i in range(400)]  # ~60 KB: parts of 8 KiB
    with streamrec.sync.open_writer(
        f"s3://{bucket}/set/part-{{index:03d}}.tfrecord",
        max_bytes=40_000,
        part_bytes=8 << 10,
        index=True,
        storage_options=options,
    ) as writer:
        writer.write_many(data)
        writer.write_many([b"small"])  # (one shard of several parts, one of a single PUT)
    glob = f"s3://{bucket}/set/part-*.tfrecord"
    assert list(streamrec.open_dataset(glob, storage_options=options)) == [*data, b"small"]
    first = f"s3://{bucket}/set/part-000.tfrecord"
    assert list(streamrec.open_dataset(first, storage_options=options))[:3] == data[:3]
    shuffled = streamrec.open_dataset(glob, shuffle="global", seed=1, storage_options=options)
    assert sorted(shuffled) == sorted([*data, b"small"])  # records by their sidecars

    async def open_uploads() -> None:
        store = open_store(f"s3://{bucket}/", options)
        try:
            assert await store.unfinished_writes(f"s3://{bucket}/set/") == []
        finally:
            await store.close()

    asyncio.run(open_uploads())


def _missing(
    records: list[ProxyRecord], wanted: Callable[[ProxyRecord], dict[str, str]]
) -> list[str]:
    found = []
    for record in records:
        for name, value in wanted(record).items():
            if record.headers.get(name) != value:
                found.append(
                    f"{record.method} {record.target}: {name}={record.headers.get(name)!r}"
                )
    return found


def test_requester_pays_reaches_every_request(
    s3_server: MotoS3Server,
    s3_bucket: str,
    s3_small_parts: int,
    fault_proxy: Callable[..., FaultProxy],
    range_gets: str,
) -> None:
    proxy = fault_proxy(s3_server.endpoint_url, flavor="s3")
    _write_and_read(s3_bucket, _through(proxy, {"requester_pays": True}))
    records = proxy.records
    assert {r.method for r in records} >= {"GET", "PUT", "POST"}
    assert any("list-type=2" in r.target for r in records)
    assert any(".idx" in r.target and r.method == "GET" for r in records)
    assert any("uploads" in r.target and r.method == "GET" for r in records)
    assert _missing(records, lambda r: {"x-amz-request-payer": "requester"}) == []


def test_sse_c_keys_reach_every_object_request(
    s3_server: MotoS3Server,
    s3_bucket: str,
    s3_small_parts: int,
    fault_proxy: Callable[..., FaultProxy],
    range_gets: str,
) -> None:
    proxy = fault_proxy(s3_server.endpoint_url, flavor="s3")
    extra = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": SSE_KEY}
    _write_and_read(s3_bucket, _through(proxy, {"s3_additional_kwargs": extra}))
    records = proxy.records

    def wanted(record: ProxyRecord) -> dict[str, str]:
        listing = record.method == "GET" and (
            "list-type=2" in record.target or "?uploads" in record.target
        )
        aborting = record.method == "DELETE"
        if record.method not in _SSE_TAKEN or listing or aborting:
            return {}
        return SSE_HEADERS

    assert any(r.method == "GET" and "bytes=" in (r.range or "") for r in records)
    assert _missing(records, wanted) == []
