"""The sans-I/O framing core: round trips at any chunking, damage, bounded allocation."""

from __future__ import annotations

import random
import struct
import zlib
from array import array
from pathlib import Path

import crc32c as crc32c_package
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from streamrec.errors import CorruptRecordError, FormatError, TruncatedRecordError
from streamrec.format import framing
from streamrec.format.crc import crc32c, mask, masked_crc32c, unmask
from streamrec.format.framing import RecordDecoder, RecordEncoder
from streamrec.format.shard import ShardDecoder, ShardEncoder

payload_lists = st.lists(st.binary(max_size=300), max_size=40)
fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for point in [*points, len(data)]:
        pieces.append(data[last:point])
        last = point
    return pieces


def decode_all(chunks: list[bytes], **options: object) -> list[bytes]:
    decoder = RecordDecoder(**options)  # type: ignore[arg-type]
    records: list[bytes] = []
    for chunk in chunks:
        records += decoder.feed(chunk)
        decoder.raise_pending()
    decoder.close()
    return records


def test_mask_matches_tensorflow_definition() -> None:
    # crc32c("123456789") = 0xe3069283 (the standard CRC-32C check value)
    assert crc32c(b"123456789") == 0xE3069283
    c = 0xE3069283
    assert mask(c) == (((c >> 15) | (c << 17)) + 0xA282EAD8) % 2**32
    assert unmask(mask(c)) == c
    assert masked_crc32c(b"") == 0xA282EAD8


def test_encoder_frames_like_tensorflow() -> None:
    framed = RecordEncoder().encode(b"hello")
    length = struct.pack("<Q", 5)
    assert framed == (
        length
        + struct.pack("<I", masked_crc32c(length))
        + b"hello"
        + struct.pack("<I", masked_crc32c(b"hello"))
    )


@pytest.mark.parametrize("name", ["features", "images", "tiny_20k", "raw_lengths", "empty"])
def test_written_files_are_byte_identical_to_tensorflow(corpus_dir: Path, name: str) -> None:
    original = (corpus_dir / "plain" / f"{name}.tfrecord").read_bytes()
    payloads = decode_all([original])
    assert RecordEncoder().encode_many(payloads) == original
    encoder = ShardEncoder(None)
    assert encoder.encode(payloads) + encoder.finish() == original


@fixture_ok
@given(payloads=payload_lists, cuts=st.lists(st.integers(min_value=0), max_size=30))
def test_round_trip_at_any_chunking(scanner: str, payloads: list[bytes], cuts: list[int]) -> None:
    data = RecordEncoder().encode_many(payloads)
    assert decode_all(split_at(data, cuts)) == payloads


@fixture_ok
@given(
    payloads=payload_lists,
    cuts=st.lists(st.integers(min_value=0), max_size=10),
    compression=st.sampled_from([None, "gzip", "zlib"]),
    auto=st.booleans(),
)
def test_shard_round_trip_with_each_codec(
    scanner: str, payloads: list[bytes], cuts: list[int], compression: str | None, auto: bool
) -> None:
    encoder = ShardEncoder(compression)
    stored = encoder.encode(payloads) + encoder.finish()
    if compression == "gzip":
        assert zlib.decompress(stored, 31) == RecordEncoder().encode_many(payloads)
    elif compression == "zlib":
        assert zlib.decompress(stored) == RecordEncoder().encode_many(payloads)
    # "auto" with an uninformative name must sniff the codec from the first bytes
    decoder = ShardDecoder(url="x.tfrecord", compression="auto" if auto else compression)
    records: list[bytes] = []
    for chunk in split_at(stored, cuts):
        records += decoder.feed(chunk)
        decoder.raise_pending()
    records += decoder.close()
    assert records == payloads
    assert decoder.compression == compression or (not payloads and compression is not None)


