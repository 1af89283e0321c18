"""The record index sidecar format (streamrec.format.index.core): the plain format the `tfrecord`
package and DALI write, the extended format for compressed shards, and hostile indexes."""

from __future__ import annotations

import itertools
import tracemalloc

import numpy as np
import pytest
from tfrecord.tools.tfrecord2idx import create_index

from streamrec.errors import FormatError
from streamrec.format.framing import RecordEncoder
from streamrec.format.index import core as index_module
from streamrec.format.index import text as index_text
from streamrec.format.index.core import (
    IndexBuilder,
    IndexParser,
    ShardIndex,
    index_size_limit,
    parse_index,
)
from streamrec.format.shard import DEFAULT_MAX_RECORD_BYTES
from support.corpus import CORPUS_DIR


def _shard(payloads: list[bytes]) -> bytes:
    return RecordEncoder().encode_many(payloads)


def test_plain_index_is_the_tfrecord_packages(tmp_path) -> None:
    payloads = [bytes([k]) * (k * 37 % 300) for k in range(50)]
    shard = tmp_path / "a.tfrecord"
    shard.write_bytes(_shard(payloads))
    create_index(str(shard), str(tmp_path / "a.idx"))
    theirs = (tmp_path / "a.idx").read_bytes()
    builder = IndexBuilder()
    builder.add_records(len(p) + 16 for p in payloads)
    ours = builder.build()
    assert ours.to_bytes() == theirs
    parsed = parse_index(theirs, source="a.idx", stored_size=shard.stat().st_size, compressed=False)
    assert parsed.offsets.tolist() == ours.offsets.tolist()
    assert parsed.lengths.tolist() == [len(p) + 16 for p in payloads]
    assert parsed.random_access and len(parsed) == 50


def test_corpus_uncompressed_files_index(tmp_path) -> None:
    files = [
        p
        for p in CORPUS_DIR.glob("*/*.tfrecord")
        if p.stat().st_size and p.parent.name != "corrupt"
    ]
    assert files
    for path in files:
        create_index(str(path), str(tmp_path / "x.idx"))
        data = (tmp_path / "x.idx").read_bytes()
        index = parse_index(
            data, source=str(path), stored_size=path.stat().st_size, compressed=False
        )
        assert index.stream_bytes == path.stat().st_size


def test_extended_round_trip() -> None:
    builder = IndexBuilder(extended=True)
    builder.add_records([20, 30], restart=(0, 0))
    builder.add_records([40], restart=(17, 50))
    builder.add_records([16, 16], restart=(17, 50))
    index = builder.build()
    assert index.restarts is not None and index.skips is not None
    assert index.restarts.tolist() == [0, 0, 17, 17, 17]
    assert index.skips.tolist() == [0, 20, 0, 40, 56]
    again = parse_index(index.to_bytes(), source="x.idx", stored_size=100, compressed=True)
    assert again.skips is not None and again.skips.tolist() == index.skips.tolist()
    assert again.random_access


def test_plain_index_of_compressed_shard_gives_counts_only() -> None:
    index = parse_index(b"0 20\n20 30\n", source="x.idx", stored_size=10, compressed=True)
    assert len(index) == 2 and not index.random_access


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"0 20\n20 30\n", "end at byte 50"),  # stale: the shard has 60 bytes
        (b"0 20\n21 39\n", "ends at 20"),
        (b"5 20\n25 35\n", "not 0"),
        (b"0 10\n10 50\n", "< 16"),
        (b"0 20\n20\n", "2 or 4 numbers"),
        (b"0 20 0 0\n20 40 0 20\n", "uncompressed"),
        (b"0 20\n\n20 40\n", "empty line"),
        (b"0 -20\n", "not a digit"),
        (b"0 1e3\n", "not a digit"),
        (b"0 99999999999999999999\n", "digits"),
        (b"<html>", "not a digit"),
        (b"", "no records"),
    ],
)
def test_hostile_plain_indexes(data: bytes, problem: str) -> None:
    with pytest.raises(FormatError, match=problem) as caught:
        parse_index(data, source="s3://b/x.idx", stored_size=60, compressed=False)
    assert "s3://b/x.idx" in str(caught.value)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"0 20 0 0\n20 20 500 0\n", "beyond"),
        (b"0 20 0 0\n20 20 0 25\n", "before the stream's start"),
        (b"0 20 9 0\n20 20 5 0\n", "going back"),
        (b"0 20 0 0\n20 20 5 30\n", "before the stream's start"),
        (b"0 20 0 0\n20 20 5 20\n", "does not move forward"),
        (b"0 20 0 0\n20 20 0 10\n", "disagree"),
        (b"0 20 4 0\n20 20 0 20\n", "going back"),
    ],
)
def test_hostile_extended_indexes(data: bytes, problem: str) -> None:
    with pytest.raises(FormatError, match=problem):
        parse_index(data, source="x.idx", stored_size=100, compressed=True)


