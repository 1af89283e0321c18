"""Resuming a shuffled read: the state's size and what refetching the shuffle buffer costs.

Run from the repository root (build the C accelerators first)::

    python benchmarks/bench_resume.py [--quick] [--buffer 4096] [--stop 0.5]

For each record size (~1 KiB and ~100 KiB; lengths vary uniformly over +-25 % so that offsets
and lengths are not all alike), 16 uncompressed shards are written to ``benchmarks/data/``
(gitignored; reused): 16 x 4 MiB of ~1 KiB records and 16 x 64 MiB of ~100 KiB records
(``--quick``: 16 x 1 MiB and 16 x 8 MiB). A dataset with ``cycle_length=16`` and
``shuffle_buffer=--buffer`` hands out ``--stop`` of the epoch's records; its state is taken and
loaded into a fresh dataset, which reads the rest of the epoch. Columns:

* ``state bytes``: ``len(json.dumps(state))``; ``buffer bytes``: the shuffle buffer's part
  of it (``json.dumps(state["shuffle"]["buffer"])``);
* ``refetch reads`` / ``refetch MB``: range reads issued and bytes read while the buffer's
  records are fetched again (everything the resumed dataset reads before its shards' own
  streams start); ``useful MB``: the buffered records' own bytes (framing included), the
  least any refetch must read;
* ``rest MB``: what the shards' streams read afterwards (the epoch's unread bytes);
* ``refetch s``: wall time of the refetch on the local disk, page cache warm (for scale only:
  on a remote store the number of round trips dominates).

``--gaps 1024,256,64`` repeats the measurement with ``_GAP_BYTES``
(streamrec/pipeline/stream/opener.py) set to each of these KiB values, and adds ``model s``: the
refetch's seconds on the emulated cloud link of bench_remote.py, modelled as
``max(sum(60 ms + bytes / 25 MB/s over reads) / 16, bytes / 125 MB/s)`` (16 reads in flight,
25 MB/s per connection, ~1 Gbit in all).

Range reads are counted by wrapping ``LocalStore.read_range`` (every local read goes through it)
and the refetch is told apart by wrapping ``ShardOpener.fetch``: instrumentation, nothing is
replaced. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _harness import DATA_DIR, KIB, MIB

import streamrec
from streamrec.format.framing import RecordEncoder
from streamrec.pipeline.stream import opener as opener_module
from streamrec.storage.local.store import LocalStore

SHARDS = 16


class Counter:
    """Range reads and bytes, split into the refetch and the rest."""

    def __init__(self) -> None:
        self.phase = "other"
        self.reads: dict[str, int] = {"refetch": 0, "other": 0}
        self.nbytes: dict[str, int] = {"refetch": 0, "other": 0}
        self.refetch_s = 0.0


COUNTER = Counter()


def instrument() -> None:
    read_range = LocalStore.read_range
    fetch = opener_module.ShardOpener.fetch

    async def counted_read_range(self: LocalStore, obj: Any, start: int, end: int) -> bytes:
        data = await read_range(self, obj, start, end)
        COUNTER.reads[COUNTER.phase] += 1
        COUNTER.nbytes[COUNTER.phase] += len(data)
        return data

    async def marked_fetch(self: Any, *args: Any, **kwargs: Any) -> Any:
        COUNTER.phase = "refetch"
        began = time.perf_counter()
        try:
            return await fetch(self, *args, **kwargs)
        finally:
            COUNTER.refetch_s += time.perf_counter() - began
            COUNTER.phase = "other"

    LocalStore.read_range = counted_read_range  # type: ignore[method-assign]
    opener_module.ShardOpener.fetch = marked_fetch  # type: ignore[method-assign]


def ensure_shards(size: int, shard_bytes: int) -> list[str]:
    root = DATA_DIR / f"resume-{size}-{SHARDS}x{shard_bytes}"
    done = root / "_complete"
    paths = [str(root / f"shard-{k:02d}.tfrecord") for k in range(SHARDS)]
    if done.exists():
        return paths
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(size)
    filler = bytes(range(256)) * (size * 2 // 256 + 1)
    encoder = RecordEncoder()
    for path in paths:
        out = bytearray()
        while len(out) < shard_bytes:
            length = rng.randint(size * 3 // 4, size * 5 // 4)
            out += encoder.encode(filler[:length])
        Path(path).write_bytes(bytes(out))
    done.write_text("ok\n")
    return paths


def measure(paths: list[str], buffer: int, stop: float) -> dict[str, Any]:
    config: dict[str, Any] = {"cycle_length": SHARDS, "shuffle_buffer": buffer, "seed": 1}
    total = sum(1 for _ in streamrec.open_dataset(paths))  # also warms the page cache
    first = streamrec.open_dataset(paths, **config)
    wanted = int(total * stop)
    it = iter(first)
    for _ in range(wanted):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    it.close()  # type: ignore[attr-defined]
    locations = _locations(state)
    useful = sum(int(loc[3]) + 16 for loc in locations)
    COUNTER.__init__()  # type: ignore[misc]
    again = streamrec.open_dataset(paths, **config)
    again.load_state_dict(state)
    rest = sum(1 for _ in again)
    assert wanted + rest == total, (wanted, rest, total)
    return {
        "records": total,
        "state": len(json.dumps(state)),
        "buffer": len(json.dumps(state["shuffle"]["buffer"])),
        "entries": len(locations),
        "reads": COUNTER.reads["refetch"],
        "refetch": COUNTER.nbytes["refetch"],
        "useful": useful,
        "rest": COUNTER.nbytes["other"],
        "rest_reads": COUNTER.reads["other"],
        "seconds": COUNTER.refetch_s,
    }


def _locations(state: dict[str, Any]) -> list[list[int]]:
    buffer = state["shuffle"]["buffer"]
    if isinstance(buffer, list):  # states of version 1
        return [list(loc) for loc in buffer]
    from streamrec.pipeline.position.buffer_codec import decode_buffer  # version 2

    return decode_buffer(buffer, "shuffle.buffer")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--buffer", type=int, default=4096)
    parser.add_argument("--stop", type=float, default=0.5)
    parser.add_argument("--gaps", default="", help="KiB values of _GAP_BYTES to compare")
    args = parser.parse_args(argv)
    instrument()
    shard_bytes = {KIB: 4 * MIB, 100 * KIB: 64 * MIB}
    if args.quick:
        shard_bytes = {KIB: 1 * MIB, 100 * KIB: 8 * MIB}
    gaps = [int(g) for g in args.gaps.split(",") if g]
    print(
        f"`python benchmarks/bench_resume.py{' --quick' if args.quick else ''} "
        f"--buffer {args.buffer} --stop {args.stop}{' --gaps ' + args.gaps if gaps else ''}`\n"
    )
    print(
        "| records | shards | stopped at | gap KiB | state bytes | buffer bytes | refetch reads "
        "| refetch MB | useful MB | rest MB | refetch s | model s |"
    )
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for size, per_shard in shard_bytes.items():
        paths = ensure_shards(size, per_shard)
        for gap in gaps or [None]:
            if gap is not None:
                opener_module._GAP_BYTES = gap * KIB  # type: ignore[attr-defined]
            shown = getattr(opener_module, "_GAP_BYTES", 0) // KIB
            r = measure(paths, args.buffer, args.stop)
            label = "~1 KiB" if size == KIB else "~100 KiB"
            model = max((0.06 * r["reads"] + r["refetch"] / 25e6) / 16, r["refetch"] / 125e6)
            print(
                f"| {label} | {SHARDS} x {per_shard // MIB} MiB | {args.stop:.0%} of "
                f"{r['records']:,} | {shown:,} | {r['state']:,} | {r['buffer']:,} | {r['reads']:,} "
                f"| {r['refetch'] / 1e6:.1f} | {r['useful'] / 1e6:.1f} | {r['rest'] / 1e6:.1f} "
                f"| {r['seconds']:.2f} | {model:.2f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
