"""Issue 31: one dataset index (``_dataset_index.bin``) instead of a sidecar per shard.

Written by the writer (``index=True``) and ``streamrec index``; read by ``len()``, ``get()``
and indexed epochs; fetched once per host through the shard cache; stale or hostile ones
never give a wrong record.
"""

from __future__ import annotations

import logging
import pickle
import random
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import streamrec
from streamrec.cli import main
from streamrec.errors import IndexMismatchError
from streamrec.format.crc import crc32c
from streamrec.format.framing import RecordEncoder
from streamrec.format.index.core import ShardIndex
from streamrec.format.index.dataset import (
    DATASET_INDEX_NAME,
    DatasetIndex,
    dataset_index_bytes,
    encode_shard,
)
from support.crc_forge import same_crc_lengths
from support.fault_proxy import FaultProxy
from support.servers import MotoS3Server

_ROW = struct.Struct("<QIIQQQQQIIBBB5x")
_HEADER_BYTES = 56


def payloads(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [b"%06d:" % k + rng.randbytes(rng.randint(0, 300)) for k in range(n)]


def write_set(
    base: str, data: list[bytes], compression: str | None = None, **options: object
) -> str:
    with streamrec.sync.open_writer(
        f"{base}/part-{{index:04d}}.tfrecord",
        max_records=37,
        compression=compression,
        index=True,
        **options,  # type: ignore[arg-type]
    ) as writer:
        writer.write_many(data)
    return base


def drop_sidecars(directory: Path) -> None:
    for sidecar in directory.glob("*.idx"):
        sidecar.unlink()


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_every_indexed_mode_reads_from_the_dataset_index_alone(
    tmp_path: Path, compression: str | None
) -> None:
    data = payloads(1500, seed=1)
    url = write_set(str(tmp_path), data, compression)
    drop_sidecars(tmp_path)
    (tmp_path / "_manifest.json").unlink()  # counts, codecs and entries: the dataset index's
    ds = streamrec.open_dataset(url, shuffle="global", seed=3)
    assert (len(ds), ds.num_records) == (1500, 1500)
    got = list(ds)
    assert got != data and sorted(got) == sorted(data)
    assert ds.get([0, 1499, 700, -1]) == [data[0], data[1499], data[700], data[-1]]
    block = streamrec.open_dataset(url, shuffle="block", seed=3, window_records=10)
    assert sorted(block) == sorted(data)
    parts = [
        list(streamrec.open_dataset(url, even="drop", num_hosts=3, host_index=k)) for k in range(3)
    ]
    assert sorted(r for part in parts for r in part) == sorted(data)
    assert {len(part) for part in parts} == {500}


def test_resume_reads_exactly_the_rest(tmp_path: Path) -> None:
    data = payloads(900, seed=2)
    url = write_set(str(tmp_path), data)
    drop_sidecars(tmp_path)
    ds = streamrec.open_dataset(url, shuffle="global", seed=9)
    it = iter(ds)
    head = [next(it) for _ in range(333)]
    state = ds.state_dict()
    it.close()
    again = streamrec.open_dataset(url, shuffle="global", seed=9)
    again.load_state_dict(state)
    rest = list(again)
    assert head + rest == list(streamrec.open_dataset(url, shuffle="global", seed=9))


def test_the_table_pickles_as_where_the_index_is(tmp_path: Path) -> None:
    data = payloads(300, seed=4)
    url = write_set(str(tmp_path), data)
    drop_sidecars(tmp_path)
    ds = streamrec.open_dataset(url)
    assert ds.get([5]) == [data[5]]
    blob = pickle.dumps(ds)
    assert len(blob) < 20_000  # where the index is, not its entries
    assert pickle.loads(blob).get([299, 0]) == [data[299], data[0]]


def test_a_stale_dataset_index_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = payloads(200, seed=5)
    url = write_set(str(tmp_path), data)
    stale = (tmp_path / DATASET_INDEX_NAME).read_bytes()
    shorter = [*data[:150], b"x" * 999, *data[151:]]
    write_set(str(tmp_path), shorter)  # rewritten: its own dataset index replaces the old one
    (tmp_path / DATASET_INDEX_NAME).write_bytes(stale)
    with caplog.at_level(logging.WARNING, logger="streamrec"):
        ds = streamrec.open_dataset(url, shuffle="global", seed=1)
        assert sorted(ds) == sorted(shorter)  # the sidecars are read instead
    assert "not using the dataset index" in caplog.text
    assert "part-0004.tfrecord" in caplog.text and "streamrec index --force" in caplog.text


def _hostile(data: bytes, shard: int, segment: bytes) -> bytes:
    """``data`` with shard ``shard``'s segment replaced (as long) and every CRC right."""
    index = DatasetIndex(data, source="x")
    count = len(index.shards)
    names_bytes = struct.unpack_from("<Q", data, 32)[0]
    segments_at = _HEADER_BYTES + count * _ROW.size + names_bytes
    row = list(_ROW.unpack_from(data, _HEADER_BYTES + shard * _ROW.size))
    start = segments_at + row[6]
    assert len(segment) == row[7]
    buffer = bytearray(data)
    buffer[start : start + len(segment)] = segment
    row[8] = crc32c(segment)
    _ROW.pack_into(buffer, _HEADER_BYTES + shard * _ROW.size, *row)
    struct.pack_into("<I", buffer, 48, crc32c(bytes(buffer[_HEADER_BYTES:segments_at])))
    struct.pack_into("<I", buffer, 52, crc32c(bytes(buffer[:52])))
    return bytes(buffer)


def test_hostile_entries_that_add_up_are_caught_by_the_shard_itself(tmp_path: Path) -> None:
    """Lengths that sum to the shard's size but cut it elsewhere: the first record read from
    a boundary the shard does not have is an IndexMismatchError, never a wrong record."""
    data = payloads(74, seed=6)
    url = write_set(str(tmp_path), data)
    drop_sidecars(tmp_path)
    path = tmp_path / DATASET_INDEX_NAME
    original = path.read_bytes()
    index = DatasetIndex(original, source="x")
    lengths = index.lengths(1).astype(int).tolist()
    width = index.lengths(1).dtype.itemsize
    lengths[3] += 5  # record 3 five bytes longer, record 4 five shorter: same sum
    lengths[4] -= 5
    segment = b"".join(n.to_bytes(width, "little") for n in lengths)
    path.write_bytes(_hostile(original, 1, segment))
    ds = streamrec.open_dataset(url)
    assert ds.get([0, 37, 38, 39]) == [data[0], data[37], data[38], data[39]]
    with pytest.raises(IndexMismatchError) as caught:
        ds.get([37 + 5])
    assert caught.value.url == str(tmp_path / "part-0001.tfrecord")


def test_damage_in_a_segment_names_the_shard_and_the_object(tmp_path: Path) -> None:
    data = payloads(74, seed=7)
    url = write_set(str(tmp_path), data)
    drop_sidecars(tmp_path)
    path = tmp_path / DATASET_INDEX_NAME
    damaged = bytearray(path.read_bytes())
    damaged[-3] ^= 0x10  # in the last shard's segment
    path.write_bytes(bytes(damaged))
    ds = streamrec.open_dataset(url)
    assert ds.get([0]) == [data[0]]  # the first shard's segment is fine
    with pytest.raises(IndexMismatchError, match="segment's CRC") as caught:
        ds.get([73])
    assert caught.value.url == str(tmp_path / "part-0001.tfrecord")
    assert DATASET_INDEX_NAME in str(caught.value)


def test_a_manifest_count_that_disagrees_with_the_dataset_index(tmp_path: Path) -> None:
    data = payloads(74, seed=8)
    url = write_set(str(tmp_path), data)
    path = tmp_path / DATASET_INDEX_NAME
    original = path.read_bytes()
    index = DatasetIndex(original, source="x")
    lengths = index.lengths(0).astype(int).tolist()
    # two records as one: a count that differs from the manifest's, the same size
    merged = [*lengths[:2], lengths[2] + lengths[3] + 16, *lengths[4:]]
    framed = np.asarray(merged, dtype=np.int64) + 16
    offsets = np.concatenate(([0], np.cumsum(framed)[:-1])).astype(np.int64)
    shards = [
        encode_shard(s.name, s.size, s.version, s.compression, ShardIndex(offsets, framed))
        if k == 0
        else encode_shard(s.name, s.size, s.version, s.compression, index.shard_index(k))
        for k, s in enumerate(index.shards)
    ]
    path.write_bytes(dataset_index_bytes(shards))
    drop_sidecars(tmp_path)
    with pytest.raises(IndexMismatchError, match="manifest says 37 records, the dataset index"):
        streamrec.open_dataset(url).get([0])


def test_streamrec_index_builds_it_for_an_existing_corpus(tmp_path: Path) -> None:
    data = payloads(400, seed=9)
    with streamrec.sync.open_writer(f"{tmp_path}/s-{{index:03d}}.tfrecord", max_records=50) as w:
        w.write_many(data)  # no index at all
    assert not (tmp_path / DATASET_INDEX_NAME).exists()
    assert main(["index", str(tmp_path), "--json"]) == 0
    drop_sidecars(tmp_path)
    ds = streamrec.open_dataset(str(tmp_path), shuffle="global", seed=2)
    assert sorted(ds) == sorted(data)
    assert main(["index", str(tmp_path), "--json", "--no-dataset-index", "--force"]) == 0


# ---------------------------------------------------------------- S3: once per host


def test_remote_dataset_index_is_fetched_once_per_host(
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[[str], FaultProxy],
    tmp_path: Path,
) -> None:
    """Four consumers of one host, one cache directory: each looks the dataset index up (one
    request: its version), one downloads it, and every one maps that copy; no sidecar is
    read, no shard's first bytes (the codec is in the index)."""
    data = [b"%06d" % k for k in range(300_000)]  # an index larger than a lookup reads
    base = f"s3://{s3_bucket}/set"
    with streamrec.sync.open_writer(
        f"{base}/part-{{index:04d}}.tfrecord",
        max_records=30_000,
        index=True,
        storage_options=s3_server.storage_options,
    ) as writer:
        writer.write_many(data)
    for k in range(10):  # every shard's sidecar gone: the dataset index alone
        s3_server.delete(s3_bucket, f"set/part-{k:04d}.tfrecord.idx")
    s3_server.delete(s3_bucket, "set/_manifest.json")
    proxy = fault_proxy(s3_server.endpoint_url)
    options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    cache = {"cache_dir": str(tmp_path / "cache"), "cache_bytes": 1 << 30}
    for consumer in range(4):
        ds = streamrec.open_dataset(base, storage_options=options, **cache)
        wanted = [consumer * 70_001 + k for k in (0, 3, 29_999)]
        assert ds.get(wanted) == [data[k] for k in wanted]
    index_gets = [
        r.range for r in proxy.records if r.method == "GET" and DATASET_INDEX_NAME in r.target
    ]
    size = len(s3_server.get(s3_bucket, f"set/{DATASET_INDEX_NAME}"))
    assert size > 262_144
    lookups = [r for r in index_gets if r == "bytes=0-262143"]
    assert len(lookups) == 4  # one lookup each
    assert index_gets.count(f"bytes=262144-{size - 1}") == 1  # the rest downloaded once
    assert len(index_gets) == 5
    shard_heads = [r for r in proxy.records if r.range == "bytes=0-11"]
    assert not [r for r in proxy.records if ".idx" in r.target] and not shard_heads


def test_later_epochs_and_get_reuse_the_table(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Callable[[str], FaultProxy]
) -> None:
    """An epoch's table serves the next epochs and get(): nothing listed, no index read."""
    data = payloads(300, seed=11)
    base = f"s3://{s3_bucket}/epochs"
    write_set(base, data, storage_options=s3_server.storage_options)
    proxy = fault_proxy(s3_server.endpoint_url)
    options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    ds = streamrec.open_dataset(base, storage_options=options, shuffle="global", seed=1)
    first = list(ds)
    assert sorted(first) == sorted(data)
    assert any(DATASET_INDEX_NAME in r.target for r in proxy.records)
    proxy.clear_records()
    ds.set_epoch(1)
    second = list(ds)
    assert sorted(second) == sorted(data) and second != first
    assert ds.get([7]) == [data[7]] and len(ds) == 300
    assert not [r for r in proxy.records if "_manifest" in r.target or "list-type" in r.target]
    assert not [r for r in proxy.records if DATASET_INDEX_NAME in r.target]


def test_a_worker_copy_reads_without_listing_what_len_listed(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Callable[[str], FaultProxy]
) -> None:
    """A DataLoader worker gets the dataset pickled after ``len()``: its epoch lists nothing
    (the shards come with the copy); it reads the dataset index only."""
    data = payloads(200, seed=12)
    base = f"s3://{s3_bucket}/workers"
    write_set(base, data, storage_options=s3_server.storage_options)
    proxy = fault_proxy(s3_server.endpoint_url)
    options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    ds = streamrec.open_dataset(base, storage_options=options, shuffle="global", seed=2)
    assert len(ds) == 200
    proxy.clear_records()
    worker = pickle.loads(pickle.dumps(ds))
    assert sorted(worker) == sorted(data)
    assert not [r for r in proxy.records if "_manifest" in r.target or "list-type" in r.target]


def test_a_forged_index_with_the_checked_ones_crc_is_checked_again(
    s3_server: MotoS3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """A process checks shard 0 against the dataset index and the host records it. Then the
    index is replaced by one that cuts record 3 so that a frame inside its payload becomes
    record 4, its segment's CRC-32C kept (solved for): the record must not be believed as
    checked (its key is a cryptographic digest of the entries, not their CRC)."""
    evil = RecordEncoder().encode(b"EVIL")
    data = [b"%06d:" % k + b"x" * (50 + (k * 7919) % 200) for k in range(800)]
    data[3] = b"AAAA" + evil + b"ZZZZ"  # user content that holds a valid frame
    base = f"s3://{s3_bucket}/set"
    options = s3_server.storage_options
    with streamrec.sync.open_writer(
        f"{base}/part-{{index:04d}}.tfrecord", max_records=400, index=True, storage_options=options
    ) as writer:
        writer.write_many(data)
    cache = {"cache_dir": str(tmp_path / "cache"), "cache_bytes": 1 << 30}
    first = streamrec.open_dataset(base, storage_options=options, **cache)
    assert first.get([399]) == [data[399]] and first.stats.bytes_checked > 0
    first.close()

    original = s3_server.get(s3_bucket, f"set/{DATASET_INDEX_NAME}")
    index = DatasetIndex(original, source="x")
    width = index.lengths(0).dtype.itemsize
    lengths = index.lengths(0).astype(np.int64).tolist()
    stored = crc32c(bytes(index.lengths(0).tobytes()))
    lengths[3], lengths[4] = 0, len(evil) - 16  # record 4: the frame inside record 3
    lengths[5] += (len(data[3]) + 16) + (len(data[4]) + 16) - 16 - len(evil)
    forged = same_crc_lengths(lengths, width, stored, range(20, 400))
    segment = b"".join(int(n).to_bytes(width, "little") for n in forged)
    names = struct.unpack_from("<Q", original, 32)[0]
    row = _ROW.unpack_from(original, _HEADER_BYTES)
    at = _HEADER_BYTES + len(index.shards) * _ROW.size + names + row[6]
    hostile = original[:at] + segment + original[at + len(segment) :]
    s3_server.put(s3_bucket, f"set/{DATASET_INDEX_NAME}", hostile)

    second = streamrec.open_dataset(base, storage_options=options, **cache)
    with pytest.raises(IndexMismatchError):
        second.get([4])
    second.close()
