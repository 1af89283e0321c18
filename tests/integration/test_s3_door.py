"""S3 reads through the door (storage/s3/door.py) against moto and a scripted server: the
bytes asked for, SigV4 headers (no credential in the url or in any error), credentials from
the options, the environment or a profile (botocore's resolver), the version pinned, errors by
their S3 code, a bucket's region learnt once, and what goes to the client instead."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
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
from streamrec.storage.base import ObjectInfo
from streamrec.storage.http import range_get
from streamrec.storage.s3.door import S3Door
from streamrec.storage.s3.settings import DoorSettings
from streamrec.storage.s3.store import S3Store
from support.servers import MotoS3Server

DATA = bytes(range(256)) * 400  # 102,400 bytes
_AWS_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The requests streamrec's own connections send from now on."""
    requests: list[Any] = []
    own = range_get.RangeClient.get

    async def recorded(self: range_get.RangeClient, url: str, headers: Any, *args: Any) -> Any:
        requests.append(SimpleNamespace(url=url, headers=dict(headers.items())))
        return await own(self, url, headers, *args)

    monkeypatch.setattr(range_get.RangeClient, "get", recorded)
    return requests


@pytest.fixture
def clean_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in _AWS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # (no instance role to look for)
    return tmp_path


def _read(options: dict[str, Any], url: str, ranges: list[tuple[int, int]]) -> list[bytes]:
    async def run() -> list[bytes]:
        store = S3Store(options)
        try:
            assert store.door_settings is not None  # the door reads
            (info,) = await store.expand(url)
            return [await store.read_range(info, start, end) for start, end in ranges]
        finally:
            await store.close()

    return asyncio.run(run())


def _authorization(request: Any) -> str:
    return str(request.headers["Authorization"])


def test_ranges_are_the_bytes_asked_for_signed_with_sigv4_headers(
    s3_server: MotoS3Server, s3_bucket: str, sent: list[Any]
) -> None:
    s3_server.put(s3_bucket, "a/data.bin", DATA)
    ranges = [(0, 1), (0, 1000), (999, 65_536), (65_536, len(DATA)), (50_000, 50_001)]
    options = {**s3_server.storage_options, "token": "session-token-123"}
    assert _read(options, f"s3://{s3_bucket}/a/data.bin", ranges) == [DATA[s:e] for s, e in ranges]
    gets = [request for request in sent if "Range" in request.headers]
    assert gets  # (the first bytes came with the listing's look-up)
    for request in gets:
        assert "?" not in request.url  # no signature, credential or token in the url
        authorization = _authorization(request)
        assert authorization.startswith("AWS4-HMAC-SHA256 Credential=")
        assert "/us-east-1/s3/aws4_request" in authorization
        signed = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
        assert {"range", "x-amz-date", "x-amz-security-token"} <= set(signed)
        assert request.headers["X-Amz-Security-Token"] == "session-token-123"


def test_a_replaced_object_and_a_missing_one_are_their_errors(
    s3_server: MotoS3Server, s3_bucket: str
) -> None:
    s3_server.put(s3_bucket, "t.bin", DATA)

    async def run() -> None:
        store = S3Store(s3_server.storage_options)
        try:
            stale = ObjectInfo(f"s3://{s3_bucket}/t.bin", len(DATA), '"not-its-etag"')
            with pytest.raises(ObjectChangedError):  # If-Match went along
                await store.read_range(stale, 0, 10)
            gone = ObjectInfo(f"s3://{s3_bucket}/gone.bin", 10, None)
            with pytest.raises(ObjectNotFoundError, match=r"gone\.bin"):
                await store.read_range(gone, 0, 10)
        finally:
            await store.close()

    asyncio.run(run())


