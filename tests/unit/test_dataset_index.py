"""The dataset index format (streamrec.format.index.dataset): round trips and hostile bytes."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from streamrec.errors import FormatError, IndexMismatchError
from streamrec.format.crc import crc32c
from streamrec.format.encoder import ShardEncoder
from streamrec.format.index.core import ShardIndex
from streamrec.format.index.dataset import (
    MAGIC,
    DatasetIndex,
    encode_shard,
)
from streamrec.format.index.dataset import dataset_index_bytes as _encoded_bytes
from streamrec.pipeline.listing.dataset_index import MARK_RECORDS, MappedIndexes, _Where


def dataset_index_bytes(
    entries: list[tuple[str, int, str | None, str | None, ShardIndex]],
) -> bytes:
    return _encoded_bytes(
        [
            encode_shard(name, size, version, codec, index)
            for name, size, version, codec, index in entries
        ]
    )


_HEADER = struct.Struct("<8sIIQQQQII")
_ROW = struct.Struct("<QIIQQQQQIIBBB5x")


def _shard(compression: str | None, count: int, seed: int) -> tuple[bytes, ShardIndex]:
    rng = random.Random(seed)
    encoder = ShardEncoder(compression, index=True, restart_bytes=2048)
    data = encoder.encode([rng.randbytes(rng.randint(0, 600)) for _ in range(count)])
    data += encoder.finish()
    index = encoder.shard_index
    assert index is not None
    return data, index


def _entries() -> list[tuple[str, int, str | None, str | None, ShardIndex]]:
    entries = []
    shapes = [(None, 120), ("gzip", 300), ("zlib", 0), (None, 0), ("gzip", 7), ("zlib", 40)]
    for k, (compression, count) in enumerate(shapes):
        data, index = _shard(compression, count, k)
        entries.append(
            (f"part-{k}.tfrecord", len(data), f'"etag{k}"' if k % 2 else None, compression, index)
        )
    return entries


def _same(a: ShardIndex, b: ShardIndex) -> None:
    for column in ("offsets", "lengths", "restarts", "skips"):
        x, y = getattr(a, column), getattr(b, column)
        assert (x is None) == (y is None), column
        if x is not None:
            assert np.array_equal(x, y), column
    assert a.counts_only == b.counts_only


def test_round_trip_every_kind_of_shard() -> None:
    entries = _entries()
    index = DatasetIndex(dataset_index_bytes(entries), source="mem")
    assert index.records == sum(len(e[4]) for e in entries)
    for k, (name, size, version, compression, shard_index) in enumerate(entries):
        shard = index.shards[k]
        assert (shard.name, shard.size, shard.version, shard.compression) == (
            name,
            size,
            version,
            compression,
        )
        assert shard.records == len(shard_index)
        _same(index.shard_index(k), shard_index)


def test_counts_only_compressed_index_stays_counts_only() -> None:
    data, full = _shard("gzip", 50, 1)
    counts = ShardIndex(full.offsets, full.lengths, counts_only=True)
    index = DatasetIndex(dataset_index_bytes([("a", len(data), None, "gzip", counts)]), source="m")
    assert not index.shards[0].random_access
    assert index.shard_index(0).counts_only


def test_lengths_pack_into_the_narrowest_width() -> None:
    small = [("s", 16 * 1000, None, None, _plain([16] * 1000))]
    wide = [("w", 16 + 70000, None, None, _plain([16 + 70000]))]
    assert len(dataset_index_bytes(small)) < 56 + 72 + 1 + 1000 + 1  # one byte a record
    assert DatasetIndex(dataset_index_bytes(wide), source="m").shard_index(0).lengths[0] == 70016


def _plain(lengths: list[int]) -> ShardIndex:
    array = np.asarray(lengths, dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(array)[:-1])).astype(np.int64)
    return ShardIndex(offsets, array)


def _patched(data: bytes, row: int, **fields: int) -> bytes:
    """``data`` with shard ``row``'s fields replaced, every CRC made right again (a hostile
    writer, not damage)."""
    names = [
        "name_at",
        "name_bytes",
        "version_bytes",
        "size",
        "records",
        "stream_bytes",
        "segment_at",
        "segment_bytes",
        "segment_crc",
        "points",
        "codec",
        "width",
        "kind",
    ]
    header = list(_HEADER.unpack_from(data))
    at = _HEADER.size + row * _ROW.size
    values = dict(zip(names, _ROW.unpack_from(data, at), strict=True))
    values.update(fields)
    buffer = bytearray(data)
    _ROW.pack_into(buffer, at, *values.values())
    table_end = _HEADER.size + header[3] * _ROW.size + header[5]
    header[7] = crc32c(bytes(buffer[_HEADER.size : table_end]))
    head = _HEADER.pack(*header)[:-4]
    buffer[: _HEADER.size] = head + struct.pack("<I", crc32c(head))
    return bytes(buffer)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"records": 10**6}, "records"),
        ({"stream_bytes": 10**12}, "stream bytes"),
        ({"codec": 7}, "unknown codec"),
        ({"width": 3}, "width"),
        ({"kind": 2}, "kind"),
        ({"segment_bytes": 5}, "segment"),
        ({"segment_at": 3}, "segment"),
        ({"name_bytes": 0}, "name"),
        ({"name_at": 10**9}, "name"),
        ({"size": 1}, "bytes"),
    ],
)
def test_hostile_rows_are_refused_at_open(fields: dict[str, int], problem: str) -> None:
    data = dataset_index_bytes(_entries()[:1])
    with pytest.raises(FormatError, match=problem) as caught:
        DatasetIndex(_patched(data, 0, **fields), source="s3://b/_dataset_index.bin")
    assert "s3://b/_dataset_index.bin" in str(caught.value)
    assert "byte 56" in str(caught.value)


def test_damage_is_refused_by_its_crc() -> None:
    data = dataset_index_bytes(_entries())
    for at, problem in [(3, "dataset index"), (20, "header's CRC"), (60, "shard table's CRC")]:
        damaged = bytearray(data)
        damaged[at] ^= 0x40
        with pytest.raises(FormatError, match=problem):
            DatasetIndex(bytes(damaged), source="x")
    damaged = bytearray(data)
    damaged[-1] ^= 1  # in the last shard's segment: found when that shard is decoded
    index = DatasetIndex(bytes(damaged), source="x")
    index.shard_index(0)
    with pytest.raises(FormatError, match="segment's CRC"):
        index.shard_index(len(index.shards) - 1)


def test_size_must_be_exactly_what_the_header_says() -> None:
    data = dataset_index_bytes(_entries())
    for wrong in (data[:-1], data + b"\0", data[:40]):
        with pytest.raises(FormatError, match="bytes"):
            DatasetIndex(wrong, source="x")


def test_a_newer_version_asks_for_an_upgrade() -> None:
    data = bytearray(dataset_index_bytes(_entries()))
    struct.pack_into("<I", data, 8, 2)
    head = bytes(data[:52])
    data[52:56] = struct.pack("<I", crc32c(head))
    with pytest.raises(FormatError, match=r"version 2.*upgrade"):
        DatasetIndex(bytes(data), source="x")
    assert data[:8] == MAGIC


def test_hostile_segment_with_a_right_crc_is_refused_when_decoded() -> None:
    """Lengths that add up to the size but no record of 16 bytes can be: the entries are
    checked as a sidecar's lines are."""
    index = _plain([20, 40, 60])
    data = bytearray(dataset_index_bytes([("a", 120, None, None, index)]))
    segment_at = len(data) - 3
    data[segment_at : segment_at + 3] = bytes([4, 24, 44 + 0])  # 20, 40, 60 unchanged
    assert DatasetIndex(bytes(data), source="x").shard_index(0).lengths.tolist() == [20, 40, 60]
    data[segment_at : segment_at + 3] = bytes([4, 0, 68])  # 20, 16, 84: still 120
    data = bytearray(_patched(bytes(data), 0, segment_crc=crc32c(bytes(data[segment_at:]))))
    assert DatasetIndex(bytes(data), source="x").shard_index(0).lengths.tolist() == [20, 16, 84]
    data[segment_at : segment_at + 3] = bytes([4, 24, 60])  # ends at 136, not 120
    data = bytearray(_patched(bytes(data), 0, segment_crc=crc32c(bytes(data[segment_at:]))))
    with pytest.raises(FormatError, match="120"):
        DatasetIndex(bytes(data), source="x").shard_index(0)


