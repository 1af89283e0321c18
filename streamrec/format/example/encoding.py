"""Encoding: a mapping of Python / numpy values -> a serialized ``Example`` or ``SequenceExample``
(the value table is in :mod:`streamrec.format.example`).

This module does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from streamrec.format.example.spec import BYTES_LIST, FLOAT_LIST, INT64_LIST, Array, checked_key
from streamrec.format.proto import example_pb2, feature_pb2

__all__ = ["encode", "encode_sequence"]

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def _kind_of_scalar(value: object) -> str | None:
    if isinstance(value, (bool, int, np.integer, np.bool_)):
        return INT64_LIST
    if isinstance(value, (float, np.floating)):
        return FLOAT_LIST
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return BYTES_LIST
    return None


def _describe(value: object) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def _to_bytes(name: str, value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"feature {name!r}: str value is not encodable as UTF-8") from exc
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"feature {name!r}: expected bytes or str, got {_describe(value)}")


def _int_values(name: str, values: Sequence[object]) -> list[int]:
    ints = [int(v) for v in values]  # type: ignore[call-overload]
    if ints and (min(ints) < _INT64_MIN or max(ints) > _INT64_MAX):
        raise ValueError(f"feature {name!r}: integer value out of the int64 range")
    return ints


def _set_floats(target: feature_pb2.FloatList, values: Array) -> None:
    """Store float32 values bit-exactly (a packed field parsed into the message)."""
    data = np.ascontiguousarray(values, dtype="<f4").tobytes()
    if data:
        target.MergeFromString(b"\x0a" + _varint(len(data)) + data)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _to_float32(values: object) -> Array:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values).astype(np.float32)


def _fill_feature(name: str, value: object, feature: feature_pb2.Feature) -> None:
    """Set ``feature`` from one Python / numpy value (see the module docstring)."""
    if isinstance(value, np.ndarray):
        flat = value.reshape(-1)
        code = value.dtype.kind
        if code in "iub":
            if code == "u" and flat.size and int(flat.max()) > _INT64_MAX:
                raise ValueError(f"feature {name!r}: integer value out of the int64 range")
            feature.int64_list.SetInParent()
            feature.int64_list.value.extend(flat.astype(np.int64).tolist())
        elif code == "f":
            feature.float_list.SetInParent()
            with np.errstate(over="ignore", invalid="ignore"):
                _set_floats(feature.float_list, flat.astype(np.float32))
        elif code in "SU":
            feature.bytes_list.SetInParent()
            feature.bytes_list.value.extend(_to_bytes(name, v) for v in flat.tolist())
        elif code == "O":
            _fill_feature(name, flat.tolist(), feature)
        else:
            raise TypeError(
                f"feature {name!r}: cannot encode a numpy array of dtype {value.dtype} "
                "(use an integer, bool, floating, S, U or object-of-bytes array)"
            )
        return
    kind = _kind_of_scalar(value)
    if kind is not None:
        values: Sequence[object] = [value]
    elif isinstance(value, (list, tuple)):
        values = value
        kinds = {_kind_of_scalar(v) for v in values}
        if None in kinds:
            bad = next(v for v in values if _kind_of_scalar(v) is None)
            raise TypeError(
                f"feature {name!r}: cannot encode a list element of type {_describe(bad)} "
                "(elements must be int, float, bytes or str)"
            )
        if len(kinds) > 1:
            raise TypeError(
                f"feature {name!r}: list mixes value kinds {sorted(k for k in kinds if k)} "
                "(a Feature holds one kind: int64, float or bytes)"
            )
        kind = kinds.pop() if kinds else BYTES_LIST
    else:
        raise TypeError(
            f"feature {name!r}: cannot encode a value of type {_describe(value)} "
            "(expected int, float, bytes, str, a list of one of these, or a numpy array)"
        )
    if kind == INT64_LIST:
        feature.int64_list.SetInParent()
        feature.int64_list.value.extend(_int_values(name, values))
    elif kind == FLOAT_LIST:
        feature.float_list.SetInParent()
        _set_floats(feature.float_list, _to_float32(values))
    else:
        feature.bytes_list.SetInParent()
        feature.bytes_list.value.extend([_to_bytes(name, v) for v in values])


def _fill_features(features: Mapping[str, object], target: feature_pb2.Features) -> None:
    if not isinstance(features, Mapping):
        raise TypeError(f"features must be a mapping of name to value, not {_describe(features)}")
    for name, value in features.items():
        if not isinstance(name, str):
            raise TypeError(f"feature names must be str, not {_describe(name)} ({name!r})")
        _fill_feature(name, value, target.feature[checked_key(name)])


def encode(features: Mapping[str, object]) -> bytes:
    """Serialize a mapping of feature name to value as a TensorFlow ``Example``.

    Values follow the table in the module docstring. The ``features`` field is always written,
    so ``encode({})`` is ``b"\\n\\x00"`` like ``tf.train.Example(features=tf.train.Features())``.
    Output is deterministic (entries sorted by name) and byte-identical to what TensorFlow
    writes for the same content with ``SerializeToString(deterministic=True)``.

    Raises :class:`TypeError` for a value that has no feature kind (naming the feature and the
    type) and :class:`ValueError` for an integer outside int64.
    """
    message = example_pb2.Example()
    message.features.SetInParent()
    _fill_features(features, message.features)
    return message.SerializeToString(deterministic=True)


def encode_sequence(
    context: Mapping[str, object] | None = None,
    feature_lists: Mapping[str, Iterable[object]] | None = None,
) -> bytes:
    """Serialize a TensorFlow ``SequenceExample``.

    ``context`` is a mapping like :func:`encode`'s. ``feature_lists`` maps a name to a sequence
    of steps (a list, tuple or numpy array iterated along its first axis), each step a value
    like :func:`encode`'s; an empty sequence gives an empty ``FeatureList``. A field given as
    None is left out (``encode_sequence()`` is ``b""``); a mapping, even empty, is written.
    """
    message = example_pb2.SequenceExample()
    if context is not None:
        message.context.SetInParent()
        _fill_features(context, message.context)
    if feature_lists is not None:
        if not isinstance(feature_lists, Mapping):
            raise TypeError(
                f"feature_lists must be a mapping of name to steps, not {_describe(feature_lists)}"
            )
        message.feature_lists.SetInParent()
        for name, steps in feature_lists.items():
            if not isinstance(name, str):
                raise TypeError(f"feature list names must be str, not {_describe(name)}")
            if isinstance(steps, (str, bytes, bytearray, memoryview)) or not isinstance(
                steps, (Sequence, np.ndarray)
            ):
                raise TypeError(
                    f"feature list {name!r}: expected a sequence of steps, got {_describe(steps)}"
                )
            target = message.feature_lists.feature_list[checked_key(name)]
            target.SetInParent()
            for index, step in enumerate(steps):
                _fill_feature(f"{name}[{index}]", step, target.feature.add())
    return message.SerializeToString(deterministic=True)