def test_size_limit_is_checked_before_parsing() -> None:
    limit = index_size_limit(32, compressed=False)
    with pytest.raises(FormatError, match="more than"):
        parse_index(b" " * (limit + 1), source="x.idx", stored_size=32, compressed=False)


def test_large_index_parses_fast_enough_to_be_vectorised() -> None:
    lengths = np.full(200_000, 116, dtype=np.int64)
    builder = IndexBuilder()
    builder.add_records(lengths.tolist())
    data = builder.build().to_bytes()
    index = parse_index(data, source="x", stored_size=116 * 200_000, compressed=False)
    assert len(index) == 200_000 and index.offsets[-1] == 116 * 199_999


def test_to_bytes_spells_every_number_as_str_does() -> None:
    # the text is made without a Python step per number: check it against the obvious way
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        columns = [
            rng.integers(0, 10 ** int(rng.integers(1, 19)), n, dtype=np.int64) for _ in range(4)
        ]
        for column in columns:
            column[rng.random(n) < 0.2] = 0
            column[rng.random(n) < 0.2] = 10 ** int(rng.integers(0, 18))
            column[rng.random(n) < 0.1] = 10**18 - 1
        for index in (
            ShardIndex(columns[0], columns[1]),
            ShardIndex(*columns),
        ):
            rows = np.stack(
                [
                    c
                    for c in (index.offsets, index.lengths, index.restarts, index.skips)
                    if c is not None
                ],
                axis=1,
            )
            expected = "".join(" ".join(map(str, row)) + "\n" for row in rows.tolist())
            assert index.to_bytes() == expected.encode()
    assert ShardIndex(np.zeros(0, np.int64), np.zeros(0, np.int64)).to_bytes() == b""


def test_to_bytes_of_many_records_is_made_in_pieces_that_join_up() -> None:
    rng = np.random.default_rng(8)
    builder = IndexBuilder()
    builder.add_records(rng.integers(16, 5_000_000, 40_000).tolist())
    index = builder.build()
    rows = zip(index.offsets.tolist(), index.lengths.tolist(), strict=True)
    assert index.to_bytes() == "".join(f"{o} {n}\n" for o, n in rows).encode()


@pytest.mark.skipif(index_text._cframing is None, reason="the C accelerator is not built")
def test_c_and_numpy_index_text_agree() -> None:
    """The sidecar's text made in C (``streamrec index``'s hot part) is the numpy twin's, for
    2 and 4 columns, every number size, zeros and the largest int64."""
    rng = np.random.default_rng(9)
    for columns in (2, 4):
        for top in (10, 10**4, 10**9, 2**40, 2**63 - 1):
            data = [rng.integers(0, top, 5_000, dtype=np.int64) for _ in range(columns)]
            data[0][:2] = (0, top - 1)
            assert index_text.c_text(data) == index_text.numpy_text(data)
    with pytest.raises(ValueError, match="equally long"):
        index_text.c_text([np.zeros(2, np.int64), np.zeros(3, np.int64)])


# --- hostile sidecars: memory (issue 29, B.6) and the sequential reader's caps (B.7) ---


