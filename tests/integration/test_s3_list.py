"""A glob's listing pages through the S3 door (storage/s3/door.py, listing.py), against the
moto server: the page botocore would have listed, no client made, and a page refused, cut or
stalled an error of that page (retried alone by the retry policy), never a second path."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest

import streamrec
from streamrec.errors import ObjectNotFoundError, StorageError
from streamrec.format.framing import RecordEncoder
from streamrec.storage.http.range_get import RangeClient
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.s3.door import S3Door
from streamrec.storage.s3.settings import door_settings
from streamrec.storage.s3.store import S3Store
from support.fault_proxy import FaultProxy
from support.servers import MotoS3Server

KEYS = [
    "e/a b.tfrecord",
    "e/a+b.tfrecord",
    "e/ü-ß.tfrecord",
    "e/100%.tfrecord",
    "e/a&b<c>'\".tfrecord",
    "e/x%2Fy.tfrecord",
    "e/~tilde.tfrecord",
]
PAYLOADS = {key: [key.encode() * (i + 1) for i in range(5)] for key in KEYS}


@pytest.fixture
def tricky(s3_server: MotoS3Server, s3_bucket: str) -> str:
    for key, payloads in PAYLOADS.items():
        s3_server.put(s3_bucket, key, RecordEncoder().encode_many(payloads))
    return s3_bucket


@pytest.fixture
def proxy(s3_server: MotoS3Server) -> Iterator[FaultProxy]:
    port = int(s3_server.endpoint_url.rsplit(":", 1)[1])
    with FaultProxy("127.0.0.1", port) as started:
        yield started


def _options(endpoint: str) -> dict[str, Any]:
    return {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": endpoint}}


@pytest.mark.parametrize("max_keys", [3, 1000])
def test_the_early_page_is_the_page_botocore_lists(
    tricky: str, s3_server: MotoS3Server, max_keys: int
) -> None:
    listing = door_settings(s3_server.storage_options, os.environ)
    assert listing is not None

    async def both() -> tuple[Any, Any]:
        direct = S3Door(listing)
        try:
            early = await direct.list_page(tricky, "e/", max_keys)
            if early.get("NextContinuationToken"):  # the next page too, by its token
                later = await direct.list_page(
                    tricky, "e/", max_keys, early["NextContinuationToken"]
                )
                assert later["Contents"] and not set(map(str, later["Contents"])) & set(
                    map(str, early["Contents"])
                )
        finally:
            direct.close()
        store = S3Store(s3_server.client_storage_options)
        try:
            client = await store.client()
            page = await client.list_objects_v2(
                Bucket=tricky, Prefix="e/", Delimiter="/", MaxKeys=max_keys
            )
        finally:
            await store.close()
        return early, page

    early, page = asyncio.run(both())
    assert early is not None
    assert early["Contents"] == [
        {"Key": c["Key"], "Size": c["Size"], "ETag": c["ETag"]} for c in page["Contents"]
    ]
    assert early["IsTruncated"] == page["IsTruncated"] == (max_keys < len(KEYS))
    assert early.get("NextContinuationToken") == page.get("NextContinuationToken")


def test_a_glob_is_listed_and_read_without_a_client(
    tricky: str, s3_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aiobotocore.session

    events: list[str] = []
    get, create = RangeClient.get, aiobotocore.session.AioSession._create_client

    async def spying_get(client: RangeClient, url: str, *args: Any, **kwargs: Any) -> Any:
        events.append("LIST" if "list-type" in url else "GET")
        return await get(client, url, *args, **kwargs)

    async def spying_create(session: Any, *args: Any, **kwargs: Any) -> Any:
        events.append("client")
        return await create(session, *args, **kwargs)

    monkeypatch.setattr(RangeClient, "get", spying_get)
    monkeypatch.setattr(aiobotocore.session.AioSession, "_create_client", spying_create)
    url = f"s3://{tricky}/e/*.tfrecord"
    got = list(iter(streamrec.open_dataset(url, storage_options=s3_server.storage_options)))
    assert got == [p for key in sorted(KEYS) for p in PAYLOADS[key]]
    assert events[0] == "LIST" and set(events[1:]) == {"GET"}  # no client made


FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=10)


def _glob(options: dict[str, Any], url: str, retry: RetryPolicy | None = None) -> list[str]:
    async def run() -> list[str]:
        store = S3Store(options)
        try:
            pages = store.glob_pages(url, retry)
            assert pages is not None
            return [o.url async for page in pages for o in page]
        finally:
            await store.close()

    return asyncio.run(run())


@pytest.mark.parametrize(
    "fault",
    [
        lambda proxy: proxy.status(503, path="list-type", times=1),
        lambda proxy: proxy.truncate_body(40, path="list-type", times=1),
        lambda proxy: proxy.reset_mid_body(0, path="list-type", times=1),
    ],
)
def test_a_page_refused_or_cut_is_retried_alone(tricky: str, proxy: FaultProxy, fault: Any) -> None:
    url = f"s3://{tricky}/e/*.tfrecord"
    expected = [f"s3://{tricky}/{key}" for key in sorted(KEYS)]
    assert _glob(_options(proxy.url), url) == expected
    added = fault(proxy)
    assert _glob(_options(proxy.url), url, FAST) == expected
    assert added.fired == 1
    assert [r.fault for r in proxy.records if "list-type" in r.target][-2:] == [added.kind, None]


@pytest.mark.parametrize(
    "fault",
    [
        lambda proxy: proxy.status(301, path="list-type", times=1),
        lambda proxy: proxy.status(
            200, path="list-type", times=1, body=b"<ListBucketResult><Name>x</Name>"
        ),
    ],
)
def test_a_page_that_is_no_page_is_an_error(tricky: str, proxy: FaultProxy, fault: Any) -> None:
    fault(proxy)
    with pytest.raises(StorageError, match="listing"):
        _glob(_options(proxy.url), f"s3://{tricky}/e/*.tfrecord", FAST)


def test_a_stalled_page_is_given_up_on_and_retried(tricky: str, proxy: FaultProxy) -> None:
    options = {**_options(proxy.url), "config_kwargs": {"read_timeout": 0.2}}
    proxy.stall(30, path="list-type", times=1)
    listed = _glob(options, f"s3://{tricky}/e/*.tfrecord", FAST)
    assert listed == [f"s3://{tricky}/{key}" for key in sorted(KEYS)]


def test_a_missing_bucket_is_the_clients_error(
    s3_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "s3://no-such-bucket-here/d/*.tfrecord"
    with pytest.raises(ObjectNotFoundError) as early:
        list(streamrec.open_dataset(url, storage_options=s3_server.storage_options))
    monkeypatch.setattr("streamrec.storage.s3.store.door_settings", lambda *args: None)
    with pytest.raises(ObjectNotFoundError) as late:
        list(streamrec.open_dataset(url, storage_options=s3_server.storage_options))
    assert str(early.value) == str(late.value)


def test_closing_while_the_early_page_is_out_leaves_nothing_running(
    tricky: str, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy.stall(30, path="list-type", times=1)
    get = RangeClient.get

    async def run() -> None:
        sent = asyncio.Event()

        async def spying_get(client: RangeClient, url: str, *args: Any) -> Any:
            assert "list-type" in url
            return await get(client, url, *args[:-1], lambda: (args[-1](), sent.set()))

        monkeypatch.setattr(RangeClient, "get", spying_get)
        store = S3Store(_options(proxy.url))
        pages = store.glob_pages(f"s3://{tricky}/e/*.tfrecord")
        assert pages is not None
        first = asyncio.ensure_future(pages.__anext__())
        await sent.wait()  # the early page is out, stalled by the proxy
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await pages.aclose()
        await store.close()
        assert {t for t in asyncio.all_tasks() if t is not asyncio.current_task()} == set()

    asyncio.run(run())
