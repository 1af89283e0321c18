"""``ds.stats`` through an emulated link: each read's first byte apart from its transfer, and the
requests counted by kind (listing pages, metadata reads, shard reads).

The link is the fault proxy in front of the moto S3 server (or the range HTTP server): a delay
before each range read is forwarded is latency, a cap on each connection's bytes per second is
bandwidth. The tests check what must hold on such a link, not timings: every read waited at
least the delay for its first byte, the pages and metadata reads counted are those the proxy saw.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.storage.s3.store import S3Store
from support.fault_proxy import FaultProxy
from support.server_fixtures import HttpDir
from support.servers import MotoS3Server

pytestmark = pytest.mark.slow  # emulated slow links: `pytest -m slow`

DELAY_S = 0.05
SLOW_MANIFEST_S = 0.5
SHARDS = 3
RECORDS = 40  # per shard
RECORD_BYTES = 8192  # shards of 320 KiB: more than a look-up's first bytes (256 KiB)


def _records(shard: int) -> list[bytes]:
    return [bytes([shard, i % 256]) * (RECORD_BYTES // 2) for i in range(RECORDS)]


def _write_set(root: Path) -> list[Path]:
    """A set of ``SHARDS`` indexed shards and its ``_manifest.json`` in ``root``; the files
    written."""
    template = str(root / "part-{index}.tfrecord")
    with streamrec.sync.open_writer(template, max_records=RECORDS, index=True) as w:
        for shard in range(SHARDS):
            w.write_many(_records(shard))
    return sorted(root.iterdir())


def _expected() -> list[bytes]:
    return [record for shard in range(SHARDS) for record in _records(shard)]


def _s3_set(
    tmp_path: Path,
    s3_server: MotoS3Server,
    bucket: str,
    fault_proxy: Callable[..., FaultProxy],
    **link: Any,
) -> tuple[FaultProxy, dict[str, Any]]:
    for path in _write_set(tmp_path):
        s3_server.put(bucket, f"set/{path.name}", path.read_bytes())
    proxy = fault_proxy(s3_server.endpoint_url, **link)
    options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    return proxy, options


def _range_gets(proxy: FaultProxy, suffix: str) -> int:
    """Range GETs of objects whose name ends with ``suffix``."""
    return sum(
        1
        for r in proxy.records
        if r.method == "GET" and r.range and r.target.split("?")[0].endswith(suffix)
    )


def test_latency_is_waiting_for_the_first_byte(
    tmp_path: Path,
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[..., FaultProxy],
) -> None:
    proxy, options = _s3_set(tmp_path, s3_server, s3_bucket, fault_proxy)
    proxy.delay(DELAY_S, range_only=True)
    ds = streamrec.open_dataset(
        f"s3://{s3_bucket}/set/part-*.tfrecord",
        storage_options=options,
        block_bytes=64 << 10,
        max_concurrency=2,
    )
    assert [record for record in ds] == _expected()
    stats = ds.stats
    # every range read of a shard the proxy forwarded is one the dataset counted
    assert stats.requests == _range_gets(proxy, ".tfrecord") >= SHARDS
    assert stats.first_byte_s >= stats.requests * DELAY_S
    assert stats.first_byte_s <= stats.storage_s
    report = stats.report()
    assert "until the first byte" in report and "transfer" in report
    assert f"{stats.requests} shard reads" in report
    # latency-bound: the reads spent most of their time before their first byte
    assert report.splitlines()[-1].startswith("bottleneck: storage: ")
    assert "waiting for the first byte: raise max_concurrency" in report


def test_reads_by_index_time_their_first_byte(
    tmp_path: Path,
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[..., FaultProxy],
) -> None:
    proxy, options = _s3_set(tmp_path, s3_server, s3_bucket, fault_proxy)
    proxy.delay(DELAY_S, range_only=True)
    url = f"s3://{s3_bucket}/set/part-*.tfrecord"
    ds = streamrec.open_dataset(url, storage_options=options, shuffle="global")
    assert sorted(record for record in ds) == sorted(_expected())
    assert ds.stats.requests >= SHARDS
    assert ds.stats.first_byte_s >= ds.stats.requests * DELAY_S
    assert ds.stats.metadata_requests >= 1  # the record indexes (a dataset index, sidecars)
    ds = streamrec.open_dataset(url, storage_options=options)
    assert ds.get([0, RECORDS, 2 * RECORDS]) == [_records(shard)[0] for shard in range(SHARDS)]
    assert ds.stats.requests >= SHARDS
    assert ds.stats.first_byte_s >= ds.stats.requests * DELAY_S
    ds.close()


def test_bandwidth_is_the_transfer(
    tmp_path: Path,
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[..., FaultProxy],
) -> None:
    # a narrow link and no added latency: the reads' time goes to moving their bytes
    _, options = _s3_set(
        tmp_path, s3_server, s3_bucket, fault_proxy, bytes_per_s_per_connection=1 << 20
    )
    ds = streamrec.open_dataset(
        f"s3://{s3_bucket}/set/part-*.tfrecord", storage_options=options, block_bytes=128 << 10
    )
    assert list(ds) == _expected()
    stats = ds.stats
    assert 0 < stats.first_byte_s < stats.storage_s / 2
    assert stats.report().splitlines()[-1].startswith("bottleneck: transfer: ")


def test_listing_pages_are_counted(
    tmp_path: Path,
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[..., FaultProxy],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(S3Store, "list_page_keys", 2)
    proxy, options = _s3_set(tmp_path, s3_server, s3_bucket, fault_proxy)
    ds = streamrec.open_dataset(f"s3://{s3_bucket}/set/part-*.tfrecord", storage_options=options)
    assert [record for record in ds] == _expected()  # (not list(ds): len() would list too)
    # one listing of the prefix (shards and their index sidecars), two objects a page
    pages = math.ceil(len(s3_server.list(s3_bucket, "set/part-")) / 2)
    listed = sum(1 for r in proxy.records if r.method == "GET" and "list-type=2" in r.target)
    assert ds.stats.list_requests == listed == pages >= 2
    assert [record for record in ds] == _expected()  # each iteration lists again
    assert ds.stats.list_requests == 2 * pages


def test_the_listing_of_shards_is_counted(
    tmp_path: Path,
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[..., FaultProxy],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(S3Store, "list_page_keys", 2)
    proxy, options = _s3_set(tmp_path, s3_server, s3_bucket, fault_proxy)
    ds = streamrec.open_dataset(f"s3://{s3_bucket}/set/part-*.tfrecord", storage_options=options)
    shards = asyncio.run(ds.shards())
    assert len(shards) == SHARDS
    listed = sum(1 for r in proxy.records if r.method == "GET" and "list-type=2" in r.target)
    assert ds.stats.list_requests == listed >= 2


def test_a_listing_through_the_filesystem_is_counted(
    http_dir: HttpDir, fault_proxy: Callable[..., FaultProxy]
) -> None:
    _write_set(http_dir.path)
    proxy = fault_proxy(http_dir.url.rsplit("/", 1)[0])
    base = f"{proxy.url}/{http_dir.url.rsplit('/', 1)[1]}"
    ds = streamrec.open_dataset(f"{base}/part-*.tfrecord")
    assert list(ds) == _expected()
    # fsspec's HTTP glob reads the directory's index page (its own requests unseen: a
    # listing counts once) and looks up each object the page gives no size for
    gets = [r.target for r in proxy.records if r.method == "GET"]
    heads = [r.target for r in proxy.records if r.method == "HEAD"]
    stats = ds.stats
    assert 1 <= stats.list_requests <= sum(1 for t in gets if t.endswith("/"))
    looked_up = sum(1 for t in heads if t.endswith(".tfrecord"))
    index_reads = sum(1 for t in gets if t.endswith("_dataset_index.bin"))
    assert stats.metadata_requests == looked_up + index_reads >= SHARDS


def test_metadata_reads_are_counted(
    tmp_path: Path,
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[..., FaultProxy],
) -> None:
    proxy, options = _s3_set(tmp_path, s3_server, s3_bucket, fault_proxy)
    proxy.delay(SLOW_MANIFEST_S, path="_manifest.json")
    ds = streamrec.open_dataset(f"s3://{s3_bucket}/set/_manifest.json", storage_options=options)
    assert [record for record in ds] == _expected()
    stats = ds.stats
    assert stats.metadata_requests == _range_gets(proxy, "_manifest.json") == 1
    assert "1 metadata reads" in stats.report()
    # the manifest's slow read is no shard read's: its wait is not in first_byte_s
    assert stats.requests >= SHARDS and stats.first_byte_s < SLOW_MANIFEST_S


def test_http_reads_time_their_first_byte(
    tmp_path: Path, http_dir: HttpDir, fault_proxy: Callable[..., FaultProxy]
) -> None:
    names = [path.name for path in _write_set(http_dir.path) if path.suffix == ".tfrecord"]
    proxy = fault_proxy(http_dir.url.rsplit("/", 1)[0])
    proxy.delay(DELAY_S, range_only=True)
    base = f"{proxy.url}/{http_dir.url.rsplit('/', 1)[1]}"
    ds = streamrec.open_dataset([f"{base}/{name}" for name in names], block_bytes=32 << 10)
    assert list(ds) == _expected()
    stats = ds.stats
    assert stats.requests >= SHARDS
    assert stats.first_byte_s >= stats.requests * DELAY_S


@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_gcs_and_azure_reads_time_their_first_byte(
    scheme: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    fault_proxy: Callable[..., FaultProxy],
) -> None:
    gcs = scheme == "gs"
    server = request.getfixturevalue("gcs_server" if gcs else "azure_server")
    bucket: str = request.getfixturevalue("gcs_bucket" if gcs else "azure_container")
    for path in _write_set(tmp_path):
        server.put(bucket, f"set/{path.name}", path.read_bytes())
    if gcs:
        proxy = fault_proxy(server.endpoint_url, flavor="gcs")
        options = {**server.storage_options, "endpoint_url": proxy.url}
        listing = re.compile(rf"/storage/v1/b/{bucket}/o\?")
    else:
        proxy = fault_proxy(server.server_url, flavor="azure")
        options = {"connection_string": server.connection_string(proxy.url)}
        listing = re.compile(r"[?&]comp=list(&|$)")
    proxy.delay(DELAY_S, range_only=True)
    ds = streamrec.open_dataset(
        f"{scheme}://{bucket}/set/part-*.tfrecord", storage_options=options, block_bytes=64 << 10
    )
    assert [record for record in ds] == _expected()
    stats = ds.stats
    assert stats.requests == _range_gets(proxy, ".tfrecord") >= SHARDS
    assert stats.first_byte_s >= stats.requests * DELAY_S
    assert stats.list_requests == sum(1 for r in proxy.records if listing.search(r.target)) >= 1


def test_local_reads_have_no_first_byte(tmp_path: Path) -> None:
    _write_set(tmp_path)
    ds = streamrec.open_dataset(str(tmp_path / "part-*.tfrecord"))
    assert list(ds) == _expected()
    stats = ds.stats
    assert stats.requests >= SHARDS and stats.first_byte_s == 0 and stats.list_requests == 0
    assert "until the first byte" not in stats.report()
