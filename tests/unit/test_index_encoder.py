"""Indexing encoder (ShardEncoder(index=True)): restart points in GZIP/ZLIB streams, the
index it builds, every encode path, and the max_bytes fit test with restart points.

Every shard is checked the same way (:func:`check_shard`): the whole stream decodes with
streamrec's reader and Python's gzip/zlib (one member / one stream, nothing after it), the
index parses against the shard's size, and every record is read alone from its restart point
(a raw inflater unless the point is the stream's start), skipping ``skip`` bytes."""

from __future__ import annotations

import gzip
import random
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tfrecord.reader import tfrecord_iterator
from tfrecord.tools.tfrecord2idx import create_index

from streamrec.format.encoder import RESTART_BYTES, ShardEncoder
from streamrec.format.framing import RecordDecoder, RecordEncoder
from streamrec.format.index.core import ShardIndex, parse_index
from streamrec.format.shard import ShardDecoder
from support.indexes import read_by_index, record_at

FRAME = 16


def read_back(stored: bytes, compression: str | None) -> list[bytes]:
    """The records as streamrec's reader sees them."""
    decoder = ShardDecoder(compression=compression)
    records = decoder.feed(stored)
    decoder.raise_pending()
    return records + decoder.close()


def inflate_whole(stored: bytes, compression: str) -> bytes:
    """Python's own modules, and one member / one stream with nothing after it."""
    inflater = zlib.decompressobj(31 if compression == "gzip" else 15)
    out = inflater.decompress(stored)
    assert inflater.eof and not inflater.unused_data
    module = gzip.decompress(stored) if compression == "gzip" else zlib.decompress(stored)
    assert module == out
    return out


def check_shard(stored: bytes, encoder: ShardEncoder, payloads: list[bytes]) -> ShardIndex:
    compression = encoder.compression
    assert len(stored) == encoder.stored
    assert read_back(stored, compression) == payloads
    framed = RecordEncoder().encode_many(payloads)
    index = encoder.shard_index
    assert index is not None
    parsed = parse_index(
        index.to_bytes(), source="t.idx", stored_size=len(stored), compressed=bool(compression)
    )
    assert parsed.lengths.tolist() == [len(p) + FRAME for p in payloads]
    assert parsed.offsets.tolist() == index.offsets.tolist()
    if compression is None:
        assert stored == framed and parsed.restarts is None
        assert read_by_index(stored, parsed, compression) == payloads
        return parsed
    assert inflate_whole(stored, compression) == framed
    if not payloads:  # an empty index: nothing tells its columns (counts only, all 0 of them)
        assert index.to_bytes() == b"" and len(parsed) == 0
        return parsed
    assert parsed.random_access and parsed.restarts is not None and parsed.skips is not None
    assert parsed.restarts.tolist() == index.restarts.tolist()  # type: ignore[union-attr]
    assert read_by_index(stored, parsed, compression) == payloads  # run by run
    for k, payload in enumerate(payloads):  # and each record alone from its restart point
        restart, skip = int(parsed.restarts[k]), int(parsed.skips[k])
        decoder = RecordDecoder()
        framed_one = record_at(stored, compression, restart, skip, int(parsed.lengths[k]))
        assert decoder.feed(framed_one) == [payload], k  # both CRCs checked
        decoder.close()
    for restart in set(parsed.restarts.tolist()) - {0}:
        inflater = zlib.decompressobj(-15)  # from a restart point to the stream's end
        inflater.decompress(stored[restart:])
        assert inflater.eof
    return parsed


def check_restart_spacing(index: ShardIndex, restart_bytes: int) -> None:
    """A new restart point only before the record that would cross restart_bytes; runs of
    at most restart_bytes, except a record bigger than that alone."""
    assert index.restarts is not None and index.skips is not None
    points = (index.offsets - index.skips).tolist()
    starts = [k for k in range(len(points)) if k == 0 or points[k] != points[k - 1]]
    for run, k in enumerate(starts):
        end = starts[run + 1] if run + 1 < len(starts) else len(points)
        size = int(index.lengths[k:end].sum())
        assert size <= restart_bytes or end == k + 1, (k, size)
        if run + 1 < len(starts):
            assert size + int(index.lengths[end]) > restart_bytes  # no early restart point


