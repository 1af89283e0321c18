"""Records read in place (``RecordSpans``): the framing's spans equal its copies, the batch
decoder reads spans as it reads bytes, and ``parse().batch()`` over them equals decoding the
records one list at a time (resume, skip and gzip included). Without the C accelerator
(``STREAMREC_PURE_PYTHON=1``) the same checks hold on the bytes path."""

from __future__ import annotations

import asyncio
import gzip
import random
from collections.abc import Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streamrec
import streamrec.sync
from streamrec.errors import CorruptRecordError
from streamrec.example import (
    FeatureSpec,
    FixedLenFeature,
    RawFeature,
    VarLenFeature,
    decode_batch,
    encode,
)
from streamrec.format.example import batch as example_batch
from streamrec.format.framing import RecordEncoder, accelerated, framed_bytes
from streamrec.format.payload import RecordRef, RecordSpans
from streamrec.format.shard import ShardDecoder

SIZES = [0, 5, 300, 70_000, 1_200_000, 17, 1024]  # empty, small, direct-copied, big, ...


def _payloads(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(SIZES[i % len(SIZES)]) for i in range(count)]


def _decoded(data: bytes, cuts: Sequence[int], spans: bool, skip: bool = False) -> Any:
    decoder = ShardDecoder(
        compression=None, size=len(data), spans=spans, on_corrupt="skip" if skip else "raise"
    )
    chunks: list[Sequence[bytes]] = []
    for start, stop in zip([0, *cuts], [*cuts, len(data)], strict=True):
        chunks.append(decoder.feed(data[start:stop]))
    chunks.append(decoder.close())
    drops = [(type(e), e.offset, e.record_index) for e in decoder.dropped]
    return chunks, drops


@pytest.mark.parametrize("seed", range(4))
def test_spans_are_the_records_the_copies_are(seed: int) -> None:
    payloads = _payloads(seed, 40)
    data = RecordEncoder().encode_many(payloads)
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(data)), 12))
    copied, _ = _decoded(data, cuts, spans=False)
    in_place, _ = _decoded(data, cuts, spans=True)
    assert [bytes(r) for c in in_place for r in c] == [r for c in copied for r in c] == payloads
    assert [len(c) for c in in_place] == [len(c) for c in copied]
    assert sum(map(framed_bytes, in_place)) == len(data)
    # (with the C scanner, records framed inside one fed chunk stay in it)
    assert any(isinstance(c, RecordSpans) for c in in_place) == accelerated


@pytest.mark.skipif(not accelerated, reason="spans come from the C scanner")
def test_the_scan_rows_are_its_pairs_with_buffer_zero() -> None:
    from streamrec.format import _cframing  # type: ignore[attr-defined]

    payloads = _payloads(3, 25)
    data = b"xyz" + RecordEncoder().encode_many(payloads) + b"\x01\x02"  # a head, a partial tail
    pairs, *pos2 = _cframing.scan(data, 3, True, None, 1 << 30, 2)
    rows, *pos3 = _cframing.scan(data, 3, True, None, 1 << 30, 3)
    assert pos2 == pos3 and pos3[0] == len(data) - 2
    found = np.frombuffer(rows, dtype=np.int64).reshape(-1, 3)
    assert (found[:, 0] == 0).all()
    assert (found[:, 1:] == np.frombuffer(pairs, dtype=np.int64).reshape(-1, 2)).all()
    spans = RecordSpans.in_buffer(data, rows)
    assert list(spans) == payloads and not spans.spans.flags.writeable