def test_large_payload_uses_the_package_crc_and_still_verifies(scanner: str) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB, above the C scanner's large-CRC threshold
    data = bytearray(RecordEncoder().encode(payload))
    assert decode_all([bytes(data)]) == [payload]
    data[12 + 500_000] ^= 1
    with pytest.raises(CorruptRecordError) as info:
        decode_all([bytes(data)])
    assert info.value.which == "payload"


def test_bad_payload_crc_names_record_offset_and_crcs(scanner: str) -> None:
    encoder = RecordEncoder()
    good = [b"a" * 10, b"b" * 20]
    data = bytearray(encoder.encode_many([*good, b"c" * 30, b"d"]))
    bad_offset = 26 + 36
    data[bad_offset + 12] ^= 0xFF
    decoder = RecordDecoder(url="mem://x")
    assert decoder.feed(bytes(data)) == good  # the good records first
    assert decoder.failed
    with pytest.raises(CorruptRecordError) as info:
        decoder.raise_pending()
    error = info.value
    assert (error.which, error.record_index, error.offset, error.url) == (
        "payload",
        2,
        bad_offset,
        "mem://x",
    )
    assert error.expected == masked_crc32c(b"c" * 30)
    assert error.actual == masked_crc32c(b"\x9c" + b"c" * 29)
    assert "record 2 in mem://x at byte offset 62: payload CRC mismatch" in str(error)
    with pytest.raises(CorruptRecordError):
        decoder.close()  # the error sticks


def test_skip_mode_drops_bad_payload_and_keeps_going(scanner: str) -> None:
    data = bytearray(RecordEncoder().encode_many([b"a", b"bb", b"ccc"]))
    data[17 + 12] ^= 1  # payload of record 1
    decoder = RecordDecoder(on_corrupt="skip")
    assert decoder.feed(bytes(data)) == [b"a", b"ccc"]
    decoder.close()
    assert [(e.record_index, e.offset) for e in decoder.dropped] == [(1, 17)]


def test_skip_mode_bad_length_crc_drops_the_rest(scanner: str) -> None:
    data = bytearray(RecordEncoder().encode_many([b"a", b"bb", b"ccc"]))
    data[17 + 9] ^= 1  # length CRC of record 1
    decoder = RecordDecoder(on_corrupt="skip")
    assert decoder.feed(bytes(data)) == [b"a"]
    assert decoder.feed(b"more bytes are ignored") == []
    decoder.close()
    assert len(decoder.dropped) == 1 and isinstance(decoder.dropped[0], CorruptRecordError)


@pytest.mark.parametrize(
    ("cut", "where"),
    [(5, "header (5 of 12"), (12 + 3, "payload (3 of 10"), (12 + 10 + 2, "payload CRC (2 of 4")],
)
def test_truncation_says_where(cut: int, where: str) -> None:
    data = RecordEncoder().encode_many([b"first", b"0123456789"])
    decoder = RecordDecoder(url="f")
    assert decoder.feed(data[: 21 + cut]) == [b"first"]
    with pytest.raises(TruncatedRecordError) as info:
        decoder.close()
    assert where in str(info.value)
    assert (info.value.offset, info.value.record_index) == (21, 1)


def test_corrupt_huge_length_is_never_allocated(scanner: str) -> None:
    # A header claiming 2**60 bytes with a *valid* length CRC, and CRCs off: the decoder
    # must wait for bytes that never come, holding only what it was fed.
    length = struct.pack("<Q", 1 << 60)
    header = length + struct.pack("<I", masked_crc32c(length))
    for verify in (True, False):
        decoder = RecordDecoder(verify_crc=verify)
        assert decoder.feed(header + b"x" * 1000) == []
        assert decoder.buffered_bytes == 1012
        with pytest.raises(TruncatedRecordError, match=f"0 of {1 << 60}|1000 of {1 << 60}"):
            decoder.close()


def test_bad_length_crc_is_caught_before_the_length_is_used(scanner: str) -> None:
    header = struct.pack("<QI", 1 << 60, 12345)
    with pytest.raises(CorruptRecordError) as info:
        RecordDecoder().feed(header)
    assert info.value.which == "length"


