"""Decoded Example columns as Arrow: ``decode_batch(..., to="arrow")`` and ``arrow_schema``.

The C parser writes a batch the way Arrow keeps data, so it becomes a ``pyarrow.RecordBatch``
without a Python object per record or per value:

==========================================  =================================================
spec                                        Arrow type (``n`` records)
==========================================  =================================================
``FixedLenFeature(int64 | float32, ())``    ``int64`` / ``float32``: the C output, not copied
``FixedLenFeature(..., (a, b))``            ``fixed_size_list(fixed_size_list(t, b), a)``
``FixedLenFeature(bytes, shape)``           ``large_binary`` (nested the same way): the
                                            values copied in C from the payloads
``VarLenFeature(int64 | float32)``          ``large_list(t)``: offsets and values written
                                            in C, not copied
``VarLenFeature(bytes)``                    ``large_list(large_binary)``: the same
``RawFeature(dtype, shape)``                ``dtype``'s Arrow type, nested by ``shape``
                                            (``S<n>``: ``fixed_size_binary(n)``; ``U<n>``,
                                            complex and structured dtypes: TypeError)
==========================================  =================================================

The var-length and bytes columns take two passes in C (``parse_examples_arrow``): one counts
the values and bytes of every record, one writes them into buffers of exactly that size from
Arrow's memory pool (:func:`allocate`). Both run with the GIL released, on the calling thread
or, for a batch of 2,048 records or more outside a PyTorch DataLoader worker, on up to one
thread per core this process may use, each over 256 KiB of payload at least (threads started
for the batch take runs of records in turn; the same buffers byte for byte; ``decode_batch``'s
``num_threads`` sets the threads). An extension built before
``parse_examples_arrow`` existed gives spans that are gathered (``gather_spans``).

A spec without features gives batches of ``n`` rows and no column. Large (64-bit offset)
types throughout: one schema for every batch whatever its size, and the
C parser's int64 counts become offsets without a conversion. Without the C parser the numpy
batch of the Python path is converted (same values, same types). pyarrow is imported on first
use (``pip install streamrec[arrow]``). This module does no I/O.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from streamrec.format.accel import load_accelerator
from streamrec.format.example.spec import (
    Array,
    FeatureSpec,
    FixedLenFeature,
    RawFeature,
    VarLenFeature,
    check_spec,
    numpy_dtype,
)

__all__ = [
    "allocate",
    "arrow_schema",
    "batch_from_c",
    "batch_from_numpy",
    "pyarrow",
    "steps_from_c",
]

_cexample: Any = load_accelerator("_cexample")
_gather_spans: Any = getattr(_cexample, "gather_spans", None)


_pyarrow: Any = None


def pyarrow() -> Any:
    """The ``pyarrow`` module; an ImportError that says how to install it when it is missing."""
    global _pyarrow
    if _pyarrow is not None:
        return _pyarrow
    try:
        _pyarrow = importlib.import_module("pyarrow")
        return _pyarrow
    except ImportError as error:
        raise ImportError(
            "Arrow output needs pyarrow: pip install 'streamrec[arrow]' (or pyarrow>=14)"
        ) from error


def _native(dtype: np.dtype[Any]) -> np.dtype[Any]:
    return dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype


def _value_type(pa: Any, entry: FeatureSpec) -> Any:
    if isinstance(entry, RawFeature):
        dtype = entry._dtype
        if dtype.kind == "S":  # each value whole, NULs included (not a C string)
            return pa.binary(dtype.itemsize)
        if dtype.kind == "U":
            raise TypeError(
                f"RawFeature dtype {dtype} has no Arrow type (use bytes: S{dtype.itemsize * 4})"
            )
        try:
            return pa.from_numpy_dtype(_native(dtype))
        except (NotImplementedError, TypeError, ValueError, pa.ArrowException) as error:
            raise TypeError(f"RawFeature dtype {dtype} has no Arrow type") from error
    if entry._kind == "bytes":
        return pa.large_binary()
    return pa.int64() if entry._kind == "int64" else pa.float32()


def _field_type(pa: Any, entry: FeatureSpec) -> Any:
    value = _value_type(pa, entry)
    if isinstance(entry, VarLenFeature):
        return pa.large_list(value)
    for size in reversed(entry.shape):
        value = pa.list_(value, size)
    return value


def arrow_schema(spec: Mapping[str, FeatureSpec]) -> Any:
    """The ``pyarrow.Schema`` of ``decode_batch(payloads, spec, to="arrow")``: one field per
    feature, in the spec's order (types in the module's table)."""
    return _schema_of(pyarrow(), check_spec(spec))


def _nest(pa: Any, values: Any, shape: tuple[int, ...], n: int) -> Any:
    """``values`` (``n * prod(shape)`` of them) as ``n`` nested fixed-size lists.

    Built from buffers, not ``FixedSizeListArray.from_arrays``: that divides by the list size,
    and a zero-size dimension (``shape=(0,)``, which TensorFlow allows) crashes the process.
    """
    for depth in range(len(shape), 0, -1):
        kind = pa.list_(values.type, shape[depth - 1])
        length = n * math.prod(shape[: depth - 1])
        values = pa.Array.from_buffers(kind, length, [None], children=[values])
    return values


def _binary(pa: Any, lengths: Array, data: Any) -> Any:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.large_binary(), len(lengths), buffers)


def _gather(payloads: Sequence[Any], rows: Array, spans: Array) -> Any:
    """The bytes of each ``(offset, length)`` span of ``payloads[row]``, one after another."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    spans = np.ascontiguousarray(spans, dtype=np.int64)
    if _gather_spans is not None:
        return _gather_spans(payloads, rows, spans)
    pieces = [  # an extension built before gather_spans existed
        memoryview(payloads[row])[offset : offset + length]
        for row, (offset, length) in zip(rows.tolist(), spans.tolist(), strict=True)
    ]
    return b"".join(pieces)


