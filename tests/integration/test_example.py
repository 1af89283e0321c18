"""streamrec.format.example against the TensorFlow-written corpus, and its API and errors.

The corpus payloads are read with a tiny local TFRecord frame reader (independent of
streamrec's framing), decoded, rendered the way ``tests/data/corpus/generate.py`` renders them and
compared with ``manifest.json`` exactly (float32 bits, int64 values, bytes or their sha256).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf.internal import api_implementation

import streamrec.example as public
from streamrec.errors import ExampleError, FeatureError
from streamrec.format import example as ex
from streamrec.format.proto import example_pb2, feature_pb2
from support.corpus import CORPUS_DIR

REPO = Path(__file__).resolve().parents[2]

# protobuf's pure-Python backend turns every NaN it parses into the canonical quiet NaN; the
# default upb (and the C++) backends keep float32 bits. NaN bit checks need the latter.
CANONICAL_NANS = api_implementation.Type() == "python"
exact_nans = pytest.mark.skipif(CANONICAL_NANS, reason="this protobuf backend rewrites NaNs")


def corpus_path() -> Path:
    """The reference corpus the project carries (tests/data/corpus)."""
    return CORPUS_DIR


@functools.lru_cache(maxsize=1)
def manifest() -> dict[str, Any]:
    with open(corpus_path() / "manifest.json") as f:
        data: dict[str, Any] = json.load(f)
    return data


@functools.cache
def payloads(rel: str) -> tuple[bytes, ...]:
    """The payloads of an uncompressed TFRecord file: 8-byte length, 4 CRC, data, 4 CRC."""
    data = (corpus_path() / rel).read_bytes()
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        out.append(data[pos + 12 : pos + 12 + length])
        pos += 16 + length
    assert pos == len(data), rel
    return tuple(out)


def corpus_files(kind: str) -> list[str]:
    """Uncompressed corpus files of one payload kind that list their records."""
    return sorted(
        rel
        for rel, entry in manifest()["files"].items()
        if entry["payload_kind"] == kind and entry["compression"] == "NONE" and "records" in entry
    )


EXAMPLE_FILES = corpus_files("example")
SEQUENCE_FILES = corpus_files("sequence_example")


# ------------------------------------------------------------------ rendering like generate.py


def render_bytes(value: bytes) -> Any:
    if len(value) <= 1024:
        return base64.b64encode(value).decode("ascii")
    return {"length": len(value), "sha256": hashlib.sha256(value).hexdigest()}


def render_value(value: Any) -> dict[str, Any]:
    if isinstance(value, list):
        assert all(type(v) is bytes for v in value)
        return {"bytes_list": [render_bytes(v) for v in value]}
    assert isinstance(value, np.ndarray) and value.ndim == 1, value
    if value.dtype == np.int64:
        return {"int64_list": [int(v) for v in value]}
    assert value.dtype == np.float32, value.dtype
    return {
        "float_list": [repr(float(v)) for v in value],
        "float_list_hex": [
            "nan" if CANONICAL_NANS and np.isnan(v) else f"{bits:08x}"
            for v, bits in zip(value, value.view(np.uint32).tolist(), strict=True)
        ],
    }


def render_features(features: dict[str, Any], kindless: set[str]) -> dict[str, Any]:
    """Render a decoded mapping; ``kindless`` names the features the protobuf has no kind for
    (streamrec decodes those to an empty float32 array; the manifest renders them as {})."""
    assert list(features) == sorted(features)
    out: dict[str, Any] = {}
    for name, value in features.items():
        if name in kindless:
            assert isinstance(value, np.ndarray) and value.dtype == np.float32 and value.size == 0
            out[name] = {}
        else:
            out[name] = render_value(value)
    return out


def nan_view(expected: Any) -> Any:
    """The manifest rendering as this protobuf backend can reproduce it (see CANONICAL_NANS)."""
    if not CANONICAL_NANS:
        return expected
    text = json.dumps(expected)
    for nan_bits in ("7fc00000", "ffc00000"):  # the corpus's NaNs
        text = text.replace(f'"{nan_bits}"', '"nan"')
    return json.loads(text)


def kindless_names(features: feature_pb2.Features) -> set[str]:
    return {k for k, v in features.feature.items() if v.WhichOneof("kind") is None}


# ------------------------------------------------------------------ corpus: decode


@pytest.mark.parametrize("rel", EXAMPLE_FILES)
def test_decode_matches_manifest(rel: str) -> None:
    records = manifest()["files"][rel]["records"]
    data = payloads(rel)
    assert len(data) == len(records) == manifest()["files"][rel]["num_records"]
    for record, payload in zip(records, data, strict=True):
        assert hashlib.sha256(payload).hexdigest() == record["sha256"]
        expected = record["example"]
        message = example_pb2.Example.FromString(payload)
        assert message.HasField("features") == expected["has_features_field"]
        decoded = ex.decode(payload)
        rendered = render_features(decoded, kindless_names(message.features))
        expected = nan_view(expected)
        assert rendered == expected["features"], (rel, record["index"])
        assert json.dumps(rendered) == json.dumps(expected["features"])  # same key order


def test_corpus_covers_everything() -> None:
    """The files the brief names are all in the parametrisation."""
    for rel in ("plain/features.tfrecord", "plain/images.tfrecord", "plain/tiny_20k.tfrecord"):
        assert rel in EXAMPLE_FILES
    assert len([r for r in EXAMPLE_FILES if r.startswith("sharded/")]) == 5
    assert SEQUENCE_FILES == ["sequence/sequence_examples.tfrecord"]


@pytest.mark.parametrize("rel", SEQUENCE_FILES)
def test_decode_sequence_matches_manifest(rel: str) -> None:
    for record, payload in zip(manifest()["files"][rel]["records"], payloads(rel), strict=True):
        expected = nan_view(record["sequence_example"])
        message = example_pb2.SequenceExample.FromString(payload)
        assert message.HasField("context") == expected["has_context_field"]
        assert message.HasField("feature_lists") == expected["has_feature_lists_field"]
        context, feature_lists = ex.decode_sequence(payload)
        assert render_features(context, kindless_names(message.context)) == expected["context"]
        assert list(feature_lists) == sorted(feature_lists)
        rendered = {
            name: [render_value(step) for step in steps] for name, steps in feature_lists.items()
        }
        assert rendered == expected["feature_lists"], record["index"]


@exact_nans
def test_special_values_bit_exact() -> None:
    """The features record holds NaN, -NaN, infinities, -0.0, float32 max and a subnormal."""
    readings = ex.decode(payloads("plain/features.tfrecord")[2])["readings"]
    assert isinstance(readings, np.ndarray)
    assert readings.view(np.uint32).tolist() == [
        0x7FC00000, 0x7F800000, 0xFF800000, 0x80000000, 0x00000000,
        0x3E99999A, 0xC0300000, 0x7F7FFFFF, 0x00000003, 0xFFC00000,
    ]  # fmt: skip
    offsets = ex.decode(payloads("plain/features.tfrecord")[3])["offsets"]
    assert isinstance(offsets, np.ndarray) and offsets.dtype == np.int64
    assert offsets[0] == -(2**63) and offsets[1] == 2**63 - 1


def test_empty_and_kindless() -> None:
    features = payloads("plain/features.tfrecord")
    assert features[5] == b"" and ex.decode(features[5]) == {}
    assert features[6] == b"\n\x00" and ex.decode(features[6]) == {}
    empty = ex.decode(features[4])
    assert empty["e_bytes"] == []
    assert isinstance(empty["e_ints"], np.ndarray) and empty["e_ints"].dtype == np.int64
    assert isinstance(empty["e_floats"], np.ndarray) and empty["e_floats"].dtype == np.float32
    unset = ex.decode(features[7])["unset_kind"]
    assert isinstance(unset, np.ndarray) and unset.dtype == np.float32 and unset.size == 0
    # with a spec a kind-less feature is present with zero values of the asked kind
    got: Any = ex.decode(features[7], {"unset_kind": ex.VarLenFeature(np.int64)})
    assert got["unset_kind"].dtype == np.int64 and len(got["unset_kind"]) == 0
    got = ex.decode(features[7], {"unset_kind": ex.FixedLenFeature(bytes, (0,))})
    assert got["unset_kind"].shape == (0,)
    with pytest.raises(FeatureError, match=r"'unset_kind'.*expected 1 int64 values.*got 0"):
        ex.decode(features[7], {"unset_kind": ex.FixedLenFeature(np.int64, default=5)})


# ------------------------------------------------------------------ corpus: encode


# Records whose re-encoding cannot give the same bytes, and why.
NOT_REENCODABLE = {
    # A 0-byte Example() has no features field; encode() always writes it (b"\n\x00"), as
    # tf.train.Example(features=tf.train.Features(feature=...)) does.
    ("plain/features.tfrecord", 5),
    # A Feature with no kind decodes to an empty float32 array, which re-encodes as an empty
    # float_list.
    ("plain/features.tfrecord", 7),
}


@pytest.mark.parametrize("rel", EXAMPLE_FILES)
def test_reencode_identical(rel: str) -> None:
    for index, payload in enumerate(payloads(rel)):
        again = ex.encode(ex.decode(payload))
        if CANONICAL_NANS and (rel, index) == ("plain/features.tfrecord", 2):
            continue  # holds -NaN
        if (rel, index) in NOT_REENCODABLE:
            assert again != payload
            assert ex.decode(again).keys() == ex.decode(payload).keys()
        else:
            assert again == payload, (rel, index)


def test_reencode_sequence_identical() -> None:
    data = payloads("sequence/sequence_examples.tfrecord")
    for index, payload in enumerate(data):
        context, feature_lists = ex.decode_sequence(payload)
        again = ex.encode_sequence(context, feature_lists)
        if index == 1:  # the 0-byte SequenceExample: encode_sequence writes both fields
            assert payload == b"" and again == b"\n\x00\x12\x00"
            assert ex.encode_sequence() == b""
        else:
            assert again == payload, index


def shake(seed: str, n: int) -> bytes:
    """generate.py's det_bytes."""
    return hashlib.shake_256(("tfrecord-public-corpus/" + seed).encode()).digest(n) if n else b""


