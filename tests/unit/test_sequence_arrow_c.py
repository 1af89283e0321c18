"""decode_sequence_batch's feature lists decoded in C (``_cexample.parse_sequence_arrow``) give
exactly the Arrow batch of the pure-Python path (protobuf, record by record), and a batch the C
parser declines gives the Python path's error: SequenceExamples written here on the wire by
hand (packed and unpacked numbers, kind-less steps, unknown fields, split and repeated lists,
wrong kinds and counts, damaged bytes)."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrec.errors import ExampleError, StreamrecError
from streamrec.example import (
    FeatureSpec,
    FixedLenFeature,
    RawFeature,
    VarLenFeature,
    decode_sequence_batch,
)
from streamrec.format.example import arrow, batch
from streamrec.format.payload import RecordSpans

pytestmark = pytest.mark.skipif(
    not hasattr(batch._cexample, "parse_sequence_arrow"), reason="C parser not built"
)

CONTEXT: dict[str, FeatureSpec] = {"label": FixedLenFeature(np.int64, (), default=0)}
SEQUENCE: dict[str, FeatureSpec] = {
    "f": FixedLenFeature(np.float32, (2,)),
    "i": FixedLenFeature(np.int64),
    "z": FixedLenFeature(np.int64, (0,)),
    "b": FixedLenFeature(bytes, (2,)),
    "vi": VarLenFeature(np.int64),
    "vf": VarLenFeature(np.float32),
    "vb": VarLenFeature(bytes),
    "r": RawFeature(np.dtype(">i2"), (2,)),
    "u": RawFeature(np.uint8, (3,)),
}
# the kind and value count a step of each list must have (None: any count)
WANT = {
    "f": ("float", 2),
    "i": ("int", 1),
    "z": ("int", 0),
    "b": ("bytes", 2),
    "vi": ("int", None),
    "vf": ("float", None),
    "vb": ("bytes", None),
    "r": ("bytes", 1),
    "u": ("bytes", 1),
}
RAW_BYTES = {"r": 4, "u": 3}


def varint(value: int) -> bytes:
    value &= 2**64 - 1
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def delimited(field: int, body: bytes) -> bytes:
    return tag(field, 2) + varint(len(body)) + body


def feature(kind: str, values: list[Any], packed: bool, unknown: bool) -> bytes:
    """A ``Feature`` message on the wire (kind "none": no kind field)."""
    extra = tag(9, 0) + varint(7) if unknown else b""  # an unknown field, skipped
    if kind == "none":
        return extra
    if kind == "bytes":
        return extra + delimited(1, b"".join(delimited(1, value) for value in values))
    if kind == "int":
        if packed:
            body = delimited(1, b"".join(varint(value) for value in values))
        else:
            body = b"".join(tag(1, 0) + varint(value) for value in values)
        return extra + delimited(3, body)
    if packed:
        body = delimited(1, struct.pack(f"<{len(values)}f", *values))
    else:
        body = b"".join(tag(1, 5) + struct.pack("<f", value) for value in values)
    return extra + delimited(2, body)


@st.composite
def step(draw: st.DrawFn, name: str) -> bytes:
    kind, count = WANT[name]
    if draw(st.integers(0, 15)) == 0:  # now and then a step that may not fit its spec
        kind = draw(st.sampled_from(["int", "float", "bytes", "none"]))
        count = draw(st.integers(0, 3))
    if count is None:
        count = draw(st.integers(0, 3))
    if kind == "none":
        values: list[Any] = []
    elif kind == "int":
        values = draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=count, max_size=count))
    elif kind == "float":
        values = draw(
            st.lists(st.floats(width=32, allow_nan=False), min_size=count, max_size=count)
        )
    else:
        size = st.just(RAW_BYTES[name]) if name in RAW_BYTES else st.integers(0, 4)
        values = [draw(st.binary(min_size=n, max_size=n)) for n in [draw(size)] * count]
    return feature(kind, values, draw(st.booleans()), draw(st.integers(0, 7)) == 0)


@st.composite
def sequence_example(draw: st.DrawFn) -> bytes:
    context = b""
    if draw(st.booleans()):
        entry = delimited(1, b"label") + delimited(
            2, feature("int", [draw(st.integers())], True, False)
        )
        context = delimited(1, delimited(1, entry))
    entries = []
    names = draw(st.lists(st.sampled_from([*SEQUENCE, "other"]), max_size=5))  # repeats too
    for name in names:
        spec_name = name if name in SEQUENCE else "vb"
        steps = draw(st.lists(step(spec_name), max_size=3))
        body = b"".join(delimited(1, s) for s in steps)
        if draw(st.integers(0, 7)) == 0:
            body += tag(5, 0) + varint(1)  # an unknown field in a FeatureList
        entries.append(delimited(1, delimited(1, name.encode()) + delimited(2, body)))
    cut = draw(st.integers(0, len(entries)))  # feature_lists given in one or two parts
    lists = [b"".join(entries[:cut]), b"".join(entries[cut:])]
    payload = context + b"".join(delimited(2, part) for part in lists if part)
    if draw(st.integers(0, 5)) == 0 and payload:  # damaged: cut short or a byte changed
        at = draw(st.integers(0, len(payload) - 1))
        if draw(st.booleans()):
            payload = payload[:at]
        else:
            payload = payload[:at] + bytes([draw(st.integers(0, 255))]) + payload[at + 1 :]
    return payload


@contextlib.contextmanager
def pure_python() -> Iterator[None]:
    saved = batch._cexample
    batch._cexample = None  # the one place the C parser is looked up
    try:
        yield
    finally:
        batch._cexample = saved


def outcome(payloads: Any) -> tuple[str, Any]:
    try:
        return "batch", decode_sequence_batch(payloads, CONTEXT, SEQUENCE)
    except StreamrecError as error:
        return "error", (type(error), str(error), getattr(error, "batch_index", None))


def assert_same(payloads: list[bytes]) -> tuple[str, Any]:
    with pure_python():
        expected = outcome(payloads)
    for given_as in (payloads, [bytearray(p) for p in payloads], RecordSpans.of_payloads(payloads)):
        got = outcome(given_as)
        assert got[0] == expected[0], (got, expected)
        if got[0] == "error":
            assert got[1] == expected[1]
        else:
            assert got[1].schema == expected[1].schema
            assert got[1].equals(expected[1]), (got[1].to_pylist(), expected[1].to_pylist())
    return expected


@settings(max_examples=20, deadline=None)
@given(st.lists(sequence_example(), max_size=5))
def test_c_and_python_paths_agree(payloads: list[bytes]) -> None:
    assert_same(payloads)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(st.lists(sequence_example(), max_size=5))
def test_c_and_python_paths_agree_at_length(payloads: list[bytes]) -> None:
    assert_same(payloads)


def test_valid_lists_are_decoded_in_c() -> None:
    steps = {
        "f": [
            feature("float", [1.5, -2.0], False, False),
            feature("float", [0.0, 3.0], True, True),
        ],
        "i": [feature("int", [-1], False, False)],
        "z": [feature("none", [], True, False), feature("int", [], True, False)],
        "b": [feature("bytes", [b"", b"xy"], True, False)],
        "vi": [
            feature("int", [2**63 - 1, -(2**63)], True, False),
            feature("none", [], True, False),
        ],
        "vf": [feature("float", [], True, False)],
        "vb": [feature("bytes", [b"a", b"\x00"], True, False)],
        "r": [feature("bytes", [b"\x01\x02\x03\x04"], True, False)],
        "u": [feature("bytes", [b"abc"], True, True)],
    }
    entries = b"".join(
        delimited(
            1, delimited(1, name.encode()) + delimited(2, b"".join(delimited(1, s) for s in found))
        )
        for name, found in steps.items()
    )
    payloads = [delimited(2, entries), b"", delimited(2, entries[: len(entries) // 2 * 0])]
    items = list(SEQUENCE.items())
    parsed = batch.parse_sequence_c(payloads, items, arrow.allocate)
    assert parsed is not None  # the C parser took the batch
    counts, _ = parsed
    assert [c.tolist() for c in counts] == [[len(steps[n]), 0, 0] for n in SEQUENCE]
    kind, result = assert_same(payloads)
    assert kind == "batch"
    assert result.column("r").to_pylist()[0] == [[0x0102, 0x0304]]  # big-endian, as the dtype says
    assert result.column("vi").to_pylist()[0] == [[2**63 - 1, -(2**63)], []]
    for damaged in (b"\x12\x05\x0a\x03", delimited(2, delimited(1, delimited(1, b"\xff")))):
        assert batch.parse_sequence_c([damaged], items, arrow.allocate) is None
        kind, (error_type, message, index) = assert_same([payloads[0], damaged])
        assert kind == "error" and error_type is ExampleError
        assert index == 1 and "record 1 of the batch" in message


def test_float_bits_are_kept() -> None:
    """A signalling NaN keeps its bits in C as in the Python path (where ``equals`` cannot
    tell: NaN is not equal to itself)."""
    bits = [0x7F800001, 0xFFC00000, 0x00000001, 0x80000000]
    values = b"".join(struct.pack("<I", b) for b in bits)
    step = delimited(2, delimited(1, values))  # a FloatList, packed, by its bits
    entry = delimited(1, b"vf") + delimited(2, delimited(1, step) + delimited(1, step[:0]))
    payloads = [delimited(2, delimited(1, entry))]
    assert batch.parse_sequence_c(payloads, list(SEQUENCE.items()), arrow.allocate) is not None

    def leaf_bits(result: Any) -> list[int]:
        floats = result.column("vf").flatten().flatten()
        return np.asarray(floats).view(np.uint32).tolist()  # type: ignore[no-any-return]

    got = decode_sequence_batch(payloads, CONTEXT, SEQUENCE)
    with pure_python():
        expected = decode_sequence_batch(payloads, CONTEXT, SEQUENCE)
    assert leaf_bits(got) == leaf_bits(expected) == bits
    assert got.column("vf").to_pylist()[0][1] == []  # the kind-less second step: no values
