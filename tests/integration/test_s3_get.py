"""S3 range GETs signed per request (storage/s3_get.py) against moto and fake servers: the
bytes asked for, one url per object, SigV4 headers (never a weaker signature, no credential in
the url or in any error), the version pinned, errors by their S3 code, bodies capped at the
range."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest

import streamrec
from streamrec.errors import (
    ObjectChangedError,
    ObjectNotFoundError,
    PermissionDeniedError,
    StorageError,
    TransientStorageError,
)
from streamrec.format.encoder import RecordEncoder
from streamrec.storage.http import range_get as http_range
from streamrec.storage.s3 import signed_get as s3_get
from streamrec.storage.s3.signed_get import RangeGetter
from streamrec.storage.s3.store import S3Store
from support.servers import MotoS3Server

DATA = bytes(range(256)) * 400  # 102,400 bytes


def _with_client(
    server: MotoS3Server, body: Callable[[Any], Awaitable[Any]], **options: Any
) -> Any:
    async def run() -> Any:
        store = S3Store({**server.storage_options, **options})
        try:
            return await body(await store.client())
        finally:
            await store.close()

    return asyncio.run(run())


def _etag(server: MotoS3Server, bucket: str, key: str) -> str:
    etag: str = server.client.head_object(Bucket=bucket, Key=key)["ETag"]
    return etag


def test_ranges_are_the_bytes_asked_for_on_one_presigned_url(
    s3_server: MotoS3Server, s3_bucket: str
) -> None:
    s3_server.put(s3_bucket, "a/data.bin", DATA)
    etag = _etag(s3_server, s3_bucket, "a/data.bin")
    getter = RangeGetter()
    ranges = [(0, 1), (0, 1000), (999, 65_536), (65_536, len(DATA)), (50_000, 50_001)]

    async def body(client: Any) -> list[bytes]:
        assert getter.serves(client, s3_bucket)
        return [
            b"".join(await getter.get(client, s3_bucket, "a/data.bin", s, e, etag, "name"))
            for s, e in ranges
        ]

    got = _with_client(s3_server, body)
    assert got == [DATA[s:e] for s, e in ranges]
    assert getter.resolved == 1  # one url served every range


def _sending(client: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The requests sent from now on, either way: through ``client``'s HTTP session or on
    streamrec's own connections (storage/http_range.py)."""
    sent: list[Any] = []
    session = client._endpoint.http_session
    send = session.send

    async def recorded(request: Any) -> Any:
        sent.append(request)
        return await send(request)

    own = http_range.RangeClient.get

    async def recorded_own(
        self: http_range.RangeClient, url: str, headers: Any, *args: Any
    ) -> http_range.Answer:
        sent.append(SimpleNamespace(url=url, headers=dict(headers.items())))
        return await own(self, url, headers, *args)

    session.send = recorded
    monkeypatch.setattr(http_range.RangeClient, "get", recorded_own)
    return sent


