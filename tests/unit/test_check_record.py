"""The host's record of index checks (format/index/check_record.py): a slot vouches only for
the shard, version and index it was written for, and only whole."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamrec.format.index.check_record import (
    HEADER_BYTES,
    MAGIC,
    SLOT_BYTES,
    decode_header,
    decode_slot,
    encode_header,
    encode_slot,
    key_digest,
)

DIGEST = key_digest("s3://b/d/part-0.tfrecord", 1000, '"etag-1"', b"\x01" * 16)


def test_layout() -> None:
    header = encode_header(7)
    assert len(header) == HEADER_BYTES == 32
    assert header[:8] == MAGIC == b"SRCHECK\x00"  # a literal: changes only with the version
    assert decode_header(header) == 7
    assert len(encode_slot(DIGEST, 5)) == SLOT_BYTES == 32
    assert decode_slot(encode_slot(DIGEST, 5), DIGEST) == 5


@pytest.mark.parametrize(
    "other",
    [
        ("s3://b/d/part-1.tfrecord", 1000, '"etag-1"', b"\x01" * 16),  # another shard
        ("s3://b/d/part-0.tfrecord", 1001, '"etag-1"', b"\x01" * 16),  # another size
        ("s3://b/d/part-0.tfrecord", 1000, '"etag-2"', b"\x01" * 16),  # another version
        ("s3://b/d/part-0.tfrecord", 1000, '"etag-1"', b"\x02" * 16),  # another index
    ],
)
def test_a_slot_vouches_for_its_own_shard_only(other: tuple[str, int, str, bytes]) -> None:
    assert decode_slot(encode_slot(DIGEST, 5), key_digest(*other)) == 0


@given(st.integers(0, SLOT_BYTES * 8 - 1), st.integers(0, 2**40))
def test_a_flipped_bit_vouches_for_nothing(bit: int, entries: int) -> None:
    slot = bytearray(encode_slot(DIGEST, entries))
    slot[bit // 8] ^= 1 << (bit % 8)
    assert decode_slot(bytes(slot), DIGEST) == 0


def test_a_key_with_any_text_has_a_digest() -> None:
    # a manifest's version or url may hold a lone surrogate (valid JSON): no exception
    assert len(key_digest("s3://b/\udc80", 1, "\udc80", b"")) == 32


def test_short_or_foreign_headers_and_slots() -> None:
    assert decode_slot(encode_slot(DIGEST, 5)[:-1], DIGEST) == 0
    assert decode_slot(b"", DIGEST) == 0
    header = bytearray(encode_header(3))
    assert decode_header(bytes(header[:-1])) is None
    header[8] = 2  # version 2: not this reader's
    assert decode_header(bytes(header)) is None
    assert decode_header(b"SRDSIDX\x00" + bytes(24)) is None
