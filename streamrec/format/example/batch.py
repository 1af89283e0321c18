"""Decoding a batch: :func:`decode_batch`, on the C parser ``streamrec.format._cexample`` when it
is built and on protobuf (the pure-Python path) otherwise.

``_cexample`` below is the one place the C parser is looked up: tests set it to None to run
the pure-Python path (``monkeypatch.setattr(batch, "_cexample", None)``).

This module does no I/O.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from streamrec.errors import ExampleError
from streamrec.format.accel import load_accelerator
from streamrec.format.example.decoding import decode_one, float_values, parse_message
from streamrec.format.example.spec import (
    FLOAT_LIST,
    INT64_LIST,
    KIND_OF_DTYPE,
    Array,
    FeatureSpec,
    FixedLenFeature,
    RawFeature,
    VarLenFeature,
    check_spec,
    numpy_dtype,
)
from streamrec.format.payload import RecordSpans
from streamrec.format.proto import example_pb2

__all__ = ["decode_batch", "has_c_accelerator"]

_cexample: Any = load_accelerator("_cexample")  # the optional C parser of decode_batch
# shortest_bytes(payloads): the shortest payload's length, -1 if one is not exactly bytes
_shortest_bytes: Any = None if _cexample is None else _cexample.shortest_bytes


def has_c_accelerator() -> bool:
    """Return whether :func:`decode_batch` can use the compiled C parser in this process."""
    return _cexample is not None and sys.byteorder == "little"


# Modes of _cexample.parse_examples (see _cexample.c).
_C_INT64, _C_FLOAT, _C_BYTES, _C_RAW, _C_VAR_INT64, _C_VAR_FLOAT, _C_VAR_BYTES = range(7)
# (kind, var-length) -> mode, for the features parse_examples_arrow writes as Arrow buffers
_C_MODES = {
    ("bytes", False): _C_BYTES,
    ("int64", True): _C_VAR_INT64,
    ("float32", True): _C_VAR_FLOAT,
    ("bytes", True): _C_VAR_BYTES,
}


def _decode_batch_python(
    payloads: Sequence[bytes], items: list[tuple[str, FeatureSpec]]
) -> dict[str, Array | list[Any]]:
    """Decode with protobuf, record by record.

    Features of the expected kind and length are written straight into the flat output rows
    (the common case); anything else goes through :func:`decode_one`, which applies defaults
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
            dtype = object if entry._kind == "bytes" else numpy_dtype(entry._kind)
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
        plan.append((name, entry, KIND_OF_DTYPE[_kind_name(entry)], flat, count, target))
    message = example_pb2.Example()
    for index, payload in enumerate(payloads):
        try:
            parse_message(message, payload, f"record {index} of the batch")
            features = message.features.feature
            for name, entry, want, flat, count, target in plan:
                if flat is not None and name in features:
                    feature = features[name]
                    if feature.WhichOneof("kind") == want:
                        if want == INT64_LIST:
                            ints = feature.int64_list.value
                            if len(ints) == count:
                                flat[index] = ints[:]
                                continue
                        elif want == FLOAT_LIST:
                            if len(feature.float_list.value) == count:
                                flat[index] = float_values(feature.float_list)
                                continue
                        else:
                            blobs = feature.bytes_list.value
                            if len(blobs) == 1 and len(blobs[0]) == count:
                                flat[index] = np.frombuffer(blobs[0], dtype=np.uint8)
                                continue
                value = decode_one(features, name, entry, f"record {index} of the batch: ")
                if isinstance(target, list):
                    target.append(value)
                else:
                    target[index, ...] = value
        except ExampleError as error:
            error.batch_index = index  # a dataset's parse names its shard and offset
            raise
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


# One feature for the C parser: (key, mode, count, default, output: "none" (Arrow buffers come
# back), "out" (written into an array of this shape and dtype) or "counts" (per record))
_CSpec = tuple[bytes, int, int, object, str, tuple[int, ...], Any]


@functools.lru_cache(maxsize=64)  # a dataset's batches share one spec: converted once
def _c_plan(items: tuple[tuple[str, FeatureSpec], ...], arrow: bool) -> tuple[_CSpec, ...]:
    plan: list[_CSpec] = []
    for name, entry in items:
        key = name.encode("utf-8")
        default: object = None
        count = 0
        if arrow and (
            isinstance(entry, VarLenFeature)
            or (isinstance(entry, FixedLenFeature) and entry._kind == "bytes")
        ):
            mode = _C_MODES[entry._kind, isinstance(entry, VarLenFeature)]
            if isinstance(entry, FixedLenFeature):
                count = entry._count
                if entry._default is not None:
                    default = tuple(entry._default.reshape(-1).tolist())
            plan.append((key, mode, count, default, "none", (), None))
        elif isinstance(entry, FixedLenFeature):
            count = entry._count
            if entry._kind == "bytes":
                default = None if entry._default is None else True
                plan.append((key, _C_BYTES, count, default, "out", (count, 2), np.int64))
            else:
                mode = _C_INT64 if entry._kind == "int64" else _C_FLOAT
                if entry._default is not None:
                    default = np.ascontiguousarray(entry._default).tobytes()
                dtype = numpy_dtype(entry._kind)
                plan.append((key, mode, count, default, "out", entry.shape, dtype))
        elif isinstance(entry, RawFeature):
            plan.append((key, _C_RAW, entry._nbytes, None, "out", entry.shape, entry._dtype))
        else:
            mode = {"int64": _C_VAR_INT64, "float32": _C_VAR_FLOAT, "bytes": _C_VAR_BYTES}[
                entry._kind
            ]
            plan.append((key, mode, 0, None, "counts", (), np.int64))
    return tuple(plan)