@pytest.mark.parametrize("direct", [True, False], ids=["own-connections", "session"])
def test_requests_are_signed_with_sigv4_headers_never_a_presigned_sigv2_url(
    s3_server: MotoS3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    s3_server.put(s3_bucket, "t.bin", DATA)
    getter = RangeGetter()
    getter.direct = direct

    async def body(client: Any) -> tuple[list[Any], bytes]:
        sent = _sending(client, monkeypatch)
        assert getter.serves(client, s3_bucket)
        data = b"".join(await getter.get(client, s3_bucket, "t.bin", 0, 10, '"e"', "n"))
        return sent, data

    with pytest.raises(ObjectChangedError):  # moto checks If-Match: the header went along
        _with_client(s3_server, body, token="session-token-123")
    etag = _etag(s3_server, s3_bucket, "t.bin")

    async def good(client: Any) -> tuple[list[Any], bytes]:
        sent = _sending(client, monkeypatch)
        data = b"".join(await getter.get(client, s3_bucket, "t.bin", 0, 10, etag, "n"))
        return sent, data

    sent, data = _with_client(s3_server, good, token="session-token-123")
    assert data == DATA[:10]
    (request,) = sent
    assert isinstance(request, SimpleNamespace) == direct  # the way asked for was taken
    assert "?" not in request.url  # no signature, credential or token in the url
    authorization = request.headers["Authorization"]
    authorization = authorization.decode() if isinstance(authorization, bytes) else authorization
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=")
    assert "/us-east-1/s3/aws4_request" in authorization
    for signed in ("range", "if-match", "x-amz-date", "x-amz-security-token"):
        assert signed in authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    token = request.headers["X-Amz-Security-Token"]
    assert (token.decode() if isinstance(token, bytes) else token) == "session-token-123"


def test_clients_configured_for_another_signature_keep_get_object(
    s3_server: MotoS3Server, s3_bucket: str
) -> None:
    async def serves(client: Any) -> bool:
        return RangeGetter().serves(client, s3_bucket)

    assert _with_client(s3_server, serves)
    assert _with_client(s3_server, serves, config_kwargs={"signature_version": "s3v4"})
    assert not _with_client(s3_server, serves, config_kwargs={"signature_version": "s3"})
    payloads = [b"x" * 100, b"y" * 5000]
    s3_server.put(s3_bucket, "v2.tfrecord", RecordEncoder().encode_many(payloads))
    options = {**s3_server.storage_options, "config_kwargs": {"signature_version": "s3"}}
    assert list(streamrec.open_dataset(f"s3://{s3_bucket}/v2.tfrecord", storage_options=options))
    assert (
        list(streamrec.open_dataset(f"s3://{s3_bucket}/v2.tfrecord", storage_options=options))
        == payloads
    )


def test_a_replaced_object_and_a_missing_one_are_their_errors(
    s3_server: MotoS3Server, s3_bucket: str
) -> None:
    s3_server.put(s3_bucket, "c.bin", DATA)
    getter = RangeGetter()

    async def changed(client: Any) -> None:
        await getter.get(client, s3_bucket, "c.bin", 0, 10, '"not-the-etag"', "s3://x/c.bin")

    with pytest.raises(ObjectChangedError, match=r"s3://x/c\.bin"):
        _with_client(s3_server, changed)

    async def missing(client: Any) -> None:
        await getter.get(client, s3_bucket, "nope.bin", 0, 10, None, "s3://x/nope.bin")

    with pytest.raises(ObjectNotFoundError, match=r"s3://x/nope\.bin: reading bytes 0-9"):
        _with_client(s3_server, missing)


def test_directory_buckets_and_foreign_clients_keep_get_object() -> None:
    class Client:
        class _endpoint:
            class http_session:
                async def send(self, request: Any) -> None: ...

        class _request_signer:
            signature_version = "s3v4"
            region_name = "eu-west-1"

        async def generate_presigned_url(self, *args: Any, **kwargs: Any) -> str:
            return "http://example.invalid/"

    getter = RangeGetter()
    assert getter.serves(Client(), "bucket")
    assert not getter.serves(Client(), "data--usw2-az1--x-s3")
    assert not getter.serves(Client(), "arn:aws:s3::123456789012:accesspoint/mrap.mrap")
    assert not getter.serves(object(), "bucket")
    Client._request_signer.region_name = ""  # no region to sign for: get_object resolves it
    assert not getter.serves(Client(), "bucket")
    Client._request_signer.region_name = "eu-west-1"
    Client._request_signer.signature_version = "v4a"
    assert not getter.serves(Client(), "bucket")


def test_a_dataset_reads_every_record_through_signed_range_gets(
    s3_server: MotoS3Server, s3_bucket: str
) -> None:
    payloads = [bytes([i % 251]) * (i * 131 % 7000) for i in range(600)]
    s3_server.put(s3_bucket, "ds/one.tfrecord", RecordEncoder().encode_many(payloads))
    s3_server.put(s3_bucket, "ds/two.tfrecord", RecordEncoder().encode_many(payloads[::-1]))
    ds = streamrec.open_dataset(
        f"s3://{s3_bucket}/ds/*.tfrecord",
        storage_options=s3_server.storage_options,
        block_bytes=65_536,
    )
    assert list(ds) == payloads + payloads[::-1]


class _Raw:
    """An aiohttp response's part the getter uses."""

    def __init__(self, body: bytes) -> None:
        self.body, self.released, self.closed = body, False, False
        self.content = self

    async def read(self, n: int = -1) -> bytes:
        data, self.body = self.body[: n if n >= 0 else None], b""
        return data

    async def readany(self) -> bytes:
        return await self.read()

    def release(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True


class _Answers:
    """A client whose HTTP session answers each GET with the next (status, body)."""

    def __init__(self, *answers: tuple[int, bytes]) -> None:
        import botocore

        self.answers = list(answers)
        self.sent: list[Any] = []
        self._endpoint = self
        self.http_session = self
        self._request_signer = type("Signer", (), {"signature_version": botocore.UNSIGNED})()

    async def generate_presigned_url(self, *args: Any, **kwargs: Any) -> str:
        return "http://example.invalid/b/k?sig=1"

    async def send(self, request: Any) -> Any:
        self.sent.append(request)
        status, body = self.answers.pop(0)
        raw = _Raw(body)
        headers = {"Content-Length": str(len(body))}
        return type("Response", (), {"status_code": status, "raw": raw, "headers": headers})()


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (
            503,
            b"<Error><Code>SlowDown</Code><Message>Reduce</Message></Error>",
            TransientStorageError,
        ),
        (400, b"<Error><Code>RequestTimeout</Code></Error>", TransientStorageError),
        (400, b"<Error><Code>ExpiredToken</Code></Error>", PermissionDeniedError),
        (404, b"<Error><Code>NoSuchKey</Code></Error>", ObjectNotFoundError),
        (412, b"<Error><Code>PreconditionFailed</Code></Error>", ObjectChangedError),
        (500, b"<html>proxy error</html>", TransientStorageError),
        (416, b"<Error><Code>InvalidRange</Code></Error>", StorageError),
    ],
)
def test_error_answers_are_translated_by_their_code(
    status: int, body: bytes, error: type[StorageError]
) -> None:
    client = _Answers((status, body))
    with pytest.raises(StorageError) as caught:
        asyncio.run(RangeGetter().get(client, "b", "k", 0, 10, '"e"', "s3://b/k"))
    assert type(caught.value) is error
    assert "s3://b/k" in str(caught.value)
    request = client.sent[0]
    assert request.headers["Range"] == "bytes=0-9" and request.headers["If-Match"] == '"e"'


