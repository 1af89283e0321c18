"""Throughput of streamrec.format.example decoding on 1 KiB Examples.

Each Example is ``{"label": int64 scalar, "values": 64 float32, "data": raw bytes}`` with the
``data`` length chosen so the serialized payload is exactly 1,024 bytes. Reports records/s for
``decode`` (one payload at a time, no spec), ``decode_batch`` (C parser when built) and
``decode_batch`` with the C parser disabled (pure-Python protobuf path), ``decode_batch(...,
to="arrow")`` on the same batches, and numpy against Arrow on Examples with variable-length
features. The measurement is
``_harness/examples.py``'s ``run(n)`` (re-exported here), which bench_local.py's Example rows
use too.

Usage: ``python benchmarks/bench_example.py [n]`` (default n = 200,000 records);
``--sequence [n]``: ``decode_sequence_batch`` of SequenceExamples instead, feature lists in C
against protobuf (``run_sequence``; default n = 50,000).
"""

from __future__ import annotations

import sys

from _harness.examples import PAYLOAD_SIZE, run, run_mixed, run_sequence

from streamrec.format import example as ex

__all__ = ["main", "run"]


def main(argv: list[str]) -> None:
    """Print the numbers of :func:`run` (or, with ``--sequence``, of ``run_sequence``)."""
    if "--sequence" in argv:
        main_sequence([arg for arg in argv if arg != "--sequence"])
        return
    n = int(argv[1]) if len(argv) > 1 else 200_000
    results = run(n)
    print(f"{n:,} Examples of {PAYLOAD_SIZE} bytes, C accelerator: {ex.has_c_accelerator()}")
    for key in ("decode", "decode_batch", "decode_batch_arrow", "decode_batch_python"):
        print(f"{key:>20}: {results[key]:>12,.0f} records/s")
    print(f"{'arrow / numpy':>20}: {results['decode_batch_arrow'] / results['decode_batch']:.2f}x")
    numpy_big, arrow_big = results["decode_batch_8192"], results["decode_batch_arrow_8192"]
    print(f"batches of 8,192 (to_arrow's default): numpy {numpy_big:,.0f}, arrow {arrow_big:,.0f}")
    print(f"{'arrow / numpy':>20}: {arrow_big / numpy_big:.2f}x")
    mixed = run_mixed(min(n, 100_000))
    print("variable-length Examples (ids, tags, text; ~500 B), batches of 1,024:")
    for key in ("numpy", "arrow"):
        print(f"{key:>20}: {mixed[key]:>12,.0f} records/s")
    print(f"{'arrow / numpy':>20}: {mixed['arrow'] / mixed['numpy']:.2f}x")


def main_sequence(argv: list[str]) -> None:
    """Print the numbers of ``run_sequence``."""
    n = int(argv[1]) if len(argv) > 1 else 50_000
    print(f"{n:,} SequenceExamples (1-20 steps of 3 lists), batches of 1,024; median of 5 rounds")
    results = run_sequence(n)
    for key in ("c", "lists_python", "python"):
        print(f"{key:>20}: {results[key]:>12,.0f} records/s")
    print(f"{'c / lists_python':>20}: {results['c'] / results['lists_python']:.2f}x")


if __name__ == "__main__":
    main(sys.argv)
