"""Manifests are untrusted: stale ones (shards rewritten since) are refused, not read through,
and their names cannot send the reader outside the manifest's own directory."""

from __future__ import annotations

import json
import logging
import posixpath
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.errors import FormatError, ObjectChangedError, ObjectNotFoundError
from streamrec.manifest.core import loads
from streamrec.storage.retry import RetryPolicy
from support.server_fixtures import HttpDir
from support.servers import FakeGcsServer, MotoS3Server, RangeHTTPServer

FAST = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=10)


@dataclass
class Place:
    base: str  # a directory url, no trailing slash
    storage_options: dict[str, Any] | None
    put: Callable[[str, bytes], None]  # replace an object by name, behind streamrec's back
    exists: Callable[[str], bool]


def _place(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> Place:
    if kind == "file":
        root = tmp_path / "set"
        root.mkdir()
        return Place(
            str(root),
            None,
            lambda name, data: (root / name).write_bytes(data),
            lambda name: (root / name).exists(),
        )
    if kind == "s3":
        request.getfixturevalue("s3_small_parts")
        s3: MotoS3Server = request.getfixturevalue("s3_server")
        bucket: str = request.getfixturevalue("s3_bucket")
        return Place(
            f"s3://{bucket}/set",
            s3.storage_options,
            lambda name, data: s3.put(bucket, f"set/{name}", data),
            lambda name: f"set/{name}" in s3.list(bucket, "set/"),
        )
    gcs: FakeGcsServer = request.getfixturevalue("gcs_server")
    bucket = request.getfixturevalue("gcs_bucket")
    return Place(
        f"gs://{bucket}/set",
        gcs.storage_options,
        lambda name, data: gcs.put(bucket, f"set/{name}", data),
        lambda name: f"set/{name}" in gcs.list(bucket, "set/"),
    )


@pytest.fixture(params=["file", "s3", "gs"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    return _place(request, request.param, tmp_path)


@pytest.fixture(params=["s3", "gs"])
def versioned(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    """Stores with object versions (local files have none: their size is what is checked)."""
    return _place(request, request.param, tmp_path)


def _write(place: Place, records: list[bytes], **options: Any) -> list[bytes]:
    with streamrec.sync.open_writer(
        f"{place.base}/part-{{index:03d}}.tfrecord",
        storage_options=place.storage_options,
        retry=FAST,
        **options,
    ) as w:
        w.write_many(records)
    return records


def _shard_bytes(records: list[bytes]) -> bytes:
    from streamrec.format.framing import RecordEncoder

    return RecordEncoder().encode_many(records)


def _read(place: Place, url: str | None = None, **options: Any) -> list[bytes]:
    return list(
        streamrec.open_dataset(
            url or f"{place.base}/_manifest.json",
            storage_options=place.storage_options,
            retry=FAST,
            **options,
        )
    )


def test_a_shard_rewritten_longer_after_its_manifest_is_an_error_not_a_prefix(
    place: Place,
) -> None:
    old = _write(place, [b"old-%03d" % i for i in range(30)], max_records=10)
    assert _read(place) == old
    # a later writer (killed before its manifest) replaced part-000 by a longer object
    place.put("part-000.tfrecord", _shard_bytes([b"new-%03d" % i for i in range(25)]))
    with pytest.raises(ObjectChangedError, match=r"part-000\.tfrecord"):
        _read(place)


@pytest.mark.parametrize("part_bytes", [1 << 20, 1024])  # one request, or multipart / chunks
def test_a_shard_rewritten_with_the_same_size_is_caught_by_its_version(
    versioned: Place, part_bytes: int
) -> None:
    records = [b"old-%03d" % i + bytes(200) for i in range(30)]
    old = _write(versioned, records, max_records=10, part_bytes=part_bytes)
    assert _read(versioned) == old
    versioned.put(
        "part-001.tfrecord", _shard_bytes([b"NEW-%03d" % i + bytes(200) for i in range(10)])
    )
    with pytest.raises(ObjectChangedError, match=r"part-001\.tfrecord"):
        _read(versioned)


def test_a_writer_removes_the_old_manifest_before_its_first_shard(
    place: Place, caplog: pytest.LogCaptureFixture
) -> None:
    _write(place, [b"old-%03d" % i for i in range(30)], max_records=10)
    assert place.exists("_manifest.json")
    caplog.set_level(logging.WARNING, logger="streamrec")
    rewrite = streamrec.sync.open_writer(
        f"{place.base}/part-{{index:03d}}.tfrecord",
        max_records=5,
        storage_options=place.storage_options,
        retry=FAST,
    )
    with pytest.raises(RuntimeError, match="killed"), rewrite as w:  # dies half-way
        w.write_many([b"new-%03d" % i for i in range(12)])
        raise RuntimeError("killed")
    assert not place.exists("_manifest.json")
    assert "removed the manifest of an earlier write" in caplog.text
    with pytest.raises(ObjectNotFoundError):
        _read(place)


# --- where names may point ----------------------------------------------------------------


def _document(*names: str) -> str:
    shards = [
        {"index": i, "name": name, "records": 0, "bytes": 0, "crc32c": 0}
        for i, name in enumerate(names)
    ]
    return json.dumps({"format": "streamrec.manifest.core", "version": 1, "shards": shards})


@pytest.mark.parametrize(
    "name",
    [
        "../secret.tfrecord",
        "sub/../../secret.tfrecord",
        "/etc/passwd",
        "file:///etc/passwd",
        "s3://other-bucket/data.tfrecord",
        "http://169.254.169.254/latest/meta-data/iam",
        "https://example.com/x.tfrecord",
        "gs://bucket/elsewhere/x.tfrecord",
        "",
    ],
)
def test_names_outside_the_manifests_directory_are_refused(name: str) -> None:
    with pytest.raises(FormatError, match="shard 0") as caught:
        loads(_document(name), "gs://bucket/data/_manifest.json")
    if "://" in name or name.startswith("/"):
        assert "allow_absolute_urls=True" in str(caught.value)
        entry = loads(_document(name), "gs://bucket/data/_manifest.json", allow_absolute_urls=True)
        assert entry.shards[0].url == name


def test_absolute_names_inside_the_manifests_own_directory_still_read() -> None:
    manifest = loads(
        _document("gs://bucket/data/a.tfrecord", "gcs://bucket/data/sub/b.tfrecord", "c"),
        "gs://bucket/data/_manifest.json",
    )
    assert [e.url for e in manifest.shards] == [
        "gs://bucket/data/a.tfrecord",
        "gs://bucket/data/sub/b.tfrecord",
        "gs://bucket/data/c",
    ]


def test_a_local_manifest_cannot_point_at_other_files_unless_trusted(tmp_path: Path) -> None:
    outside = tmp_path / "private.tfrecord"
    outside.write_bytes(_shard_bytes([b"secret"]))
    (tmp_path / "set").mkdir()
    document = json.loads(_document(str(outside)))
    document["shards"][0]["bytes"] = outside.stat().st_size
    document["shards"][0]["records"] = 1
    manifest = tmp_path / "set" / "_manifest.json"
    manifest.write_text(json.dumps(document))
    with pytest.raises(FormatError, match="allow_absolute_urls"):
        list(streamrec.open_dataset(str(manifest)))
    assert list(streamrec.open_dataset(str(manifest), allow_absolute_urls=True)) == [b"secret"]


def test_old_manifests_listing_absolute_paths_of_their_own_directory_still_read(
    tmp_path: Path,
) -> None:
    with streamrec.sync.open_writer(str(tmp_path / "p-{index}"), max_records=2) as w:
        w.write_many([b"1", b"2", b"3"])
    path = tmp_path / "_manifest.json"
    document = json.loads(path.read_text())
    for shard in document["shards"]:  # as older writers listed some sets
        shard["name"] = str(tmp_path / shard["name"])
    path.write_text(json.dumps(document))
    assert list(streamrec.open_dataset(str(path))) == [b"1", b"2", b"3"]


def test_the_writer_refuses_a_manifest_its_readers_would_refuse(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="shards' directory or above"):
        streamrec.open_writer(
            str(tmp_path / "a" / "p-{index}"), manifest=str(tmp_path / "b" / "_manifest.json")
        )
    # above the shards is fine: names are relative paths below it
    with streamrec.sync.open_writer(
        str(tmp_path / "a" / "p-{index}"), max_records=1, manifest=str(tmp_path / "m.json")
    ) as w:
        w.write_many([b"1", b"2"])
    names = [s["name"] for s in json.loads((tmp_path / "m.json").read_text())["shards"]]
    assert names == ["a/p-0", "a/p-1"]
    assert list(streamrec.open_dataset(str(tmp_path / "m.json"))) == [b"1", b"2"]


# --- names that climb out once percent-decoded (issue 29 B.10) ------------------------------

ENCODED_ESCAPES = [
    "%2e%2e/secret.tfrecord",
    "%2E%2E/secret.tfrecord",
    ".%2e/secret.tfrecord",
    "%2e./secret.tfrecord",
    "sub/%2e%2e/%2e%2e/secret.tfrecord",
    "..%2fsecret.tfrecord",
    "%2e%2e%2fsecret.tfrecord",
    "%252e%252e/secret.tfrecord",  # decoded twice (a proxy, then the server)
    "%25252e%25252e/secret.tfrecord",
    "..\\secret.tfrecord",
    "%2e%2e%5csecret.tfrecord",
    "%2Fetc%2Fpasswd",
    "%2F%2F169.254.169.254/latest/meta-data",
    "http%3A%2F%2F169.254.169.254/latest",
    "a%00b.tfrecord",
]


@pytest.mark.parametrize("name", ENCODED_ESCAPES)
def test_percent_encoded_names_cannot_climb_out(name: str) -> None:
    with pytest.raises(FormatError, match="shard 0") as caught:
        loads(_document(name), "https://host/data/set/_manifest.json")
    assert "not a name relative to the manifest" in str(caught.value)
    # a sidecar's name is checked the same way
    document = json.loads(_document("part-0.tfrecord"))
    document["shards"][0]["record_index"] = {"name": name, "bytes": 0}
    with pytest.raises(FormatError, match="shard 0"):
        loads(json.dumps(document), "https://host/data/set/_manifest.json")


def test_names_that_only_look_encoded_still_read() -> None:
    names = ["50%-sample.tfrecord", "a%20b.tfrecord", "sub/./c.tfrecord", "...x", "x..y"]
    manifest = loads(_document(*names), "gs://bucket/data/_manifest.json")
    assert [e.url for e in manifest.shards] == [f"gs://bucket/data/{n}" for n in names]


def _outside(path: str, home: str) -> bool:
    """True when a request path, decoded as often as it decodes and normalised, is not below
    ``home``."""
    previous = None
    while previous != path:
        previous, path = path, urllib.parse.unquote(path)
    path = posixpath.normpath(path.split("?", 1)[0].replace("\\", "/"))
    return not path.startswith(home.rstrip("/") + "/")


@pytest.mark.parametrize("name", [*ENCODED_ESCAPES[:11], "%2F{dir}/secret.tfrecord"])
@pytest.mark.parametrize("sidecar", [False, True], ids=["shard", "sidecar"])
def test_no_request_leaves_the_manifests_directory(
    http_server: RangeHTTPServer, http_dir: HttpDir, name: str, sidecar: bool
) -> None:
    """Over a real HTTP server (which decodes and resolves ``..``): a hostile manifest's
    names, shard or sidecar, are refused before any request outside its directory."""
    secret = _shard_bytes([b"secret"])
    http_dir.write("secret.tfrecord", secret)
    http_dir.write("set/secret.tfrecord", secret)  # (so that "sub/../../" reaches a file)
    home = urllib_path(http_dir.url) + "/set"
    name = name.replace("{dir}", urllib_path(http_dir.url).lstrip("/"))
    good = _shard_bytes([b"good"])
    http_dir.write("set/part-0.tfrecord", good)
    shard = {"index": 0, "name": name, "records": 1, "bytes": len(secret), "crc32c": 0}
    if sidecar:
        shard.update(name="part-0.tfrecord", bytes=len(good))
        shard["record_index"] = {"name": name, "bytes": 0}
    document = {"format": "streamrec.manifest.core", "version": 1, "shards": [shard]}
    http_dir.write("set/_manifest.json", json.dumps(document).encode())
    http_server.clear_requests()
    with pytest.raises(FormatError, match="not a name relative to the manifest"):
        list(
            streamrec.open_dataset(
                f"{http_dir.url}/set/_manifest.json", retry=FAST, verify_crc=False
            )
        )
    paths = [r.path for r in http_server.requests]
    assert paths and not [p for p in paths if _outside(p, home)], paths


def urllib_path(url: str) -> str:
    return urllib.parse.urlsplit(url).path