# Arrow mode's default threads: none for a batch under this many records, and each thread at
# least this much payload (a thread's start and join cost about what 0.1 ms of parsing saves)
_THREADED_RECORDS = 2048
_MIN_RUN_BYTES = 256 * 1024


def _arrow_threads(num_threads: int | None, n: int) -> tuple[int, int]:
    """``(threads, min_run_bytes)`` for ``parse_examples_arrow``: the caller's ``num_threads``
    exactly (runs of any size), or by default :func:`_default_threads` (each thread over
    ``_MIN_RUN_BYTES`` at least)."""
    if num_threads is not None:
        return num_threads, 0
    if n < _THREADED_RECORDS or _in_torch_worker():  # (a worker is one of many processes)
        return 1, 0
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # (not on macOS or Windows)
        cores = os.cpu_count() or 1
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):  # (not on Windows)
        load = None
    return _default_threads(cores, os.cpu_count() or cores, load), _MIN_RUN_BYTES


def _default_threads(cores: int, cpus: int, load: float | None) -> int:
    """The cores this process may run on (``cores``), but only as many as the machine's
    ``cpus`` leave idle by the 1-minute load average (this thread's own share counted as idle):
    on a busy machine a thread that waits for a core holds up the whole batch (measured on 2
    shared cores: the C passes on 2 threads 1.45x one thread at load 1.3; ``decode_batch``
    about 0.9x at load 4-5)."""
    if load is None:
        return cores
    return max(1, min(cores, round(cpus - load + 1)))


def _in_torch_worker() -> bool:
    """Whether this is a PyTorch DataLoader worker (only asked if torch is imported already)."""
    data = sys.modules.get("torch.utils.data")
    get_worker_info = getattr(data, "get_worker_info", None)
    return get_worker_info is not None and get_worker_info() is not None


def _parse_c(
    payloads: Sequence[bytes],
    items: list[tuple[str, FeatureSpec]],
    alloc: Any = None,
    num_threads: int | None = None,
) -> tuple[list[Array | None], list[Any]] | None:
    """The C parser's output: per feature the values (fixed, raw), the ``(offset, length)``
    spans (fixed bytes) or the per-record counts (var-length), and the var-length values
    appended; None when it declines (then the Python path decides).

    With ``alloc`` (``alloc(nbytes)``: a writable buffer) and an extension that has it,
    ``parse_examples_arrow`` instead: the var-length and bytes features come back as Arrow
    buffers (their ``outs`` entry None; see ``_cexample.c``), on threads as
    :func:`_arrow_threads` says."""
    n = len(payloads)
    arrow = alloc is not None and hasattr(_cexample, "parse_examples_arrow")
    specs: list[tuple[bytes, int, int, object, object, object]] = []
    outs: list[Array | None] = []
    for key, mode, count, default, output, shape, dtype in _c_plan(tuple(items), arrow):
        if output == "none":
            outs.append(None)
            specs.append((key, mode, count, None, default, None))
        elif output == "out":
            out = np.empty((n, *shape), dtype=dtype)
            outs.append(out)
            specs.append((key, mode, count, out, default, None))
        else:
            out = np.empty((n,), dtype=np.int64)  # per-record value counts
            outs.append(out)
            specs.append((key, mode, count, None, default, out))
    if type(payloads) is RecordSpans:  # read where they lie: no bytes object per record
        buffers: Sequence[Any] = payloads.buffers
        spans: Array | None = np.ascontiguousarray(payloads.spans)  # (a strided slice: copied)
    else:
        buffers, spans = payloads, None
    if arrow:
        threads, min_run_bytes = _arrow_threads(num_threads, n)
        if threads > 1:
            result = _cexample.parse_examples_arrow(
                buffers, specs, spans, alloc, threads, min_run_bytes
            )
        else:
            result = _cexample.parse_examples_arrow(buffers, specs, spans, alloc)
    elif spans is not None:
        result = _cexample.parse_examples(buffers, specs, spans)
    else:
        result = _cexample.parse_examples(buffers, specs)
    if result is None:
        return None
    return outs, result