def f32(bits: int) -> float:
    value: float = struct.unpack("<f", struct.pack("<I", bits))[0]
    return value


@exact_nans
def test_encode_matches_tensorflow_features() -> None:
    """encode() of the content generate.py gave TensorFlow writes TensorFlow's exact bytes."""
    empty_f = np.array([], dtype=np.float32)
    empty_i = np.array([], dtype=np.int64)
    built: list[dict[str, Any]] = [
        {
            "caption": b"",
            "tags": [b"sun", b"", b"\x00\xff", "Grüße ☀ 雨"],
            "digest": shake("features/digest", 32),
        },
        {"thumbnail": shake("features/thumbnail", 2500), "no_bytes": []},
        {
            "readings": [
                float("nan"),
                float("inf"),
                float("-inf"),
                -0.0,
                0.0,
                0.3,
                -2.75,
                f32(0x7F7FFFFF),
                f32(0x00000003),
                f32(0xFFC00000),
            ],
            "no_floats": empty_f,
        },
        {"offsets": [-(2**63), 2**63 - 1, -1, 0, 1, 2**32 + 5, -(2**40)], "no_ints": empty_i},
        {"e_bytes": (), "e_floats": empty_f, "e_ints": empty_i},
    ]
    data = payloads("plain/features.tfrecord")
    for index, features in enumerate(built):
        assert ex.encode(features) == data[index], index
    assert ex.encode({}) == data[6]
    assert ex.encode(
        {
            "user_id": 424242,
            "ratings": np.array([4.5, 3.0, -0.0]),
            "country": "NZ",
            "größe/尺寸": np.int64(7),
            "with space\tand tab": b"odd key",
        }
    ) == _without_kindless(data[7])