def _offsets(pa: Any, counts: Array) -> Any:
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return pa.array(offsets)


def allocate(nbytes: int) -> Any:
    """A writable buffer of ``nbytes`` from Arrow's memory pool: the C parser writes the Arrow
    buffers of var-length and bytes features straight into it (the pool keeps freed pages,
    where fresh memory from the OS would be faulted in page by page for every batch)."""
    return pyarrow().allocate_buffer(nbytes)


def _from_c_buffers(pa: Any, entry: FeatureSpec, buffers: tuple[Any, ...], n: int) -> Any:
    """A column from ``parse_examples_arrow``'s buffers for one feature (see ``_cexample.c``)."""
    if isinstance(entry, VarLenFeature):
        if entry._kind == "bytes":
            offsets, value_offsets, data = buffers
            values = pa.Array.from_buffers(
                pa.large_binary(), len(value_offsets) // 8 - 1, [None, value_offsets, data]
            )
        else:
            offsets, data = buffers
            value_type = _value_type(pa, entry)
            width = 8 if entry._kind == "int64" else 4
            values = pa.Array.from_buffers(value_type, len(data) // width, [None, data])
        return pa.Array.from_buffers(
            pa.large_list(values.type), n, [None, offsets], children=[values]
        )
    assert isinstance(entry, FixedLenFeature)
    value_offsets, data = buffers
    values = pa.Array.from_buffers(
        pa.large_binary(), len(value_offsets) // 8 - 1, [None, value_offsets, data]
    )
    return _nest(pa, values, entry.shape, n)


def batch_from_c(
    payloads: Sequence[Any],
    items: list[tuple[str, FeatureSpec]],
    outs: list[Array | None],
    flats: list[Any],
) -> Any:
    """A ``RecordBatch`` from ``_cexample.parse_examples``' output (``outs``: the fixed and
    raw values, the bytes spans and the var-length counts; ``flats``: the var-length values)
    or from ``parse_examples_arrow``'s (``flats``: a tuple of Arrow buffers for each
    var-length or bytes feature, written in C: taken as they are)."""
    pa = pyarrow()
    schema = _schema_of(pa, items)  # a feature without an Arrow type fails before any work
    n = len(payloads)
    columns: list[Any] = []
    for (_, entry), out, flat in zip(items, outs, flats, strict=True):
        if isinstance(flat, tuple):
            columns.append(_from_c_buffers(pa, entry, flat, n))
            continue
        assert out is not None
        if isinstance(entry, VarLenFeature):
            if entry._kind == "bytes":
                spans = np.frombuffer(flat, dtype=np.int64).reshape(-1, 2)
                rows = np.repeat(np.arange(n, dtype=np.int64), out)
                values = _binary(pa, spans[:, 1], _gather(payloads, rows, spans))
            else:
                values = pa.array(np.frombuffer(flat, dtype=numpy_dtype(entry._kind)))
            columns.append(pa.LargeListArray.from_arrays(_offsets(pa, out), values))
        elif isinstance(entry, FixedLenFeature) and entry._kind == "bytes":
            spans = out.reshape(-1, 2)
            if n and entry._count and int(spans[:, 0].min()) < 0:  # defaults: rare, per value
                columns.append(_fixed_bytes_with_defaults(pa, payloads, entry, spans))
                continue
            rows = np.repeat(np.arange(n, dtype=np.int64), entry._count)
            values = _binary(pa, spans[:, 1], _gather(payloads, rows, spans))
            columns.append(_nest(pa, values, entry.shape, n))
        else:
            columns.append(_nest(pa, _numbers(pa, out), entry.shape, n))
    return _batch(pa, columns, schema, n)


def steps_from_c(entry: FeatureSpec, buffers: tuple[Any, ...], steps: int) -> Any:
    """The ``steps`` steps of one ``SequenceExample`` feature list as one Arrow array, each
    typed as the spec's column, from ``_cexample.parse_sequence_arrow``'s buffers (the values
    of fixed and raw features: ``(values,)``; var-length and bytes ones as for a batch)."""
    pa = pyarrow()
    if isinstance(entry, VarLenFeature) or (
        isinstance(entry, FixedLenFeature) and entry._kind == "bytes"
    ):
        return _from_c_buffers(pa, entry, buffers, steps)
    dtype = entry._dtype if isinstance(entry, RawFeature) else numpy_dtype(entry._kind)
    count = steps * math.prod(entry.shape)
    values = np.frombuffer(buffers[0], dtype=dtype, count=count).reshape(steps, *entry.shape)
    return _nest(pa, _numbers(pa, values), entry.shape, steps)


def _numbers(pa: Any, values: Array) -> Any:
    """A fixed or raw feature's values, flat (in native byte order: Arrow has no other)."""
    flat = values.reshape(-1)  # C-contiguous already: decode_batch's own arrays
    if not flat.dtype.isnative:
        flat = flat.astype(_native(flat.dtype))
    if flat.dtype.kind not in "iufS":
        return pa.array(flat)
    # the buffer as it is: 4x quicker than pa.array's checks, and S<n> values whole (pa.array
    # would cut each at its first NUL)
    kind = (
        pa.binary(flat.dtype.itemsize)
        if flat.dtype.kind == "S"
        else pa.from_numpy_dtype(flat.dtype)
    )
    return pa.Array.from_buffers(kind, len(flat), [None, pa.py_buffer(flat)])


def _fixed_bytes_with_defaults(
    pa: Any, payloads: Sequence[Any], entry: FixedLenFeature, spans: Array
) -> Any:
    assert entry._default is not None
    default = entry._default.reshape(-1).tolist()
    values: list[bytes] = []
    for index, (offset, length) in enumerate(spans.tolist()):
        if offset < 0:
            values.append(default[index % entry._count])
        else:
            payload = memoryview(payloads[index // entry._count])
            values.append(bytes(payload[offset : offset + length]))
    return _nest(pa, pa.array(values, type=pa.large_binary()), entry.shape, len(payloads))


def batch_from_numpy(
    decoded: Mapping[str, Any], items: list[tuple[str, FeatureSpec]], n: int
) -> Any:
    """A ``RecordBatch`` from ``decode_batch``'s numpy output (the Python path's)."""
    pa = pyarrow()
    schema = _schema_of(pa, items)
    columns: list[Any] = []
    for name, entry in items:
        value = decoded[name]
        if isinstance(entry, VarLenFeature):
            counts = np.fromiter((len(row) for row in value), dtype=np.int64, count=n)
            if entry._kind == "bytes":
                flat: Any = pa.array([blob for row in value for blob in row], pa.large_binary())
            else:
                dtype = numpy_dtype(entry._kind)
                flat = pa.array(np.concatenate([np.empty(0, dtype), *value]).astype(dtype))
            columns.append(pa.LargeListArray.from_arrays(_offsets(pa, counts), flat))
        elif isinstance(entry, FixedLenFeature) and entry._kind == "bytes":
            flat = pa.array(value.reshape(-1).tolist(), type=pa.large_binary())
            columns.append(_nest(pa, flat, entry.shape, n))
        else:
            columns.append(_nest(pa, _numbers(pa, value), entry.shape, n))
    return _batch(pa, columns, schema, n)


def _batch(pa: Any, columns: list[Any], schema: Any, n: int) -> Any:
    if not columns:  # no feature asked for: still n rows (from_arrays would make 0)
        return pa.RecordBatch.from_struct_array(
            pa.StructArray.from_buffers(pa.struct([]), n, [None])
        )
    # (names, not schema=: 3x quicker; the columns have the schema's types already)
    return pa.RecordBatch.from_arrays(columns, names=schema.names)


def _schema_of(pa: Any, items: list[tuple[str, FeatureSpec]]) -> Any:
    return _schema_cached(pa, tuple(items))


@functools.lru_cache(maxsize=64)  # a dataset's batches share one spec: its schema, once
def _schema_cached(pa: Any, items: tuple[tuple[str, FeatureSpec], ...]) -> Any:
    return pa.schema([pa.field(name, _field_type(pa, entry)) for name, entry in items])