def test_a_damaged_payload_is_skipped_alike() -> None:
    payloads = _payloads(7, 30)
    data = bytearray(RecordEncoder().encode_many(payloads))
    data[12 + 2] ^= 0xFF  # record 0's payload
    hit = len(RecordEncoder().encode_many(payloads[:9])) + 12 + 3
    data[hit] ^= 0xFF  # record 9's payload
    cuts = [len(data) // 3, len(data) // 2]
    copied, copied_drops = _decoded(bytes(data), cuts, spans=False, skip=True)
    in_place, drops = _decoded(bytes(data), cuts, spans=True, skip=True)
    expected = [p for i, p in enumerate(payloads) if i not in (0, 9)]
    assert [r for c in in_place for r in c] == [r for c in copied for r in c] == expected
    assert drops == copied_drops
    assert [d[2] for d in drops] == [0, 9] and drops[0][0] is CorruptRecordError


def test_record_spans_behave_as_a_sequence_of_bytes() -> None:
    buffers = [b"..abc..de", b"fghij"]
    spans = RecordSpans(buffers, np.array([[0, 2, 3], [0, 7, 2], [1, 0, 5]], dtype=np.int64))
    assert list(spans) == [b"abc", b"de", b"fghij"] and spans[-1] == b"fghij"
    assert isinstance(spans[1:], RecordSpans) and list(spans[1:]) == [b"de", b"fghij"]
    assert list(spans[::2]) == [b"abc", b"fghij"] and list(spans[::-1]) == [b"fghij", b"de", b"abc"]
    assert spans.framed_bytes() == 10 + 3 * 16 == framed_bytes(spans)
    assert spans.shortest() == 2 and RecordSpans([], spans.spans[:0]).shortest() > 2**60
    joined = RecordSpans.join([spans[2:], [b"xy"], spans[:1]])
    assert (
        list(joined) == [b"fghij", b"xy", b"abc"] and len(joined.buffers) == 3
    )  # each buffer once
    tail = spans[2:].compact()
    assert tail.buffers == [b"fghij"] and list(tail) == [b"fghij"]
    assert joined.find(spans.ref(0)) == 2 and joined.find(RecordRef(b"abc", 0)) is None
    assert joined.find(b"abc") is None and "3 records in 2 buffers" in repr(spans)


SPEC: dict[str, FeatureSpec] = {
    "data": RawFeature(np.uint8, (48,)),
    "label": FixedLenFeature(np.int64),
    "name": FixedLenFeature(bytes),
    "tags": VarLenFeature(np.int64),
    "words": VarLenFeature(bytes),
}


def _example(i: int) -> bytes:
    return encode(
        {
            "data": bytes(range(i % 200, i % 200 + 48)),
            "label": np.array([i], dtype=np.int64),
            "name": f"record-{i}".encode(),
            "tags": np.arange(i % 5, dtype=np.int64),
            "words": [b"w"] * (i % 3),
        }
    )


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], list):
            assert len(a[key]) == len(b[key])
            for x, y in zip(a[key], b[key], strict=True):
                assert np.array_equal(np.asarray(x), np.asarray(y))
        else:
            assert np.array_equal(a[key], b[key]), key


def test_decode_batch_reads_spans_as_it_reads_bytes() -> None:
    payloads = [_example(i) for i in range(50)]
    data = RecordEncoder().encode_many(payloads)
    chunk = ShardDecoder(compression=None, spans=True).feed(data)
    assert isinstance(chunk, RecordSpans) == accelerated
    _same(decode_batch(chunk[3:40], SPEC), decode_batch(payloads[3:40], SPEC))
    _same(decode_batch(chunk[40:3:-3], SPEC), decode_batch(payloads[40:3:-3], SPEC))
    pytest.importorskip("pyarrow")
    arrow = decode_batch(chunk[3:40], SPEC, to="arrow")
    assert arrow.equals(decode_batch(payloads[3:40], SPEC, to="arrow"))


def test_the_c_parser_refuses_spans_outside_their_buffers() -> None:
    c = example_batch._cexample
    if c is None:
        pytest.skip("no C parser in this build")
    spec = [(b"label", 0, 1, np.empty(1, dtype=np.int64), None, None)]
    for bad in ([0, 2, 9], [1, 0, 1], [0, -1, 1], [0, 0, -1]):
        with pytest.raises(ValueError, match="outside its buffer"):
            c.parse_examples([b"12345678"], spec, np.array(bad, dtype=np.int64))
    with pytest.raises(TypeError):
        c.parse_examples([bytearray(8)], spec, np.array([0, 0, 1], dtype=np.int64))
    # spans are int64 triples, nothing else reinterpreted as them
    for wrong in (
        np.array([0, 0, 1], dtype=np.float64),
        np.array([0, 0, 1], dtype=np.int32),
        np.array([0, 0, 1, 0], dtype=np.int64),
    ):
        with pytest.raises(ValueError, match="int64"):
            c.parse_examples([b"12345678"], spec, wrong)