def _without_kindless(payload: bytes) -> bytes:
    message = example_pb2.Example.FromString(payload)
    del message.features.feature["unset_kind"]
    return message.SerializeToString(deterministic=True)


def test_encode_matches_tensorflow_images() -> None:
    data = payloads("plain/images.tfrecord")
    for i, payload in enumerate(data):
        pixels = np.frombuffer(shake(f"images/pixels/{i}", 32 * 32 * 3), np.uint8)
        img = pixels.reshape(32, 32, 3) // 8
        b = shake(f"images/box/{i}", 5)
        y0, x0 = b[0] % 24, b[1] % 24
        y1, x1 = y0 + 4 + b[2] % (29 - y0), x0 + 4 + b[3] % (29 - x0)
        label = b[4] % 10
        img[y0:y1, x0:x1] = np.frombuffer(shake(f"images/colour/{label}", 3), np.uint8) | 0x80
        features = {
            "image_raw": img.tobytes(),
            "label": label,
            "bbox": [y0 / 32, x0 / 32, y1 / 32, x1 / 32],
        }
        assert ex.encode(features) == payload, i


def test_encode_matches_tensorflow_tiny_and_sharded() -> None:
    tiny = payloads("plain/tiny_20k.tfrecord")
    assert all(ex.encode({"tick": i - 500}) == p for i, p in enumerate(tiny))
    idx = 0
    for shard in range(5):
        for payload in payloads(f"sharded/data-{shard:05d}-of-00005.tfrecord"):
            assert ex.encode({"idx": idx, "shard": shard}) == payload
            idx += 1
    assert idx == 15


