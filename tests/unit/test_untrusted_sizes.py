"""Sizes read from storage are untrusted: no buffering by a claimed length, no gzip bomb.

A record header's length is checked against what is known (the object's size; for compressed
data a maximum record size and deflate's best ratio) before a byte is buffered for it, and a
highly compressed shard is inflated a bounded piece at a time, whatever its ratio.
"""

from __future__ import annotations

import gzip
import struct
import tracemalloc
from pathlib import Path

import pytest

import streamrec
from streamrec.errors import FormatError, TruncatedRecordError
from streamrec.format.crc import masked_crc32c
from streamrec.format.shard import ShardDecoder, ShardEncoder


def header(length: int) -> bytes:
    """A record header claiming ``length`` bytes, with a valid length CRC."""
    packed = struct.pack("<Q", length)
    return packed + struct.pack("<I", masked_crc32c(packed))


def test_a_length_beyond_the_object_is_an_error_at_once(scanner: str) -> None:
    decoder = ShardDecoder(url="big.tfrecord", compression=None, size=512 << 20)
    with pytest.raises(TruncatedRecordError) as info:
        decoder.feed(header(1 << 40) + bytes(65536))  # was: [] and 64 KiB buffered
    assert decoder.framing.buffered_bytes == 0
    assert (info.value.offset, info.value.record_index, info.value.url) == (0, 0, "big.tfrecord")
    assert f"stream ends inside a payload ({(512 << 20) - 12} of {1 << 40} bytes)" in str(
        info.value
    )


def test_a_record_that_just_fits_is_read(scanner: str) -> None:
    payload = b"x" * 100
    stored = ShardEncoder(None).encode([payload])
    decoder = ShardDecoder(compression=None, size=len(stored))
    assert decoder.feed(stored[:50]) == []
    assert decoder.feed(stored[50:]) == [payload]
    assert decoder.close() == []


def test_skip_mode_drops_the_rest_after_an_impossible_length(scanner: str) -> None:
    first = ShardEncoder(None).encode([b"first"])
    decoder = ShardDecoder(compression=None, size=1 << 20, on_corrupt="skip")
    assert decoder.feed(first + header(1 << 40) + bytes(100)) == [b"first"]
    assert decoder.close() == []
    assert [type(e) for e in decoder.dropped] == [TruncatedRecordError]


def test_open_dataset_stops_at_a_huge_header_without_reading_the_object(tmp_path: Path) -> None:
    path = tmp_path / "huge.tfrecord"
    with path.open("wb") as f:
        f.write(header(1 << 40))
        f.truncate(512 << 20)  # sparse: 512 MiB that cost no disk
    ds = streamrec.open_dataset(str(path))
    with pytest.raises(TruncatedRecordError) as info:
        list(ds)
    assert info.value.offset == 0
    assert ds.stats.bytes_read <= 256 << 10  # the first block only (was all 512 MiB)


def test_compressed_length_over_the_maximum_is_an_error_at_once(scanner: str) -> None:
    stored = gzip.compress(header(1 << 40) + bytes(1 << 16))
    decoder = ShardDecoder(url="h.gz", compression="gzip")
    with pytest.raises(FormatError, match=f"claims a {1 << 40}-byte payload, more than the"):
        decoder.feed(stored)
    assert decoder.framing.buffered_bytes == 0
    small = ShardDecoder(compression="gzip", max_record_bytes=1000)
    with pytest.raises(FormatError, match="more than the 1000 bytes"):
        small.feed(gzip.compress(header(1001) + bytes(500)))


def test_compressed_length_beyond_deflates_best_ratio_is_an_error_at_once(scanner: str) -> None:
    # 100 MiB is under the 1 GiB maximum, but no 1032:1 deflate stream of this size holds it
    stored = gzip.compress(header(100 << 20) + bytes(1 << 16), compresslevel=9)
    decoder = ShardDecoder(compression="gzip", size=len(stored))
    with pytest.raises(FormatError, match=f"more than the {1032 * len(stored)} bytes"):
        decoder.feed(stored)
    assert decoder.framing.buffered_bytes == 0


def test_gzip_bomb_is_read_in_bounded_memory(tmp_path: Path) -> None:
    # 256 MiB of zero-filled 64 KiB records in ~300 KiB of gzip (~900:1), read with a 1 MiB
    # prefetch budget in 256 KiB blocks: held bytes must not grow with the ratio.
    encoder = ShardEncoder("gzip", level=9)
    records = [bytes(64 << 10)] * 64
    path = tmp_path / "bomb.tfrecord.gz"
    with path.open("wb") as f:
        for _ in range(64):
            f.write(encoder.encode(records))
        f.write(encoder.finish())
    del records
    prefetch, block = 1 << 20, 256 << 10
    ds = streamrec.open_dataset(str(path), prefetch_bytes=prefetch, block_bytes=block)
    count = 0
    tracemalloc.start()
    try:
        for record in ds:
            count += len(record) == 64 << 10
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 64 * 64
    assert peak < 4 * (prefetch + block)  # was ~450 MiB: the block inflated all at once
