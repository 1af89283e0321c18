"""decode_batch and the framing on buffers of any item size, fuzz-compared across C and Python.

Both decoders must accept exactly the same inputs and give the same values or the same error
type: payloads that are buffers of non-byte items (``memoryview.cast("I")``, 2-d uint8 arrays)
included, and mutated Examples and SequenceExamples. A spec shape no payload can hold raises
FeatureError, never numpy's MemoryError / ValueError.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from streamrec.errors import FeatureError, FormatError
from streamrec.format import example as ex
from streamrec.format import framing
from streamrec.format.framing import RecordDecoder, RecordEncoder
from unit.test_example_batch import CEXAMPLE, IMAGE_SPEC, assert_same_outcome, read_payloads, run


def as_uint32_view(payload: bytes) -> Any:
    """The payload as a memoryview of 4-byte items (padded payloads only: 4 | len)."""
    return memoryview(payload).cast("I")


def as_rows(payload: bytes) -> Any:
    """The payload as a 2-d uint8 array (len / 4 rows of 4 bytes)."""
    return np.frombuffer(payload, dtype=np.uint8).reshape(-1, 4)


def as_strided(payload: bytes) -> Any:
    """A non-contiguous view of the payload's bytes."""
    doubled = np.zeros(2 * len(payload), dtype=np.uint8)
    doubled[::2] = np.frombuffer(payload, dtype=np.uint8)
    return doubled[::2]


def pad4(payload: bytes) -> bytes:
    """Unknown field 15 (a length-delimited blob) pads a payload to a multiple of 4 bytes."""
    while len(payload) % 4:
        payload += b"\x7a\x00"  # field 15, wire type 2, empty: ignored by both parsers
        if len(payload) % 4 == 1:
            payload += b"\x7a\x01\x00"
    return payload


CONVERTERS: list[Callable[[bytes], Any]] = [as_uint32_view, as_rows, as_strided, bytearray]
BYTES_SPEC: dict[str, ex.FeatureSpec] = {
    "image_raw": ex.FixedLenFeature(bytes, (1,)),
    "label": ex.VarLenFeature(np.int64),
    "blobs": ex.VarLenFeature(bytes),
}


@pytest.mark.parametrize("convert", CONVERTERS)
@pytest.mark.parametrize("spec", [IMAGE_SPEC, BYTES_SPEC])
def test_buffers_of_any_item_size_decode_like_bytes(
    convert: Callable[[bytes], Any], spec: dict[str, ex.FeatureSpec]
) -> None:
    payloads = [pad4(p) for p in read_payloads("plain/images.tfrecord")[:4]]
    expected = run(payloads, spec, False)
    assert expected[0] == "ok"
    buffers = [convert(p) for p in payloads]
    assert_same_outcome(run(buffers, spec, True), expected)  # was: wrong bytes or IndexError
    assert_same_outcome(run(buffers, spec, False), expected)


def test_a_huge_shape_raises_feature_error_before_allocating() -> None:
    payloads = read_payloads("plain/images.tfrecord")[:3]
    for spec in (
        {"label": ex.FixedLenFeature(np.int64, (1 << 40,))},
        {"image_raw": ex.RawFeature(np.uint8, (1 << 20, 1 << 20, 1 << 20))},
        {"image_raw": ex.FixedLenFeature(bytes, (1 << 30, 1 << 30))},
    ):
        for use_c in (True, False):
            outcome = run(payloads, spec, use_c)  # was: numpy's ValueError / MemoryError
            assert outcome[0] == "error" and outcome[1] is FeatureError, outcome
            assert "record 0 of the batch" in outcome[2]
        with pytest.raises(FeatureError):
            ex.decode(payloads[0], spec)


def test_a_huge_shape_with_a_short_record_later_names_that_record() -> None:
    long = ex.encode({"v": np.arange(100, dtype=np.int64)})
    short = ex.encode({"v": np.arange(3, dtype=np.int64)})
    spec = {"v": ex.FixedLenFeature(np.int64, (100,))}
    for use_c in (True, False):
        outcome = run([long, long, short], spec, use_c)
        assert outcome[0] == "error" and outcome[1] is FeatureError
        assert "record 2 of the batch" in outcome[2]