def test_a_refused_url_is_not_used_again() -> None:
    client = _Answers(
        (403, b"<Error><Code>AccessDenied</Code></Error>"),
        (503, b"<Error><Code>SlowDown</Code></Error>"),
        (206, b"abc"),
        (206, b"def"),
    )
    getter = RangeGetter()

    async def run() -> list[bytes]:
        with pytest.raises(PermissionDeniedError):
            await getter.get(client, "b", "k", 0, 3, None, "s3://b/k")
        with pytest.raises(TransientStorageError):
            await getter.get(client, "b", "k", 0, 3, None, "s3://b/k")
        return [
            *await getter.get(client, "b", "k", 0, 3, None, "s3://b/k"),
            *await getter.get(client, "b", "k", 3, 6, None, "s3://b/k"),
        ]

    assert asyncio.run(run()) == [b"abc", b"def"]
    assert getter.resolved == 3  # after each error answer, not after a good one


def test_keys_that_need_quoting_and_anonymous_clients(
    s3_server: MotoS3Server, s3_bucket: str
) -> None:
    key = "dir with space/ü+x=1&y.bin"
    s3_server.client.put_object(Bucket=s3_bucket, Key=key, Body=DATA, ACL="public-read")

    async def body(client: Any) -> tuple[str, bytes]:
        getter = RangeGetter()
        url = await getter.url(client, s3_bucket, key)
        return url, b"".join(await getter.get(client, s3_bucket, key, 100, 300, None, "n"))

    for options in ({}, {"anon": True}):
        url, data = _with_client(s3_server, body, **options)
        assert data == DATA[100:300], options
        assert "?" not in url and "dir%20with%20space/" in url


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (301, b"<Error><Code>PermanentRedirect</Code></Error>"),
        (400, b"<Error><Code>AuthorizationHeaderMalformed</Code></Error>"),
        (307, b""),
    ],
)
def test_a_bucket_in_another_region_goes_back_to_get_object(status: int, body: bytes) -> None:
    client = _Answers((status, body))
    getter = RangeGetter()
    assert getter.serves(client, "b")
    with pytest.raises(s3_get.UseGetObject):
        asyncio.run(getter.get(client, "b", "k", 0, 10, None, "s3://b/k"))
    assert not getter.serves(client, "b")  # get_object's region redirector follows it
    assert getter.serves(client, "other")


def test_urls_of_many_objects_are_kept_up_to_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3_get, "MAX_URLS", 3)
    client = _Answers(*[(206, b"x")] * 9)
    getter = RangeGetter()

    async def run() -> None:
        for key in ["k0", "k1", "k2", "k0", "k3", "k4", "k3", "k0", "k4"]:
            assert await getter.get(client, "b", key, 0, 1, None, "n") == [b"x"]
            assert len(getter._urls) <= 3

    asyncio.run(run())
    assert getter.resolved == 6  # k0 k1 k2, then k3 cleared them: k3 k4 k0 again
    assert [request.url for request in client.sent][:2] == ["http://example.invalid/b/k"] * 2
