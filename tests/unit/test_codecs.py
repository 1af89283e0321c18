"""Streaming gzip / zlib codecs and compression detection."""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import pytest

import streamrec
from streamrec.errors import CompressionError, FormatError
from streamrec.format.codecs import (
    compression_from_name,
    make_decompressor,
    normalize_compression,
    resolve_compression,
    sniff,
)
from streamrec.format.framing import RecordEncoder
from streamrec.format.shard import ShardDecoder, ShardEncoder


@pytest.mark.parametrize(
    ("name", "codec"),
    [
        ("a.tfrecord.gz", "gzip"),
        ("A.TFRECORD.GZIP", "gzip"),
        ("a.tfrecord.zlib", "zlib"),
        ("a.zz", "zlib"),
        ("a.tfrecord", "unknown"),
        ("gs://b/data.gz.tfrecord", "unknown"),
    ],
)
def test_compression_from_name(name: str, codec: str) -> None:
    assert compression_from_name(name) == codec


def test_normalize_accepts_tensorflow_spellings() -> None:
    assert normalize_compression("GZIP") == "gzip"
    assert normalize_compression("ZLIB") == "zlib"
    assert normalize_compression("") is None
    assert normalize_compression(None) is None
    assert normalize_compression("Auto") == "auto"
    with pytest.raises(ValueError, match="unknown compression 'lz4'"):
        normalize_compression("lz4")


def test_sniff_prefers_a_valid_tfrecord_header_over_look_alike_magic() -> None:
    # A record of 0x9c78 bytes starts with 78 9c, which is also a zlib header.
    plain = RecordEncoder().encode(b"\0" * 0x9C78)
    assert plain[:2] == b"\x78\x9c"
    assert sniff(plain[:12]) is None
    assert sniff(zlib.compress(plain)[:12]) == "zlib"
    assert sniff(gzip.compress(plain)[:12]) == "gzip"
    assert sniff(b"") is None


def test_explicit_compression_overrides_name_and_bytes() -> None:
    assert resolve_compression(None, "x.gz", b"\x1f\x8b") is None
    assert resolve_compression("zlib", "x.gz", b"") == "zlib"
    assert resolve_compression("auto", "x.gz", b"") == "gzip"
    assert resolve_compression("auto", "x", zlib.compress(b"abc")) == "zlib"


def test_auto_detects_compressed_files_without_suffix(tmp_path: Path) -> None:
    payloads = [b"p%d" % i for i in range(100)]
    for codec in ("gzip", "zlib"):
        encoder = ShardEncoder(codec)
        (tmp_path / f"{codec}.tfrecord").write_bytes(encoder.encode(payloads) + encoder.finish())
        assert list(streamrec.open_dataset(str(tmp_path / f"{codec}.tfrecord"))) == payloads


def test_concatenated_gzip_members_are_all_read() -> None:
    a = RecordEncoder().encode_many([b"one", b"two"])
    b = RecordEncoder().encode_many([b"three"])
    stored = gzip.compress(a) + gzip.compress(b)
    decoder = ShardDecoder(compression="gzip")
    records = []
    for i in range(len(stored)):  # byte by byte: member boundaries fall anywhere
        records += decoder.feed(stored[i : i + 1])
    records += decoder.close()
    assert records == [b"one", b"two", b"three"]


def test_trailing_garbage_after_gzip_member_is_an_error_after_the_records() -> None:
    stored = gzip.compress(RecordEncoder().encode_many([b"one", b"two"])) + b"garbage!"
    decoder = ShardDecoder(url="g.gz", compression="gzip")
    assert decoder.feed(stored) == [b"one", b"two"]
    with pytest.raises(CompressionError, match=r"g\.gz"):
        decoder.raise_pending()
        decoder.close()


def test_trailing_bytes_after_zlib_stream_are_an_error() -> None:
    stored = zlib.compress(RecordEncoder().encode(b"x"))
    decoder = ShardDecoder(url="z", compression="zlib")
    assert decoder.feed(stored) == [b"x"]
    with pytest.raises(CompressionError, match="trailing bytes after the zlib stream"):
        decoder.feed(b"\x00")


def test_gzip_stream_that_fails_to_inflate_raises_after_good_records() -> None:
    framed = RecordEncoder().encode_many([b"r%d" % i for i in range(1000)])
    stored = bytearray(gzip.compress(framed, compresslevel=1))
    stored[len(stored) // 2] ^= 0xFF
    decoder = ShardDecoder(url="bad.gz")
    good: list[bytes] = []
    with pytest.raises(FormatError) as info:
        for i in range(0, len(stored), 64):
            good += decoder.feed(bytes(stored[i : i + 64]))
            decoder.raise_pending()
        good += decoder.close()
        decoder.raise_pending()
    assert good == [b"r%d" % i for i in range(len(good))]
    assert "bad.gz" in str(info.value)


def test_damage_in_a_later_gzip_member_is_located_to_the_byte() -> None:
    first = gzip.compress(RecordEncoder().encode_many([b"one", b"two"]))
    second = bytearray(gzip.compress(RecordEncoder().encode(b"three")))
    second[0] ^= 0xFF  # the second member's magic: zlib checks it once both bytes are in
    decoder = ShardDecoder(url="m.gz")
    assert decoder.feed(first + bytes(second)) == [b"one", b"two"]
    with pytest.raises(CompressionError) as info:
        decoder.raise_pending()
    assert info.value.record_index == 2
    assert info.value.offset == 38
    assert "incorrect header check" in str(info.value)
    assert f"(at compressed byte {len(first) + 1}, after 38 uncompressed bytes)" in str(info.value)


def test_inflate_output_comes_in_bounded_pieces() -> None:
    bomb = zlib.compress(b"\0" * (64 << 20), 9)  # 64 MiB from ~64 KiB
    inflater = make_decompressor("zlib", max_piece_bytes=1 << 20)
    pieces = inflater.feed(bomb) + inflater.close()
    assert sum(map(len, pieces)) == 64 << 20
    assert max(map(len, pieces)) <= 1 << 20


def test_truncated_zlib_stream_says_so() -> None:
    stored = zlib.compress(RecordEncoder().encode(b"x" * 100))
    decoder = ShardDecoder(url="t.zlib")
    decoder.feed(stored[:-3])
    with pytest.raises(CompressionError, match="ends early"):
        decoder.close()


def test_header_sized_plain_files_and_tiny_inputs() -> None:
    framed = RecordEncoder().encode(b"")
    assert len(framed) == 16
    decoder = ShardDecoder(url="tiny")
    assert decoder.feed(framed[:5]) == []  # held back while sniffing
    assert decoder.feed(framed[5:]) == [b""]
    assert decoder.close() == []
    assert struct.unpack("<Q", framed[:8]) == (0,)
