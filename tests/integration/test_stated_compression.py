"""A shard's codec as its manifest states it (``ObjectInfo.compression``): ``.tfrecord`` names
carry none, so without it every reader GETs each shard's first bytes to learn it.

The statement is untrusted: a shard whose bytes are not the codec its manifest states is a
CompressionError naming the shard, byte 0 and the statement, in every mode (never other
records); the ``compression`` a user passes still wins. Requests are counted at a proxy in
front of moto."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import streamrec
from integration.test_cli import cli
from streamrec.errors import CompressionError, FormatError, RandomAccessUnavailableError
from streamrec.format.codecs import compression_known
from streamrec.format.index.dataset import DATASET_INDEX_NAME
from streamrec.storage.base import ObjectInfo
from support.fault_proxy import FaultProxy
from support.servers import MotoS3Server

DATA = [b"record %04d " % k * 20 for k in range(120)]
FIRST_BYTES = "bytes=0-11"  # what a reader GETs to learn a shard's codec from its bytes


def write(base: str, codec: str | None, **options: Any) -> None:
    """``DATA`` in ``.tfrecord`` shards of 20 records (whatever the codec), with their index
    sidecars and the directory's ``_manifest.json``; no dataset index (the sidecars are what
    is read by index; ``indexed`` writes one as well)."""
    indexed(base, codec, **options)
    path = f"{base}/{DATASET_INDEX_NAME}"
    store = options.get("storage_options")
    if store is None:
        Path(path).unlink()
    else:  # (written through s3fs to moto)
        import s3fs

        s3fs.S3FileSystem(**store, skip_instance_cache=True).rm(path)


def indexed(base: str, codec: str | None, **options: Any) -> None:
    """:func:`write`'s set, with the dataset index."""
    with streamrec.sync.open_writer(
        f"{base}/part-{{index:03d}}.tfrecord",
        max_records=20,
        compression=codec,
        index=True,
        **options,
    ) as writer:
        writer.write_many(DATA)


def state(directory: Path, compression: object) -> None:
    """Make the directory's manifest state ``compression`` (whatever its shards are)."""
    path = directory / "_manifest.json"
    document = json.loads(path.read_text())
    document["compression"] = compression
    path.write_text(json.dumps(document))


def test_the_codec_known_without_reading_a_shard() -> None:
    assert ObjectInfo("s", 1).compression == "unknown"  # nothing stated: not "uncompressed"
    assert "compression='gzip'" in repr(ObjectInfo("s", 1, compression="gzip"))
    assert compression_known("auto", "a.tfrecord") == "unknown"
    assert compression_known("auto", "a.tfrecord", None) is None
    assert compression_known("auto", "a.tfrecord", "zlib") == "zlib"
    assert compression_known("auto", "a.tfrecord.gz", None) == "gzip"  # the name first
    assert compression_known(None, "a.tfrecord.gz", "zlib") is None  # the user's choice wins
    assert compression_known("ZLIB", "a.tfrecord", None) == "zlib"


@pytest.mark.parametrize("dataset_index", [False, True])
@pytest.mark.parametrize("codec", [None, "gzip"])
def test_a_manifest_directory_is_read_by_index_without_first_byte_reads(
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[..., FaultProxy],
    codec: str | None,
    dataset_index: bool,
) -> None:
    (indexed if dataset_index else write)(
        f"s3://{s3_bucket}/set", codec, storage_options=s3_server.storage_options
    )
    proxy = fault_proxy(s3_server.endpoint_url)
    options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    url = f"s3://{s3_bucket}/set/"
    ds = streamrec.open_dataset(url, storage_options=options)
    assert len(ds) == len(DATA)
    assert ds.get([119, 0, 57]) == [DATA[119], DATA[0], DATA[57]]
    shuffled = list(streamrec.open_dataset(url, storage_options=options, shuffle="global"))
    assert sorted(shuffled) == sorted(DATA) and shuffled != DATA
    firsts = [r.target for r in proxy.records if r.range == FIRST_BYTES]
    assert firsts == []  # 6 per table built before: the codec of each .tfrecord shard
    assert proxy.count("GET") > 0
    proxy.clear_records()
    # the codec as the manifest states it, and no first bytes read: `ls` and `index`
    ls = cli("ls", "--json", "--storage-options", json.dumps(options), url)
    assert ls.rc == 0, ls.err
    assert {shard["compression"] for shard in ls.json()["shards"]} == {codec or "none"}
    assert [r.target for r in proxy.records if r.range == FIRST_BYTES] == []


