"""Example decoding rates on 1 KiB Examples: what bench_example.py prints and bench_local's
Example rows show.

Each Example is ``{"label": int64 scalar, "values": 64 float32, "data": raw bytes}`` with the
``data`` length chosen so the serialized payload is exactly 1,024 bytes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from streamrec.format import example as ex
from streamrec.format.example import batch as example_batch

__all__ = [
    "BATCH",
    "MIXED_SPEC",
    "PAYLOAD_SIZE",
    "make_mixed_payloads",
    "make_payloads",
    "run",
    "run_mixed",
    "run_sequence",
    "spec_for",
]

PAYLOAD_SIZE = 1024
BATCH = 1024
BIG_BATCH = 8192


def make_payloads(n: int, size: int = PAYLOAD_SIZE) -> list[bytes]:
    """``n`` distinct Examples of exactly ``size`` bytes (the ``data`` length is fitted)."""
    rng = np.random.default_rng(0)
    values = rng.standard_normal((n, 64)).astype(np.float32)
    data_len = 700
    probe = ex.encode({"label": 0, "values": values[0], "data": bytes(data_len)})
    data_len += size - len(probe)  # varint lengths of this size do not change with +-few bytes
    blob = rng.integers(0, 256, size=data_len + n, dtype=np.uint8).tobytes()
    payloads = [
        ex.encode({"label": i, "values": values[i], "data": blob[i : i + data_len]})
        for i in range(n)
    ]
    return payloads


def spec_for(payload: bytes) -> dict[str, ex.FeatureSpec]:
    """The FixedLen / Raw spec of the benchmark records."""
    data_len = len(ex.decode(payload)["data"][0])
    return {
        "label": ex.FixedLenFeature(np.int64),
        "values": ex.FixedLenFeature(np.float32, (64,)),
        "data": ex.RawFeature(np.uint8, (data_len,)),
    }


def _rate(n: int, fn: Callable[[], object], min_seconds: float = 0.5) -> float:
    """Best records/s of ``fn`` (which decodes ``n`` records) over repeated runs."""
    best = float("inf")
    spent = 0.0
    runs = 0
    while spent < min_seconds or runs < 3:
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        best = min(best, elapsed)
        spent += elapsed
        runs += 1
    return n / best


def _arrow_rate(n: int, batches: list[list[bytes]], spec: dict[str, ex.FeatureSpec]) -> float:
    """records/s of ``decode_batch(..., to="arrow")`` (NaN without pyarrow)."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return float("nan")
    return _rate(n, lambda: [ex.decode_batch(batch, spec, to="arrow") for batch in batches])


def make_mixed_payloads(n: int) -> list[bytes]:
    """``n`` Examples with variable-length features: a label, 0-39 int64 ids, 0-4 short
    bytes tags and one 50-499 byte text (~500 bytes on average)."""
    rng = np.random.default_rng(1)
    return [
        ex.encode(
            {
                "label": i,
                "ids": rng.integers(0, 1000, int(rng.integers(0, 40))).astype(np.int64),
                "tags": [b"tag%d" % k for k in range(i % 5)],
                "text": bytes(int(rng.integers(50, 500))),
            }
        )
        for i in range(n)
    ]


MIXED_SPEC: dict[str, ex.FeatureSpec] = {
    "label": ex.FixedLenFeature(np.int64),
    "ids": ex.VarLenFeature(np.int64),
    "tags": ex.VarLenFeature(bytes),
    "text": ex.FixedLenFeature(bytes),
}


def run_mixed(n: int) -> dict[str, float]:
    """records/s of ``decode_batch`` to numpy and to Arrow on :func:`make_mixed_payloads`
    (batches of 1,024): keys ``numpy`` and ``arrow``."""
    payloads = make_mixed_payloads(n)
    batches = [payloads[i : i + BATCH] for i in range(0, n, BATCH)]
    numpy_rate = _rate(n, lambda: [ex.decode_batch(batch, MIXED_SPEC) for batch in batches])
    return {"numpy": numpy_rate, "arrow": _arrow_rate(n, batches, MIXED_SPEC)}


