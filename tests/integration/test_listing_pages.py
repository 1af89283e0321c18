"""A paged S3 listing is untrusted input, checked and retried a page at a time
(storage/pages.py, storage/s3/store.py, storage/s3/listing.py), against a server whose
pages the test
writes (support/listing_server.py), through the store's direct requests and its client:

* a key on two pages, keys out of order, a continuation token again, a truncated page without
  one: a broken listing, a StorageError naming the url, never records read twice;
* each page is one request under the retry policy: a listing longer than one attempt's
  ``timeout_s`` completes, and a page that fails is retried from its own token;
* a hostile page (16 MiB of empty or nested elements) is refused while it is parsed, and not
  listed again through the client.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

import streamrec
from streamrec.errors import StorageError
from streamrec.format.framing import RecordEncoder
from streamrec.storage.pages import glob_prefix, list_glob
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.s3.listing import PAGE_BYTES
from streamrec.storage.s3.store import S3Store
from support.deep_tree import DEEP_GLOBS, DEEP_KEYS, DEEP_PLACEHOLDERS, under
from support.fault_proxy import FaultProxy
from support.listing_server import BUCKET, ListingServer
from support.servers import MotoS3Server

NAMES = [f"d/part-{i}.tfrecord" for i in range(6)]
RECORDS = {name: [f"{name}:{i}".encode() for i in range(10)] for name in NAMES}
URL = f"s3://{BUCKET}/d/*"  # (it would match the sidecars: none is looked for apart)


@pytest.fixture
def server() -> Iterator[ListingServer]:
    objects = {name: RecordEncoder().encode_many(records) for name, records in RECORDS.items()}
    with ListingServer(objects) as started:
        yield started


@pytest.fixture(params=["direct", "client"])
def options(request: pytest.FixtureRequest, server: ListingServer) -> dict[str, Any]:
    """The store's two paths: its own requests, and its aiobotocore client."""
    if request.param == "direct":
        return server.storage_options
    return server.client_storage_options


def _read(url: str, options: dict[str, Any], retry: RetryPolicy | None = None) -> list[bytes]:
    dataset = streamrec.open_dataset(url, storage_options=options, retry=retry)
    return [record for record in dataset]  # (list() would list once more for len())


def _scripted(*pages: tuple[list[str], str | None]) -> Any:
    """Pages by token: the first for no token, each next one for the token before it."""
    by_token = {None: pages[0], **{pages[i][1]: pages[i + 1] for i in range(len(pages) - 1)}}
    return lambda prefix, token, max_keys: by_token[token]


@pytest.mark.parametrize(
    ("pages", "problem"),
    [
        # a key on two pages (read before: 40 records for 30)
        (((NAMES[0:2], "t1"), (NAMES[1:3], None)), "a key listed twice"),
        # the same key twice on one page
        (((NAMES[0:1] * 2, None),), "a key listed twice"),
        # keys that do not increase
        (((NAMES[2:4], "t1"), (NAMES[0:1], None)), "keys out of order"),
        # a token that comes again (followed before until the time ran out)
        (((NAMES[0:1], "t1"), (NAMES[1:2], "t1")), "a continuation token that came before"),
        # a truncated page that names no next one (the rest lost before)
        (((NAMES[0:1], ""),), "names no continuation token"),
    ],
)
def test_a_broken_listing_is_an_error_never_duplicated_records(
    server: ListingServer, options: dict[str, Any], pages: Any, problem: str
) -> None:
    if pages[-1][1] == "":  # a truncated page without a token
        server.pages = lambda prefix, token, max_keys: (NAMES[0:1], None)
        server.raw = lambda token: _truncated_without_token()
    else:
        server.pages = _scripted(*pages)
    retry = RetryPolicy(max_attempts=2, timeout_s=10)
    for url in (URL, f"s3://{BUCKET}/d/"):  # a glob, a directory
        with pytest.raises(StorageError, match=problem) as raised:
            _read(url, options, retry)
        assert "a broken listing" in str(raised.value) and url in str(raised.value)


def _truncated_without_token() -> bytes:
    return (
        b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>bkt</Name>'
        b"<Prefix>d%2F</Prefix><EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>"
        b"<Contents><Key>d%2Fpart-0.tfrecord</Key><Size>1</Size></Contents></ListBucketResult>"
    )


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(S3Store, "list_page_keys", 1)  # six pages
    return 1