MODES: dict[str, Callable[[str], list[bytes]]] = {
    "sequential": lambda url: list(streamrec.open_dataset(url)),
    "global": lambda url: list(streamrec.open_dataset(url, shuffle="global")),
    "get": lambda url: streamrec.open_dataset(url).get(range(len(DATA))),
    "unverified": lambda url: list(streamrec.open_dataset(url, verify_crc=False)),
}
LIES = [("gzip", None), (None, "gzip"), ("zlib", "gzip"), ("gzip", "zlib"), (None, "zlib")]


@pytest.mark.parametrize(("codec", "stated"), LIES)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_manifest_that_misstates_the_codec_is_an_error_naming_it(
    tmp_path: Path, codec: str | None, stated: str | None, mode: str
) -> None:
    write(str(tmp_path), codec)
    state(tmp_path, stated)
    with pytest.raises(CompressionError) as raised:
        MODES[mode](str(tmp_path))
    error = raised.value
    assert error.offset == 0 and error.url is not None and error.url.endswith(".tfrecord")
    assert "its listing states it is stored" in str(error) and "manifest" in str(error)
    assert f"compression={codec!r} reads it regardless" in str(error)
    # the user's choice wins over the statement
    ds = streamrec.open_dataset(str(tmp_path), compression=codec)
    assert list(ds) == DATA and ds.get([5, 100]) == [DATA[5], DATA[100]]


def test_a_manifest_that_states_the_right_codec_reads_every_mode(tmp_path: Path) -> None:
    write(str(tmp_path), "zlib")
    for mode, read in MODES.items():
        assert sorted(read(str(tmp_path))) == sorted(DATA), mode


@pytest.mark.parametrize(("codec", "stated"), LIES)
def test_a_dataset_index_that_disagrees_with_the_manifest_is_not_used(
    tmp_path: Path, codec: str | None, stated: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    indexed(str(tmp_path), codec)  # its dataset index states the codec the shards have
    state(tmp_path, stated)
    with pytest.raises(CompressionError, match="its listing states it is stored"):
        streamrec.open_dataset(str(tmp_path)).get([0])
    assert "not using the dataset index" in caplog.text


@pytest.mark.parametrize("compression", ["brotli", "auto", 5, ["gzip"]])
def test_a_codec_this_version_does_not_know_is_refused(tmp_path: Path, compression: object) -> None:
    write(str(tmp_path), None)
    state(tmp_path, compression)
    with pytest.raises(FormatError, match='"compression"') as raised:
        list(streamrec.open_dataset(str(tmp_path)))
    assert str(tmp_path / "_manifest.json") in str(raised.value)


def test_sidecars_a_manifest_names_that_were_removed_or_rebuilt(tmp_path: Path) -> None:
    write(str(tmp_path), None)
    sidecar = tmp_path / "part-001.tfrecord.idx"
    sidecar.unlink()  # named by the manifest, read without a lookup: gone
    ds = streamrec.open_dataset(str(tmp_path))
    assert len(ds) == len(DATA)  # counts from the manifest
    with pytest.raises(RandomAccessUnavailableError, match="1 of 6 shards have none"):
        ds.get([0])
    run = cli("index", str(tmp_path))  # rebuilds the missing one
    assert run.rc == 0, run.err
    assert streamrec.open_dataset(str(tmp_path)).get([25, 0]) == [DATA[25], DATA[0]]
    # rebuilt in another size than the manifest names (here: padded with blank lines)
    sidecar.write_bytes(sidecar.read_bytes() + b"\n")
    assert streamrec.open_dataset(str(tmp_path)).get([39, 20]) == [DATA[39], DATA[20]]
