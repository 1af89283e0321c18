"""Decoding specs (:class:`FixedLenFeature`, :class:`VarLenFeature`, :class:`RawFeature`) and
the names shared by the encoder and the decoders: the ``Feature`` kinds and their dtypes.

This module does no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = [
    "BYTES_LIST",
    "DTYPE_OF_KIND",
    "FLOAT_LIST",
    "INT64_LIST",
    "KIND_OF_DTYPE",
    "Array",
    "Decoded",
    "FeatureSpec",
    "FixedLenFeature",
    "RawFeature",
    "VarLenFeature",
    "check_spec",
    "checked_key",
    "numpy_dtype",
]

Array: TypeAlias = npt.NDArray[Any]
#: One decoded feature: a numpy array (int64 / float32 / raw / object of bytes) or, for
#: ``bytes_list`` features without a spec, a list of bytes.
Decoded: TypeAlias = Array | list[bytes]


#: The ``kind`` oneof of a ``Feature``: its three list fields.
BYTES_LIST = "bytes_list"
FLOAT_LIST = "float_list"
INT64_LIST = "int64_list"
#: A spec's normalised dtype -> the Feature kind holding it, and back.
KIND_OF_DTYPE = {"int64": INT64_LIST, "float32": FLOAT_LIST, "bytes": BYTES_LIST}
DTYPE_OF_KIND = {INT64_LIST: "int64", FLOAT_LIST: "float32", BYTES_LIST: "bytes"}


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


def numpy_dtype(kind: str) -> np.dtype[Any]:
    """The numpy dtype of the normalised spec dtype ``"int64"`` or ``"float32"``."""
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
            given = np.asarray(self.default, dtype=numpy_dtype(kind))
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


def check_spec(spec: Mapping[str, FeatureSpec]) -> list[tuple[str, FeatureSpec]]:
    """``spec``'s ``(name, entry)`` pairs; TypeError / ValueError if it is not a valid spec."""
    if not isinstance(spec, Mapping):
        raise TypeError(f"spec must be a mapping of feature name to spec, not {type(spec)}")
    items = list(spec.items())
    for name, entry in items:
        if not isinstance(name, str):
            raise TypeError(f"feature names in a spec must be str, not {name!r}")
        checked_key(name)
        if not isinstance(entry, (FixedLenFeature, VarLenFeature, RawFeature)):
            raise TypeError(
                f"spec for feature {name!r} must be a FixedLenFeature, VarLenFeature or "
                f"RawFeature, not {type(entry).__name__}"
            )
    return items


def checked_key(name: str) -> str:
    """``name``, checked to be encodable as UTF-8 (ValueError otherwise)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"feature name {name!r} is not encodable as UTF-8") from exc
    return name
