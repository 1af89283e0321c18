"""Whether an index's records are the shard's (streamrec.format.index.check): length fields
checked from the stream's start, a compressed shard's restart points checked to be ones
(issue 29, B.8)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from streamrec.errors import IndexMismatchError
from streamrec.format.framing import RecordEncoder
from streamrec.format.index.check import CompressedCheck, check_lengths
from streamrec.format.index.core import IndexBuilder, ShardIndex

WBITS = {"gzip": 31, "zlib": 15}


def framed(payload: bytes) -> bytes:
    return RecordEncoder().encode_many([payload])


def plain_index(lengths: list[int]) -> ShardIndex:
    builder = IndexBuilder()
    builder.add_records(lengths)
    return builder.build()


def test_lengths_agree_with_the_shards_own_framing() -> None:
    payloads = [b"a" * 10, b"b" * 300, b"", b"c" * 7]
    shard = RecordEncoder().encode_many(payloads)
    index = plain_index([len(p) + 16 for p in payloads])
    check_lengths(shard, 0, index, 0, 4, "s")
    check_lengths(shard[26:], 26, index, 1, 4, "s")  # from a later verified boundary


def test_an_entry_cut_inside_a_payload_is_named() -> None:
    inner = framed(b"inside")
    shard = framed(b"x" * 5 + inner + b"y" * 20) + framed(b"z")
    index = plain_index([12 + 5, len(inner), 20 + 4, len(framed(b"z"))])
    with pytest.raises(IndexMismatchError, match="does not follow the shard's records") as caught:
        check_lengths(shard, 0, index, 0, 4, "s3://b/s.tfrecord")
    assert caught.value.offset == 0 and caught.value.record_index == 0
    assert f"a record of {len(shard) - len(framed(b'z'))} framed bytes" in str(caught.value)


def stream_shard(
    payloads: list[bytes], compression: str, every: int, level: int = 6
) -> tuple[bytes, ShardIndex]:
    """A compressed shard with a full flush before every ``every``-th record, and its
    extended index (as the writer makes them)."""
    deflate = zlib.compressobj(level, zlib.DEFLATED, WBITS[compression])
    out = bytearray()
    builder = IndexBuilder(extended=True)
    restart, stream = (0, 0), 0
    for k, payload in enumerate(payloads):
        if k and k % every == 0:
            out += deflate.flush(zlib.Z_FULL_FLUSH)
            restart = (len(out), stream)
        record = framed(payload)
        builder.add_records([len(record)], restart=restart)
        out += deflate.compress(record)
        stream += len(record)
    out += deflate.flush()
    return bytes(out), builder.build()


def run_check(stored: bytes, index: ShardIndex, compression: str, piece: int) -> None:
    check = CompressedCheck(
        url="s.gz", compression=compression, index=index, stored_size=len(stored)
    )
    for start in range(0, len(stored), piece):
        check.feed(stored[start : start + piece])
    check.close()


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
@pytest.mark.parametrize("piece", [1, 7, 4096, 1 << 22])
def test_an_honest_compressed_index_passes(compression: str, piece: int) -> None:
    rng = np.random.default_rng(3)
    payloads = [rng.bytes(int(n)) for n in rng.integers(0, 3000, 60)]
    stored, index = stream_shard(payloads, compression, every=7)
    run_check(stored, index, compression, piece)


def test_a_restart_point_moved_to_another_flush_point_is_refused() -> None:
    payloads = [bytes([k]) * 500 for k in range(30)]
    stored, index = stream_shard(payloads, "gzip", every=5)
    assert index.restarts is not None and index.skips is not None
    restarts = index.restarts.copy()
    points = sorted(set(restarts.tolist()))
    restarts[restarts == points[2]] = points[3]  # run 2's records "restart" at run 3's point
    moved = ShardIndex(index.offsets, index.lengths, restarts, index.skips)
    with pytest.raises(IndexMismatchError):
        run_check(stored, moved, "gzip", 1000)


def test_a_restart_point_into_a_stored_payload_is_refused() -> None:
    smuggled = framed(b"not this shard's")
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    embedded = deflate.compress(smuggled) + deflate.flush()
    record = framed(b"a" * 50 + embedded + b"b" * 50)
    gzip = zlib.compressobj(0, zlib.DEFLATED, 31)
    stored = gzip.compress(record) + gzip.flush()
    restart = stored.index(embedded)
    index = ShardIndex(
        np.array([0, len(record)]),
        np.array([len(record), len(smuggled)]),
        np.array([0, restart]),
        np.array([0, 0]),
    )
    with pytest.raises(IndexMismatchError) as caught:
        run_check(stored, index, "gzip", 64)
    assert caught.value.url == "s.gz"


def test_a_stream_longer_than_the_index_is_refused() -> None:
    payloads = [b"x" * 100] * 4
    stored, index = stream_shard(payloads, "zlib", every=2)
    short = ShardIndex(index.offsets[:3], index.lengths[:3], index.restarts[:3], index.skips[:3])  # type: ignore[index]
    with pytest.raises(IndexMismatchError, match="stream has 464 bytes"):
        run_check(stored, short, "zlib", 100)
