"""One contract, every store: the corpus reads back exactly through s3://, gs://, az://, http://,
memory:// and local files, from real servers on loopback; faults injected by a proxy heal with
the exact same records or end in a clear StorageError."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest

import streamrec
from streamrec.errors import (
    ObjectChangedError,
    ObjectNotFoundError,
    PermissionDeniedError,
    RetriesExhaustedError,
    StorageError,
)
from streamrec.format.framing import RecordEncoder
from streamrec.storage.retry import RetryPolicy
from support.azurite import AzuriteServer
from support.fault_proxy import FaultProxy
from support.server_fixtures import HttpDir
from support.servers import FakeGcsServer, MotoS3Server

FAST = RetryPolicy(max_attempts=5, initial_backoff_s=0.01, max_backoff_s=0.05, timeout_s=2)


@dataclass
class Remote:
    """A place to put objects and the urls / options that read them back."""

    kind: str
    put: Callable[[str, bytes], None]
    url: Callable[[str], str]
    storage_options: dict[str, Any] | None
    upstream: str | None = None  # http://host:port of the server, for a proxy


def _s3(server: MotoS3Server, bucket: str) -> Remote:
    return Remote(
        "s3",
        lambda name, data: server.put(bucket, name, data),
        lambda name: f"s3://{bucket}/{name}",
        server.storage_options,
        server.endpoint_url,
    )


def _gcs(server: FakeGcsServer, bucket: str) -> Remote:
    return Remote(
        "gs",
        lambda name, data: server.put(bucket, name, data),
        lambda name: f"gs://{bucket}/{name}",
        server.storage_options,
        server.endpoint_url,
    )


def _azure(server: AzuriteServer, container: str) -> Remote:
    return Remote(
        "az",
        lambda name, data: server.put(container, name, data),
        lambda name: f"az://{container}/{name}",
        server.storage_options,
        server.server_url,
    )


def _http(directory: HttpDir) -> Remote:
    base = directory.url.split("/", 3)

    def put(name: str, data: bytes) -> None:
        directory.write(name, data)

    return Remote(
        "http",
        put,
        lambda name: f"{directory.url}/{name}",
        None,
        f"{base[0]}//{base[2]}",
    )


def _memory() -> Remote:
    root = f"streamrec-remote/{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    return Remote(
        "memory",
        lambda name, data: fs.pipe(f"/{root}/{name}", data),
        lambda name: f"memory://{root}/{name}",
        None,
    )


def _local(tmp_path: Path) -> Remote:
    def put(name: str, data: bytes) -> None:
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    return Remote("file", put, lambda name: f"file://{tmp_path}/{name}", None)


@pytest.fixture(params=["s3", "gs", "az", "http", "memory", "file"])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Remote]:
    kind = request.param
    if kind == "az":
        server = request.getfixturevalue("azure_server")
        yield _azure(server, request.getfixturevalue("azure_container"))
    elif kind == "s3":
        server = request.getfixturevalue("s3_server")
        yield _s3(server, request.getfixturevalue("s3_bucket"))
    elif kind == "gs":
        server = request.getfixturevalue("gcs_server")
        yield _gcs(server, request.getfixturevalue("gcs_bucket"))
    elif kind == "http":
        yield _http(request.getfixturevalue("http_dir"))
    elif kind == "memory":
        yield _memory()
    else:
        yield _local(tmp_path)


@pytest.fixture(params=["s3", "gs", "az", "http"])
def served(request: pytest.FixtureRequest) -> Remote:
    """Only the stores behind a real HTTP server (for versions and injected faults)."""
    if request.param == "az":
        server = request.getfixturevalue("azure_server")
        return _azure(server, request.getfixturevalue("azure_container"))
    if request.param == "s3":
        return _s3(request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket"))
    if request.param == "gs":
        server = request.getfixturevalue("gcs_server")
        return _gcs(server, request.getfixturevalue("gcs_bucket"))
    return _http(request.getfixturevalue("http_dir"))


def _valid_files(manifest: dict[str, Any]) -> list[str]:
    return sorted(manifest["files"])


def _expected(manifest: dict[str, Any], name: str) -> list[str]:
    files = manifest["files"]
    if name == "gzip/concatenated_members.tfrecord.gz":
        records = (
            files["plain/images.tfrecord"]["records"] + files["plain/features.tfrecord"]["records"]
        )
    else:
        entry = files[name]
        records = files[entry.get("records_same_as", name)]["records"]
    return [r["sha256"] for r in records]


def test_whole_corpus_reads_back_exactly(
    remote: Remote, corpus_dir: Path, manifest: dict[str, Any]
) -> None:
    names = _valid_files(manifest)
    for name in names:
        remote.put(name, (corpus_dir / name).read_bytes())
    for name in names:
        # small blocks: records and gzip members straddle many range reads (fewer on the big
        # files: moto reads the whole object for every range)
        size = (corpus_dir / name).stat().st_size
        ds = streamrec.open_dataset(
            remote.url(name),
            storage_options=remote.storage_options,
            block_bytes=4096 if size < 100_000 else 65_536,
            retry=FAST,
        )
        got = [hashlib.sha256(p).hexdigest() for p in ds]
        assert got == _expected(manifest, name), f"{remote.kind}: {name}"
        assert ds.stats.bytes_read == (corpus_dir / name).stat().st_size


def test_glob_is_sorted_and_every_shard_read_once(
    remote: Remote, corpus_dir: Path, manifest: dict[str, Any]
) -> None:
    shards = sorted(n for n in manifest["files"] if n.startswith("sharded/"))
    for name in reversed(shards):  # upload order must not matter
        remote.put(name, (corpus_dir / name).read_bytes())
    ds = streamrec.open_dataset(
        remote.url("sharded/data-*-of-00005.tfrecord"),
        storage_options=remote.storage_options,
        retry=FAST,
    )
    got = [hashlib.sha256(p).hexdigest() for p in ds]
    assert got == [h for name in shards for h in _expected(manifest, name)]
    assert ds.stats.shards_opened == 5


def test_missing_object_fails_at_once_naming_the_url(remote: Remote) -> None:
    remote.put("present.tfrecord", RecordEncoder().encode(b"x"))
    url = remote.url("absent.tfrecord")
    ds = streamrec.open_dataset(url, storage_options=remote.storage_options, retry=FAST)
    with pytest.raises(ObjectNotFoundError, match=r"absent\.tfrecord"):
        list(ds)
    assert ds.stats.retries == 0


def test_async_and_sync_iteration_agree(remote: Remote) -> None:
    payloads = [bytes([i % 256]) * (i * 37 % 5000) for i in range(300)]
    remote.put("mixed.tfrecord", RecordEncoder().encode_many(payloads))
    ds = streamrec.open_dataset(
        remote.url("mixed.tfrecord"), storage_options=remote.storage_options, block_bytes=10_000
    )

    async def read_async() -> list[bytes]:
        return [p async for p in ds]

    import asyncio

    assert asyncio.run(read_async()) == list(ds) == payloads


def test_object_replaced_mid_read_is_an_error_not_a_splice(served: Remote) -> None:
    first = [b"a" * 1000] * 300
    # another size too: the HTTP test server's ETag is mtime_ns + size, and two writes within
    # one kernel clock tick share an mtime
    second = [b"b" * 1000] * 301
    served.put("changing.tfrecord", RecordEncoder().encode_many(first))
    ds = streamrec.open_dataset(
        served.url("changing.tfrecord"),
        storage_options=served.storage_options,
        block_bytes=16_384,
        max_concurrency=1,
        prefetch_bytes=16_384,
        retry=FAST,
    )
    seen: list[bytes] = []
    with pytest.raises(ObjectChangedError, match="changed while it was being read"):
        for i, payload in enumerate(ds):
            seen.append(payload)
            if i == 5:
                served.put("changing.tfrecord", RecordEncoder().encode_many(second))
    assert set(seen) == {b"a" * 1000}


# --- faults injected between streamrec and the server --------------------------------------

PAYLOADS = [hashlib.sha256(b"%d" % i).digest() * (1 + i % 97) for i in range(2000)]


@pytest.fixture
def proxied(
    served: Remote, fault_proxy: Callable[..., FaultProxy]
) -> tuple[Remote, FaultProxy, str]:
    """The served store with an object on it, and a fault proxy between client and server.

    The url is a glob matching that one object, so the object is found by a listing and every
    range GET is a data read. (A single-object url's size comes from its first range GET
    instead: faults there are tested on their own below.)
    """
    served.put("data.tfrecord", RecordEncoder().encode_many(PAYLOADS))
    assert served.upstream is not None
    proxy = fault_proxy(served.upstream)
    url = served.url("data.tfrecor[d]")
    if served.kind == "http":
        url = url.replace(served.upstream, proxy.url)
    return served, proxy, url


def _options_via(remote: Remote, proxy: FaultProxy) -> dict[str, Any] | None:
    if remote.kind == "s3":
        return {**remote.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}  # type: ignore[dict-item]
    if remote.kind == "gs":
        return {**(remote.storage_options or {}), "endpoint_url": proxy.url}
    if remote.kind == "az":
        return {"connection_string": AzuriteServer.connection_string_for(proxy.url)}
    return None


def _read(remote: Remote, proxy: FaultProxy, url: str, **options: Any) -> streamrec.Dataset:
    return streamrec.open_dataset(
        url,
        storage_options=_options_via(remote, proxy),
        block_bytes=32_768,
        retry=options.pop("retry", FAST),
        **options,
    )


FAULTS: dict[str, Callable[[FaultProxy], object]] = {
    "reset mid-body": lambda p: p.reset_mid_body(5000, method="GET", range_only=True, times=3),
    "truncated body": lambda p: p.truncate_body(7000, method="GET", range_only=True, times=3),
    "short 206": lambda p: p.short_206(1000, method="GET", range_only=True, times=4),
    "503 burst": lambda p: p.status(503, method="GET", range_only=True, times=3),
    "429 slow down": lambda p: p.status(429, method="GET", range_only=True, times=2),
    "stall past the timeout": lambda p: p.stall(5, method="GET", range_only=True, times=1),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_transient_faults_heal_with_the_exact_records(
    proxied: tuple[Remote, FaultProxy, str], fault: str
) -> None:
    remote, proxy, url = proxied
    injected = FAULTS[fault](proxy)
    policy = RetryPolicy(max_attempts=6, initial_backoff_s=0.01, max_backoff_s=0.05, timeout_s=1)
    ds = _read(remote, proxy, url, retry=policy)
    assert list(ds) == PAYLOADS
    assert injected.fired >= 1  # type: ignore[attr-defined]
    assert ds.stats.retries >= 1


@pytest.mark.parametrize("fault", ["503 burst", "reset mid-body", "stall past the timeout"])
def test_faults_on_a_single_objects_first_read_heal(
    proxied: tuple[Remote, FaultProxy, str], fault: str
) -> None:
    # Without a glob, the size comes from the first range GET (no HEAD): faults there are
    # retried like a listing's, and the records come out exactly.
    remote, proxy, url = proxied
    url = url.replace("data.tfrecor[d]", "data.tfrecord")
    injected = FAULTS[fault](proxy)
    policy = RetryPolicy(max_attempts=6, initial_backoff_s=0.01, max_backoff_s=0.05, timeout_s=1)
    ds = _read(remote, proxy, url, retry=policy)
    assert list(ds) == PAYLOADS
    assert injected.fired >= 1  # type: ignore[attr-defined]
    gets = [r for r in proxy.records if r.method == "GET" and r.range]
    assert not any(r.method == "HEAD" for r in proxy.records)
    assert gets[0].range is not None and gets[0].range.startswith("bytes=0-")


def test_a_single_object_costs_one_request_before_its_first_bytes(
    proxied: tuple[Remote, FaultProxy, str],
) -> None:
    remote, proxy, url = proxied
    url = url.replace("data.tfrecor[d]", "data.tfrecord")
    ds = _read(remote, proxy, url)
    records = iter(ds)
    assert next(records) == PAYLOADS[0]
    # the object was looked up by reading its first bytes (no HEAD) ...
    first = proxy.records[0]
    assert (first.method, first.range) == ("GET", "bytes=0-262143")
    assert list(records) == PAYLOADS[1:]
    # ... which also served the first blocks: no other GET asks for them
    requests = [(r.method, r.range) for r in proxy.records]
    assert not any(method == "HEAD" for method, _ in requests)
    ranges = sorted(int(r.split("=")[1].split("-")[0]) for _, r in requests if r is not None)
    assert ranges[:2] == [0, 262144]
    assert ds.stats.bytes_read == len(RecordEncoder().encode_many(PAYLOADS))


@pytest.mark.slow  # seconds: in the slow step
def test_wait_time_counts_a_slow_storage(proxied: tuple[Remote, FaultProxy, str]) -> None:
    # One block at a time, the first four GETs held back 0.25 s each: a consumer that does
    # nothing with its records spends about a second waiting, and stats.wait_s says so.
    remote, proxy, url = proxied
    proxy.delay(0.25, method="GET", range_only=True, times=4)
    ds = _read(remote, proxy, url, max_concurrency=1, prefetch_bytes=32_768)
    started = time.perf_counter()
    count = sum(1 for _ in ds)
    wall = time.perf_counter() - started
    assert count == len(PAYLOADS)
    assert 0.9 <= ds.stats.wait_s <= wall


def test_a_fault_that_persists_ends_in_a_clear_error(
    proxied: tuple[Remote, FaultProxy, str],
) -> None:
    remote, proxy, url = proxied
    proxy.status(503, method="GET", range_only=True)
    ds = _read(remote, proxy, url)
    with pytest.raises(RetriesExhaustedError, match=r"data\.tfrecord.*gave up after 5 attempt"):
        list(ds)
    assert ds.stats.records == 0


def test_a_server_that_keeps_sending_short_bodies_is_an_error(
    proxied: tuple[Remote, FaultProxy, str],
) -> None:
    remote, proxy, url = proxied
    proxy.short_206(10, method="GET", range_only=True)
    with pytest.raises(RetriesExhaustedError, match="short bodies"):
        list(_read(remote, proxy, url))


def test_a_dead_server_is_a_storage_error_not_a_hang(
    proxied: tuple[Remote, FaultProxy, str],
) -> None:
    remote, proxy, url = proxied
    ds = _read(remote, proxy, url)
    records = iter(ds)
    first = next(records)
    assert first == PAYLOADS[0]
    proxy.stop()  # the server vanishes mid-stream
    with pytest.raises(StorageError):
        for _ in records:
            pass


def test_access_denied_fails_at_once_naming_the_url(
    proxied: tuple[Remote, FaultProxy, str],
) -> None:
    remote, proxy, url = proxied
    proxy.status(403, method="GET", range_only=True)
    ds = _read(remote, proxy, url)
    with pytest.raises(PermissionDeniedError, match=r"data\.tfrecord"):
        list(ds)
    assert ds.stats.retries == 0
    ranges = [r.range for r in proxy.records if r.method == "GET" and r.range]
    assert ranges and len(ranges) == len(set(ranges))  # no block was asked for twice


def _count_records(url: str, storage_options: dict[str, Any] | None) -> int:
    return sum(1 for _ in streamrec.open_dataset(url, storage_options=storage_options))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_child_processes_read_with_their_own_connections(
    s3_server: MotoS3Server, s3_bucket: str, method: str
) -> None:
    # What DataLoader workers do: the parent has used the dataset (an event loop, sessions),
    # then children read too; nothing bound to the parent's loop or PID may be reused.
    import multiprocessing

    s3_server.put(s3_bucket, "d.tfrecord", RecordEncoder().encode_many(PAYLOADS[:300]))
    url = f"s3://{s3_bucket}/d.tfrecord"
    assert _count_records(url, s3_server.storage_options) == 300
    with multiprocessing.get_context(method).Pool(2) as pool:
        counts = pool.starmap(_count_records, [(url, s3_server.storage_options)] * 2)
    assert counts == [300, 300]
