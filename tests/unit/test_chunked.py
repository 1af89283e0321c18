"""streamrec.storage.http.chunked's decoder on its own: any chunking fed in any split decodes
exactly into pieces of ``piece_bytes``, says where the body ended, keeps to ``limit`` (too long,
or cut for an error body's start) and to its framing bounds."""

from __future__ import annotations

import random

import pytest

from streamrec.storage.http.chunked import (
    FRAMING_BYTES,
    ChunkedBody,
    ChunkError,
    ChunkTooLong,
)


def encode(chunks: list[bytes], ext: bytes = b"") -> bytes:
    lines = [b"%x%s\r\n%s\r\n" % (len(chunk), ext, chunk) for chunk in chunks]
    return b"".join(lines) + b"0\r\nX-T: 1\r\n\r\n"


def feed(body: ChunkedBody, stream: bytes, cuts: list[int]) -> int:
    """``stream`` fed in reads ending at ``cuts``: where the body ended in it (-1: not)."""
    start = 0
    for end in [*sorted(cuts), len(stream)]:
        ended = body.feed(bytearray(stream[start:end]), 0, end - start)
        if ended >= 0:
            return start + ended
        start = end
    return -1


@pytest.mark.parametrize("seed", range(30))
def test_any_chunking_in_any_split_decodes_exactly(seed: int) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(rng.randrange(0, 300))
    chunks, at = [], 0
    while at < len(data):
        size = rng.randrange(1, 40)
        chunks.append(data[at : at + size])
        at += size
    stream = encode(chunks, b";e=1" if seed % 2 else b"")
    cuts = rng.sample(range(len(stream)), min(len(stream), rng.randrange(0, 40)))
    body = ChunkedBody(len(data), cut=False, piece_bytes=7, trailer_bytes=100)
    assert feed(body, stream + b"NEXT", cuts) == len(stream)
    pieces = body.pieces()
    assert b"".join(pieces) == data
    assert all(len(piece) == 7 for piece in pieces[:-1]) and all(map(len, pieces))


@pytest.mark.parametrize(("limit", "ends_at"), [(0, 3), (10, 18), (12, 20), (19, 27), (20, -1)])
def test_a_cut_body_ends_at_its_limit(limit: int, ends_at: int) -> None:
    stream = encode([b"a" * 10, b"b" * 10])  # a CRLF, 10 bytes, CRLF; a CRLF, 10 bytes...
    body = ChunkedBody(limit, cut=True, piece_bytes=100, trailer_bytes=100)
    ended = feed(body, stream, [])
    if ends_at < 0:  # the whole body fits: its real end, not cut
        assert ended == len(stream) and not body.cut_short
    else:
        assert ended == ends_at and body.cut_short
    assert b"".join(body.pieces()) == (b"a" * 10 + b"b" * 10)[:limit]


def test_a_chunk_past_the_limit_is_too_long_at_its_size_line() -> None:
    body = ChunkedBody(10, cut=False, piece_bytes=100, trailer_bytes=100)
    with pytest.raises(ChunkTooLong):
        body.feed(bytearray(b"5\r\nhello\r\n6\r\n"), 0, 13)


def test_framing_is_bounded_whatever_the_chunks() -> None:
    limit = 1000  # 1-byte chunks with long extensions: framing runs out first
    stream = encode([b"x"] * limit, b";" + b"e" * 200)
    assert len(stream) > 2 * limit + FRAMING_BYTES
    body = ChunkedBody(limit, cut=False, piece_bytes=100, trailer_bytes=100)
    with pytest.raises(ChunkError, match="chunk framing of more than"):
        feed(body, stream, [])