@settings(max_examples=300, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=64), min_size=1, max_size=8),
    compression=st.sampled_from([None, "gzip", "zlib"]),
    mutations=st.lists(st.tuples(st.integers(min_value=0), st.integers(1, 255)), max_size=4),
    truncate=st.one_of(st.none(), st.integers(min_value=0)),
)
def test_fuzz_damage_raises_only_format_errors(
    payloads: list[bytes],
    compression: str | None,
    mutations: list[tuple[int, int]],
    truncate: int | None,
) -> None:
    encoder = ShardEncoder(compression)
    data = bytearray(encoder.encode(payloads) + encoder.finish())
    for position, xor in mutations:
        data[position % len(data)] ^= xor
    if truncate is not None:
        del data[truncate % (len(data) + 1) :]
    for on_corrupt in ("raise", "skip"):
        decoder = ShardDecoder(url="fuzz", compression=compression, on_corrupt=on_corrupt)
        out: list[bytes] = []
        try:
            for i in range(0, len(data), 7):
                out += decoder.feed(bytes(data[i : i + 7]))
                decoder.raise_pending()
                # never holds more than the stream could: what was fed (inflated, if compressed)
                limit = len(data) if compression is None else len(data) * 1032 + 64
                assert decoder.framing.buffered_bytes <= limit
            out += decoder.close()
            decoder.raise_pending()
        except FormatError:
            assert on_corrupt == "raise"
        if not mutations and truncate is None:
            assert out == payloads
        # No invented records: every record out is one that went in (both CRCs hold). In an
        # uncompressed stream they come as a subsequence, in order. In a damaged deflate
        # stream a back-reference can copy earlier bytes again, CRCs and all: records may
        # repeat (the gzip/zlib trailer's checksum then fails at the end, too late for those).
        if compression is None:
            remaining = iter(payloads)
            assert all(any(p == q for q in remaining) for p in out)
        else:
            assert all(p in payloads for p in out)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.sampled_from([0, 5, 1 << 20, (1 << 20) + 7, 3 << 20]), max_size=5),
    chunk=st.sampled_from([1000, 65536, 1 << 20, 4 << 20]),
    as_bytearray=st.booleans(),
)
def test_big_records_assemble_from_chunks(
    scanner: str, sizes: list[int], chunk: int, as_bytearray: bool
) -> None:
    payloads = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    data = RecordEncoder().encode_many(payloads)
    decoder = RecordDecoder()
    out: list[bytes] = []
    reused = bytearray(chunk)
    for i in range(0, len(data), chunk):
        piece = data[i : i + chunk]
        if as_bytearray:  # a caller that reuses its read buffer must not corrupt records
            reused[: len(piece)] = piece
            out += decoder.feed(memoryview(reused)[: len(piece)])
            reused[:] = b"\xee" * len(reused)
        else:
            out += decoder.feed(piece)
    decoder.close()
    assert out == payloads


def test_big_record_with_bad_crc_or_truncation(scanner: str) -> None:
    big = b"z" * (2 << 20)
    data = bytearray(RecordEncoder().encode_many([b"small", big, b"after"]))
    data[21 + 12 + 12345] ^= 4
    chunks = [bytes(data[i : i + 65536]) for i in range(0, len(data), 65536)]
    with pytest.raises(CorruptRecordError) as info:
        decode_all(chunks)
    assert (info.value.record_index, info.value.offset, info.value.which) == (1, 21, "payload")
    skipping = RecordDecoder(on_corrupt="skip")
    out = [r for c in chunks for r in skipping.feed(c)]
    skipping.close()
    assert out == [b"small", b"after"]
    decoder = RecordDecoder()
    decoder.feed(bytes(data[: 21 + 100_000]))
    with pytest.raises(TruncatedRecordError, match=f"payload \\(99988 of {len(big)} bytes\\)"):
        decoder.close()


