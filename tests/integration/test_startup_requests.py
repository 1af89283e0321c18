"""Issue 31: what a job of many consumers sends before and while it reads, counted at a proxy.

* A shard's index is checked against the shard with the read of its records (one range read
  from the verified point: trust.py's rule holds, the check costs no request of its own).
* The first record waits for the first chunk's reads only (8 records: at most 8 shard GETs).
* The manifest is downloaded once per host: a second consumer process of the host looks it up
  (a HEAD) and reads the host's copy; a copy that is not valid, or that others may write, is
  not believed (fetched again, or read from the store).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import streamrec
from streamrec.manifest.core import MANIFEST_NAME
from support.fault_proxy import FaultProxy, ProxyRecord
from support.servers import MotoS3Server

pytestmark = pytest.mark.slow  # seconds each (many requests through real servers): `pytest -m slow`

SHARDS = 240
RECORDS = 4  # a shard's


def write_set(server: MotoS3Server, bucket: str, name: str, shards: int) -> tuple[str, list[bytes]]:
    """``shards`` shards of RECORDS records of 100-odd bytes (sidecars, manifest, dataset
    index): the directory url and the records."""
    data = [b"%06d:" % k + b"r" * (100 + k % 7) for k in range(shards * RECORDS)]
    base = f"s3://{bucket}/{name}"
    with streamrec.sync.open_writer(
        f"{base}/part-{{index:04d}}.tfrecord",
        max_records=RECORDS,
        index=True,
        storage_options=server.storage_options,
    ) as writer:
        writer.write_many(data)
    return base, data


def shard_gets(records: list[ProxyRecord]) -> list[ProxyRecord]:
    return [
        r for r in records if r.method == "GET" and r.target.split("?")[0].endswith(".tfrecord")
    ]


def manifest_gets(records: list[ProxyRecord]) -> list[ProxyRecord]:
    return [r for r in records if r.method == "GET" and MANIFEST_NAME in r.target]


def test_a_shards_check_rides_on_the_read_of_its_records(
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[[str], FaultProxy],
    tmp_path: Path,
) -> None:
    """Eight consumers of a global shuffle over 240 shards (mostly one record per shard
    each, deep in it): every record costs at most one shard GET, its shard's check included
    (it used to be a GET for the check and one for the record), and each consumer gets
    exactly its share."""
    base, data = write_set(s3_server, s3_bucket, "deep", SHARDS)
    proxy = fault_proxy(s3_server.endpoint_url)
    options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    cache = {"cache_dir": str(tmp_path / "cache"), "cache_bytes": 1 << 30}
    seen: list[bytes] = []
    for host in range(8):
        proxy.clear_records()
        ds = streamrec.open_dataset(
            base,
            storage_options=options,
            shuffle="global",
            seed=5,
            num_hosts=8,
            host_index=host,
            **cache,
        )
        got = list(ds)
        seen += got
        gets = shard_gets(proxy.records)
        assert len(got) == len(data) // 8
        assert ds.stats.bytes_checked > 0  # the shards' indexes were checked
        assert 0 < len(gets) <= len(got), (host, len(gets), len(got))
        ds.close()
    assert sorted(seen) == sorted(data)  # exactly once


def test_the_first_record_waits_for_the_first_chunk_only(
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[[str], FaultProxy],
    tmp_path: Path,
) -> None:
    """Consumer 3 of 8 whose share is 8 records of 16 shards (records 1-3 of a shard need a
    check of the ones before): the first chunk (or two, the sizes differ), so everything it
    sends is what its first record costs: at most one GET per record, and metadata that does
    not grow with the shards (lookups: the host's copies serve the manifest's and the dataset
    index's bytes)."""
    base, data = write_set(s3_server, s3_bucket, "first", 16)
    proxy = fault_proxy(s3_server.endpoint_url)
    options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    cache = {"cache_dir": str(tmp_path / "cache"), "cache_bytes": 1 << 30}
    job = {"shuffle": "global", "seed": 9, "num_hosts": 8, **cache}
    warm = streamrec.open_dataset(base, storage_options=options, host_index=0, **job)
    assert len(list(warm)) == 8  # another consumer of the host fetched the metadata
    warm.close()
    proxy.clear_records()
    ds = streamrec.open_dataset(base, storage_options=options, host_index=3, **job)
    got = list(ds)
    assert len(got) == 8 and set(got) <= set(data)
    assert len(shard_gets(proxy.records)) <= len(got) == 8  # a record's check: no GET more
    others = [r for r in proxy.records if r not in shard_gets(proxy.records)]
    assert not [r for r in others if ".idx" in r.target]
    # lookups only: the directory url (not an object; a directory), the manifest, the index
    assert len(others) <= 4, [(r.method, r.target) for r in others]


_CONSUMER = """
import json, sys
import streamrec
args = json.loads(sys.argv[1])
ds = streamrec.open_dataset(args["url"], storage_options=args["options"], **args["job"])
print(json.dumps([len(ds), ds.get([5])[0].decode()]))
"""


def _cached_manifest(cache_dir: Path) -> Path:
    [found] = [p for p in cache_dir.glob("*.shard") if p.read_bytes().startswith(b"{")]
    return found


def test_the_manifest_is_downloaded_once_per_host(
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[[str], FaultProxy],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first consumer downloads the manifest into the host's cache; a second consumer
    process makes no GET of it; a copy damaged on disk is removed and fetched again; a copy
    others may write is not used (read from the store, a warning)."""
    base, data = write_set(s3_server, s3_bucket, "hosted", 40)
    proxy = fault_proxy(s3_server.endpoint_url)
    options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    cache_dir = tmp_path / "cache"
    job = {"cache_dir": str(cache_dir), "cache_bytes": 1 << 30}
    first = streamrec.open_dataset(base, storage_options=options, **job)
    assert len(first) == len(data)
    first.close()
    assert len(manifest_gets(proxy.records)) == 1
    copy = _cached_manifest(cache_dir)
    assert copy.read_bytes() == s3_server.get(s3_bucket, f"hosted/{MANIFEST_NAME}")

    proxy.clear_records()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argument = json.dumps({"url": base, "options": options, "job": job})
    out = subprocess.run(
        [sys.executable, "-c", _CONSUMER, argument],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout) == [len(data), data[5].decode()]
    assert not manifest_gets(proxy.records)
    assert [r.method for r in proxy.records if MANIFEST_NAME in r.target] == ["HEAD"]

    # damaged on disk (same size, not JSON): not believed, fetched again
    damaged = b"X" + copy.read_bytes()[1:]
    copy.write_bytes(damaged)
    proxy.clear_records()
    with caplog.at_level(logging.WARNING, logger="streamrec"):
        again = streamrec.open_dataset(base, storage_options=options, **job)
        assert len(again) == len(data) and again.get([5]) == [data[5]]
        again.close()
    assert "is not a valid manifest" in caplog.text
    assert len(manifest_gets(proxy.records)) == 1
    assert _cached_manifest(cache_dir).read_bytes()[:1] == b"{"

    # writable by others: the cache is not used, the manifest comes from the store
    copy = _cached_manifest(cache_dir)
    copy.chmod(0o620)
    proxy.clear_records()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="streamrec"):
        other = streamrec.open_dataset(base, storage_options=options, **job)
        assert len(other) == len(data)
        other.close()
    assert "not using the cache" in caplog.text
    assert len(manifest_gets(proxy.records)) == 1