def test_many_damaged_records_keep_one_buffer_each() -> None:
    # skipping a bad record joins the records around it: each fed buffer is held once (not
    # once per drop: joining each part to all before it made a shard of many bad records
    # quadratic in time and in buffer references)
    encoder = RecordEncoder()
    bad = bytearray(encoder.encode(b"b"))
    bad[-1] ^= 1
    data = (encoder.encode(b"a") + bytes(bad)) * 500
    decoder = ShardDecoder(compression=None, size=len(data), spans=True, on_corrupt="skip")
    records = decoder.feed(data)
    decoder.close()
    assert list(records) == [b"a"] * 500 and len(decoder.dropped) == 500
    if isinstance(records, RecordSpans):
        assert len(records.buffers) == 1


def test_a_bad_example_after_a_large_record_is_still_placed(tmp_path: Path) -> None:
    # a batch's leftover records in place joined with a chunk of copies (a large record
    # completes in it): the bad record still names its shard and offset
    spec = {"id": FixedLenFeature(np.int64), "b": VarLenFeature(np.int64)}
    payloads = [
        encode({"id": np.array([i]), "b": np.zeros(300_000 if i == 3 else 4, dtype=np.int64)})
        for i in range(8)
    ]
    payloads[1] = b"\xff\xff\xff not an Example"
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(b"".join(RecordEncoder().encode(p) for p in payloads))
    for n in (4, 8):
        with pytest.raises(streamrec.errors.ExampleError, match=r"bad\.tfrecord at byte offset 46"):
            for _ in streamrec.open_dataset([str(path)]).parse(spec).batch(n):
                pass


def _shards(tmp_path: Path) -> tuple[str, list[bytes]]:
    """Three shards (one gzip) of Examples; a few large records among them."""
    payloads = [_example(i) for i in range(3000)]
    payloads[1500] = encode({"data": bytes(48), "label": np.array([7]), "name": b"x" * 200_000})
    for k, part in enumerate((payloads[:1400], payloads[1400:2200], payloads[2200:])):
        path = tmp_path / f"part-{k}.tfrecord"
        with streamrec.sync.open_writer(str(path)) as writer:
            writer.write_many(part)
        if k == 1:
            path.with_suffix(".tfrecord.gz").write_bytes(gzip.compress(path.read_bytes()))
            path.unlink()
    return str(tmp_path), payloads


def _stacked(batches: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in batches[0]:
        parts = [b[key] for b in batches]
        out[key] = list(chain(*parts)) if isinstance(parts[0], list) else np.concatenate(parts)
    return out


def test_parse_batch_in_place_equals_decoding_the_records(tmp_path: Path) -> None:
    root, payloads = _shards(tmp_path)
    want = decode_batch(payloads, SPEC)
    ds = streamrec.open_dataset(root, block_bytes=64 << 10)
    _same(_stacked(list(ds.parse(SPEC).batch(97))), want)

    async def read() -> tuple[list[dict[str, Any]], set[type]]:
        batches = [b async for b in ds.parse(SPEC).batch(256)]
        kinds = {type(c) async for c in ds.record_chunks(in_place=True)}
        return batches, kinds

    batches, kinds = asyncio.run(read())
    _same(_stacked(batches), want)
    assert (RecordSpans in kinds) == accelerated  # (inflated pieces too)
    rows = list(ds.parse(SPEC))
    assert [int(r["label"]) for r in rows[:3]] == [0, 1, 2] and len(rows) == len(payloads)


def test_parse_batch_in_place_resumes_exactly(tmp_path: Path) -> None:
    root, payloads = _shards(tmp_path)
    chain = streamrec.open_dataset(root, block_bytes=64 << 10).parse(SPEC).batch(100)
    it = iter(chain)
    first = [next(it) for _ in range(17)]  # into the gzip shard
    state = chain.state_dict()
    it.close()  # type: ignore[attr-defined]
    fresh = streamrec.open_dataset(root, block_bytes=64 << 10).parse(SPEC).batch(100)
    fresh.load_state_dict(state)
    _same(_stacked(first + list(fresh)), decode_batch(payloads, SPEC))
