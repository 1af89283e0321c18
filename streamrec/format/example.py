"""TensorFlow ``Example`` / ``SequenceExample`` payloads <-> Python and numpy values.

Encoding (:func:`encode`, :func:`encode_sequence`) turns a mapping of feature values into the
serialized protobuf that TensorFlow writes for the same content (deterministic: map entries are
sorted by key), so ``tf.train.Example.FromString`` reads it back and byte comparisons with
TF-written files hold. Each value becomes one ``Feature``:

=====================================================  =====================================
value                                                  feature kind
=====================================================  =====================================
``int``, ``bool``, numpy integer / bool scalar         ``int64_list`` (one value)
``float``, numpy floating scalar                       ``float_list`` (one float32 value)
``bytes``, ``bytearray``, ``memoryview``, ``str``      ``bytes_list`` (one value; str as UTF-8)
list / tuple of one of these kinds                     that kind, one value per element
empty list / tuple                                     empty ``bytes_list``
numpy array, integer or bool dtype                     ``int64_list`` (flattened, C order)
numpy array, floating dtype                            ``float_list`` (flattened, as float32)
numpy array, ``S`` / ``U`` dtype or object of bytes    ``bytes_list`` (flattened)
=====================================================  =====================================

Anything else (``None``, dicts, nested lists, complex numbers, ...) raises :class:`TypeError`
naming the feature and the type; a list mixing kinds raises :class:`TypeError` too, and an
integer outside the int64 range :class:`ValueError`. Floats are stored as float32 (rounded to
nearest, as protobuf does; the bits of float32 arrays, NaN payloads included, are kept exactly).

Decoding without a spec (:func:`decode`, :func:`decode_sequence`) returns every feature:
``int64_list`` as an int64 array, ``float_list`` as a float32 array (bit-exact: NaN payloads
and -0.0 survive) and ``bytes_list`` as a ``list`` of ``bytes``. A ``Feature`` with no kind set
(TensorFlow's ``tf.train.Feature()``) has no values of any kind; it decodes to an *empty float32
array* (so re-encoding it writes an empty ``float_list`` rather than a kind-less Feature). With a
spec, a kind-less feature counts as present with zero values of whatever kind the spec asks for,
as in TensorFlow's ``tf.io.parse_example``.

Decoding with a spec (:func:`decode`, :func:`decode_batch`) works like ``tf.io.parse_example``:

* :class:`FixedLenFeature` ``(dtype, shape=(), default=None)``: exactly ``prod(shape)`` values,
  returned as an array of ``shape`` (``shape=()`` gives a 0-d array). A missing feature takes the
  default (a scalar is broadcast) or raises :class:`~streamrec.errors.FeatureError`. ``dtype``
  ``bytes`` gives a numpy ``object`` array of ``bytes``.
* :class:`VarLenFeature` ``(dtype)``: any number of values, a 1-d int64 / float32 array or a list
  of bytes; a missing feature gives an empty one.
* :class:`RawFeature` ``(dtype, shape)``: exactly one bytes value holding the raw array
  (``np.frombuffer(value, dtype).reshape(shape)``, as TF's ``decode_raw``); wrong byte count or
  missing feature raises :class:`~streamrec.errors.FeatureError`.

:func:`decode_batch` decodes many payloads with one spec and stacks the results: fixed-length
and raw features as ``(n, *shape)`` arrays (fixed-length ``bytes`` as an ``(n, *shape)`` object
array), variable-length features as a ``list`` of ``n`` per-record values (1-d arrays, or lists
of bytes). It uses the C accelerator ``streamrec.format._cexample`` when that extension is
built, and the pure-Python (protobuf) path otherwise; both give identical results, and the C
path hands any batch it cannot decode cleanly to the Python path, so errors are identical too.

Errors: a payload that is not a valid protobuf raises :class:`~streamrec.errors.ExampleError`
(with protobuf's ``DecodeError`` as ``__cause__``); a spec mismatch raises
:class:`~streamrec.errors.FeatureError` naming the feature, and in batches the record index.

NaN bits: with protobuf's upb (default) or C++ backend every path keeps float32 bits exactly.
protobuf's pure-Python backend turns every NaN it parses into the canonical quiet NaN (sign
and payload lost), so there the Python paths return that NaN while the C batch parser, which
reads the bytes itself, keeps the original bits; all other values are identical.

This module does no I/O.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
from google.protobuf.message import DecodeError

from streamrec.errors import ExampleError, FeatureError
from streamrec.format.accel import load_accelerator
from streamrec.format.proto import example_pb2, feature_pb2

__all__ = [
    "Decoded",
    "FeatureSpec",
    "FixedLenFeature",
    "RawFeature",
    "VarLenFeature",
    "decode",
    "decode_batch",
    "decode_sequence",
    "encode",
    "encode_sequence",
    "has_c_accelerator",
]

Array: TypeAlias = npt.NDArray[Any]
#: One decoded feature: a numpy array (int64 / float32 / raw / object of bytes) or, for
#: ``bytes_list`` features without a spec, a list of bytes.
Decoded: TypeAlias = Array | list[bytes]

_cexample: Any = load_accelerator("_cexample")  # the optional C parser of decode_batch
# shortest_bytes(payloads): the shortest payload's length, -1 if one is not exactly bytes
_shortest_bytes: Any = None if _cexample is None else _cexample.shortest_bytes

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

_BYTES = "bytes_list"
_FLOAT = "float_list"
_INT64 = "int64_list"
_KIND_OF_DTYPE = {"int64": _INT64, "float32": _FLOAT, "bytes": _BYTES}


def has_c_accelerator() -> bool:
    """Return whether :func:`decode_batch` can use the compiled C parser in this process."""
    return _cexample is not None and sys.byteorder == "little"


# ------------------------------------------------------------------------------------ specs


def _spec_dtype(dtype: object) -> str:
    """Normalise a spec dtype to ``"int64"``, ``"float32"`` or ``"bytes"``."""
    if isinstance(dtype, str):
        if dtype in ("bytes", "string"):
            return "bytes"
    elif dtype is bytes or dtype is np.bytes_:
        return "bytes"
    try:
        resolved = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError:
        resolved = None
    if resolved == np.dtype(np.int64):
        return "int64"
    if resolved == np.dtype(np.float32):
        return "float32"
    raise TypeError(
        f"feature dtype must be numpy.int64, numpy.float32 or bytes (like TensorFlow's int64, "
        f"float32 and string), not {dtype!r}"
    )


def _spec_shape(shape: object) -> tuple[int, ...]:
    """Normalise a spec shape to a tuple of non-negative ints."""
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    if not isinstance(shape, Iterable):
        raise TypeError(f"shape must be a sequence of ints, not {shape!r}")
    dims = tuple(shape)
    for dim in dims:
        if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool) or dim < 0:
            raise ValueError(f"shape must be fully defined (non-negative ints), not {shape!r}")
    return tuple(int(d) for d in dims)


_CANONICAL_DTYPE: dict[str, object] = {"int64": np.int64, "float32": np.float32, "bytes": bytes}


def _numpy_dtype(kind: str) -> np.dtype[Any]:
    return np.dtype(np.int64) if kind == "int64" else np.dtype(np.float32)


@dataclass(frozen=True, eq=False)
class FixedLenFeature:
    """A feature with exactly ``prod(shape)`` values, like ``tf.io.FixedLenFeature``.

    ``dtype`` is ``numpy.int64``, ``numpy.float32`` or ``bytes``. The decoded value is an array
    of ``shape`` (``(n, *shape)`` in a batch); for ``bytes`` a numpy ``object`` array of bytes.
    A missing feature takes ``default`` (a scalar is broadcast to ``shape``; otherwise it must
    have ``prod(shape)`` elements), or raises :class:`~streamrec.errors.FeatureError` when
    ``default`` is None. Compared by identity (a default may be an array).
    """

    dtype: object
    shape: tuple[int, ...] = ()
    default: object = None
    _kind: str = field(init=False, repr=False)
    _count: int = field(init=False, repr=False)
    _default: Array | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        kind = _spec_dtype(self.dtype)
        shape = _spec_shape(self.shape)
        count = math.prod(shape)
        object.__setattr__(self, "dtype", _CANONICAL_DTYPE[kind])
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_count", count)
        object.__setattr__(self, "_default", None)
        if self.default is None:
            return
        if kind == "bytes":
            default = np.empty(count, dtype=object)
            if isinstance(self.default, (bytes, str)):
                items: list[object] = [self.default] * count
            else:
                items = list(np.asarray(self.default, dtype=object).reshape(-1))
            if len(items) != count:
                raise ValueError(
                    f"default has {len(items)} values, shape {shape} needs {count} (or 1)"
                )
            for i, item in enumerate(items):
                if isinstance(item, str):
                    item = item.encode("utf-8")
                if not isinstance(item, bytes):
                    raise TypeError(f"a bytes default must hold bytes or str, not {item!r}")
                default[i] = item
        else:
            given = np.asarray(self.default, dtype=_numpy_dtype(kind))
            if given.size == 1:
                default = np.full(count, given.reshape(-1)[0], dtype=given.dtype)
            elif given.size == count:
                default = given.reshape(-1).copy()
            else:
                raise ValueError(
                    f"default has {given.size} values, shape {shape} needs {count} (or 1)"
                )
        shaped: Array = default.reshape(shape)
        shaped.flags.writeable = False
        object.__setattr__(self, "_default", shaped)


@dataclass(frozen=True)
class VarLenFeature:
    """A feature with any number of values, like ``tf.io.VarLenFeature``.

    ``dtype`` is ``numpy.int64``, ``numpy.float32`` or ``bytes``. The decoded value is a 1-d
    int64 / float32 array or a list of bytes (empty when the feature is missing); in a batch, a
    list with one such value per record.
    """

    dtype: object
    _kind: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kind = _spec_dtype(self.dtype)
        object.__setattr__(self, "dtype", _CANONICAL_DTYPE[kind])
        object.__setattr__(self, "_kind", kind)


@dataclass(frozen=True)
class RawFeature:
    """One bytes value holding a raw array, like ``tf.io.decode_raw`` of a bytes feature.

    The value must hold exactly ``prod(shape) * dtype.itemsize`` bytes; it decodes to
    ``np.frombuffer(value, dtype).reshape(shape)`` (a writable copy; ``(n, *shape)`` in a
    batch). ``dtype`` is any numpy dtype without objects, in its own byte order (``"<f4"`` for
    TensorFlow's default little-endian). A missing feature, another kind, more or fewer than
    one value or a wrong byte count raise :class:`~streamrec.errors.FeatureError`.
    """

    dtype: object
    shape: tuple[int, ...]
    _dtype: np.dtype[Any] = field(init=False, repr=False, compare=False)
    _nbytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        dtype = np.dtype(self.dtype)  # type: ignore[call-overload]
        if dtype.hasobject or dtype.itemsize == 0:
            raise TypeError(
                f"RawFeature needs a fixed-size numpy dtype without objects, not {dtype}"
            )
        shape = _spec_shape(self.shape)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "_dtype", dtype)
        object.__setattr__(self, "_nbytes", math.prod(shape) * dtype.itemsize)


#: One entry of a decoding spec.
FeatureSpec: TypeAlias = FixedLenFeature | VarLenFeature | RawFeature


def _check_spec(spec: Mapping[str, FeatureSpec]) -> list[tuple[str, FeatureSpec]]:
    if not isinstance(spec, Mapping):
        raise TypeError(f"spec must be a mapping of feature name to spec, not {type(spec)}")
    items = list(spec.items())
    for name, entry in items:
        if not isinstance(name, str):
            raise TypeError(f"feature names in a spec must be str, not {name!r}")
        _checked_key(name)
        if not isinstance(entry, (FixedLenFeature, VarLenFeature, RawFeature)):
            raise TypeError(
                f"spec for feature {name!r} must be a FixedLenFeature, VarLenFeature or "
                f"RawFeature, not {type(entry).__name__}"
            )
    return items


# ------------------------------------------------------------------------------------ encode


def _kind_of_scalar(value: object) -> str | None:
    if isinstance(value, (bool, int, np.integer, np.bool_)):
        return _INT64
    if isinstance(value, (float, np.floating)):
        return _FLOAT
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return _BYTES
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
        kind = kinds.pop() if kinds else _BYTES
    else:
        raise TypeError(
            f"feature {name!r}: cannot encode a value of type {_describe(value)} "
            "(expected int, float, bytes, str, a list of one of these, or a numpy array)"
        )
    if kind == _INT64:
        feature.int64_list.SetInParent()
        feature.int64_list.value.extend(_int_values(name, values))
    elif kind == _FLOAT:
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
        _fill_feature(name, value, target.feature[_checked_key(name)])


def _checked_key(name: str) -> str:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"feature name {name!r} is not encodable as UTF-8") from exc
    return name


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
            target = message.feature_lists.feature_list[_checked_key(name)]
            target.SetInParent()
            for index, step in enumerate(steps):
                _fill_feature(f"{name}[{index}]", step, target.feature.add())
    return message.SerializeToString(deterministic=True)


# ------------------------------------------------------------------------------------ decode


def _parse(message: Any, payload: bytes, what: str) -> None:
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


def _float_values(values: feature_pb2.FloatList) -> Array:
    """The float32 values of a FloatList, bit-exact.

    protobuf's getters widen to double, which quiets signalling NaNs; the packed field of the
    re-serialized list holds the exact bits.
    """
    count = len(values.value)
    if count == 0:
        return np.empty(0, dtype=np.float32)
    size = 4 * count
    header = 2 if size < 0x80 else 3 if size < 0x4000 else 1 + len(_varint(size))
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
    if kind == _INT64:
        return _int64_values(feature.int64_list)
    if kind == _BYTES:
        return list(feature.bytes_list.value)
    if kind == _FLOAT:
        return _float_values(feature.float_list)
    return np.empty(0, dtype=np.float32)  # kind not set: no values


def _features_dict(features: feature_pb2.Features) -> dict[str, Decoded]:
    return {name: _any_values(features.feature[name]) for name in sorted(features.feature)}


def _kind_values(
    name: str, feature: feature_pb2.Feature, want: str, where: str
) -> Array | list[bytes]:
    """The values of ``feature``, which must be of kind ``want`` (or have no kind)."""
    kind = feature.WhichOneof("kind")
    if kind is None:
        return [] if want == _BYTES else np.empty(0, dtype=_numpy_dtype(_DTYPE_OF_KIND[want]))
    if kind != want:
        raise FeatureError(name, f"{where}expected {want} ({_DTYPE_OF_KIND[want]}), got {kind}")
    if kind == _INT64:
        return _int64_values(feature.int64_list)
    if kind == _FLOAT:
        return _float_values(feature.float_list)
    return list(feature.bytes_list.value)


_DTYPE_OF_KIND = {_INT64: "int64", _FLOAT: "float32", _BYTES: "bytes"}


def _decode_one(features: Any, name: str, spec: FeatureSpec, where: str) -> Array | list[bytes]:
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
        want = _KIND_OF_DTYPE[spec._kind]
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
        want = _KIND_OF_DTYPE[spec._kind]
        if not present:
            return [] if want == _BYTES else np.empty(0, dtype=_numpy_dtype(spec._kind))
        return _kind_values(name, features[name], want, where)
    # RawFeature
    if not present:
        raise FeatureError(name, f"{where}missing (a RawFeature has no default)")
    raw = _kind_values(name, features[name], _BYTES, where)
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
    _parse(message, payload, "payload")
    if spec is None:
        return _features_dict(message.features)
    features = message.features.feature
    return {name: _decode_one(features, name, entry, "") for name, entry in _check_spec(spec)}


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
    _parse(message, payload, "payload")
    context = _features_dict(message.context)
    lists = message.feature_lists.feature_list
    feature_lists = {
        name: [_any_values(step) for step in lists[name].feature] for name in sorted(lists)
    }
    return context, feature_lists


# ------------------------------------------------------------------------------ decode_batch

# Modes of _cexample.parse_examples (see _cexample.c).
_C_INT64, _C_FLOAT, _C_BYTES, _C_RAW, _C_VAR_INT64, _C_VAR_FLOAT, _C_VAR_BYTES = range(7)


def _decode_batch_python(
    payloads: Sequence[bytes], items: list[tuple[str, FeatureSpec]]
) -> dict[str, Array | list[Any]]:
    """Decode with protobuf, record by record.

    Features of the expected kind and length are written straight into the flat output rows
    (the common case); anything else goes through :func:`_decode_one`, which applies defaults
    and raises the errors, so the result equals stacking :func:`decode`.
    """
    n = len(payloads)
    out: dict[str, Array | list[Any]] = {}
    # (name, spec, kind wanted, flat row target or None, value count, output)
    plan: list[tuple[str, FeatureSpec, str, Array | None, int, Array | list[Any]]] = []
    sizes = (memoryview(payload).nbytes for payload in payloads)
    unfillable = _unfillable(min(sizes, default=sys.maxsize), items)
    for name, entry in items:
        target: Array | list[Any]
        flat: Array | None = None
        count = 0
        if name in unfillable:
            target = []  # some record cannot hold it: decoding raises at or before that one
        elif isinstance(entry, FixedLenFeature):
            dtype = object if entry._kind == "bytes" else _numpy_dtype(entry._kind)
            target = np.empty((n, *entry.shape), dtype=dtype)
            count = entry._count
            if entry._kind != "bytes" and count:
                flat = target.reshape(n, count)
        elif isinstance(entry, RawFeature):
            target = np.empty((n, *entry.shape), dtype=entry._dtype)
            count = entry._nbytes
            if count:
                flat = target.reshape(n, math.prod(entry.shape)).view(np.uint8)
        else:
            target = []
        out[name] = target
        plan.append((name, entry, _KIND_OF_DTYPE[_kind_name(entry)], flat, count, target))
    message = example_pb2.Example()
    for index, payload in enumerate(payloads):
        _parse(message, payload, f"record {index} of the batch")
        features = message.features.feature
        for name, entry, want, flat, count, target in plan:
            if flat is not None and name in features:
                feature = features[name]
                if feature.WhichOneof("kind") == want:
                    if want == _INT64:
                        ints = feature.int64_list.value
                        if len(ints) == count:
                            flat[index] = ints[:]
                            continue
                    elif want == _FLOAT:
                        if len(feature.float_list.value) == count:
                            flat[index] = _float_values(feature.float_list)
                            continue
                    else:
                        blobs = feature.bytes_list.value
                        if len(blobs) == 1 and len(blobs[0]) == count:
                            flat[index] = np.frombuffer(blobs[0], dtype=np.uint8)
                            continue
            value = _decode_one(features, name, entry, f"record {index} of the batch: ")
            if isinstance(target, list):
                target.append(value)
            else:
                target[index, ...] = value
    for name in unfillable:  # (only reached if every record held it after all)
        out[name] = np.stack(list(out[name]))
    return out


def _unfillable(shortest: int, items: list[tuple[str, FeatureSpec]]) -> set[str]:
    """Fixed-size features with no default that a payload of ``shortest`` bytes cannot hold.

    Every value takes at least one byte on the wire, so a record of ``k`` bytes cannot hold
    more than ``k`` values (or a raw value of more than ``k`` bytes): decoding that record
    raises :class:`FeatureError` (or :class:`ExampleError`), as :func:`decode` does. The
    batch's ``(n, *shape)`` output is then never allocated: a spec shape is checked against
    the payloads before memory is taken for it.
    """
    found: set[str] = set()
    for name, entry in items:
        if isinstance(entry, FixedLenFeature):
            if entry._default is None and entry._count > shortest:
                found.add(name)
        elif isinstance(entry, RawFeature) and entry._nbytes > shortest:
            found.add(name)
    return found


def _kind_name(entry: FeatureSpec) -> str:
    return "bytes" if isinstance(entry, RawFeature) else entry._kind


def _decode_batch_c(
    payloads: Sequence[bytes], items: list[tuple[str, FeatureSpec]]
) -> dict[str, Array | list[Any]] | None:
    """Decode with the C parser; None when it declines (then the Python path decides)."""
    n = len(payloads)
    specs: list[tuple[bytes, int, int, object, object, object]] = []
    outs: list[Array] = []
    for name, entry in items:
        key = name.encode("utf-8")
        counts: object = None
        default: object = None
        if isinstance(entry, FixedLenFeature):
            count = entry._count
            if entry._kind == "bytes":
                mode = _C_BYTES
                out = np.empty((n, count, 2), dtype=np.int64)
                default = None if entry._default is None else True
            else:
                mode = _C_INT64 if entry._kind == "int64" else _C_FLOAT
                out = np.empty((n, *entry.shape), dtype=_numpy_dtype(entry._kind))
                if entry._default is not None:
                    default = np.ascontiguousarray(entry._default).tobytes()
        elif isinstance(entry, RawFeature):
            mode, count = _C_RAW, entry._nbytes
            out = np.empty((n, *entry.shape), dtype=entry._dtype)
        else:
            mode = {"int64": _C_VAR_INT64, "float32": _C_VAR_FLOAT, "bytes": _C_VAR_BYTES}[
                entry._kind
            ]
            count = 0
            out = np.empty((n,), dtype=np.int64)  # per-record value counts
            counts = out
        outs.append(out)
        specs.append((key, mode, count, None if counts is not None else out, default, counts))
    result = _cexample.parse_examples(payloads, specs)
    if result is None:
        return None
    decoded: dict[str, Array | list[Any]] = {}
    for (name, entry), out, flat in zip(items, outs, result, strict=True):
        if isinstance(entry, FixedLenFeature) and entry._kind == "bytes":
            decoded[name] = _bytes_array(payloads, out, entry)
        elif isinstance(entry, VarLenFeature):
            decoded[name] = _split_var(payloads, entry._kind, out, flat)
        else:
            decoded[name] = out
    return decoded


def _bytes_array(payloads: Sequence[bytes], spans: Array, entry: FixedLenFeature) -> Array:
    n = len(payloads)
    array = np.empty((n, entry._count), dtype=object)
    default = entry._default
    for index, (payload, row) in enumerate(zip(payloads, spans.tolist(), strict=True)):
        for j, (offset, length) in enumerate(row):
            if offset < 0:
                assert default is not None
                array[index, j] = default.reshape(-1)[j]
            else:
                array[index, j] = bytes(payload[offset : offset + length])
    return array.reshape((n, *entry.shape))


def _split_var(payloads: Sequence[bytes], kind: str, counts: Array, flat: bytearray) -> list[Any]:
    ends = np.cumsum(counts).tolist()
    starts = [0, *ends][: len(ends)]
    if kind == "bytes":
        spans = np.frombuffer(flat, dtype=np.int64).reshape(-1, 2).tolist()
        return [
            [bytes(payload[o : o + ln]) for o, ln in spans[a:b]]
            for payload, a, b in zip(payloads, starts, ends, strict=True)
        ]
    values = np.frombuffer(flat, dtype=_numpy_dtype(kind))
    return [values[a:b] for a, b in zip(starts, ends, strict=True)]


def _byte_view(payload: Any) -> Any:
    """``payload``'s bytes, indexed by byte (what ``memoryview(payload).tobytes()`` holds).

    The C parser reads a buffer's bytes and returns byte offsets into it; a buffer whose items
    are not single bytes (``memoryview.cast("I")``, a 2-d uint8 array) is cast to a flat byte
    view (copied when it is not contiguous) so that those offsets index bytes.
    """
    if isinstance(payload, bytes):
        return payload
    view = memoryview(payload)
    if view.ndim == 1 and view.itemsize == 1:
        return payload
    try:
        return view.cast("B")
    except (TypeError, ValueError):  # not C-contiguous, or a format cast() cannot read
        return view.tobytes()


def decode_batch(
    payloads: Sequence[bytes], spec: Mapping[str, FeatureSpec]
) -> dict[str, Array | list[Any]]:
    """Decode many serialized ``Example`` payloads with one spec and stack the results.

    Returns one entry per spec'd feature:

    * :class:`FixedLenFeature` (int64 / float32): an ``(n, *shape)`` array;
      ``bytes``: an ``(n, *shape)`` numpy object array of bytes.
    * :class:`RawFeature`: an ``(n, *shape)`` array of its dtype.
    * :class:`VarLenFeature`: a list of ``n`` per-record values, each a 1-d int64 / float32
      array (with the C parser, views into one shared buffer) or a list of bytes.

    The result equals stacking :func:`decode` of every payload. Uses the C parser when it is
    built (see :func:`has_c_accelerator`); any batch it cannot decode cleanly is decoded again
    by the Python path, so errors are the same either way: :class:`~streamrec.errors.ExampleError`
    for a damaged payload and :class:`~streamrec.errors.FeatureError` for a spec mismatch, both
    naming the record index in the batch (and the feature). Payloads may be any buffers
    (their bytes are decoded, as in a ``bytes`` copy). A fixed shape that some payload is
    too short to hold raises that record's error before the batch's output is allocated.
    """
    items = _check_spec(spec)
    if has_c_accelerator():
        shortest = _shortest_bytes(payloads)  # one C pass: types and lengths
        if shortest < 0:  # not all bytes: give the C parser flat byte views
            payloads = [_byte_view(payload) for payload in payloads]
            shortest = min(map(len, payloads))
        decoded = None if _unfillable(shortest, items) else _decode_batch_c(payloads, items)
        if decoded is not None:
            return decoded
    return _decode_batch_python(payloads, items)