def test_encode_sequence_matches_tensorflow() -> None:
    data = payloads("sequence/sequence_examples.tfrecord")
    full = ex.encode_sequence(
        {"clip": b"clip-007", "fps": 29.97, "frames": 4},
        {
            "words": [b"hello", [], [b"a", b"b", b""], b"\xfe\x00"],
            "frame_ids": [[10], [11, 12], np.array([], np.int64), [-(2**63), 2**63 - 1]],
            "energy": [
                -0.0,
                [float("nan"), float("inf")],
                np.zeros(0, np.float32),
                [0.125, 0.25, 0.375],
            ],
        },
    )
    assert full == data[0]
    assert ex.encode_sequence() == data[1]
    partial = ex.encode_sequence(
        {"speaker": "Zoë"},
        {"silence": [], "pitch_steps": [[3], [-3, 0], np.array([], np.int64)]},
    )
    assert partial == data[2]


# ------------------------------------------------------------------ encode: values and errors


def test_encode_value_kinds() -> None:
    payload = ex.encode(
        {
            "i": 7,
            "b": True,
            "np_i": np.uint8(200),
            "f": 0.5,
            "np_f": np.float16(1.5),
            "s": "héllo",
            "ba": bytearray(b"xy"),
            "ints": (1, 2, np.int32(-3)),
            "floats": [1.0, np.float32(2.5)],
            "strs": ["a", b"b"],
            "arr2d": np.arange(6, dtype=np.int16).reshape(2, 3),
            "bools": np.array([True, False]),
            "f64": np.array([[0.1, 0.2]]),
            "S": np.array([b"ab", b"c"]),
            "U": np.array(["ü", "v"]),
            "O": np.array([b"x", "y"], dtype=object),
            "zero_d": np.array(3.0),
        }
    )
    got: Any = ex.decode(payload)
    assert list(got["i"]) == [7] and list(got["b"]) == [1] and list(got["np_i"]) == [200]
    assert got["f"].dtype == np.float32 and list(got["f"]) == [0.5]
    assert list(got["np_f"]) == [1.5]
    assert got["s"] == ["héllo".encode()] and got["ba"] == [b"xy"]
    assert list(got["ints"]) == [1, 2, -3] and list(got["floats"]) == [1.0, 2.5]
    assert got["strs"] == [b"a", b"b"]
    assert list(got["arr2d"]) == [0, 1, 2, 3, 4, 5] and list(got["bools"]) == [1, 0]
    assert np.array_equal(got["f64"], np.array([0.1, 0.2], dtype=np.float32))
    assert got["S"] == [b"ab", b"c"] and got["U"] == ["ü".encode(), b"v"]
    assert got["O"] == [b"x", b"y"] and list(got["zero_d"]) == [3.0]
    # deterministic: the order of the mapping does not matter
    assert ex.encode({"a": 1, "b": 2}) == ex.encode({"b": 2, "a": 1})


