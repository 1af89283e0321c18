"""decode_batch: the C parser and the pure-Python path agree with each other and with decode().

Every test here runs on both paths (the ``path`` fixture), and the property tests compare the
two paths directly, on canonical Examples (encode), on hand-built wire-format variants
(unpacked and split repeated fields, unknown fields, duplicate keys, ...) and on damaged bytes.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf.internal import api_implementation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrec.errors import ExampleError, FeatureError
from streamrec.format import example as ex
from streamrec.format.example import batch as example_batch
from support.corpus import CORPUS_DIR

# The C parser, looked up in one place: example_batch._cexample (set to None for the Python path).
CEXAMPLE = example_batch._cexample
# protobuf's pure-Python backend turns every NaN it parses into the canonical quiet NaN (the
# C parser and the default upb backend keep the bits): compare NaNs loosely there.
CANONICAL_NANS = api_implementation.Type() == "python"
PATHS = ["c", "python"] if CEXAMPLE is not None else ["python"]


def corpus_path() -> Path:
    """The reference corpus the project carries (tests/data/corpus)."""
    return CORPUS_DIR


def read_payloads(rel: str) -> list[bytes]:
    """8-byte length, 4 CRC, payload, 4 CRC: a tiny TFRecord reader for the corpus."""
    data = (corpus_path() / rel).read_bytes()
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        out.append(data[pos + 12 : pos + 12 + length])
        pos += 16 + length
    return out


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test with the C parser and again with the pure-Python path."""
    if request.param == "python":
        monkeypatch.setattr(example_batch, "_cexample", None)
        assert not ex.has_c_accelerator()
    yield request.param


class Spy:
    """Counts how often the C parser decoded a batch itself (did not hand it back)."""

    def __init__(self) -> None:
        self.decoded = 0
        self.declined = 0

    def parse_examples(self, payloads: Any, specs: Any) -> Any:
        result = CEXAMPLE.parse_examples(payloads, specs)
        if result is None:
            self.declined += 1
        else:
            self.decoded += 1
        return result


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    if CEXAMPLE is None:
        pytest.skip("the C accelerator is not built")
    spy = Spy()
    monkeypatch.setattr(example_batch, "_cexample", spy)
    return spy


def run(payloads: Sequence[bytes], spec: Mapping[str, ex.FeatureSpec], use_c: bool) -> Any:
    """decode_batch on one path: ("ok", result) or ("error", type, message)."""
    saved = example_batch._cexample
    example_batch._cexample = CEXAMPLE if use_c else None
    try:
        assert use_c or not ex.has_c_accelerator()  # the Python path really runs
        return ("ok", ex.decode_batch(payloads, spec))
    except (ExampleError, TypeError, ValueError) as exc:
        return ("error", type(exc), str(exc))
    finally:
        example_batch._cexample = saved