def mutate(rng: random.Random, payload: bytes) -> bytes:
    data = bytearray(payload)
    for _ in range(rng.choice([0, 1, 1, 2])):
        if not data:
            break
        at = rng.randrange(len(data))
        action = rng.choice([0, 0, 0, 1, 2, 3])
        if action == 0:
            data[at] ^= 1 << rng.randrange(8)
        elif action == 1:
            del data[at:]
        elif action == 2:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
        else:
            del data[at : at + rng.randint(1, 3)]
    return bytes(data)


def seeds() -> list[bytes]:
    examples = (
        read_payloads("plain/images.tfrecord")[:2] + read_payloads("plain/features.tfrecord")[:2]
    )
    sequence = ex.encode_sequence(
        {"label": 3, "name": b"abc"},
        {"frames": [1, 2, 3], "scores": [[0.5, 1.5], []], "tokens": [[b"a", b"bc"], [b"d"]]},
    )
    return [*examples, sequence]


FUZZ_SPECS: list[dict[str, ex.FeatureSpec]] = [
    IMAGE_SPEC,
    BYTES_SPEC,
    {"label": ex.FixedLenFeature(np.int64, default=-1), "name": ex.VarLenFeature(bytes)},
    {"label": ex.VarLenFeature(np.float32), "name": ex.FixedLenFeature(bytes, default="")},
]


@pytest.mark.skipif(CEXAMPLE is None, reason="the C accelerator is not built")
def test_fuzz_c_and_python_decoders_agree_on_mutated_examples() -> None:
    rng = random.Random(13)
    pool = seeds()
    for round_ in range(1500):
        batch = [mutate(rng, rng.choice(pool)) for _ in range(rng.randint(1, 3))]
        if round_ % 3 == 0:
            batch = [pad4(p) for p in batch]
            convert = rng.choice(CONVERTERS)
            batch = [convert(p) for p in batch]
        spec = FUZZ_SPECS[round_ % len(FUZZ_SPECS)]
        assert_same_outcome(run(batch, spec, True), run(batch, spec, False))


def frame_all(scan: object, chunks: list[Any]) -> tuple[Any, ...]:
    """Records, error (type, offset, index) and drops of decoding ``chunks`` with ``scan``."""
    saved = framing._scan
    framing._scan = scan  # type: ignore[assignment]
    try:
        outcomes = []
        for on_corrupt in ("raise", "skip"):
            decoder = RecordDecoder(on_corrupt=on_corrupt)  # type: ignore[arg-type]
            out: list[bytes] = []
            error: tuple[Any, ...] = ()
            try:
                for chunk in chunks:
                    out += decoder.feed(chunk)
                    decoder.raise_pending()
                decoder.close()
            except FormatError as exc:
                error = (type(exc), exc.offset, exc.record_index, str(exc))
            drops = [(type(e), e.offset, e.record_index) for e in decoder.dropped]
            outcomes.append((out, error, drops))
        return tuple(outcomes)
    finally:
        framing._scan = saved


@pytest.mark.skipif(not framing.accelerated, reason="the C scanner is not built")
def test_fuzz_c_and_python_framing_agree() -> None:
    rng = random.Random(8)
    encoder = RecordEncoder()
    for round_ in range(800):
        payloads = [rng.randbytes(rng.choice([0, 1, 7, 40, 300])) for _ in range(rng.randint(1, 6))]
        data = mutate(rng, encoder.encode_many(payloads)) if round_ % 4 else b""
        data = data or encoder.encode_many(payloads)
        cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randint(0, 4)))
        chunks: list[Any] = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        if round_ % 5 == 0:  # buffers of 4-byte items: framed by their bytes
            chunks = [memoryview(c).cast("I") if len(c) % 4 == 0 and c else c for c in chunks]
        c = frame_all(framing._scan, chunks)
        python = frame_all(framing._scan_python, chunks)
        assert c == python
        if round_ % 5 == 0:
            assert c == frame_all(framing._scan, [bytes(memoryview(x)) for x in chunks])
