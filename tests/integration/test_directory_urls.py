"""A url ending in ``/`` is a directory: its shards are read, whatever a lookup of its name
answers (SeaweedFS, like real S3-compatible stores, answers a HEAD or GET of ``prefix/`` with
an empty object; on moto an explicit empty ``prefix/`` marker does the same), and a directory
in which no shard is found is an error naming the url, never an empty dataset.
On SeaweedFS and moto, and the same rule on local directories, GCS and Azure.

A directory's ``_manifest.json`` is read before anything is listed (one GET, requests counted
at a proxy): the directory is listed only when it has none."""

from __future__ import annotations

import glob
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import streamrec
from integration.test_cli_sources import RECORDS, check_written_set, count, read, write_set
from streamrec.errors import ObjectNotFoundError
from support.azurite import AzuriteServer
from support.fault_proxy import FaultProxy, ProxyRecord
from support.seaweed import SeaweedServer
from support.server_fixtures import HttpDir, unique_name
from support.servers import FakeGcsServer, MotoS3Server


@pytest.fixture
def weed_bucket(seaweed_server: SeaweedServer) -> str:
    return seaweed_server.create_bucket(unique_name())


def _no_shard(url: str, options: dict[str, Any] | None) -> None:
    """Reading and counting ``url`` fail, naming it and saying no shard was found."""
    with pytest.raises(ObjectNotFoundError) as raised:
        read(url, options)
    assert url in str(raised.value) and "no shard" in str(raised.value)
    storage = ["--storage-options", json.dumps(options)] if options else []
    rc, total, err = count(url, *storage)
    assert (rc, total) == (1, -1) and url in err and "no shard" in err, err


@pytest.mark.slow  # SeaweedFS started for it
def test_a_written_set_on_seaweedfs_reads_back_every_obvious_way(
    seaweed_server: SeaweedServer, weed_bucket: str
) -> None:
    # SeaweedFS answers a HEAD of out/ with 200 and 0 bytes: read before as 0 records, exit 0
    options = seaweed_server.storage_options
    write_set(f"s3://{weed_bucket}/out", options)
    head = seaweed_server.client.head_object(Bucket=weed_bucket, Key="out/")  # (if ever
    assert head["ContentLength"] == 0  # it stops doing so, this test no longer tests that)
    check_written_set(f"s3://{weed_bucket}/out", options)


def test_a_seaweedfs_prefix_without_manifest_and_empty_ones(
    seaweed_server: SeaweedServer, weed_bucket: str
) -> None:
    options = seaweed_server.storage_options
    write_set(f"s3://{weed_bucket}/out", options)
    seaweed_server.client.delete_object(Bucket=weed_bucket, Key="out/_manifest.json")
    assert read(f"s3://{weed_bucket}/out/", options) == RECORDS
    seaweed_server.put(weed_bucket, "hidden/_only.tfrecord", b"")
    _no_shard(f"s3://{weed_bucket}/hidden/", options)
    _no_shard(f"s3://{weed_bucket}/nothing/", options)


def test_an_empty_marker_object_is_no_shard_on_moto(
    s3_server: MotoS3Server, s3_bucket: str
) -> None:
    # the console's "create folder": an empty object named out/ (and one inside, out/sub/)
    options = s3_server.storage_options
    s3_server.put(s3_bucket, "out/", b"")
    _no_shard(f"s3://{s3_bucket}/out/", options)
    write_set(f"s3://{s3_bucket}/out", options)
    s3_server.put(s3_bucket, "out/sub/", b"")
    s3_server.delete(s3_bucket, "out/_manifest.json")
    for url in (f"s3://{s3_bucket}/out/", f"s3://{s3_bucket}/out", f"s3://{s3_bucket}/out/*"):
        assert read(url, options) == RECORDS, url
    s3_server.put(s3_bucket, "out/sub/x.tfrecord", b"")
    assert read(f"s3://{s3_bucket}/out/sub/*", options) == []  # x is an empty shard