@exact_nans
def test_encode_float32_bits_preserved() -> None:
    bits = np.array([0x7FC00001, 0x7F800001, 0xFFBFFFFF, 0x80000000, 1], dtype=np.uint32)
    values = bits.view(np.float32)  # including signalling NaNs
    got: Any = ex.decode(ex.encode({"x": values}))["x"]
    assert isinstance(got, np.ndarray)
    assert got.view(np.uint32).tolist() == bits.tolist()
    # float64 values round to nearest float32, overflow to inf, like protobuf
    got = ex.decode(ex.encode({"x": [1e300, -1e300, 0.1]}))["x"]
    assert isinstance(got, np.ndarray)
    assert got.tolist() == [np.inf, -np.inf, float(np.float32(0.1))]


@pytest.mark.parametrize(
    ("value", "pattern"),
    [
        (None, r"feature 'bad': cannot encode a value of type NoneType"),
        ({"a": 1}, r"'bad'.*type dict"),
        ([1, 2.0], r"'bad'.*mixes value kinds \['float_list', 'int64_list'\]"),
        ([b"a", 1], r"'bad'.*mixes"),
        ([[1], [2]], r"'bad'.*list element of type list"),
        ([None], r"'bad'.*list element of type NoneType"),
        (np.array([1 + 2j]), r"'bad'.*dtype complex128"),
        (np.array(["2020-01-01"], dtype="datetime64[D]"), r"'bad'.*datetime64"),
        (np.array([None], dtype=object), r"'bad'.*NoneType"),
        (1 + 2j, r"'bad'.*type complex"),
        (object(), r"'bad'.*type object"),
    ],
)
def test_encode_type_errors(value: object, pattern: str) -> None:
    with pytest.raises(TypeError, match=pattern):
        ex.encode({"ok": 1, "bad": value})