def test_credentials_from_the_environment_without_storage_options(
    s3_server: MotoS3Server,
    s3_bucket: str,
    sent: list[Any],
    clean_aws_env: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keys and endpoint from the environment alone: botocore's resolver gives the keys, the
    door signs with them (no client made for the reads)."""
    payloads = [bytes([i % 251]) * (i * 131 % 3000) for i in range(200)]
    s3_server.put(s3_bucket, "env/one.tfrecord", RecordEncoder().encode_many(payloads))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEYID")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    assert list(streamrec.open_dataset(f"s3://{s3_bucket}/env/*.tfrecord")) == payloads
    assert sent and all("Credential=ENVKEYID/" in _authorization(r) for r in sent)


def test_credentials_from_a_profile_file(
    s3_server: MotoS3Server,
    s3_bucket: str,
    sent: list[Any],
    clean_aws_env: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s3_server.put(s3_bucket, "p/data.bin", DATA)
    credentials = clean_aws_env / "credentials"
    credentials.write_text(
        "[default]\naws_access_key_id = WRONG\naws_secret_access_key = wrong\n"
        "[reader]\naws_access_key_id = PROFILEKEY\naws_secret_access_key = profile-secret\n"
        "aws_session_token = profile-token\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    options = {"profile": "reader", "client_kwargs": {"endpoint_url": s3_server.endpoint_url}}
    got = _read(options, f"s3://{s3_bucket}/p/data.bin", [(5, 500)])
    assert got == [DATA[5:500]]
    assert sent and all("Credential=PROFILEKEY/" in _authorization(r) for r in sent)
    assert all(r.headers["X-Amz-Security-Token"] == "profile-token" for r in sent)


def test_no_credentials_anywhere_is_a_clear_error(
    s3_server: MotoS3Server, s3_bucket: str, clean_aws_env: Path
) -> None:
    options = {"client_kwargs": {"endpoint_url": s3_server.endpoint_url}}
    with pytest.raises(StorageError, match="no AWS credentials found"):
        _read(options, f"s3://{s3_bucket}/anything.bin", [])


def test_keys_that_need_quoting_and_anonymous_reads(
    s3_server: MotoS3Server, s3_bucket: str, sent: list[Any]
) -> None:
    key = "dir with space/ü+x=1&y.bin"
    s3_server.client.put_object(Bucket=s3_bucket, Key=key, Body=DATA, ACL="public-read")
    for options in (s3_server.storage_options, {**s3_server.storage_options, "anon": True}):
        sent.clear()
        assert _read(options, f"s3://{s3_bucket}/{key}", [(100, 300)]) == [DATA[100:300]]
        assert all("dir%20with%20space/" in r.url and "?" not in r.url for r in sent)
        assert all(("Authorization" in r.headers) != bool(options.get("anon")) for r in sent)


class Scripted:
    """A loopback S3 stand-in: each request is answered with the next scripted
    ``(status, headers, body)``; the requests are kept."""

    def __init__(self, *answers: tuple[int, dict[str, str], bytes]) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.endpoint = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Scripted:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.endpoint = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while self.answers:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                headers = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
                self.requests.append((head[0], {k.lower(): v for k, v in headers.items()}))
                status, extra, body = self.answers.pop(0)
                lines = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}"]
                lines += [f"{name}: {value}" for name, value in extra.items()]
                writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _door(endpoint: str, region: str | None = "us-east-1") -> S3Door:
    settings = DoorSettings(endpoint, region, ("AKID", "SECRET", None), 5.0, 15.0)
    return S3Door(settings)


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
        (403, b"<Error><Code>SignatureDoesNotMatch</Code></Error>", PermissionDeniedError),
        (404, b"<Error><Code>NoSuchKey</Code></Error>", ObjectNotFoundError),
        (412, b"<Error><Code>PreconditionFailed</Code></Error>", ObjectChangedError),
        (500, b"<html>proxy error</html>", TransientStorageError),
        (416, b"<Error><Code>InvalidRange</Code></Error>", StorageError),
    ],
)
def test_error_answers_are_translated_by_their_code(
    status: int, body: bytes, error: type[StorageError]
) -> None:
    async def run() -> Scripted:
        async with Scripted((status, {}, body)) as server:
            door = _door(server.endpoint)
            try:
                with pytest.raises(StorageError) as caught:
                    await door.get("b", "k", 0, 10, '"e"', "s3://b/k")
            finally:
                door.close()
            assert type(caught.value) is error
            assert "s3://b/k" in str(caught.value) and "SECRET" not in str(caught.value)
            return server

    server = asyncio.run(run())
    (request,) = server.requests  # one request: no second path tried
    assert request[1]["range"] == "bytes=0-9" and request[1]["if-match"] == '"e"'


def test_a_bucket_region_is_learnt_once_from_s3s_answer() -> None:
    """No region named: signed for us-east-1 first; S3 names the bucket's region, the request
    goes again signed for it, and the bucket's later requests go there at once."""
    wrong = b"<Error><Code>AuthorizationHeaderMalformed</Code></Error>"

    async def run() -> tuple[Scripted, list[bytes]]:
        async with Scripted(
            (400, {"x-amz-bucket-region": "eu-west-1"}, wrong),
            (206, {"Content-Range": "bytes 0-2/9"}, b"abc"),
            (206, {"Content-Range": "bytes 3-5/9"}, b"def"),
        ) as server:
            door = _door(server.endpoint, region=None)
            try:
                got = [
                    *await door.get("b", "k", 0, 3, None, "s3://b/k"),
                    *await door.get("b", "k", 3, 6, None, "s3://b/k"),
                ]
            finally:
                door.close()
            assert door.region_of("b") == "eu-west-1" and door.region_of("other") == "us-east-1"
            return server, got

    server, got = asyncio.run(run())
    assert b"".join(got) == b"abcdef"
    scopes = [r[1]["authorization"].split("Credential=")[1].split(",")[0] for r in server.requests]
    assert ["/us-east-1/" in scopes[0], "/eu-west-1/" in scopes[1], "/eu-west-1/" in scopes[2]] == [
        True
    ] * 3


def test_a_named_region_that_is_wrong_is_an_error_naming_the_buckets() -> None:
    async def run() -> None:
        async with Scripted(
            (
                301,
                {"x-amz-bucket-region": "ap-south-1"},
                b"<Error><Code>PermanentRedirect</Code></Error>",
            ),
            (
                400,
                {"x-amz-bucket-region": "ap-south-1"},
                b"<Error><Code>AuthorizationHeaderMalformed</Code></Error>",
            ),
        ) as server:
            door = _door(server.endpoint, region="us-east-1")
            try:
                with pytest.raises(StorageError, match="redirected"):
                    await door.get("b", "k", 0, 3, None, "s3://b/k")
                with pytest.raises(StorageError, match="ap-south-1"):
                    await door.get("b", "k", 0, 3, None, "s3://b/k")
            finally:
                door.close()
            assert len(server.requests) == 2  # each sent once

    asyncio.run(run())


def test_what_the_door_does_not_follow_goes_to_the_client_for_the_store_life(
    s3_server: MotoS3Server, s3_bucket: str, sent: list[Any]
) -> None:
    """Options the door does not follow (here a botocore config setting) make the store read
    through its client, decided at set-up; S3 Express directory buckets too."""
    s3_server.put(s3_bucket, "c/data.bin", DATA)
    options = {**s3_server.storage_options, "config_kwargs": {"signature_version": "s3v4"}}

    async def run() -> list[bytes]:
        store = S3Store(options)
        try:
            assert store.door_settings is None
            (info,) = await store.expand(f"s3://{s3_bucket}/c/data.bin")
            return [await store.read_range(info, 10, 20)]
        finally:
            await store.close()

    assert asyncio.run(run()) == [DATA[10:20]]
    assert sent == []  # none on the door's connections
    store = S3Store(s3_server.storage_options)
    assert store.door_settings is not None
    assert store._door_reads("b--usw2-az1--x-s3") is None and store._door_reads("b") is not None
    asyncio.run(store.close())


@pytest.fixture
def many_records(s3_server: MotoS3Server, s3_bucket: str) -> Iterator[list[bytes]]:
    payloads = [bytes([i % 251]) * (i * 131 % 7000) for i in range(600)]
    s3_server.put(s3_bucket, "ds/one.tfrecord", RecordEncoder().encode_many(payloads))
    s3_server.put(s3_bucket, "ds/two.tfrecord", RecordEncoder().encode_many(payloads[::-1]))
    yield payloads


def test_a_dataset_reads_every_record_through_the_door(
    s3_server: MotoS3Server, s3_bucket: str, many_records: list[bytes], sent: list[Any]
) -> None:
    ds = streamrec.open_dataset(
        f"s3://{s3_bucket}/ds/*.tfrecord",
        storage_options=s3_server.storage_options,
        block_bytes=65_536,
    )
    assert list(ds) == many_records + many_records[::-1]
    assert any("list-type=2" in r.url for r in sent)  # the listing went through it too