def test_an_empty_or_missing_local_directory_with_a_slash(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _no_shard(f"{tmp_path}/empty/", None)
    _no_shard(f"{tmp_path}/missing/", None)
    write_set(str(tmp_path / "out"))
    assert read(f"{tmp_path}/out/") == RECORDS


def test_gcs_and_azure_directories_with_a_slash(
    gcs_server: FakeGcsServer,
    gcs_bucket: str,
    azure_server: AzuriteServer,
    azure_container: str,
) -> None:
    for base, options in (
        (f"gs://{gcs_bucket}", gcs_server.storage_options),
        (f"az://{azure_container}", azure_server.storage_options),
    ):
        write_set(f"{base}/out", options)
        assert read(f"{base}/out/", options) == RECORDS, base
        _no_shard(f"{base}/nothing/", options)


def test_an_http_directory_with_a_slash_is_its_index(http_dir: HttpDir) -> None:
    # (read before as an object: its HTML index page, a CorruptRecordError)
    write_set(str(http_dir.path / "out"))
    assert read(f"{http_dir.url}/out/") == RECORDS
    (http_dir.path / "empty").mkdir()
    _no_shard(f"{http_dir.url}/empty/", None)


def _is_listing(record: ProxyRecord) -> bool:
    """An S3 ListObjects request (a GET of the bucket with ``list-type`` or ``prefix``)."""
    query = record.target.partition("?")[2]
    return "list-type=" in query or "prefix=" in query


def test_a_directory_with_a_manifest_is_read_without_listing_it(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Callable[..., FaultProxy]
) -> None:
    write_set(f"s3://{s3_bucket}/out", s3_server.storage_options)
    proxy = fault_proxy(s3_server.endpoint_url)
    options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    # len() reads only the listing's answer: the manifest's counts
    url = f"s3://{s3_bucket}/out/"
    assert len(streamrec.open_dataset(url, storage_options=options)) == len(RECORDS)
    assert [(r.method, r.target.partition("?")[0], r.status) for r in proxy.records] == [
        ("GET", f"/{s3_bucket}/out/_manifest.json", 206)
    ]  # one GET (its first bytes are the whole small manifest), nothing listed
    proxy.clear_records()
    assert read(f"s3://{s3_bucket}/out", options) == RECORDS  # no slash: an object first
    listed = [r for r in proxy.records if r.method == "GET" and r.range is None]
    assert not any(_is_listing(r) for r in proxy.records), listed
    assert [r.status for r in proxy.records[:2]] == [404, 206]  # out, then out/_manifest.json
    proxy.clear_records()
    assert count(url, "--storage-options", json.dumps(options)) == (0, len(RECORDS), "")
    assert not any(_is_listing(r) for r in proxy.records)


def test_a_directory_without_a_manifest_is_listed_after_one_lookup(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Callable[..., FaultProxy]
) -> None:
    write_set(f"s3://{s3_bucket}/out", s3_server.storage_options)
    s3_server.delete(s3_bucket, "out/_manifest.json")
    proxy = fault_proxy(s3_server.endpoint_url)
    options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    assert read(f"s3://{s3_bucket}/out/", options) == RECORDS
    first, second = proxy.records[:2]
    assert (first.target.partition("?")[0], first.status) == (
        f"/{s3_bucket}/out/_manifest.json",
        404,
    )
    assert _is_listing(second)


def test_a_local_directory_with_a_manifest_is_not_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_set(str(tmp_path / "out"))
    (tmp_path / "out" / "stray.tfrecord").write_bytes(b"not a shard")  # a listing would see it
    patterns: list[str] = []
    listed = glob.glob

    def listing(pattern: str, **kwargs: Any) -> list[str]:
        patterns.append(pattern)
        return listed(pattern, **kwargs)

    monkeypatch.setattr(glob, "glob", listing)  # a spy: the local store lists through glob
    for url in (f"{tmp_path}/out", f"{tmp_path}/out/"):
        assert read(url) == RECORDS
        assert len(streamrec.open_dataset(url)) == len(RECORDS)
    assert patterns == []
    (tmp_path / "out" / "_manifest.json").unlink()
    (tmp_path / "out" / "stray.tfrecord").unlink()
    assert read(f"{tmp_path}/out/") == RECORDS  # no manifest: listed
    assert set(patterns) == {f"{tmp_path}/out/*"}