def test_encode_other_errors() -> None:
    with pytest.raises(ValueError, match=r"'big'.*int64 range"):
        ex.encode({"big": 2**63})
    with pytest.raises(ValueError, match=r"'small'.*int64 range"):
        ex.encode({"small": [-(2**63) - 1]})
    with pytest.raises(ValueError, match=r"'u'.*int64 range"):
        ex.encode({"u": np.array([2**64 - 1], dtype=np.uint64)})
    with pytest.raises(TypeError, match="feature names must be str"):
        ex.encode({b"key": 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="mapping"):
        ex.encode([("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="feature list 'w': expected a sequence of steps"):
        ex.encode_sequence({}, {"w": b"abc"})
    with pytest.raises(TypeError, match=r"'w\[1\]'.*NoneType"):
        ex.encode_sequence(None, {"w": [1, None]})
    with pytest.raises(ValueError, match="UTF-8"):
        ex.encode({"\ud800": 1})


# ------------------------------------------------------------------ decode with a spec


IMAGE_SPEC: dict[str, ex.FeatureSpec] = {
    "image_raw": ex.RawFeature(np.uint8, (32, 32, 3)),
    "label": ex.FixedLenFeature(np.int64),
    "bbox": ex.FixedLenFeature(np.float32, (2, 2)),
}


def test_decode_with_spec() -> None:
    payload = payloads("plain/images.tfrecord")[0]
    got: Any = ex.decode(payload, IMAGE_SPEC)
    assert list(got) == ["image_raw", "label", "bbox"]
    image, label, bbox = got["image_raw"], got["label"], got["bbox"]
    assert isinstance(image, np.ndarray) and image.shape == (32, 32, 3) and image.dtype == np.uint8
    assert isinstance(label, np.ndarray) and label.shape == () and label.dtype == np.int64
    assert isinstance(bbox, np.ndarray) and bbox.dtype == np.float32
    assert bbox.tolist() == [[0.25, 0.65625], [0.96875, 0.9375]]
    assert image.flags.writeable
    plain: Any = ex.decode(payload)
    assert image.tobytes() == plain["image_raw"][0]


def test_decode_spec_defaults_and_varlen() -> None:
    payload = ex.encode({"ids": [1, 2, 3], "name": "x", "tags": [b"a", b"b"]})
    spec: dict[str, ex.FeatureSpec] = {
        "ids": ex.VarLenFeature(np.int64),
        "missing_ids": ex.VarLenFeature(np.int64),
        "missing_b": ex.VarLenFeature(bytes),
        "tags": ex.VarLenFeature(bytes),
        "name": ex.FixedLenFeature(bytes),
        "tags2": ex.FixedLenFeature(bytes, (2,), default=[b"p", "q"]),
        "w": ex.FixedLenFeature(np.float32, (2, 2), default=0.5),
        "v": ex.FixedLenFeature(np.int64, (3,), default=[7, 8, 9]),
    }
    got: Any = ex.decode(payload, spec)
    assert got["ids"].tolist() == [1, 2, 3]
    assert got["missing_ids"].dtype == np.int64 and len(got["missing_ids"]) == 0
    assert got["missing_b"] == [] and got["tags"] == [b"a", b"b"]
    name = got["name"]
    assert isinstance(name, np.ndarray) and name.dtype == object and name.shape == ()
    assert name.item() == b"x"
    assert got["tags2"].tolist() == [b"p", b"q"]
    assert got["w"].tolist() == [[0.5, 0.5], [0.5, 0.5]]
    assert got["v"].tolist() == [7, 8, 9]
    got["v"][0] = 0  # a copy, not the spec's default
    again: Any = ex.decode(payload, spec)
    assert again["v"].tolist() == [7, 8, 9]


def feature_error(payload: bytes, spec: dict[str, ex.FeatureSpec]) -> FeatureError:
    with pytest.raises(FeatureError) as info:
        ex.decode(payload, spec)
    return info.value


def test_decode_spec_errors() -> None:
    payload = ex.encode({"f": [1.0, 2.0], "i": 3, "b": b"abc", "bb": [b"a", b"b"]})
    err = feature_error(payload, {"nope": ex.FixedLenFeature(np.int64)})
    assert err.feature == "nope" and "missing" in str(err) and "'nope'" in str(err)
    assert isinstance(err, KeyError) and isinstance(err, ExampleError)
    err = feature_error(payload, {"f": ex.FixedLenFeature(np.int64, (2,))})
    assert err.feature == "f"
    assert "expected int64_list (int64), got float_list" in str(err)
    err = feature_error(payload, {"f": ex.FixedLenFeature(np.float32, (3,))})
    assert "expected 3 float32 values for shape (3,), got 2" in str(err)
    err = feature_error(payload, {"i": ex.VarLenFeature(bytes)})
    assert "expected bytes_list (bytes), got int64_list" in str(err)
    err = feature_error(payload, {"b": ex.RawFeature(np.uint8, (4,))})
    assert "'b'" in str(err) and "expected 4 bytes" in str(err) and "got 3 bytes" in str(err)
    err = feature_error(payload, {"bb": ex.RawFeature(np.uint8, (1,))})
    assert "expected 1 bytes value for a RawFeature, got 2" in str(err)
    err = feature_error(payload, {"i": ex.RawFeature(np.uint8, (1,))})
    assert "got int64_list" in str(err)
    err = feature_error(payload, {"gone": ex.RawFeature(np.uint8, (1,))})
    assert "missing" in str(err)
    raw: Any = ex.decode(payload, {"b": ex.RawFeature("<u1", (3,))})["b"]
    assert raw.tolist() == [97, 98, 99]
    two = ex.encode({"r": np.array([1, 2], dtype="<u2").tobytes()})
    raw = ex.decode(two, {"r": ex.RawFeature("<u2", (2,))})["r"]
    assert raw.tolist() == [1, 2]


@pytest.mark.parametrize("payload", [b"\xff", b"\n\x05\n\x03", b"\x0a", b"\x08\x80"])
def test_damaged_payload(payload: bytes) -> None:
    with pytest.raises(ExampleError, match="not a valid serialized Example") as info:
        ex.decode(payload)
    assert info.value.__cause__ is not None
    with pytest.raises(ExampleError, match="not a valid serialized SequenceExample"):
        ex.decode_sequence(payload)
    with pytest.raises(ExampleError, match="record 1 of the batch"):
        ex.decode_batch([b"", payload], {"x": ex.VarLenFeature(np.int64)})


def test_spec_validation() -> None:
    with pytest.raises(TypeError, match=r"numpy\.int64, numpy\.float32 or bytes"):
        ex.FixedLenFeature(np.float64)
    with pytest.raises(TypeError, match=r"numpy\.int64, numpy\.float32 or bytes"):
        ex.VarLenFeature(str)
    with pytest.raises(ValueError, match="fully defined"):
        ex.FixedLenFeature(np.int64, (-1,))
    with pytest.raises(ValueError, match="default has 2 values"):
        ex.FixedLenFeature(np.int64, (3,), default=[1, 2])
    with pytest.raises(TypeError, match="bytes default"):
        ex.FixedLenFeature(bytes, default=5)
    with pytest.raises(TypeError, match="without objects"):
        ex.RawFeature(object, (1,))
    with pytest.raises(TypeError, match="must be a FixedLenFeature"):
        ex.decode(b"", {"x": np.int64})  # type: ignore[dict-item]
    assert ex.FixedLenFeature("int64", 3).shape == (3,)  # type: ignore[arg-type]
    assert ex.VarLenFeature("string") == ex.VarLenFeature(bytes)
    assert ex.RawFeature(np.uint8, [2, 3]) == ex.RawFeature(np.uint8, (2, 3))  # type: ignore[arg-type]
    assert ex.RawFeature("u1", (1,)).dtype == np.dtype(np.uint8)
    assert ex.FixedLenFeature(np.dtype("int64")).dtype is np.int64


# ------------------------------------------------------------------ protos and modules


def test_private_proto_package() -> None:
    assert example_pb2.Example.DESCRIPTOR.full_name == "streamrec.tfexample.Example"
    assert feature_pb2.Feature.DESCRIPTOR.full_name == "streamrec.tfexample.Feature"
    assert example_pb2.DESCRIPTOR.name == "streamrec/format/proto/example.proto"
    assert example_pb2.DESCRIPTOR.package == "streamrec.tfexample"
    numbers = {f.name: f.number for f in feature_pb2.Feature.DESCRIPTOR.fields}
    assert numbers == {"bytes_list": 1, "float_list": 2, "int64_list": 3}
    field = feature_pb2.FloatList.DESCRIPTOR.fields_by_name["value"]
    assert field.number == 1


def test_coexists_with_tfrecord_in_process() -> None:
    tf_example_pb2 = pytest.importorskip("tfrecord.example_pb2")
    payload = payloads("plain/images.tfrecord")[3]
    theirs = tf_example_pb2.Example.FromString(payload)
    assert theirs.SerializeToString(deterministic=True) == payload
    assert ex.encode(ex.decode(payload)) == payload


COEXIST = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
from streamrec.format.proto import example_pb2
import tfrecord.example_pb2 as theirs
payload = example_pb2.Example()
payload.features.feature["a"].int64_list.value.append(1)
data = payload.SerializeToString()
assert theirs.Example.FromString(data).features.feature["a"].int64_list.value == [1]
print("ok")
"""


@pytest.mark.parametrize(
    "order",
    [
        ["tfrecord", "streamrec.format.proto.example_pb2", "streamrec.example"],
        ["streamrec.example", "tfrecord", "tfrecord.example_pb2"],
    ],
)
@pytest.mark.parametrize("impl", ["upb", "python"])
def test_coexists_with_tfrecord_subprocess(order: list[str], impl: str) -> None:
    pytest.importorskip("tfrecord")
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": impl}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", COEXIST, *order],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


PURE_PYTHON_CHECK = """
import json, sys
import numpy as np
from google.protobuf.internal import api_implementation
from streamrec.format import example as ex
assert api_implementation.Type() == "python", api_implementation.Type()
def portable(value):
    if isinstance(value, list):
        return [v.hex() for v in value]
    if value.dtype == np.float32:
        bits = value.view(np.uint32)
        return ["nan" if np.isnan(v) else int(b) for v, b in zip(value, bits, strict=True)]
    return value.tolist()
out = []
for payload in json.load(sys.stdin):
    decoded = ex.decode(bytes.fromhex(payload))
    out.append({name: portable(value) for name, value in decoded.items()})
    out.append(ex.encode(decoded).hex())
print(json.dumps(out))
"""


def portable(value: Any) -> Any:
    """A decoded value as JSON, with every NaN the same (see the test below)."""
    if isinstance(value, list):
        return [v.hex() for v in value]
    if value.dtype == np.float32:
        return [
            "nan" if np.isnan(v) else int(b)
            for v, b in zip(value, value.view(np.uint32), strict=True)
        ]
    return value.tolist()


@exact_nans
def test_pure_python_protobuf_backend_agrees() -> None:
    """The codec gives the same values and bytes on protobuf's pure-Python backend, except
    that this backend turns every NaN into the canonical quiet NaN (sign and payload lost)."""
    data = list(payloads("plain/features.tfrecord")) + list(payloads("plain/images.tfrecord")[:3])
    expected: list[Any] = []
    for payload in data:
        decoded = ex.decode(payload)
        expected.append({name: portable(value) for name, value in decoded.items()})
        expected.append(ex.encode(decoded).hex())
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", PURE_PYTHON_CHECK],
        input=json.dumps([p.hex() for p in data]),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    nan_record = 2 * 2 + 1  # the encoding of features record 2 (-NaN comes back as NaN)
    assert got[nan_record] != expected[nan_record]
    got[nan_record] = expected[nan_record]
    assert got == expected


def test_public_module_reexports() -> None:
    assert set(public.__all__) == set(ex.__all__)
    for name in public.__all__:
        assert getattr(public, name) is getattr(ex, name)
    for name in ex.__all__:
        obj = getattr(ex, name)
        if callable(obj):  # functions and classes (not the type aliases)
            assert obj.__doc__, name


def test_codec_package_does_no_io() -> None:
    modules = sorted((REPO / "streamrec" / "format" / "example").glob("*.py"))
    assert modules
    for path in modules:
        source = path.read_text()
        for banned in ("import asyncio", "import fsspec", "open("):
            assert banned not in source, f"{path.name} uses {banned!r}"