def sizes_to_payloads(sizes: list[int], seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for n in sizes:
        if rng.random() < 0.5:
            out.append(rng.randbytes(n))  # incompressible
        else:
            out.append((b"word%d " % rng.randint(0, 9) * (n // 6 + 1))[:n])  # compressible
    return out


def encode_by(path: str, encoder: ShardEncoder, payloads: list[bytes], rng: random.Random) -> bytes:
    """``payloads`` through one encode path (``mixed``: all of them, chunks of any size)."""
    out: list[bytes] = []
    i = 0
    while i < len(payloads):
        how = path if path != "mixed" else rng.choice(["encode", "one", "framed", "fits"])
        take = 1 if how in ("one", "fits") else rng.randint(1, 50)
        chunk = payloads[i : i + take]
        if how == "encode":
            out.append(encoder.encode(chunk))
        elif how == "one":
            out.append(encoder.encode_one(chunk[0]))
        elif how == "framed":
            lengths = [len(p) + FRAME for p in chunk]
            out.append(encoder.add_framed(encoder.frame(chunk), len(chunk), lengths))
        else:
            added = encoder.add_if_fits(chunk[0], 1 << 40)
            assert added is not None
            out.append(added)
        i += len(chunk)
    out.append(encoder.finish())
    return b"".join(out)


sizes = st.lists(
    st.one_of(st.integers(0, 40), st.integers(41, 700), st.integers(701, 3000)),
    min_size=0,
    max_size=60,
)


@pytest.mark.parametrize("compression", ["gzip", "zlib", None])
@pytest.mark.parametrize("path", ["encode", "one", "framed", "fits", "mixed"])
@settings(max_examples=40, deadline=None)
@given(sizes=sizes, restart_bytes=st.sampled_from([1, 64, 500, 2000, 10_000]), seed=st.integers())
def test_every_record_reads_from_its_restart_point(
    compression: str | None, path: str, sizes: list[int], restart_bytes: int, seed: int
) -> None:
    payloads = sizes_to_payloads(sizes, seed)
    encoder = ShardEncoder(compression, index=True, restart_bytes=restart_bytes)
    stored = encode_by(path, encoder, payloads, random.Random(seed))
    index = check_shard(stored, encoder, payloads)
    if compression is not None and payloads:
        check_restart_spacing(index, restart_bytes)


def test_restart_points_about_every_restart_bytes() -> None:
    payloads = sizes_to_payloads([random.Random(k).randint(0, 5000) for k in range(3000)], 1)
    encoder = ShardEncoder("gzip", index=True, restart_bytes=64 << 10)
    stored = encoder.encode(payloads) + encoder.finish()
    index = check_shard(stored, encoder, payloads)
    check_restart_spacing(index, 64 << 10)
    points = sorted(set(index.restarts.tolist()))  # type: ignore[union-attr]
    total = int(index.lengths.sum())
    assert total // (64 << 10) <= len(points) <= 2 * total // (64 << 10) + 1
    assert ShardEncoder("gzip", index=True)._restart_bytes == RESTART_BYTES == 1 << 20


def test_a_big_record_gets_restart_points_of_its_own() -> None:
    payloads = [b"a" * 10, b"B" * 5000, b"c" * 10, b"d" * 10]
    encoder = ShardEncoder("zlib", index=True, restart_bytes=1000)
    stored = encoder.encode(payloads) + encoder.finish()
    index = check_shard(stored, encoder, payloads)
    restarts = index.restarts.tolist()  # type: ignore[union-attr]
    assert restarts[0] == 0 and restarts[1] > 0 and restarts[2] > restarts[1]
    assert restarts[3] == restarts[2]  # the two small ones share one
    assert index.skips.tolist() == [0, 0, 0, 26]  # type: ignore[union-attr]


@pytest.mark.parametrize("compression", [None, "gzip", "zlib"])
def test_without_index_the_bytes_are_unchanged(compression: str | None) -> None:
    payloads = sizes_to_payloads([random.Random(k).randint(0, 3000) for k in range(2000)], 2)
    plain = ShardEncoder(compression)
    expected = plain.encode(payloads) + plain.finish()
    assert plain.shard_index is None and not plain.indexed
    reference = RecordEncoder().encode_many(payloads)
    if compression is None:
        assert expected == reference
    else:  # TensorFlow's settings: one deflate stream with no flush in it
        wbits = 31 if compression == "gzip" else 15
        deflater = zlib.compressobj(6, zlib.DEFLATED, wbits, 9)
        assert expected == deflater.compress(reference) + deflater.flush()
    indexed = ShardEncoder(compression, index=True, restart_bytes=1 << 30)
    # one restart point (the start): the same deflate stream as without the index
    assert indexed.encode(payloads) + indexed.finish() == expected


def test_uncompressed_index_is_the_tfrecord_packages(tmp_path: Path) -> None:
    payloads = sizes_to_payloads([k * 37 % 900 for k in range(300)], 3)
    encoder = ShardEncoder(None, index=True)
    shard = tmp_path / "s.tfrecord"
    shard.write_bytes(encoder.encode(payloads[:100]) + encoder.encode(payloads[100:]))
    encoder.finish()
    create_index(str(shard), str(tmp_path / "s.idx"))
    assert encoder.shard_index is not None
    assert encoder.shard_index.to_bytes() == (tmp_path / "s.idx").read_bytes()


def test_add_framed_needs_the_lengths_when_indexing() -> None:
    encoder = ShardEncoder("gzip", index=True)
    framed = encoder.frame([b"ab", b"cde"])
    with pytest.raises(ValueError, match="framed length of each record"):
        encoder.add_framed(framed, 2)
    with pytest.raises(ValueError, match="framed length of each record"):
        encoder.add_framed(framed, 2, [18, 18])  # they do not add up to the bytes
    with pytest.raises(ValueError, match="restart_bytes"):
        ShardEncoder("gzip", index=True, restart_bytes=0)
    assert ShardEncoder("gzip").add_framed(framed, 2)  # without the index: as before


def _fill(
    encoder: ShardEncoder, payloads: list[bytes], limit: int, bound_first: bool
) -> tuple[list[bytes], int, Callable[[ShardEncoder], None]]:
    """Add records as the planner does (the bound first, else the exact test) until one does
    not fit; the bytes, how many went in, and a replay of the same calls."""
    out: list[bytes] = []
    calls: list[tuple[str, bytes]] = []
    taken = 0
    for payload in payloads:
        if bound_first and encoder.bound_fits(len(payload) + FRAME, limit):
            out.append(encoder.encode_one(payload))
            calls.append(("one", payload))
        else:
            added = encoder.add_if_fits(payload, limit)
            if added is None:
                break
            out.append(added)
            calls.append(("fits", payload))
        taken += 1

    def replay(other: ShardEncoder) -> None:
        for how, payload in calls:
            if how == "one":
                other.encode_one(payload)
            else:
                assert other.add_if_fits(payload, limit) is not None

    return out, taken, replay


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
@pytest.mark.parametrize("bound_first", [False, True])
@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 2500), min_size=1, max_size=80),
    restart_bytes=st.sampled_from([1, 200, 1500, 6000]),
    limit=st.integers(40, 40_000),
    seed=st.integers(),
)
def test_max_bytes_fit_stays_exact_with_restart_points(
    compression: str,
    bound_first: bool,
    sizes: list[int],
    restart_bytes: int,
    limit: int,
    seed: int,
) -> None:
    payloads = sizes_to_payloads(sizes, seed)

    def make() -> ShardEncoder:
        return ShardEncoder(compression, index=True, restart_bytes=restart_bytes)

    encoder = make()
    out, taken, replay = _fill(encoder, payloads, limit, bound_first)
    stored = b"".join(out) + encoder.finish()
    assert len(stored) <= limit or taken == 0  # within the limit, exactly measured
    check_shard(stored, encoder, payloads[:taken])
    if taken < len(payloads):
        # the refused record really did not fit: the same calls, then that record forced in
        forced = make()
        replay(forced)
        forced.encode_one(payloads[taken])
        forced.finish()
        assert forced.stored > limit


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
@pytest.mark.parametrize("size", [0, 3, 40, 120])
def test_the_bound_holds_with_a_flush_before_every_record(compression: str, size: int) -> None:
    # restart spans smaller than a record: a full flush before every record, each one a few
    # bytes more; the bound the planner adds whole chunks by must still hold
    payloads = [random.Random(k).randbytes(size) for k in range(1500)]
    for limit in range(1000, 60_000, 1999):
        encoder = ShardEncoder(compression, index=True, restart_bytes=1)
        taken = 0
        while taken < len(payloads) and encoder.bound_fits(
            sum(len(p) + FRAME for p in payloads[: taken + 8]), limit
        ):
            taken += 8
        encoder.encode(payloads[:taken])
        encoder.finish()
        assert encoder.stored <= limit, (limit, taken, encoder.stored)
        assert taken or limit < 3000  # not a useless bound


@pytest.mark.parametrize("n", [2, 3, 7])
def test_the_tfrecord_package_reads_an_indexed_gzip_shard(tmp_path: Path, n: int) -> None:
    payloads = sizes_to_payloads([random.Random(k).randint(0, 4000) for k in range(700)], 5)
    encoder = ShardEncoder("gzip", index=True, restart_bytes=50_000)
    shard = tmp_path / "s.tfrecord.gz"
    shard.write_bytes(encoder.encode(payloads) + encoder.finish())
    assert encoder.shard_index is not None
    (tmp_path / "s.idx").write_bytes(encoder.shard_index.to_bytes())
    assert np.loadtxt(tmp_path / "s.idx", dtype=np.int64).shape == (700, 4)
    seen: list[bytes] = []
    for i in range(n):
        part = tfrecord_iterator(
            str(shard), str(tmp_path / "s.idx"), shard=(i, n), compression_type="gzip"
        )
        seen += [bytes(view) for view in part]
    assert seen == payloads