def parse_sequence_c(
    payloads: Sequence[Any], items: list[tuple[str, FeatureSpec]], alloc: Any
) -> tuple[list[Array], list[tuple[Any, ...]]] | None:
    """The feature lists of serialized ``SequenceExample`` payloads from the C parser
    (``_cexample.parse_sequence_arrow``): per feature the steps of each record (int64) and the
    Arrow buffers of all its steps, each step decoded as a record of ``parse_examples_arrow``;
    None when the C parser is not used or lacks it, or declines the batch (anything damaged or
    unexpected: the Python path then decodes it, and raises the errors)."""
    if not has_c_accelerator() or not hasattr(_cexample, "parse_sequence_arrow"):
        return None
    n = len(payloads)
    modes = {"int64": _C_INT64, "float32": _C_FLOAT, "bytes": _C_BYTES}
    specs: list[tuple[bytes, int, int, None, None, Array]] = []
    counts: list[Array] = []
    for name, entry in items:
        if isinstance(entry, RawFeature):
            mode, count = _C_RAW, entry._nbytes
        elif isinstance(entry, VarLenFeature):
            mode, count = _C_MODES[entry._kind, True], 0
        else:
            mode, count = modes[entry._kind], entry._count
        counts.append(np.empty((n,), dtype=np.int64))  # the steps of each record
        specs.append((name.encode("utf-8"), mode, count, None, None, counts[-1]))
    spans: Array | None = None
    if type(payloads) is RecordSpans:  # read where they lie: no bytes object per record
        buffers: Sequence[Any] = payloads.buffers
        spans = np.ascontiguousarray(payloads.spans)
    elif _shortest_bytes(payloads) < 0:  # not all bytes: flat byte views
        buffers = [_byte_view(payload) for payload in payloads]
    else:
        buffers = payloads
    result = _cexample.parse_sequence_arrow(buffers, specs, spans, alloc)
    if result is None:
        return None
    return counts, result


def _numpy_from_c(
    payloads: Sequence[bytes],
    items: list[tuple[str, FeatureSpec]],
    outs: list[Array | None],
    flats: Any,
) -> dict[str, Array | list[Any]]:
    decoded: dict[str, Array | list[Any]] = {}
    for (name, entry), out, flat in zip(items, outs, flats, strict=True):
        assert out is not None  # (None only from parse_examples_arrow)
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
    values = np.frombuffer(flat, dtype=numpy_dtype(kind))
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
    payloads: Sequence[bytes],
    spec: Mapping[str, FeatureSpec],
    *,
    to: str = "numpy",
    num_threads: int | None = None,
) -> Any:
    """Decode many serialized ``Example`` payloads with one spec and stack the results.

    Returns one entry per spec'd feature:

    * :class:`FixedLenFeature` (int64 / float32): an ``(n, *shape)`` array;
      ``bytes``: an ``(n, *shape)`` numpy object array of bytes.
    * :class:`RawFeature`: an ``(n, *shape)`` array of its dtype.
    * :class:`VarLenFeature`: a list of ``n`` per-record values, each a 1-d int64 / float32
      array (with the C parser, views into one shared buffer) or a list of bytes.

    ``to="arrow"`` returns a ``pyarrow.RecordBatch`` instead, one column per feature in the
    spec's order (types: :mod:`streamrec.format.example.arrow`; needs pyarrow), built from the
    C parser's output without an object per record or value. The C parser decodes a batch of
    2,048 records or more on up to ``len(os.sched_getaffinity(0))`` threads, as many as the
    load average leaves cores idle (each over 256 KiB of payload at least; none in a PyTorch
    DataLoader worker); ``num_threads`` sets the threads instead (``1``: the calling thread
    only). The result is the same either way.

    The result equals stacking :func:`decode` of every payload. Uses the C parser when it is
    built (see :func:`has_c_accelerator`); any batch it cannot decode cleanly is decoded again
    by the Python path, so errors are the same either way: :class:`~streamrec.errors.ExampleError`
    for a damaged payload and :class:`~streamrec.errors.FeatureError` for a spec mismatch, both
    naming the record index in the batch (and the feature). Payloads may be any buffers
    (their bytes are decoded, as in a ``bytes`` copy). A fixed shape that some payload is
    too short to hold raises that record's error before the batch's output is allocated.
    """
    if to not in ("numpy", "arrow"):
        raise ValueError(f'to must be "numpy" or "arrow", not {to!r}')
    if num_threads is not None and (type(num_threads) is not int or num_threads < 1):
        raise ValueError(f"num_threads must be None or an int >= 1, not {num_threads!r}")
    items = check_spec(spec)
    arrow: Any = None
    if to == "arrow":
        from streamrec.format.example import arrow

        arrow.pyarrow()  # a missing pyarrow says so before any decoding
    if has_c_accelerator():
        if type(payloads) is RecordSpans:
            shortest = payloads.shortest()
        else:
            shortest = _shortest_bytes(payloads)  # one C pass: types and lengths
        if shortest < 0:  # not all bytes: give the C parser flat byte views
            payloads = [_byte_view(payload) for payload in payloads]
            shortest = min(map(len, payloads))
        unfillable = _unfillable(shortest, items)
        alloc = None if arrow is None else arrow.allocate
        parsed = None if unfillable else _parse_c(payloads, items, alloc, num_threads)
        if parsed is not None:
            if arrow is not None:
                return arrow.batch_from_c(payloads, items, *parsed)
            return _numpy_from_c(payloads, items, *parsed)
    decoded = _decode_batch_python(payloads, items)
    if arrow is not None:
        return arrow.batch_from_numpy(decoded, items, len(payloads))
    return decoded
