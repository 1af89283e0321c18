"""GCS's and Azure's paged listings are streamrec's own (storage/gcs/listing.py,
storage/azure/listing.py, storage/pages.py), against fake-gcs-server and Azurite behind a
fault proxy (support/fault_proxy.py) that counts the listing requests and answers chosen pages
itself:

* a glob or directory of more objects than a page holds is listed a page at a time, every
  shard once;
* a page that repeats a key of the page before, goes back in key order, or names the
  continuation token of the page before: a broken listing, a StorageError naming the url and
  the page, never records read twice;
* each page is one request under the retry policy: a listing whose pages together take longer
  than one attempt's ``timeout_s`` completes, and a page that fails is asked for again from
  its own token (the pages before it are not asked for again);
* GCS at its own page size (1,000): a second page naming the first page's token again is an
  error at once (gcsfs followed it until the attempt's ``timeout_s`` ran out), and a page that
  is no listing page (not JSON, a name outside the prefix, longer than a page can be) is
  refused, not asked for again.

(gcsfs and adlfs page inside one call: a token that came again was followed until the
attempt's time ran out, and a listing of many pages had to fit in one attempt.)
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, quote_plus, urlencode

import pytest

import streamrec
from streamrec.errors import ObjectNotFoundError, StorageError
from streamrec.format.framing import RecordEncoder
from streamrec.storage.azure.store import AzureStore
from streamrec.storage.base import ObjectInfo
from streamrec.storage.gcs.store import GCSStore
from streamrec.storage.pages import glob_prefix, list_glob
from streamrec.storage.registry import StoreSet
from streamrec.storage.retry import RetryPolicy
from support.deep_tree import DEEP_GLOBS, DEEP_KEYS, DEEP_PLACEHOLDERS, under
from support.fault_proxy import FaultProxy
from support.servers import http_request

pytestmark = pytest.mark.slow  # seconds each (many requests through real servers): `pytest -m slow`

NAMES = [f"d/part-{i}.tfrecord" for i in range(6)]
RECORDS = {name: [f"{name}:{i}".encode() for i in range(5)] for name in NAMES}
EVERY_RECORD = [record for name in NAMES for record in RECORDS[name]]


@dataclass
class Remote:
    """One store behind a proxy: its urls, options, and the pages its server lists."""

    scheme: str
    bucket: str
    proxy: FaultProxy
    options: dict[str, Any]
    listing: re.Pattern[str]
    """What the listing requests' targets hold (and no other request's)."""
    first_token: Callable[[int, bool], str]
    """The token that the server's first page (of that many keys) names: of ``d/`` one level
    down, or (``flat``) of every key in the bucket."""
    page: Callable[[list[str], str | None], tuple[bytes, str]]
    """A page of these keys naming this next token: its body and content type."""
    token_in_target: Callable[[str], re.Pattern[str]]

    def url(self, tail: str) -> str:
        return f"{self.scheme}://{self.bucket}/{tail}"

    def listed(self) -> int:
        return sum(1 for record in self.proxy.records if self.listing.search(record.target))


def _gcs(request: pytest.FixtureRequest, fault_proxy: Any) -> Remote:
    server = request.getfixturevalue("gcs_server")
    bucket = request.getfixturevalue("gcs_bucket")
    for name in NAMES:
        server.put(bucket, name, RecordEncoder().encode_many(RECORDS[name]))
    stats = {name: server.stat(bucket, name) for name in NAMES}
    proxy = fault_proxy(server.endpoint_url, flavor="gcs")

    def first_token(per_page: int, flat: bool = False) -> str:
        asked = {"prefix": "d/", "delimiter": "/"} if not flat else {"prefix": ""}
        query = urlencode({**asked, "maxResults": per_page})
        answer = http_request("GET", f"{server.endpoint_url}/storage/v1/b/{bucket}/o?{query}")
        token: str = answer.json()["nextPageToken"]
        return token

    def page(keys: list[str], token: str | None) -> tuple[bytes, str]:
        items = [
            {"name": key, "size": stats[key]["size"], "generation": stats[key]["generation"]}
            for key in keys
        ]
        body = {"kind": "storage#objects", "items": items}
        if token is not None:
            body["nextPageToken"] = token
        return json.dumps(body).encode(), "application/json"

    return Remote(
        "gs",
        bucket,
        proxy,
        {**server.storage_options, "endpoint_url": proxy.url},
        re.compile(rf"/storage/v1/b/{bucket}/o\?"),
        first_token,
        page,
        lambda token: _either("pageToken", token),
    )


def _azure(request: pytest.FixtureRequest, fault_proxy: Any) -> Remote:
    server = request.getfixturevalue("azure_server")
    container = request.getfixturevalue("azure_container")
    for name in NAMES:
        server.put(container, name, RecordEncoder().encode_many(RECORDS[name]))
    client = server.client.get_container_client(container)
    sizes = {name: client.get_blob_client(name).get_blob_properties().size for name in NAMES}
    proxy = fault_proxy(server.server_url, flavor="azure")

    def first_token(per_page: int, flat: bool = False) -> str:
        if flat:
            pages = client.list_blobs(results_per_page=per_page).by_page()
        else:
            pages = client.walk_blobs(
                name_starts_with="d/", delimiter="/", results_per_page=per_page
            ).by_page()
        list(next(pages))
        token: str = pages.continuation_token
        return token

    def page(keys: list[str], token: str | None) -> tuple[bytes, str]:
        blobs = "".join(
            f"<Blob><Name>{key}</Name><Properties>"
            "<Last-Modified>Sat, 28 Nov 2026 07:00:00 GMT</Last-Modified>"
            f"<Etag>0x8D{i:014X}</Etag><Content-Length>{sizes[key]}</Content-Length>"
            "<BlobType>BlockBlob</BlobType></Properties></Blob>"
            for i, key in enumerate(keys)
        )
        body = (
            '<?xml version="1.0" encoding="utf-8"?>'
            f'<EnumerationResults ServiceEndpoint="{proxy.url}/" ContainerName="{container}">'
            f"<Prefix>d/</Prefix><Delimiter>/</Delimiter><Blobs>{blobs}</Blobs>"
            f"<NextMarker>{token or ''}</NextMarker></EnumerationResults>"
        )
        return body.encode(), "application/xml"

    return Remote(
        "az",
        container,
        proxy,
        {"connection_string": server.connection_string(proxy.url)},
        re.compile(r"[?&]comp=list(&|$)"),
        first_token,
        page,
        lambda token: _either("marker", token),
    )


def _either(field: str, token: str) -> re.Pattern[str]:
    """The query field ``field=token``, however the client quotes it."""
    forms = {quote_plus(token), quote(token, safe=""), quote(token, safe="/")}
    return re.compile("|".join(rf"[?&]{field}={re.escape(form)}(&|$)" for form in forms))


@pytest.fixture(params=["gcs", "azure"])
def remote(request: pytest.FixtureRequest, fault_proxy: Any) -> Remote:
    return _gcs(request, fault_proxy) if request.param == "gcs" else _azure(request, fault_proxy)


@pytest.fixture
def page_keys(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], int]:
    """Set both stores' objects per listing page (the JSON API's and List Blobs' most make
    a listing of a few objects one page). ``raising=False``: a store that pages inside one
    call ignores it, and the request counts below tell."""

    def make(keys: int) -> int:
        for store in (GCSStore, AzureStore):
            monkeypatch.setattr(store, "list_page_keys", keys, raising=False)
        return keys

    return make


def _read(url: str, options: dict[str, Any], retry: RetryPolicy) -> list[bytes]:
    dataset = streamrec.open_dataset(url, storage_options=options, retry=retry)
    return [record for record in dataset]  # (list() would list once more for len())


FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=10)


@pytest.mark.parametrize("tail", ["d/*", "d/part-*.tfrecord", "d/"])
def test_a_listing_of_many_pages_gives_every_shard_once(
    remote: Remote, page_keys: Callable[[int], int], tail: str
) -> None:
    keys = page_keys(2)
    assert _read(remote.url(tail), remote.options, FAST) == EVERY_RECORD
    assert remote.listed() == len(NAMES) // keys  # a page a request, each asked for once


@pytest.mark.parametrize(
    ("scripted", "problem"),
    [
        # the page after the first repeats its last key (read before: 35 records for 30)
        (lambda token: ([NAMES[1], NAMES[2]], None), "page 2: a key listed twice"),
        # the page after the first goes back
        (lambda token: ([NAMES[0]], None), "page 2: keys out of order"),
        # the page after the first names its token again (followed before until timeout_s)
        (lambda token: ([NAMES[2], NAMES[3]], token), "page 2: a continuation token that came"),
    ],
)
def test_a_broken_listing_is_an_error_never_duplicated_records(
    remote: Remote,
    page_keys: Callable[[int], int],
    scripted: Callable[[str], tuple[list[str], str | None]],
    problem: str,
) -> None:
    token = remote.first_token(page_keys(2), False)
    keys, following = scripted(token)
    body, kind = remote.page(keys, following)
    remote.proxy.status(
        200, path=remote.token_in_target(token), body=body, headers={"Content-Type": kind}
    )
    for url in (remote.url("d/*"), remote.url("d/")):  # a glob, a directory
        with pytest.raises(StorageError, match=problem) as raised:
            _read(url, remote.options, FAST)
        assert "a broken listing" in str(raised.value) and url in str(raised.value)


def test_a_listing_longer_than_one_attempts_timeout_completes(
    remote: Remote, page_keys: Callable[[int], int]
) -> None:
    page_keys(1)
    # six pages of 0.35 s each: 2.1 s in all, each page well within timeout_s=1.5
    remote.proxy.delay(0.35, path=remote.listing)
    retry = RetryPolicy(max_attempts=2, timeout_s=1.5, initial_backoff_s=0.01)
    assert _read(remote.url("d/*"), remote.options, retry) == EVERY_RECORD
    assert remote.listed() == len(NAMES)  # no page timed out, none asked for twice


def test_a_failing_page_is_retried_from_its_own_token(
    remote: Remote, page_keys: Callable[[int], int]
) -> None:
    token = remote.first_token(page_keys(2), False)  # the second page's
    failing = remote.proxy.status(503, path=remote.token_in_target(token), times=2)
    assert _read(remote.url("d/*"), remote.options, FAST) == EVERY_RECORD
    assert failing.fired == 2
    # three pages, the second asked for three times: the first was not asked for again
    assert remote.listed() == len(NAMES) // 2 + 2


async def test_gcs_a_token_again_past_the_default_page_size_is_an_error_at_once(
    gcs_server: Any, gcs_bucket: str, fault_proxy: Any
) -> None:
    # 1,001 objects: two pages of the JSON API's most, at the store's own page size
    names = [f"big/s-{i:04d}" for i in range(1001)]
    shard = RecordEncoder().encode_many([b"r"])
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda name: gcs_server.put(gcs_bucket, name, shard), names))
    proxy = fault_proxy(gcs_server.endpoint_url, flavor="gcs")
    options = {**gcs_server.storage_options, "endpoint_url": proxy.url}
    url = f"gs://{gcs_bucket}/big/*"
    retry = RetryPolicy(max_attempts=1, timeout_s=5)
    shards = await streamrec.open_dataset(url, storage_options=options, retry=retry).shards()
    assert [obj.url for obj in shards] == [f"gs://{gcs_bucket}/{name}" for name in names]
    listing = re.compile(rf"/storage/v1/b/{gcs_bucket}/o\?")
    assert sum(1 for record in proxy.records if listing.search(record.target)) == 2
    # the second page names its own token again: gcsfs followed it until timeout_s
    query = urlencode({"prefix": "big/", "delimiter": "/", "maxResults": 1000})
    first = http_request("GET", f"{gcs_server.endpoint_url}/storage/v1/b/{gcs_bucket}/o?{query}")
    token = first.json()["nextPageToken"]
    item = gcs_server.stat(gcs_bucket, names[1000])  # (all its fields: gcsfs reads them)
    again = {"kind": "storage#objects", "items": [item], "nextPageToken": token}
    proxy.status(
        200,
        path=_either("pageToken", token),
        body=json.dumps(again).encode(),
        headers={"Content-Type": "application/json"},
    )
    proxy.clear_records()
    dataset = streamrec.open_dataset(url, storage_options=options, retry=retry)
    with pytest.raises(StorageError, match="page 2: a continuation token that came") as raised:
        await dataset.shards()
    assert url in str(raised.value)
    assert sum(1 for record in proxy.records if listing.search(record.target)) == 2


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"<html>not a page</html>", "not a JSON document"),
        (b"[]", "not a JSON object"),
        (b'{"items": [{"name": "e/x", "size": "1"}]}', "outside the prefix"),
        (b'{"items": [{"name": "d/x", "size": "-1"}]}', "a size that is not a decimal"),
        (b'{"items": {}}', "items are not a list"),
        (b'{"nextPageToken": 7}', "nextPageToken is not a string"),
        (b'{"items": []' + b" " * (17 << 20) + b"}", "longer than 16,777,216 bytes"),
    ],
)
def test_gcs_a_page_that_is_no_listing_page_is_refused_once(
    gcs_server: Any, gcs_bucket: str, fault_proxy: Any, body: bytes, problem: str
) -> None:
    proxy = fault_proxy(gcs_server.endpoint_url, flavor="gcs")
    listing = re.compile(rf"/storage/v1/b/{gcs_bucket}/o\?")
    proxy.status(200, path=listing, body=body, headers={"Content-Type": "application/json"})
    options = {**gcs_server.storage_options, "endpoint_url": proxy.url}
    url = f"gs://{gcs_bucket}/d/*"
    with pytest.raises(StorageError, match=problem) as raised:
        _read(url, options, FAST)
    assert f"{url}: listing page 1 refused" in str(raised.value)
    assert sum(1 for record in proxy.records if listing.search(record.target)) == 1


# ---------------------------------------------------------------------- deep globs

DEEP_URL_TAIL = "*/part-*.tfrecord"  # a wildcard above the last level: every key listed


def test_a_deep_glob_is_listed_a_page_a_request(
    remote: Remote, page_keys: Callable[[int], int]
) -> None:
    keys = page_keys(2)
    assert _read(remote.url(DEEP_URL_TAIL), remote.options, FAST) == EVERY_RECORD
    assert remote.listed() == len(NAMES) // keys  # a page a request, each asked for once
    listings = [r.target for r in remote.proxy.records if remote.listing.search(r.target)]
    assert not any("delimiter=" in target for target in listings)


def test_a_deep_globs_failing_page_is_retried_from_its_own_token(
    remote: Remote, page_keys: Callable[[int], int]
) -> None:
    token = remote.first_token(page_keys(2), True)  # the second page's
    failing = remote.proxy.status(503, path=remote.token_in_target(token), times=2)
    assert _read(remote.url(DEEP_URL_TAIL), remote.options, FAST) == EVERY_RECORD
    assert failing.fired == 2
    assert remote.listed() == len(NAMES) // 2 + 2  # the first page not asked for again


@pytest.mark.parametrize(
    ("scripted", "problem"),
    [
        (lambda token: ([NAMES[1], NAMES[2]], None), "page 2: a key listed twice"),
        # back in name order and in depth-first order (Azure's hierarchical namespace's)
        (lambda token: ([NAMES[0]], None), "page 2: keys out of order"),
        (lambda token: ([NAMES[2], NAMES[3]], token), "page 2: a continuation token that came"),
    ],
)
def test_a_deep_globs_broken_listing_is_an_error(
    remote: Remote,
    page_keys: Callable[[int], int],
    scripted: Callable[[str], tuple[list[str], str | None]],
    problem: str,
) -> None:
    token = remote.first_token(page_keys(2), True)
    keys, following = scripted(token)
    body, kind = remote.page(keys, following)
    remote.proxy.status(
        200, path=remote.token_in_target(token), body=body, headers={"Content-Type": kind}
    )
    url = remote.url(DEEP_URL_TAIL)
    with pytest.raises(StorageError, match=problem) as raised:
        _read(url, remote.options, FAST)
    assert "a broken listing" in str(raised.value) and url in str(raised.value)


@pytest.mark.parametrize("kind", ["gcs", "azure"])
async def test_a_deep_glob_lists_what_the_filesystems_expand_lists(
    request: pytest.FixtureRequest,
    fault_proxy: Any,
    page_keys: Callable[[int], int],
    kind: str,
) -> None:
    if kind == "gcs":
        server = request.getfixturevalue("gcs_server")
        bucket, endpoint = request.getfixturevalue("gcs_bucket"), server.endpoint_url
        put = functools.partial(server.put, bucket)
    else:
        server = request.getfixturevalue("azure_server")
        bucket, endpoint = request.getfixturevalue("azure_container"), server.server_url
        put = functools.partial(server.put, bucket)
        # a blob adlfs's mkdir leaves: a directory, no object
        blob = server.client.get_blob_client(bucket, "data/a/marked")
        blob.upload_blob(b"", metadata={"is_directory": "true"})
    for key in DEEP_KEYS:
        put(key, key.encode())
    for key in DEEP_PLACEHOLDERS:
        put(key, b"")
    proxy = fault_proxy(endpoint, flavor=kind)
    if kind == "gcs":
        options = {**server.storage_options, "endpoint_url": proxy.url}
        listing = re.compile(rf"/storage/v1/b/{bucket}/o\?")
    else:
        options = {"connection_string": server.connection_string(proxy.url)}
        listing = re.compile(r"[?&]comp=list(&|$)")
    scheme = "gs" if kind == "gcs" else "az"
    keys = page_keys(2)
    # placeholders are never shards (gcsfs and adlfs may list them as empty objects)
    placeholders = {f"{scheme}://{bucket}/{key}".rstrip("/") for key in DEEP_PLACEHOLDERS}
    marked = ["data/a/marked"] if kind == "azure" else []
    async with StoreSet(options) as stores:
        for tail in DEEP_GLOBS:
            url = f"{scheme}://{bucket}/{tail}"
            store = stores.get(url)
            expected = await _found(store.expand(url))  # the filesystem's glob, in one call
            expected = [obj for obj in expected if obj.url.rstrip("/") not in placeholders]
            # (adlfs drops a trailing ``?`` from a path, a version's query: no match either way)
            assert expected or (kind == "azure" and tail.endswith("?")), url
            proxy.clear_records()
            retry = RetryPolicy(max_attempts=1, timeout_s=10)
            assert await _found(list_glob(store, url, retry)) == expected, url
            glob = glob_prefix(f"{bucket}/{tail}")
            assert glob is not None
            if not glob.delimiter:  # every key below the prefix, a page a request
                below = under(glob.prefix) + [k for k in marked if k.startswith(glob.prefix)]
                listings = [r.target for r in proxy.records if listing.search(r.target)]
                assert len(listings) == max(1, -(-len(below) // keys)), url
                assert not any("delimiter=" in target for target in listings), url


async def _found(listing: Awaitable[list[ObjectInfo]]) -> list[ObjectInfo]:
    """A glob's matches, none where it matched no object."""
    try:
        return await listing
    except ObjectNotFoundError:
        return []