def run(n: int) -> dict[str, float]:
    """Decode ``n`` 1 KiB Examples and return records/s for each decoding path.

    Keys: ``decode`` (per record, no spec), ``decode_batch`` (C parser if built, in batches of
    1,024; equal to ``decode_batch_python`` when it is not built), ``decode_batch_arrow``
    (the same batches to ``pyarrow.RecordBatch``es), both again in batches of 8,192
    (``decode_batch_8192``, ``decode_batch_arrow_8192``: ``to_arrow()``'s default) and
    ``decode_batch_python`` (C parser disabled). The slow paths are timed on at most 20,000
    of the ``n`` records.
    """
    payloads = make_payloads(n)
    spec = spec_for(payloads[0])
    batches = [payloads[i : i + BATCH] for i in range(0, n, BATCH)]

    def batched() -> None:
        for batch in batches:
            ex.decode_batch(batch, spec)

    results: dict[str, float] = {}
    small = max(1, min(n, 20_000))  # the slow paths need fewer records for a stable number
    results["decode"] = _rate(small, lambda: [ex.decode(p) for p in payloads[:small]])
    results["decode_batch"] = _rate(n, batched) if ex.has_c_accelerator() else float("nan")
    results["decode_batch_arrow"] = _arrow_rate(n, batches, spec)
    big = [payloads[i : i + BIG_BATCH] for i in range(0, n, BIG_BATCH)]  # to_arrow's default
    results["decode_batch_8192"] = _rate(n, lambda: [ex.decode_batch(b, spec) for b in big])
    results["decode_batch_arrow_8192"] = _arrow_rate(n, big, spec)
    saved = example_batch._cexample  # the C parser's one seam: None runs the Python path
    example_batch._cexample = None
    try:
        python_batches = [payloads[i : i + BATCH] for i in range(0, small, BATCH)]
        results["decode_batch_python"] = _rate(
            small, lambda: [ex.decode_batch(b, spec) for b in python_batches]
        )
        if not saved:
            results["decode_batch"] = results["decode_batch_python"]
    finally:
        example_batch._cexample = saved
    return results


SEQUENCE_CONTEXT: dict[str, ex.FeatureSpec] = {"label": ex.FixedLenFeature(np.int64)}
SEQUENCE_SPEC: dict[str, ex.FeatureSpec] = {
    "frames": ex.FixedLenFeature(np.float32, (8,)),
    "tokens": ex.VarLenFeature(np.int64),
    "words": ex.VarLenFeature(bytes),
}


def make_sequence_payloads(n: int) -> list[bytes]:
    """``n`` SequenceExamples: a context label and 1-20 steps of three feature lists (8 float32
    frames, 0-9 int64 tokens, 0-2 short bytes words a step; ~500 bytes on average)."""
    rng = np.random.default_rng(2)
    payloads = []
    for i in range(n):
        steps = int(rng.integers(1, 21))
        lists: dict[str, list[Any]] = {
            "frames": [rng.random(8, dtype=np.float32) for _ in range(steps)],
            "tokens": [rng.integers(0, 1000, int(rng.integers(0, 10))) for _ in range(steps)],
            "words": [[b"w%d" % k for k in range(j % 3)] for j in range(steps)],
        }
        payloads.append(ex.encode_sequence({"label": i}, lists))
    return payloads


def run_sequence(n: int, rounds: int = 5) -> dict[str, float]:
    """Median records/s of ``decode_sequence_batch`` on :func:`make_sequence_payloads` in
    batches of 1,024, rounds alternating: ``c`` (feature lists in C), ``lists_python`` (the
    context in C, the lists with protobuf: before ``parse_sequence_arrow``) and ``python``
    (no C parser). The Python rows are timed on at most 20,000 of the records."""
    payloads = make_sequence_payloads(n)
    small = max(1, min(n, 20_000))
    batches = [payloads[i : i + BATCH] for i in range(0, n, BATCH)]
    few = [payloads[i : i + BATCH] for i in range(0, small, BATCH)]

    def decode(chosen: list[list[bytes]]) -> None:
        for batch in chosen:
            ex.decode_sequence_batch(batch, SEQUENCE_CONTEXT, SEQUENCE_SPEC)

    rates: dict[str, list[float]] = {"c": [], "lists_python": [], "python": []}
    saved_c, saved_lists = example_batch._cexample, example_batch.parse_sequence_c
    first = ex.decode_sequence_batch(batches[0], SEQUENCE_CONTEXT, SEQUENCE_SPEC)
    example_batch._cexample = None
    try:  # the paths timed give the same batch
        assert first.equals(ex.decode_sequence_batch(batches[0], SEQUENCE_CONTEXT, SEQUENCE_SPEC))
    finally:
        example_batch._cexample = saved_c
    for _ in range(rounds):
        rates["c"].append(_rate(n, lambda: decode(batches), 0.2))
        example_batch.parse_sequence_c = lambda *args: None  # the lists with protobuf
        try:
            rates["lists_python"].append(_rate(small, lambda: decode(few), 0.2))
        finally:
            example_batch.parse_sequence_c = saved_lists
        example_batch._cexample = None  # the C parser's one seam: None runs the Python path
        try:
            rates["python"].append(_rate(small, lambda: decode(few), 0.2))
        finally:
            example_batch._cexample = saved_c
    return {key: statistics.median(values) for key, values in rates.items()}