def lengths_of(chunks: list[bytes], **options: object) -> tuple[list[int], RecordDecoder]:
    """The payload lengths a ``lengths_only`` decoder collects from ``chunks`` (it returns no
    payloads), and the decoder."""
    decoder = RecordDecoder(lengths_only=True, **options)  # type: ignore[arg-type]
    for chunk in chunks:
        assert decoder.feed(chunk) == []
    decoder.close()
    assert decoder.lengths is not None
    return decoder.lengths.tolist(), decoder


@fixture_ok
@given(
    payloads=st.lists(st.binary(max_size=300), max_size=40)
    | st.lists(st.sampled_from([b"x" * (1 << 20), b"y" * 5000, b""]), max_size=4),
    cuts=st.lists(st.integers(min_value=0), max_size=30),
)
def test_lengths_only_at_any_chunking(scanner: str, payloads: list[bytes], cuts: list[int]) -> None:
    """Lengths only (what ``streamrec index`` reads with): the lengths of the records a full
    decode returns, at any chunking, big records (assembled across chunks) included."""
    data = RecordEncoder().encode_many(payloads)
    lengths, decoder = lengths_of(split_at(data, cuts))
    assert lengths == [len(p) for p in payloads]
    assert decoder.record_index == len(payloads)
    assert decoder.offset == len(data)


@pytest.mark.skipif(not framing.accelerated, reason="the C scanner is not built")
@given(
    payloads=payload_lists,
    start=st.integers(min_value=0, max_value=40),
    damage=st.integers(min_value=-1, max_value=4000),
    verify=st.booleans(),
)
def test_c_and_python_scanners_agree_on_lengths(
    payloads: list[bytes], start: int, damage: int, verify: bool
) -> None:
    """The C scanner and its pure-Python twin give the same result in both modes, on good and
    damaged bytes (a flipped byte anywhere: a header, a payload or a footer)."""
    data = bytearray(RecordEncoder().encode_many(payloads))
    if 0 <= damage < len(data):
        data[damage] ^= 0x40
    buf = bytes(data)
    for lengths_only in (False, True):
        c = framing._cframing.scan(buf, start, verify, crc32c, 4096, lengths_only)
        py = framing._scan_python(buf, start, verify, crc32c, 4096, lengths_only)
        assert c == py
        if lengths_only:
            records = framing._scan_python(buf, start, verify, crc32c, 4096)[0]
            assert array("q", c[0]).tolist() == [len(r) for r in records]


def test_lengths_only_raises_the_same_damage(scanner: str) -> None:
    data = bytearray(RecordEncoder().encode_many([b"a" * 10, b"b" * 20, b"c" * 30, b"d"]))
    data[26 + 36 + 12] ^= 0xFF  # record 2's payload
    with pytest.raises(CorruptRecordError) as info:
        lengths_of([bytes(data)], url="mem://x")
    assert (info.value.which, info.value.record_index, info.value.offset) == ("payload", 2, 62)
    decoder = RecordDecoder(lengths_only=True, url="mem://x")
    with pytest.raises(CorruptRecordError):
        decoder.feed(bytes(data))
    assert decoder.lengths is not None and decoder.lengths.tolist() == [10, 20]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(
        st.sampled_from([0, 5, (64 << 10) - 17, 64 << 10, 100_000, (1 << 20) + 7]), max_size=5
    ),
    chunk=st.sampled_from([1, 11, 1000, 65536, 100_003, 1 << 20]),
    as_bytearray=st.booleans(),
)
def test_records_copied_straight_into_their_payload_where_the_end_is_known(
    scanner: str, sizes: list[int], chunk: int, as_bytearray: bool
) -> None:
    # end_offset known (an uncompressed object of known size): records of 64 KiB and more
    # that straddle chunks are copied into their payload object as they arrive, CRC fused
    assume(chunk > 1 or sum(sizes) < 300_000)  # (a feed per byte of megabytes: seconds each)
    payloads = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    data = RecordEncoder().encode_many(payloads)
    decoder = RecordDecoder(end_offset=len(data))
    out: list[bytes] = []
    reused = bytearray(chunk)
    for i in range(0, len(data), chunk):
        piece = data[i : i + chunk]
        if as_bytearray:  # a caller that reuses its read buffer must not corrupt records
            reused[: len(piece)] = piece
            out += decoder.feed(memoryview(reused)[: len(piece)])
            reused[:] = b"\xee" * len(reused)
        else:
            out += decoder.feed(piece)
        assert decoder.buffered_bytes <= len(data)
    decoder.close()
    assert out == payloads
    assert all(type(record) is bytes for record in out)


