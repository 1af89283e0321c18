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
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.s3.listing import PAGE_BYTES
from streamrec.storage.s3.store import S3Store
from support.listing_server import BUCKET, ListingServer

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