def test_a_failing_page_is_retried_from_its_own_token(
    server: ListingServer, options: dict[str, Any], small_pages: int
) -> None:
    # page 4 fails twice (the direct request and the client's, or the client's twice)
    server.fail = lambda token, seen: token == "3" and seen <= 2
    got = _read(URL, options, RetryPolicy(max_attempts=3, initial_backoff_s=0.01))
    assert got == [record for name in NAMES for record in RECORDS[name]]
    # each page before it was listed once (a retry of the whole listing would start again)
    assert server.listed.count(None) == 1 and server.listed.count("1") == 1
    assert server.listed.count("3") == 3


def test_a_listing_longer_than_one_attempts_timeout_completes(
    server: ListingServer, options: dict[str, Any], small_pages: int
) -> None:
    # six pages of 0.25 s each: 1.5 s in all, each page well within timeout_s=1
    server.delay_s = 0.25
    got = _read(URL, options, RetryPolicy(max_attempts=2, timeout_s=1.0))
    assert got == [record for name in NAMES for record in RECORDS[name]]
    assert len(server.listed) == len(NAMES)  # no page timed out, none listed twice


def _hostile(kind: str) -> bytes:
    """A page of 16 MiB (as long as a page may be): empty elements, or nested ones."""
    start = b'<?xml version="1.0"?><ListBucketResult><Name>bkt</Name>'
    end = b"</ListBucketResult>"
    room = PAGE_BYTES - len(start) - len(end)
    if kind == "flat":
        return start + b"<a/>" * (room // 4) + end
    return start + b"<a>" * (room // 7) + b"</a>" * (room // 7) + end


@pytest.mark.parametrize("kind", ["flat", "deep"])
def test_a_hostile_page_is_refused_once(
    server: ListingServer, options: dict[str, Any], kind: str
) -> None:
    body = _hostile(kind)
    assert len(body) <= PAGE_BYTES  # (refused for its elements, not its length)
    server.raw = lambda token: body
    why = "more elements" if kind == "flat" else "nested more than"
    tracemalloc.start()
    try:
        with pytest.raises(StorageError, match=why) as raised:
            _read(URL, options, RetryPolicy(max_attempts=3, timeout_s=30))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert URL in str(raised.value)
    assert len(server.listed) == 1  # refused, not listed again through the client
    # the page received (and joined) once or twice, not parsed into millions of elements
    # (botocore's own look for an error in a 200 would build a tree of ~400 MB first)
    assert peak < 4 * PAGE_BYTES, peak


def test_a_page_longer_than_a_page_can_be_is_refused_once(
    server: ListingServer, options: dict[str, Any]
) -> None:
    body = b'<?xml version="1.0"?><ListBucketResult><Name>bkt</Name>' + b" " * (17 << 20)
    server.raw = lambda token: body + b"</ListBucketResult>"
    with pytest.raises(StorageError, match="bytes") as raised:
        _read(URL, options, RetryPolicy(max_attempts=3, timeout_s=30))
    assert URL in str(raised.value) and len(server.listed) == 1


# ---------------------------------------------------------------------- deep globs

DEEP = ["d/part-0.tfrecord", "d/x/notes", "d/x/part-1.tfrecord", "d/x/y/part-2.tfrecord"]
DEEP += ["d/y/part-3.tfrecord", "d/z/w/v/part-4.tfrecord", "e/part-5.tfrecord"]
DEEP_RECORDS = {name: [f"{name}:{i}".encode() for i in range(3)] for name in DEEP}
DEEP_URL = f"s3://{BUCKET}/d/**/part-*.tfrecord"  # every part below d/: 5 shards
DEEP_SHARDS = [name for name in DEEP if name.startswith("d/") and "part-" in name]


@pytest.fixture
def deep_server() -> Iterator[ListingServer]:
    encoded = {name: RecordEncoder().encode_many(records) for name, records in DEEP_RECORDS.items()}
    with ListingServer(encoded) as started:
        yield started


@pytest.fixture(params=["direct", "client"])
def deep_options(request: pytest.FixtureRequest, deep_server: ListingServer) -> dict[str, Any]:
    if request.param == "direct":
        return deep_server.storage_options
    return deep_server.client_storage_options


@pytest.mark.slow  # (a second each on 2 cores: a server a test)
def test_a_deep_glob_is_listed_a_page_a_request_without_a_delimiter(
    deep_server: ListingServer, deep_options: dict[str, Any], small_pages: int
) -> None:
    got = _read(DEEP_URL, deep_options, RetryPolicy(max_attempts=2, timeout_s=10))
    assert got == [record for name in DEEP_SHARDS for record in DEEP_RECORDS[name]]
    under = [name for name in DEEP if name.startswith("d/")]
    # one request a page (a key a page), each asked for once, every level below d/ in one
    assert deep_server.listed == [None, *(str(i) for i in range(1, len(under)))]
    assert deep_server.delimiters == [None] * len(under)


@pytest.mark.slow  # (a second each on 2 cores: a server a test)
def test_a_deep_globs_failing_page_is_retried_from_its_own_token(
    deep_server: ListingServer, deep_options: dict[str, Any], small_pages: int
) -> None:
    deep_server.fail = lambda token, seen: token == "3" and seen <= 2  # page 4: 503 twice
    got = _read(DEEP_URL, deep_options, RetryPolicy(max_attempts=3, initial_backoff_s=0.01))
    assert got == [record for name in DEEP_SHARDS for record in DEEP_RECORDS[name]]
    assert deep_server.listed.count(None) == 1 and deep_server.listed.count("1") == 1
    assert deep_server.listed.count("3") == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pages", "problem"),
    [
        # a key of page 1 again on page 2, in another directory level's place
        ((([DEEP[0], DEEP[2]], "t1"), ([DEEP[2], DEEP[3]], None)), "page 2: a key listed twice"),
        # a deeper key, then one before it
        ((([DEEP[3]], "t1"), ([DEEP[2]], None)), "page 2: keys out of order"),
        ((([DEEP[2]], "t1"), ([DEEP[3]], "t1")), "page 2: a continuation token that came"),
    ],
)
def test_a_deep_globs_broken_listing_is_an_error(
    deep_server: ListingServer, deep_options: dict[str, Any], pages: Any, problem: str
) -> None:
    deep_server.pages = _scripted(*pages)
    with pytest.raises(StorageError, match=problem) as raised:
        _read(DEEP_URL, deep_options, RetryPolicy(max_attempts=2, timeout_s=10))
    assert "a broken listing" in str(raised.value) and DEEP_URL in str(raised.value)


@pytest.mark.slow  # (many listings through moto)
@pytest.mark.parametrize("path", ["direct", "client"])
async def test_a_deep_glob_lists_what_s3fs_expand_lists(
    s3_server: MotoS3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    for key in DEEP_KEYS:
        s3_server.put(s3_bucket, key, key.encode())
    for key in DEEP_PLACEHOLDERS:
        s3_server.put(s3_bucket, key, b"")
    monkeypatch.setattr(S3Store, "list_page_keys", 2)
    port = int(s3_server.endpoint_url.rsplit(":", 1)[1])
    with FaultProxy("127.0.0.1", port) as proxy:
        options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": proxy.url}}
        if path == "client":
            options["config_kwargs"] = {"signature_version": "s3v4"}
        store = S3Store(options)
        try:
            for tail in DEEP_GLOBS:
                url = f"s3://{s3_bucket}/{tail}"
                # s3fs's glob, in one call; its ``**`` also matches placeholders (``data/``,
                # empty objects named like directories): never a shard, as one level down
                expected = [obj for obj in await store.expand(url) if obj.url[-1] != "/"]
                assert expected, url
                proxy.clear_records()
                got = await list_glob(store, url, RetryPolicy(max_attempts=1, timeout_s=10))
                assert got == expected, url
                glob = glob_prefix(f"{s3_bucket}/{tail}")
                assert glob is not None
                keys = len(under(glob.prefix)) if not glob.delimiter else None
                listings = [r.target for r in proxy.records if "list-type=2" in r.target]
                if keys is not None:  # every key below the prefix, two a page, in order
                    assert len(listings) == max(1, -(-keys // 2)), url
                    assert not any("delimiter=" in target for target in listings), url
        finally:
            await store.close()