@pytest.mark.parametrize("where", ["payload", "footer"])
@pytest.mark.parametrize("chunk", [3, 4096, 65536])
def test_straight_copy_checks_the_crc_of_a_straddling_record(
    scanner: str, where: str, chunk: int
) -> None:
    big = bytes(range(256)) * 1000  # 256,000 bytes: copied straight into its payload
    data = bytearray(RecordEncoder().encode_many([b"small", big, b"after"]))
    damaged = 21 + 12 + (77_777 if where == "payload" else len(big) + 2)
    data[damaged] ^= 8
    chunks = [bytes(data[i : i + chunk]) for i in range(0, len(data), chunk)]
    with pytest.raises(CorruptRecordError) as info:
        decode_all(chunks, end_offset=len(data), url="f")
    assert (info.value.record_index, info.value.offset, info.value.which) == (1, 21, "payload")
    skipping = RecordDecoder(on_corrupt="skip", end_offset=len(data))
    out = [r for c in chunks for r in skipping.feed(c)]
    skipping.close()
    assert out == [b"small", b"after"]
    assert [e.offset for e in skipping.dropped] == [21]
    # verify_crc=False copies without checking (damage passes, as everywhere else)
    assert decode_all(chunks, end_offset=len(data), verify_crc=False)[0] == b"small"


def test_straight_copy_truncation_and_lengths_past_the_end(scanner: str) -> None:
    big = b"q" * 300_000
    data = RecordEncoder().encode_many([b"first", big])
    # the object ends inside the big record: what was fed is all there is
    decoder = RecordDecoder(url="f", end_offset=21 + 100_000)
    assert decoder.feed(data[: 21 + 50_000]) == [b"first"]
    with pytest.raises(TruncatedRecordError) as info:
        decoder.feed(data[21 + 50_000 : 21 + 100_000])
        decoder.close()
    assert (info.value.url, info.value.offset, info.value.record_index) == ("f", 21, 1)
    assert f"of {len(big)} bytes" in str(info.value)
    # fed in full but the stream stops short of the footer: truncation at close
    decoder = RecordDecoder(url="f", end_offset=len(data))
    assert decoder.feed(data[:-2]) == [b"first"]
    with pytest.raises(TruncatedRecordError, match=r"payload CRC \(2 of 4 bytes\)"):
        decoder.close()
    # a header claiming more than the object holds: refused before anything is allocated
    length = struct.pack("<Q", 1 << 40)
    header = length + struct.pack("<I", masked_crc32c(length))
    decoder = RecordDecoder(url="f", end_offset=1 << 20)
    with pytest.raises(TruncatedRecordError) as info:
        decoder.feed(header + b"x" * 100)
    assert info.value.offset == 0
    assert decoder.buffered_bytes == 0


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=70_000),
    cuts=st.lists(st.integers(min_value=0), max_size=6),
    start=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_fused_copy_and_crc_c_and_python_agree(data: bytes, cuts: list[int], start: int) -> None:
    fills = [(framing._new_payload_python, framing._fill_python)]
    if framing._cframing is not None:
        fills.append((framing._cframing.new_payload, framing._cframing.fill))
    for new_payload, fill in fills:
        payload = new_payload(len(data))
        crc, at = start, 0
        for piece in split_at(data, cuts):
            crc = fill(payload, at, piece, crc, True)
            at += len(piece)
        assert bytes(payload) == data
        assert crc == crc32c_package.crc32c(data, start)
        assert fill(payload, 0, data, 7, False) == 7
        with pytest.raises(ValueError):
            fill(payload, 1, data, 0, True)


