"""grain's random-access source against streamrec's own ``get()``, on the same random records.

Run from the repository root (build the C accelerators first; ``pip install grain``)::

    python benchmarks/bench_grain.py [--records 20000] [--record-bytes 1024] [--rounds 5]

Writes 8 indexed local shards of Examples (``{"n": int, "data": bytes}``, ``--record-bytes``
each) to ``benchmarks/data/grain/`` (gitignored; reused), then, in alternating order each
round, reads the same shuffled batches of 64 record numbers (all ``--records`` of them):

* ``ds.get``: ``streamrec.open_dataset(...).get(batch)``, the baseline;
* ``__getitems__``: ``TFRecordDataSource(...).__getitems__(batch)`` (grain's batched read);
* ``__getitems__, spec``: the same with a spec (records decoded to dicts of arrays);
* ``grain MapDataset``: ``grain.MapDataset.source(source).batch(64)`` over the same order
  (grain calls ``__getitem__`` per record unless its batch push-down is on: one ``get`` each).

Prints records/s (best round) and each against ``ds.get``; the target for ``__getitems__`` is
>= 0.8x.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from _harness import BENCH_DIR

import streamrec
from streamrec.example import FixedLenFeature, encode

SHARDS = 8
BATCH = 64


def write_shards(directory: Path, records: int, record_bytes: int) -> str:
    """``SHARDS`` indexed shards of ``records`` Examples in ``directory`` (reused)."""
    pattern = str(directory / "part-*.tfrecord")
    marker = directory / f"written-{records}-{record_bytes}"
    if marker.exists():
        return pattern
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*"):
        old.unlink()
    per_shard = -(-records // SHARDS)
    blob = bytes(record_bytes)
    for shard in range(SHARDS):
        first = shard * per_shard
        numbers = range(first, min(records, first + per_shard))
        with streamrec.sync.open_writer(str(directory / f"part-{shard}.tfrecord"), index=True) as w:
            w.write_many([encode({"n": n, "data": blob}) for n in numbers])
    marker.touch()
    return pattern


def best_rate(records: int, run: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return records / best


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    import grain  # the extra: pip install grain

    from streamrec.interop.grain import TFRecordDataSource

    pattern = write_shards(BENCH_DIR / "data" / "grain", args.records, args.record_bytes)
    order = np.random.default_rng(0).permutation(args.records)
    batches = [order[i : i + BATCH].tolist() for i in range(0, args.records, BATCH)]
    ds = streamrec.open_dataset(pattern)
    source = TFRecordDataSource(pattern)
    parsed = TFRecordDataSource(pattern, spec={"n": FixedLenFeature(np.int64)})
    ds.get([0]), source[0], parsed[0]  # tables built, loops started: not timed

    class Ordered:  # grain reads the source in this order
        def __len__(self) -> int:
            return int(args.records)

        def __getitem__(self, i: int) -> object:
            return parsed[int(order[i])]

    readers: dict[str, Callable[[], object]] = {
        "ds.get": lambda: [ds.get(batch) for batch in batches],
        "__getitems__": lambda: [source.__getitems__(batch) for batch in batches],
        "__getitems__, spec": lambda: [parsed.__getitems__(batch) for batch in batches],
        "grain MapDataset": lambda: list(grain.MapDataset.source(Ordered()).batch(BATCH)),
    }
    rates = {name: 0.0 for name in readers}
    for _ in range(args.rounds):  # alternating: drift hits every reader alike
        for name, run in readers.items():
            rates[name] = max(rates[name], best_rate(args.records, run, 1))
    print(f"{args.records:,} random records of {args.record_bytes:,} bytes, batches of {BATCH}")
    print("| reader | records/s | x ds.get |\n|---|--:|--:|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:,.0f} | {rate / rates['ds.get']:.2f}x |")
    for closing in (ds, source, parsed):
        closing.close()


if __name__ == "__main__":
    main(sys.argv[1:])