def test_records_must_sum_to_the_header() -> None:
    data = bytearray(dataset_index_bytes(_entries()))
    header = list(_HEADER.unpack_from(data))
    header[4] += 1
    head = _HEADER.pack(*header)[:-4]
    data[:56] = head + struct.pack("<I", crc32c(head))
    with pytest.raises(FormatError, match="records"):
        DatasetIndex(bytes(data), source="x")


def test_a_length_past_the_int64_range_is_refused_not_wrapped() -> None:
    """Eight-byte lengths whose int64 cast would wrap negative and still sum to the size."""
    index = _plain([16 + 2**40, 16])
    data = bytearray(dataset_index_bytes([("a", 2**40 + 32, None, None, index)]))
    segment_at = len(data) - 16
    data[segment_at:] = (2**64 - 16).to_bytes(8, "little") + (2**40 + 16).to_bytes(8, "little")
    data = bytearray(_patched(bytes(data), 0, segment_crc=crc32c(bytes(data[segment_at:]))))
    with pytest.raises(FormatError, match="more than its"):
        DatasetIndex(bytes(data), source="x").shard_index(0)


def test_a_ranges_entries_are_its_decoded_index_s_and_checked_first() -> None:
    """MappedIndexes.entries(k, low, high), what indexed reads hold across their awaits (issue
    31): shard k's offsets and lengths low .. high-1, equal to its decoded index's, decoded
    alone (no shard's whole index kept); a hostile segment is refused on first use."""
    entries = _entries()
    rng = random.Random(3)
    for count in (2 * MARK_RECORDS, 2 * MARK_RECORDS + 5):  # offsets summed from marks
        index = _plain([rng.randint(16, 300) for _ in range(count)])
        size = int(index.offsets[-1] + index.lengths[-1])
        entries.append((f"large-{count}.tfrecord", size, None, None, index))
    data = dataset_index_bytes(entries)
    rows = list(range(len(entries)))
    mapped = MappedIndexes(
        _Where("mem", data=data), DatasetIndex(data, source="mem"), rows, [e[0] for e in entries]
    )
    for k, (*_, shard_index) in enumerate(entries):
        n = len(shard_index)
        marks = [(m, m + 1) for m in (MARK_RECORDS - 1, MARK_RECORDS, 2 * MARK_RECORDS) if m < n]
        ranges = [(0, n), (0, 0), (n, n), *marks] + [
            tuple(sorted(rng.sample(range(n + 1), 2))) for _ in range(20) if n
        ]
        for low, high in ranges:
            offsets, lengths = mapped.entries(k, low, high)
            assert offsets.dtype == lengths.dtype == np.int64
            assert offsets.tolist() == shard_index.offsets[low:high].tolist(), (k, low, high)
            assert lengths.tolist() == shard_index.lengths[low:high].tolist(), (k, low, high)
    assert not mapped._kept
    index = _plain([20, 40, 60])
    hostile = bytearray(dataset_index_bytes([("a", 120, None, None, index)]))
    hostile[-3:] = bytes([4, 0, 68])  # 20, 16, 84: its segment's CRC no longer matches
    mapped = MappedIndexes(
        _Where("x", data=bytes(hostile)), DatasetIndex(bytes(hostile), source="x"), [0], ["a"]
    )
    with pytest.raises(IndexMismatchError, match="CRC"):
        mapped.entries(0, 1, 2)
