"""Decoding one payload: :func:`decode` (with or without a spec) and :func:`decode_sequence`,
and the protobuf readers the batch decoder and :mod:`streamrec.format.inspect` share.

This module does no I/O.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from streamrec.errors import ExampleError, FeatureError
from streamrec.format.example.spec import (
    BYTES_LIST,
    DTYPE_OF_KIND,
    FLOAT_LIST,
    INT64_LIST,
    KIND_OF_DTYPE,
    Array,
    Decoded,
    FeatureSpec,
    FixedLenFeature,
    VarLenFeature,
    check_spec,
    numpy_dtype,
)
from streamrec.format.proto import example_pb2, feature_pb2

__all__ = ["decode", "decode_one", "decode_sequence", "float_values", "parse_message"]


def parse_message(message: Any, payload: bytes, what: str) -> None:
    """Parse ``payload`` into ``message``; ExampleError naming ``what`` if it is not valid."""
    if not isinstance(payload, bytes):  # any bytes-like (old protobufs take bytes only)
        payload = memoryview(payload).tobytes()
    try:
        message.ParseFromString(payload)
    except (DecodeError, ValueError, IndexError, OverflowError) as exc:
        # DecodeError from upb / C++; the pure-Python backend can also raise e.g.
        # UnicodeDecodeError (a bad UTF-8 key) or IndexError on damaged input.
        kind = type(message).__name__
        raise ExampleError(f"{what} is not a valid serialized {kind}: {exc}") from exc


_F32LE = np.dtype("<f4")
_NATIVE_LE = sys.byteorder == "little"


def float_values(values: feature_pb2.FloatList) -> Array:
    """The float32 values of a FloatList, bit-exact.

    protobuf's getters widen to double, which quiets signalling NaNs; the packed field of the
    re-serialized list holds the exact bits.
    """
    count = len(values.value)
    if count == 0:
        return np.empty(0, dtype=np.float32)
    size = 4 * count
    header = 1 + (size.bit_length() + 6) // 7  # the tag byte, then size as a varint
    data = values.SerializeToString()
    if len(data) != header + size:  # unknown fields were kept: drop them
        values.DiscardUnknownFields()
        data = values.SerializeToString()
    array = np.frombuffer(data, dtype=_F32LE, offset=header)
    return array.copy() if _NATIVE_LE else array.astype(np.float32)


def _int64_values(values: feature_pb2.Int64List) -> Array:
    return np.array(values.value[:], dtype=np.int64)


def _any_values(feature: feature_pb2.Feature) -> Decoded:
    kind = feature.WhichOneof("kind")
    if kind == INT64_LIST:
        return _int64_values(feature.int64_list)
    if kind == BYTES_LIST:
        return list(feature.bytes_list.value)
    if kind == FLOAT_LIST:
        return float_values(feature.float_list)
    return np.empty(0, dtype=np.float32)  # kind not set: no values


def _features_dict(features: feature_pb2.Features) -> dict[str, Decoded]:
    return {name: _any_values(features.feature[name]) for name in sorted(features.feature)}


def _kind_values(
    name: str, feature: feature_pb2.Feature, want: str, where: str
) -> Array | list[bytes]:
    """The values of ``feature``, which must be of kind ``want`` (or have no kind)."""
    kind = feature.WhichOneof("kind")
    if kind is None:
        return [] if want == BYTES_LIST else np.empty(0, dtype=numpy_dtype(DTYPE_OF_KIND[want]))
    if kind != want:
        raise FeatureError(name, f"{where}expected {want} ({DTYPE_OF_KIND[want]}), got {kind}")
    if kind == INT64_LIST:
        return _int64_values(feature.int64_list)
    if kind == FLOAT_LIST:
        return float_values(feature.float_list)
    return list(feature.bytes_list.value)


def decode_one(features: Any, name: str, spec: FeatureSpec, where: str) -> Array | list[bytes]:
    """Decode feature ``name`` of a parsed ``Features`` map according to ``spec``."""
    present = name in features
    if isinstance(spec, FixedLenFeature):
        if not present:
            if spec._default is None:
                raise FeatureError(
                    name, f"{where}missing, and its FixedLenFeature spec has no default"
                )
            fallback: Array = spec._default.copy()
            return fallback
        want = KIND_OF_DTYPE[spec._kind]
        values = _kind_values(name, features[name], want, where)
        if len(values) != spec._count:
            raise FeatureError(
                name,
                f"{where}expected {spec._count} {spec._kind} values for shape {spec.shape}, "
                f"got {len(values)}",
            )
        if isinstance(values, list):
            strings = np.empty(len(values), dtype=object)
            strings[:] = values
            return strings.reshape(spec.shape)
        return values.reshape(spec.shape)
    if isinstance(spec, VarLenFeature):
        want = KIND_OF_DTYPE[spec._kind]
        if not present:
            return [] if want == BYTES_LIST else np.empty(0, dtype=numpy_dtype(spec._kind))
        return _kind_values(name, features[name], want, where)
    # RawFeature
    if not present:
        raise FeatureError(name, f"{where}missing (a RawFeature has no default)")
    raw = _kind_values(name, features[name], BYTES_LIST, where)
    if len(raw) != 1:
        raise FeatureError(name, f"{where}expected 1 bytes value for a RawFeature, got {len(raw)}")
    blob = raw[0]
    assert isinstance(blob, bytes)
    if len(blob) != spec._nbytes:
        raise FeatureError(
            name,
            f"{where}expected {spec._nbytes} bytes for {spec._dtype} shape {spec.shape}, "
            f"got {len(blob)} bytes",
        )
    array: Array = np.frombuffer(blob, dtype=spec._dtype).reshape(spec.shape).copy()
    return array


def decode(payload: bytes, spec: Mapping[str, FeatureSpec] | None = None) -> dict[str, Decoded]:
    """Decode a serialized ``Example``.

    Without ``spec``, return every feature, sorted by name: int64 array, float32 array or list
    of bytes (a kind-less feature gives an empty float32 array). With ``spec``, return only the
    spec'd features, typed and shaped as :class:`FixedLenFeature`, :class:`VarLenFeature` and
    :class:`RawFeature` say; features not in the spec are ignored.

    Raises :class:`~streamrec.errors.ExampleError` if ``payload`` is not a valid protobuf and
    :class:`~streamrec.errors.FeatureError` (naming the feature) on a spec mismatch.
    """
    message = example_pb2.Example()
    parse_message(message, payload, "payload")
    if spec is None:
        return _features_dict(message.features)
    features = message.features.feature
    return {name: decode_one(features, name, entry, "") for name, entry in check_spec(spec)}


def decode_sequence(
    payload: bytes,
) -> tuple[dict[str, Decoded], dict[str, list[Decoded]]]:
    """Decode a serialized ``SequenceExample`` into ``(context, feature_lists)``.

    ``context`` is like :func:`decode`'s result without a spec; ``feature_lists`` maps each name
    (sorted) to the list of its steps, each step decoded the same way (an empty
    ``FeatureList`` gives ``[]``). Raises :class:`~streamrec.errors.ExampleError` if ``payload``
    is not a valid protobuf.
    """
    message = example_pb2.SequenceExample()
    parse_message(message, payload, "payload")
    context = _features_dict(message.context)
    lists = message.feature_lists.feature_list
    feature_lists = {
        name: [_any_values(step) for step in lists[name].feature] for name in sorted(lists)
    }
    return context, feature_lists