def test_a_line_padded_past_any_valid_width_is_refused() -> None:
    # a valid index of a 64 KiB shard, its one line padded with spaces: well inside the
    # sidecar size an index of such a shard may have, but no valid line is that wide
    data = b"0" + b" " * 50_000 + b"65536\n"
    with pytest.raises(FormatError, match="a line of more than 14 bytes"):
        parse_index(data, source="x.idx", stored_size=65536, compressed=False)


def test_padding_is_refused_at_the_first_piece_fed() -> None:
    parser = IndexParser(source="x.idx", stored_size=64 << 10, compressed=True)
    with pytest.raises(FormatError, match="a line of more than"):
        parser.feed(b"0 " + b" " * (1 << 20))  # 1 MiB of one line: refused, not carried


def test_size_limit_counts_lines_of_the_widest_valid_numbers() -> None:
    # a plain shard's records take 16 bytes at least, its numbers at most its size's digits
    assert index_size_limit(65536, compressed=False) == 4096 * (2 * 6 + 2)
    assert index_size_limit(65536, compressed=False) < 65536
    # compressed: up to 1032x as many records, with 4 numbers of the stream's digits
    assert index_size_limit(65536, compressed=True) == (65536 * 1032 // 16) * (4 * 9 + 2)


def test_counting_keeps_no_table_and_little_memory() -> None:
    builder = IndexBuilder()
    builder.add_records([116] * 400_000)
    data = builder.build().to_bytes()  # ~5 MiB of text
    parser = IndexParser(source="x", stored_size=116 * 400_000, compressed=False, keep=False)
    tracemalloc.start()
    try:
        for start in range(0, len(data), 1 << 20):
            parser.feed(data[start : start + (1 << 20)])
        assert parser.finish() == 400_000
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the 1 MiB pieces fed plus one parse's temporaries; parsing the whole text at once
    # (the index made 21-33 bytes of Python objects per byte) took ~30x the text
    assert peak < 12 << 20, peak
    with pytest.raises(ValueError, match="keep=True"):
        parser.index()


def test_parsed_in_pieces_as_parsed_whole() -> None:
    rng = np.random.default_rng(5)
    builder = IndexBuilder()
    builder.add_records(rng.integers(16, 3000, 50_000).tolist())
    index = builder.build()
    data = index.to_bytes()
    size = index.stream_bytes
    for piece in (1, 7, 1000, 1 << 20):
        parser = IndexParser(source="x", stored_size=size, compressed=False)
        cuts = [*range(0, min(len(data), 1000 * piece), piece), len(data)]
        for start, stop in itertools.pairwise(cuts):  # the rest in one piece
            parser.feed(data[start:stop])
        parser.finish()
        again = parser.index()
        assert again.offsets.tolist() == index.offsets.tolist()
        assert again.lengths.tolist() == index.lengths.tolist()


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        # a record longer than max_record_bytes: the sequential reader would refuse it too
        (b"0 %d 0 0\n" % ((1 << 30) + 17), "more than a record of this shard can have"),
        # the records of restart point 0 inflate from 10 stored bytes: 10320 at most
        (b"0 50000 0 0\n50000 50000 10 0\n", "1032x its 10 stored bytes"),
        # the last restart point's records, up to the object's end (90 stored bytes)
        (b"0 20 0 0\n20 95000 10 0\n", "1032x its 90 stored bytes"),
    ],
)
def test_compressed_index_claims_are_capped_as_the_reader_caps_records(
    data: bytes, problem: str
) -> None:
    size = 100 if b"1073741841" not in data else 2 << 20
    with pytest.raises(FormatError, match=problem):
        parse_index(data, source="x.idx", stored_size=size, compressed=True)


def test_the_record_cap_is_the_sequential_readers() -> None:
    assert index_module.DEFAULT_MAX_RECORD_BYTES == DEFAULT_MAX_RECORD_BYTES


def test_text_past_the_limit_is_refused_as_it_is_fed() -> None:
    limit = index_size_limit(160, compressed=False)  # 10 records of lines of 10 bytes
    assert limit == 100
    parser = IndexParser(source="x.idx", stored_size=160, compressed=False)
    parser.feed(b"\n" * limit)
    with pytest.raises(FormatError, match="more than 100 bytes"):
        parser.feed(b"\n")