@pytest.mark.skipif(not framing.accelerated, reason="the C scanner is not built")
@pytest.mark.parametrize(
    "size",
    # around the three-lane CRC's steps: 3 tiny lanes (192), 3 short lanes (768), 3 long
    # lanes (24576) and all three
    [
        0,
        1,
        8,
        191,
        192,
        193,
        255,
        767,
        768,
        769,
        959,
        960,
        961,
        1023,
        1024,
        1535,
        1536,
        24575,
        24576,
        24577,
        24576 + 768 + 192 + 5,
        # around the folding CRC's steps (VPCLMULQDQ, where the CPU has it): its 256-byte
        # minimum, four 64-byte registers, one, a 16-byte lane, the few bytes after
        257,
        271,
        272,
        319,
        320,
        335,
        336,
        511,
        512,
        527,
        10197,
        65536 + 64 + 16 + 7,
    ],
)
def test_the_c_crc_agrees_with_the_package_around_its_lanes(size: int) -> None:
    data = random.Random(size).randbytes(size)
    assert framing._cframing.masked_crc32c(data) == masked_crc32c(data)
    # every kernel this CPU can run, not only the one picked (software, three streams, folding)
    kernels = framing._cframing.crc32c_kernels(data)
    assert kernels == (crc32c(data),) * len(kernels)


@pytest.mark.skipif(not framing.accelerated, reason="the C scanner is not built")
@settings(max_examples=80, deadline=None)
@given(
    size=st.integers(min_value=0, max_value=3000),
    shift=st.integers(min_value=0, max_value=63),
    damage=st.integers(min_value=0),
    bit=st.integers(min_value=0, max_value=7),
)
def test_the_c_crc_finds_a_flipped_bit_anywhere_at_any_alignment(
    size: int, shift: int, damage: int, bit: int
) -> None:
    """The C CRC (folding or not) is the package's at any start in memory, and a record with
    one bit flipped anywhere in its payload is refused at its own offset (the span scan)."""
    rng = random.Random(size * 64 + shift)
    payload = rng.randbytes(size)
    assert framing._cframing.masked_crc32c(memoryview(b"\0" * shift + payload)[shift:]) == (
        masked_crc32c(payload)
    )
    before = RecordEncoder().encode(b"x" * shift)
    data = bytearray(before + RecordEncoder().encode(payload))
    if size:
        data[len(before) + 12 + damage % size] ^= 1 << bit
    rows, pos, status, _, _ = framing._cframing.scan(bytes(data), 0, True, None, 1 << 30, 3)
    assert (status, pos) == ((2, len(before)) if size else (0, len(data)))
    assert len(rows) == 3 * 8 * (1 + (not size))


@given(st.lists(st.binary(max_size=300), max_size=50))
def test_framed_bytes_is_what_the_records_take_in_the_stream(payloads: list[bytes]) -> None:
    """The Take events' byte counts: what the payloads take framed, the encoder's own bytes
    (C and pure Python, lists, tuples and slices, other buffers by their length)."""
    from streamrec.format.framing_python import framed_bytes as framed_bytes_python

    stream = b"".join(RecordEncoder().encode(p) for p in payloads)
    assert framing.framed_bytes(payloads) == len(stream)
    assert framing.framed_bytes(tuple(payloads)) == len(stream)
    assert framed_bytes_python(payloads) == len(stream)
    assert framing.framed_bytes([bytearray(p) for p in payloads[1:]]) == framing.framed_bytes(
        payloads[1:]
    )


def test_framed_bytes_refuses_what_has_no_length() -> None:
    with pytest.raises(TypeError):
        framing.framed_bytes([b"ab", 3])  # type: ignore[list-item]
