"""Random access into a shard by its index: SpanDecoder decodes exactly the span's records,
CRC-checked, from a restart point of a compressed stream or an offset of an uncompressed one,
and refuses an index that does not match the shard."""

from __future__ import annotations

import random
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrec.errors import FormatError, IndexMismatchError
from streamrec.format.framing import RecordEncoder
from streamrec.format.index.core import IndexBuilder, ShardIndex
from streamrec.format.span import SpanDecoder

WBITS = {"gzip": 31, "zlib": 15}


def compressed_shard(
    payloads: list[bytes], compression: str, restart_every: int
) -> tuple[bytes, ShardIndex]:
    """A one-stream shard with a full flush (restart point) about every ``restart_every``
    framed bytes, and its extended index."""
    framing = RecordEncoder()
    deflate = zlib.compressobj(6, zlib.DEFLATED, WBITS[compression], 9)
    out = bytearray(deflate.compress(b""))
    builder = IndexBuilder(extended=True)
    restart = (0, 0)
    stream = since = 0
    for payload in payloads:
        framed = framing.encode(payload)
        if since >= restart_every:
            out += deflate.flush(zlib.Z_FULL_FLUSH)
            restart, since = (len(out), stream), 0
        builder.add_records([len(framed)], restart=restart)
        out += deflate.compress(framed)
        stream += len(framed)
        since += len(framed)
    out += deflate.flush()
    return bytes(out), builder.build()


def read_span(
    shard: bytes, index: ShardIndex, first: int, last: int, compression: str | None, piece: int
) -> list[bytes]:
    """Records first..last (inclusive) through a SpanDecoder fed in pieces."""
    lengths = index.lengths[first : last + 1].tolist()
    if compression is None:
        start = int(index.offsets[first])
        end = int(index.offsets[last] + index.lengths[last])
        decoder = SpanDecoder(url="x", compression=None, lengths=lengths, offset=start, index=first)
    else:
        assert index.restarts is not None and index.skips is not None
        start = int(index.restarts[first])
        later = index.restarts[index.restarts > index.restarts[last]]
        end = int(later[0]) if len(later) else len(shard)
        decoder = SpanDecoder(
            url="x",
            compression=compression,  # type: ignore[arg-type]
            lengths=lengths,
            offset=int(index.offsets[first]),
            index=first,
            skip=int(index.skips[first]),
            at_stream_start=start == 0,
        )
    data = shard[start:end]
    for k in range(0, len(data), piece):
        decoder.feed(data[k : k + piece])
    return decoder.close()


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=60),
    compression=st.sampled_from([None, "gzip", "zlib"]),
    restart_every=st.integers(1, 8000),
    seed=st.integers(0, 1000),
    piece=st.sampled_from([1, 7, 4096, 1 << 20]),
)
def test_any_span_decodes_its_records(
    sizes: list[int], compression: str | None, restart_every: int, seed: int, piece: int
) -> None:
    rng = random.Random(seed)
    payloads = [rng.randbytes(n) for n in sizes]
    if compression is None:
        shard = RecordEncoder().encode_many(payloads)
        builder = IndexBuilder()
        builder.add_records(len(p) + 16 for p in payloads)
        index = builder.build()
    else:
        shard, index = compressed_shard(payloads, compression, restart_every)
        assert zlib.decompress(shard, WBITS[compression]) == RecordEncoder().encode_many(payloads)
    for _ in range(5):
        first = rng.randrange(len(payloads))
        last = rng.randrange(first, len(payloads))
        got = read_span(shard, index, first, last, compression, piece)
        assert got == payloads[first : last + 1]


def test_an_index_that_does_not_match_the_shard_is_a_format_error() -> None:
    payloads = [b"a" * 10, b"b" * 20, b"c" * 30]
    shard = RecordEncoder().encode_many(payloads)
    decoder = SpanDecoder(url="s3://b/x", compression=None, lengths=[26, 40], offset=0, index=0)
    with pytest.raises(FormatError, match="index does not match") as caught:
        decoder.feed(shard[:66])
    assert "s3://b/x" in str(caught.value)
    short = SpanDecoder(url="x", compression=None, lengths=[26, 36], offset=0, index=0)
    short.feed(shard[:30])
    with pytest.raises(FormatError, match="ends after 1 of its 2"):
        short.close()


def test_a_restart_point_that_is_not_one_is_a_compression_error() -> None:
    payloads = [bytes(range(256)) * 40 for _ in range(20)]
    shard, _ = compressed_shard(payloads, "gzip", 10_000)
    decoder = SpanDecoder(url="x", compression="gzip", lengths=[10256], offset=0, index=0, skip=0)
    with pytest.raises(FormatError):
        decoder.feed(shard[3:])  # not a full-flush point: raw deflate cannot start here
        decoder.close()


def test_a_span_never_inflates_more_than_its_records() -> None:
    # a huge run of zeros after the wanted record: the decoder stops at what the index needs
    payloads = [b"x" * 100, bytes(50_000_000)]
    shard, _ = compressed_shard(payloads, "zlib", 1 << 30)
    decoder = SpanDecoder(
        url="x", compression="zlib", lengths=[116], offset=0, index=0, at_stream_start=True
    )
    decoder.feed(shard)
    assert decoder.close() == [b"x" * 100]


def test_a_claimed_length_is_not_inflated_in_one_call() -> None:
    """Issue 29, B.7: an index claiming one huge record over a gzip bomb of 1 MiB records
    (within 1032x: it passes the index's checks) is refused after a bounded piece, not
    after inflating all it claims."""
    import tracemalloc

    payloads = [bytes(1 << 20)] * 48
    shard, _ = compressed_shard(payloads, "gzip", restart_every=1 << 40)  # one restart point
    claimed = 48 * ((1 << 20) + 16)
    tracemalloc.start()
    try:
        decoder = SpanDecoder(
            url="bomb.gz",
            compression="gzip",
            lengths=[claimed],
            offset=0,
            index=0,
            at_stream_start=True,
        )
        with pytest.raises(IndexMismatchError, match="does not match"):
            decoder.feed(shard)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # a piece or two; inflating the claim took 48 MiB at once


def test_a_header_longer_than_the_index_says_is_refused_before_it_is_buffered() -> None:
    payloads = [bytes(4 << 20)]
    shard, _ = compressed_shard(payloads, "zlib", restart_every=1 << 40)
    decoder = SpanDecoder(
        url="x.zz", compression="zlib", lengths=[16, 16], offset=0, index=0, at_stream_start=True
    )
    with pytest.raises(IndexMismatchError, match="at most 16 framed bytes") as caught:
        decoder.feed(shard[:100])  # only the header has arrived
    assert caught.value.offset == 0