def assert_same_value(a: Any, b: Any) -> None:
    """Equal type, dtype, shape and bits (NaN payloads included)."""
    assert type(a) is type(b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.dtype == object:
            assert a.tolist() == b.tolist()
            assert all(type(v) is bytes for v in a.reshape(-1))
        elif CANONICAL_NANS and a.dtype == np.float32:
            nan = np.float32("nan")
            assert (
                np.where(np.isnan(a), nan, a).tobytes() == np.where(np.isnan(b), nan, b).tobytes()
            )
        else:
            assert a.tobytes() == b.tobytes()
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            if isinstance(x, bytes):
                assert type(y) is bytes and x == y
            else:
                assert_same_value(x, y)
    else:
        raise AssertionError(f"unexpected value {a!r}")


def assert_same_outcome(a: Any, b: Any) -> None:
    assert a[0] == b[0], (a, b)
    if a[0] == "error":
        assert a[1:] == b[1:]
        return
    assert list(a[1]) == list(b[1])
    for name in a[1]:
        assert_same_value(a[1][name], b[1][name])


def stacked_decode(payloads: Sequence[bytes], spec: Mapping[str, ex.FeatureSpec]) -> dict[str, Any]:
    """What decode_batch must equal: per-record decode(), stacked."""
    rows = [ex.decode(p, spec) for p in payloads]
    out: dict[str, Any] = {}
    for name, entry in spec.items():
        values: list[Any] = [row[name] for row in rows]
        if isinstance(entry, ex.VarLenFeature):
            out[name] = values
        else:
            dtype = entry._dtype if isinstance(entry, ex.RawFeature) else values[0].dtype
            stacked = np.empty((len(values), *entry.shape), dtype=dtype)
            for i, v in enumerate(values):
                stacked[i, ...] = v
            out[name] = stacked
    return out


# ------------------------------------------------------------------ corpus and basics

IMAGE_SPEC: dict[str, ex.FeatureSpec] = {
    "image_raw": ex.RawFeature(np.uint8, (32, 32, 3)),
    "label": ex.FixedLenFeature(np.int64),
    "bbox": ex.FixedLenFeature(np.float32, (4,)),
    "absent": ex.FixedLenFeature(np.float32, (2,), default=[1.0, -0.0]),
    "absent_b": ex.FixedLenFeature(bytes, (), default="d"),
    "absent_v": ex.VarLenFeature(np.float32),
    "absent_vb": ex.VarLenFeature(bytes),
}
BYTES_SPECS: list[dict[str, ex.FeatureSpec]] = [
    {"image_raw": ex.VarLenFeature(bytes), "label": ex.VarLenFeature(np.int64)},
    {"image_raw": ex.FixedLenFeature(bytes, (1,)), "bbox": ex.VarLenFeature(np.float32)},
]


def test_images_batch_equals_decode(path: str) -> None:
    payloads = read_payloads("plain/images.tfrecord")
    got: Any = ex.decode_batch(payloads, IMAGE_SPEC)
    expected = stacked_decode(payloads, IMAGE_SPEC)
    assert_same_outcome(("ok", got), ("ok", expected))
    assert got["image_raw"].shape == (50, 32, 32, 3)
    assert got["absent_b"].dtype == object and got["absent_b"][0] == b"d"
    assert got["absent"][7].view(np.uint32).tolist() == [0x3F800000, 0x80000000]
    image: Any = ex.decode(payloads[9])["image_raw"][0]
    assert got["image_raw"][9].tobytes() == image
    assert got["absent_vb"] == [[]] * 50
    var, fixed = (ex.decode_batch(payloads, spec) for spec in BYTES_SPECS)
    assert isinstance(fixed["image_raw"], np.ndarray)
    assert var["image_raw"][9] == [image] and fixed["image_raw"][9, 0] == image
    assert fixed["image_raw"].shape == (50, 1) and var["label"][9].tolist() == [got["label"][9]]
    for spec in BYTES_SPECS:
        assert_same_outcome(
            ("ok", ex.decode_batch(payloads, spec)), ("ok", stacked_decode(payloads, spec))
        )


def test_c_path_is_used(spy: Spy) -> None:
    payloads = read_payloads("plain/images.tfrecord")
    ex.decode_batch(payloads, IMAGE_SPEC)
    for spec in BYTES_SPECS:
        ex.decode_batch(payloads, spec)
    ticks = read_payloads("plain/tiny_20k.tfrecord")
    got: Any = ex.decode_batch(ticks, {"tick": ex.FixedLenFeature(np.int64)})
    assert got["tick"].tolist() == list(range(-500, 19500))
    assert spy.decoded == 4 and spy.declined == 0


def test_tiny_and_sharded(path: str) -> None:
    ticks = read_payloads("plain/tiny_20k.tfrecord")
    got: Any = ex.decode_batch(ticks, {"tick": ex.FixedLenFeature(np.int64, (1,))})
    assert got["tick"].shape == (20000, 1)
    assert got["tick"][:, 0].tolist() == list(range(-500, 19500))
    shards = [p for s in range(5) for p in read_payloads(f"sharded/data-{s:05d}-of-00005.tfrecord")]
    got = ex.decode_batch(shards, {"idx": ex.FixedLenFeature(np.int64)})
    assert got["idx"].tolist() == list(range(15))


def test_features_corpus_var_len(path: str) -> None:
    payloads = read_payloads("plain/features.tfrecord")
    spec: dict[str, ex.FeatureSpec] = {
        "readings": ex.VarLenFeature(np.float32),
        "offsets": ex.VarLenFeature(np.int64),
        "tags": ex.VarLenFeature(bytes),
        "unset_kind": ex.VarLenFeature(np.float32),
    }
    got: Any = ex.decode_batch(payloads, spec)
    assert_same_outcome(("ok", got), ("ok", stacked_decode(payloads, spec)))
    if not CANONICAL_NANS or (CEXAMPLE is not None and path == "c"):
        assert got["readings"][2].view(np.uint32).tolist()[-1] == 0xFFC00000


def test_empty_batch(path: str) -> None:
    got: Any = ex.decode_batch([], IMAGE_SPEC)
    assert got["image_raw"].shape == (0, 32, 32, 3)
    assert got["label"].shape == (0,) and got["absent_vb"] == []
    assert ex.decode_batch([b"", b"\n\x00"], {}) == {}


def test_buffer_payloads(path: str) -> None:
    payloads = read_payloads("plain/images.tfrecord")[:5]
    expected = ex.decode_batch(payloads, IMAGE_SPEC)
    for convert in (memoryview, bytearray):
        views = tuple(convert(p) for p in payloads)
        assert_same_outcome(("ok", ex.decode_batch(views, IMAGE_SPEC)), ("ok", expected))  # type: ignore[arg-type]


BATCH_ERRORS = [
    ({"label": ex.FixedLenFeature(np.int64, (2,))}, "'label'", "expected 2 int64 values"),
    ({"label": ex.FixedLenFeature(np.float32)}, "'label'", "got int64_list"),
    ({"nope": ex.FixedLenFeature(np.int64)}, "'nope'", "missing"),
    ({"image_raw": ex.RawFeature(np.uint8, (32, 32))}, "'image_raw'", "expected 1024 bytes"),
    ({"bbox": ex.RawFeature(np.uint8, (4,))}, "'bbox'", "got float_list"),
    ({"nope": ex.RawFeature(np.uint8, (4,))}, "'nope'", "missing"),
    ({"bbox": ex.VarLenFeature(bytes)}, "'bbox'", "expected bytes_list (bytes), got float_list"),
    ({"image_raw": ex.FixedLenFeature(bytes, (2,))}, "'image_raw'", "expected 2 bytes values"),
]


@pytest.mark.parametrize(("spec", "name", "problem"), BATCH_ERRORS)
def test_batch_errors_name_feature_and_record(
    path: str, spec: dict[str, ex.FeatureSpec], name: str, problem: str
) -> None:
    payloads = read_payloads("plain/images.tfrecord")[:3]
    with pytest.raises(FeatureError) as info:
        ex.decode_batch(payloads, spec)
    message = str(info.value)
    assert name in message and problem in message and "record 0 of the batch" in message
    assert info.value.feature == name.strip("'")


def test_batch_error_in_a_later_record(path: str) -> None:
    payloads = read_payloads("plain/images.tfrecord")[:4]
    payloads[2] = ex.encode({"label": [1, 2], "image_raw": bytes(3072), "bbox": [0.0] * 4})
    with pytest.raises(FeatureError, match=r"feature 'label': record 2 of the batch: expected 1"):
        ex.decode_batch(payloads, IMAGE_SPEC)
    payloads[2] = payloads[2][:-3]
    with pytest.raises(ExampleError, match="record 2 of the batch is not a valid serialized"):
        ex.decode_batch(payloads, IMAGE_SPEC)


def test_batch_errors_identical_on_both_paths() -> None:
    payloads = read_payloads("plain/images.tfrecord")[:3]
    for spec, _, _ in BATCH_ERRORS:
        assert isinstance(spec, dict)
        assert_same_outcome(run(payloads, spec, True), run(payloads, spec, False))


# ------------------------------------------------------------------ wire-format builders


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def delimited(field: int, data: bytes) -> bytes:
    return tag(field, 2) + varint(len(data)) + data


def rare(draw: st.DrawFn, n: int) -> bool:
    """True about once in n draws (hypothesis favours boundary values, so not 0 or n - 1)."""
    return draw(st.integers(0, n - 1)) == n // 2


UNKNOWN = st.sampled_from(
    [tag(9, 0) + varint(300), tag(10, 1) + bytes(8), tag(11, 5) + bytes(4), delimited(12, b"xy")]
)


@st.composite
def wire_list(draw: st.DrawFn, kind: int, values: list[Any]) -> bytes:
    """A BytesList / FloatList / Int64List, in a randomly chosen but valid wire form."""
    parts: list[bytes] = []
    if kind == 1:
        parts = [delimited(1, v) for v in values]
    else:
        encoded = [struct.pack("<f", v) if kind == 2 else varint(v) for v in values]
        i = 0
        while i < len(encoded):
            if draw(st.booleans()):  # a packed chunk of some of the values
                j = draw(st.integers(i + 1, len(encoded)))
                parts.append(delimited(1, b"".join(encoded[i:j])))
                i = j
            else:  # one unpacked value
                parts.append(tag(1, 5 if kind == 2 else 0) + encoded[i])
                i += 1
        if rare(draw, 10):
            parts.append(delimited(1, b""))  # an empty packed chunk
    if rare(draw, 8):
        parts.insert(draw(st.integers(0, len(parts))), draw(UNKNOWN))
    return b"".join(parts)


FLOATS = st.floats(width=32, allow_nan=True) | st.integers(0, 2**32 - 1).map(
    lambda bits: struct.unpack("<f", struct.pack("<I", bits))[0]
)
INT64 = st.integers(-(2**63), 2**63 - 1)
BLOBS = st.binary(max_size=12)


def values_of(kind: int, size: st.SearchStrategy[int]) -> st.SearchStrategy[list[Any]]:
    element = {1: BLOBS, 2: FLOATS, 3: INT64}[kind]
    return size.flatmap(lambda n: st.lists(element, min_size=n, max_size=n))


@st.composite
def wire_feature(draw: st.DrawFn, kind: int, values: list[Any]) -> bytes:
    body = b"" if kind == 0 else delimited(kind, draw(wire_list(kind, values)))
    if rare(draw, 8):
        body = draw(UNKNOWN) + body
    if rare(draw, 30):  # a second kind field: protobuf merges / switches
        other = draw(st.integers(1, 3))
        body += delimited(other, draw(wire_list(other, draw(values_of(other, st.just(1))))))
    return body


@st.composite
def wire_entry(draw: st.DrawFn, key: bytes, feature: bytes | None) -> bytes:
    parts = [delimited(1, key)]
    if feature is not None:
        parts.append(delimited(2, feature))
    if draw(st.booleans()):
        parts.reverse()
    if rare(draw, 30):  # a second key field: the last one counts
        parts.insert(0, delimited(1, draw(st.sampled_from([b"zz", b"a", b"\xff"]))))
    if rare(draw, 40):  # upb drops entries with unknown fields
        parts.append(draw(UNKNOWN))
    return delimited(1, b"".join(parts))


# name -> (spec, kind, count or None for any)
SPEC_SHAPES: dict[str, tuple[ex.FeatureSpec, int, int | None]] = {
    "i": (ex.FixedLenFeature(np.int64, (2,)), 3, 2),
    "f": (ex.FixedLenFeature(np.float32, (3,), default=[0.5, float("nan"), -0.0]), 2, 3),
    "s": (ex.FixedLenFeature(np.int64, (), default=-7), 3, 1),
    "r": (ex.RawFeature(np.uint8, (2, 2)), 1, 1),
    "b": (ex.FixedLenFeature(bytes, (2,), default=[b"d1", b"d2"]), 1, 2),
    "vi": (ex.VarLenFeature(np.int64), 3, None),
    "vf": (ex.VarLenFeature(np.float32), 2, None),
    "vb": (ex.VarLenFeature(bytes), 1, None),
    "": (ex.FixedLenFeature(np.float32, (0,)), 2, 0),
}
SPEC = {name: entry for name, (entry, _, _) in SPEC_SHAPES.items()}


@st.composite
def wire_example(draw: st.DrawFn) -> bytes:
    """An Example that mostly fits SPEC, in varied (mostly valid) wire forms."""
    entries: list[bytes] = []
    for name, (_, kind, count) in SPEC_SHAPES.items():
        roll = draw(st.integers(0, 59))
        if roll == 30:
            continue  # missing
        if roll == 31:  # anything
            kind = draw(st.integers(0, 3))
            count = draw(st.integers(0, 3))
        elif count is None:
            count = draw(st.integers(0, 4))
        if name == "r" and kind == 1 and count == 1 and roll != 31:
            values = [draw(st.binary(min_size=4, max_size=4))]
        else:
            values = draw(values_of(kind, st.just(count))) if kind else []
        feature = draw(wire_feature(kind, values))
        entries.append(draw(wire_entry(name.encode(), feature)))
        if rare(draw, 10):  # the same key again, other values: the last entry wins
            if kind and count is None:
                values = draw(values_of(kind, st.integers(0, 4)))
            elif kind:
                values = draw(values_of(kind, st.just(len(values))))
                if name == "r" and kind == 1 and len(values) == 1:
                    values = [draw(st.binary(min_size=4, max_size=4))]
            entries.append(draw(wire_entry(name.encode(), draw(wire_feature(kind, values)))))
    for _ in range(draw(st.integers(0, 2))):  # features outside the spec
        key = draw(st.text(max_size=4)).encode()
        kind = draw(st.integers(0, 3))
        values = draw(values_of(kind, st.integers(0, 3))) if kind else []
        entries.append(draw(wire_entry(key, draw(wire_feature(kind, values)))))
    if rare(draw, 20):
        entries.append(draw(wire_entry(b"x", None)))  # an entry without a value
    entries = draw(st.permutations(entries))
    split = draw(st.integers(0, len(entries)))
    if rare(draw, 10):  # two features fields: protobuf merges the maps
        body = delimited(1, b"".join(entries[:split])) + delimited(1, b"".join(entries[split:]))
    else:
        body = delimited(1, b"".join(entries))
    if rare(draw, 10):
        body = draw(UNKNOWN) + body
    return body


def canonical(payload: bytes) -> bytes:
    return ex.encode(ex.decode(payload))


# A quick run by default; STREAMREC_FUZZ_EXAMPLES=5000 fuzzes the C parser properly.
FUZZ_EXAMPLES = int(os.environ.get("STREAMREC_FUZZ_EXAMPLES", "50"))
PROPERTY = settings(
    max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY
@given(st.lists(wire_example(), min_size=1, max_size=4))
def test_paths_agree_on_wire_variants(payloads: list[bytes]) -> None:
    c = run(payloads, SPEC, True)
    python = run(payloads, SPEC, False)
    assert_same_outcome(c, python)
    if python[0] == "ok":
        assert_same_outcome(python, ("ok", stacked_decode(payloads, SPEC)))


@PROPERTY
@given(st.lists(wire_example(), min_size=1, max_size=3))
def test_c_parser_accepts_canonical_encodings(payloads: list[bytes]) -> None:
    """Re-encoded payloads (plain protobuf, as TF writes them) never need the Python path."""
    if CEXAMPLE is None:
        return
    try:
        encoded = [canonical(p) for p in payloads]
    except ExampleError:
        return
    python = run(encoded, SPEC, False)
    if python[0] != "ok":
        return
    specs_ok = _c_decodes(encoded)
    assert specs_ok, "the C parser declined a canonical batch that the Python path decodes"
    assert_same_outcome(run(encoded, SPEC, True), python)


def _c_decodes(payloads: list[bytes]) -> bool:
    spy = Spy()
    saved = example_batch._cexample
    example_batch._cexample = spy
    try:
        ex.decode_batch(payloads, SPEC)
    finally:
        example_batch._cexample = saved
    return spy.decoded == 1


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    payload = bytearray(draw(wire_example()))
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
        if not payload:
            break
        at = draw(st.integers(0, len(payload) - 1))
        if action == "flip":
            payload[at] ^= 1 << draw(st.integers(0, 7))
        elif action == "truncate":
            del payload[at:]
        elif action == "insert":
            payload[at:at] = draw(st.binary(min_size=1, max_size=3))
        else:
            del payload[at : at + draw(st.integers(1, 3))]
    return bytes(payload)


@PROPERTY
@given(st.lists(damaged() | st.binary(max_size=40), min_size=1, max_size=3))
def test_paths_agree_on_damaged_bytes(payloads: list[bytes]) -> None:
    assert_same_outcome(run(payloads, SPEC, True), run(payloads, SPEC, False))


@PROPERTY
@given(
    st.dictionaries(
        st.text(max_size=6),
        st.one_of(
            st.lists(INT64, max_size=5).map(lambda v: np.array(v, dtype=np.int64)),
            st.lists(FLOATS, max_size=5).map(lambda v: np.array(v, dtype=np.float32)),
            st.lists(st.binary(max_size=8), max_size=5),
        ),
        max_size=5,
    )
)
def test_encode_decode_round_trip(features: dict[str, Any]) -> None:
    payload = ex.encode(features)
    decoded = ex.decode(payload)
    assert list(decoded) == sorted(features)
    for name, value in features.items():
        assert_same_value(decoded[name], value)
    assert ex.encode(decoded) == payload
    spec: dict[str, ex.FeatureSpec] = {
        name: ex.VarLenFeature(bytes if isinstance(v, list) else v.dtype.type)
        for name, v in features.items()
    }
    batch = [payload, payload]
    c = run(batch, spec, True)
    assert_same_outcome(c, run(batch, spec, False))
    assert c[0] == "ok"
    for name, value in features.items():
        assert_same_value(c[1][name][1], value)


@PROPERTY
@given(st.binary(max_size=16).filter(lambda k: k != b"\xff"))
def test_utf8_keys_agree(key: bytes) -> None:
    """The C parser checks UTF-8 of map keys exactly like protobuf does."""
    payload = delimited(1, delimited(1, delimited(1, key) + delimited(2, b"")))
    spec: dict[str, ex.FeatureSpec] = {"k": ex.VarLenFeature(np.int64)}
    assert_same_outcome(run([payload], spec, True), run([payload], spec, False))


def test_c_parser_declines_what_it_does_not_handle(spy: Spy) -> None:
    """Merged kinds, entries with unknown fields, groups and bad varints go to Python."""
    good = delimited(3, delimited(1, varint(5)))  # int64_list [5]
    cases = [
        delimited(1, delimited(1, delimited(1, b"vi") + delimited(2, good + good))),  # merged
        delimited(1, delimited(1, delimited(1, b"vi") + delimited(2, good) + tag(3, 0) + b"\x01")),
        tag(5, 3) + tag(5, 4),  # a group
        delimited(1, delimited(1, delimited(1, b"vi") + delimited(2, tag(3, 0) + b"\x05"))),
    ]
    spec: dict[str, ex.FeatureSpec] = {"vi": ex.VarLenFeature(np.int64)}
    for payload in cases:
        before = spy.declined
        try:
            c: Any = ("ok", ex.decode_batch([payload], spec))
        except ExampleError as exc:
            c = ("error", type(exc), str(exc))
        assert spy.declined == before + 1, payload
        assert_same_outcome(c, run([payload], spec, False))
    # and the Python path gives protobuf's answers for them
    assert run([cases[0]], spec, False)[1]["vi"][0].tolist() == [5, 5]
    if api_implementation.Type() == "upb":
        assert run([cases[1]], spec, False)[1]["vi"][0].tolist() == []  # upb drops the entry


def test_duplicate_keys_last_wins(path: str) -> None:
    """A key repeated in the map (or in a second features field) takes its last entry."""

    def entry(key: bytes, feature: bytes) -> bytes:
        return delimited(1, delimited(1, key) + delimited(2, feature))

    ints = [delimited(3, delimited(1, varint(v) + varint(v + 1))) for v in (10, 20, 30)]
    floats = [delimited(2, delimited(1, struct.pack("<ff", v, -v))) for v in (1.5, 2.5)]
    blobs = [delimited(1, delimited(1, b"%04d" % v)) for v in (1, 2)]
    first = delimited(
        1,
        entry(b"i", ints[0])
        + entry(b"f", floats[0])
        + entry(b"i", ints[1])
        + entry(b"r", blobs[0]),
    ) + delimited(1, entry(b"f", floats[1]) + entry(b"r", blobs[1]) + entry(b"v", ints[2]))
    second = delimited(
        1,
        entry(b"v", ints[0])
        + entry(b"v", delimited(3, b""))
        + entry(b"i", ints[2])
        + entry(b"r", blobs[0]),
    )
    spec: dict[str, ex.FeatureSpec] = {
        "i": ex.FixedLenFeature(np.int64, (2,)),
        "f": ex.FixedLenFeature(np.float32, (2,), default=[0, 0]),
        "r": ex.RawFeature(np.uint8, (4,)),
        "v": ex.VarLenFeature(np.int64),
    }
    got: Any = ex.decode_batch([first, second, first], spec)
    assert got["i"].tolist() == [[20, 21], [30, 31], [20, 21]]
    assert got["f"].tolist() == [[2.5, -2.5], [0, 0], [2.5, -2.5]]
    assert bytes(got["r"][0]) == b"0002" and bytes(got["r"][1]) == b"0001"
    assert [v.tolist() for v in got["v"]] == [[30, 31], [], [30, 31]]


def test_ten_byte_varints(path: str) -> None:
    """Negative int64 are 10-byte varints; the 10th byte's high bits are dropped."""
    values = [-1, -(2**63), 2**63 - 1, -500]
    payload = ex.encode({"v": values})
    got: Any = ex.decode_batch([payload], {"v": ex.FixedLenFeature(np.int64, (4,))})
    assert got["v"].tolist() == [values]
    odd = delimited(
        1,
        delimited(
            1, delimited(1, b"v") + delimited(2, delimited(3, delimited(1, b"\xff" * 9 + b"\x7f")))
        ),
    )
    got = ex.decode_batch([odd], {"v": ex.VarLenFeature(np.int64)})
    assert got["v"][0].tolist() == [-1]
    one: Any = ex.decode(odd)
    assert one["v"].tolist() == [-1]
