"""Every good record before the damage, then the error: at every layer, at any chunking.

The framing, the shard decoder (gzip pieces), the dataset's read path and ``streamrec count``
must all hand on exactly the records before the first damaged one, then raise.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamrec
from integration.test_cli import cli
from streamrec.errors import CorruptRecordError, FormatError, TruncatedRecordError
from streamrec.format import framing
from streamrec.format.framing import RecordDecoder, RecordEncoder
from streamrec.format.shard import ShardDecoder

fixture_ok = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def damage(payloads: list[bytes], bad: int, kind: str) -> bytes:
    """The framed ``payloads`` with record ``bad`` damaged: its payload CRC or length CRC."""
    encoder = RecordEncoder()
    data = bytearray(encoder.encode_many(payloads))
    offset = sum(len(p) + 16 for p in payloads[:bad])
    if kind == "payload":
        data[offset + 12 + len(payloads[bad])] ^= 0x40  # the stored payload CRC
    else:
        data[offset + 8] ^= 0x40  # the stored length CRC
    return bytes(data)


def drive(decoder: RecordDecoder, chunks: list[bytes]) -> tuple[list[bytes], FormatError | None]:
    """Feed like a reader does; the records handed on, and the error that ended it."""
    out: list[bytes] = []
    try:
        for chunk in chunks:
            out += decoder.feed(chunk)
            decoder.raise_pending()
        decoder.close()
    except FormatError as exc:
        return out, exc
    return out, None


def test_record_completed_across_a_boundary_comes_before_a_bad_payload(scanner: str) -> None:
    data = damage([b"a" * 10, b"b" * 10], 1, "payload")
    decoder = RecordDecoder()
    assert decoder.feed(data[:5]) == []
    assert decoder.feed(data[5:]) == [b"a" * 10]  # was lost: the error was raised instead
    with pytest.raises(CorruptRecordError) as info:
        decoder.raise_pending()
    assert (info.value.which, info.value.record_index, info.value.offset) == ("payload", 1, 26)


def test_big_record_completed_in_a_chunk_comes_before_a_bad_payload(scanner: str) -> None:
    big = b"z" * (2 << 20)
    data = damage([big, b"after"], 1, "payload")
    decoder = RecordDecoder()
    assert decoder.feed(data[:1000]) == []
    assert decoder.feed(data[1000:]) == [big]
    with pytest.raises(CorruptRecordError):
        decoder.raise_pending()


@fixture_ok
@given(
    payloads=st.lists(st.binary(max_size=200), min_size=1, max_size=12),
    bad=st.integers(min_value=0),
    kind=st.sampled_from(["payload", "length", "truncate", "none"]),
    cuts=st.lists(st.integers(min_value=0), max_size=12),
    big_threshold=st.sampled_from([1 << 20, 40]),
)
def test_records_before_the_error_are_exactly_the_good_prefix(
    scanner: str,
    monkeypatch: pytest.MonkeyPatch,
    payloads: list[bytes],
    bad: int,
    kind: str,
    cuts: list[int],
    big_threshold: int,
) -> None:
    # the model: records 0..bad-1 are good; record `bad` is damaged (or cut short)
    monkeypatch.setattr(framing, "_BIG_RECORD_BYTES", big_threshold)  # the big-record path too
    bad %= len(payloads)
    if kind in ("payload", "length"):
        data = damage(payloads, bad, kind)
    else:
        data = RecordEncoder().encode_many(payloads)
        if kind == "truncate":
            data = data[: sum(len(p) + 16 for p in payloads[:bad]) + 1 + len(payloads[bad])]
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    out, error = drive(RecordDecoder(), chunks)
    if kind == "none":
        assert (out, error) == (payloads, None)
        return
    assert out == payloads[:bad]
    expected = TruncatedRecordError if kind == "truncate" else CorruptRecordError
    assert isinstance(error, expected)
    assert (error.record_index, error.offset) == (bad, sum(len(p) + 16 for p in payloads[:bad]))


def gzip_with_damage_at_a_piece_boundary(records: int, piece: int) -> tuple[bytes, list[bytes]]:
    """A gzip shard: ``records`` good records filling whole pieces, then one bad record."""
    good = [bytes([i % 251]) * (piece - 16) for i in range(records)]
    data = damage([*good, b"bad"], records, "payload")
    return gzip.compress(data, compresslevel=1), good


@pytest.mark.parametrize("piece", [4096, 4 << 20])
def test_shard_decoder_keeps_the_records_of_earlier_pieces(scanner: str, piece: int) -> None:
    stored, good = gzip_with_damage_at_a_piece_boundary(4096 if piece == 4096 else 3, piece)
    decoder = ShardDecoder(url="s.gz", max_piece_bytes=piece)
    assert decoder.feed(stored) == good  # was []: the last piece's error dropped them all
    with pytest.raises(CorruptRecordError) as info:
        decoder.raise_pending()
    assert info.value.record_index == len(good)
    streamed: list[bytes] = []
    decoder = ShardDecoder(url="s.gz", max_piece_bytes=piece)
    with pytest.raises(CorruptRecordError):
        for chunk in decoder.stream(stored):
            streamed += chunk
    assert streamed == good


@pytest.fixture(scope="module")
def damaged_gzip_shard(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """4,096 good records, then a bad one starting exactly at a 4 MiB inflate piece."""
    stored, good = gzip_with_damage_at_a_piece_boundary(4096, 4096)
    path = tmp_path_factory.mktemp("damaged") / "bad.tfrecord.gz"
    path.write_bytes(stored)
    return path, len(good)


def test_open_dataset_yields_every_good_record_of_a_gzip_shard(
    damaged_gzip_shard: tuple[Path, int],
) -> None:
    path, good = damaged_gzip_shard
    seen = 0
    with pytest.raises(CorruptRecordError) as info:
        for _ in streamrec.open_dataset(str(path)):
            seen += 1
    assert seen == good  # was 0
    assert (info.value.record_index, info.value.url) == (good, str(path))


def test_count_and_verify_report_every_good_record(damaged_gzip_shard: tuple[Path, int]) -> None:
    path, good = damaged_gzip_shard
    done = cli("count", "--json", str(path))
    assert done.rc == 1
    document = done.json()
    assert document["total_records"] == good  # was 0
    assert document["shards"][0]["error"].startswith(f"record {good} in {path}")
    done = cli("verify", "--json", str(path))
    assert done.rc == 1
    assert done.json()["good_records"] == good
    assert [p["record_index"] for p in done.json()["problems"]] == [good]


def test_a_length_crc_error_after_a_straddling_record(scanner: str) -> None:
    header = struct.pack("<QI", 5, 12345)  # a length CRC that does not match
    data = RecordEncoder().encode(b"first") + header
    decoder = RecordDecoder()
    assert decoder.feed(data[:3]) == []
    assert decoder.feed(data[3:]) == [b"first"]
    assert decoder.failed
