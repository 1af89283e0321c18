"""A second epoch from the local shard cache against reading the same shards as local files,
and the cache directory's size sampled throughout, in one run.

Run from the repository root (build the C accelerators first)::

    python benchmarks/bench_cache.py [--quick] [--shard-mib 32] [--rounds 9] [--out FILE]

16 uncompressed shards of ``--shard-mib`` MiB (default 32; ``--quick``: 2 MiB) of 1 KiB
records (lengths vary over +-25 %) are written to ``benchmarks/data/cache/`` (gitignored;
reused) and uploaded to a fake-gcs-server on loopback (tests/support). Then:

* **fill**: one epoch of ``gs://`` with ``cache_dir`` (cache_bytes: all shards fit), timed;
  every shard is downloaded and written to the cache as it streams;
* **rounds**: ``--rounds`` times, in alternating order, one epoch read from the cache
  (``gs://`` url, ``cache_dir``: the listing is the one request) and one epoch of the same
  shards as local files (the copies the cache read from: the same bytes, page cache warm for
  both). Columns: best and median seconds, MB/s of the best, and ``cache / local speed``
  (``local s / cache s``) of the best times and the median of the rounds' pairs; target
  >= 0.9;
* **bound**: two epochs of ``gs://`` through a cache of a quarter of the shards
  (``cache_bytes`` = 4 shards + 1 byte, ``cycle_length=4``: four downloads at once, so
  reservations compete and shards are evicted and refetched), while a thread sums the sizes
  of the cache directory's files every millisecond. Reported: the most it ever held against
  ``cache_bytes`` (target: never more), and the samples taken.

Every epoch iterates the records with a plain ``for`` (the consumer's loop is the same in
both columns). The machine is shared: the load average is printed with the numbers.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _harness import DATA_DIR, MB, MIB
from _harness.local import write_random_shards
from _harness.report import cpu_model, given_outputs, now, replace_section, source_state
from _harness.results import JSON_HELP, save_results
from _harness.servers import FakeGcsServer

import streamrec
from streamrec.format import framing

SHARDS = 16
RECORD_BYTES = 1024
START, END = "<!-- bench_cache:start -->", "<!-- bench_cache:end -->"


def epoch(ds: streamrec.Dataset) -> tuple[float, int]:
    """Seconds one pass over ``ds`` takes, and the records it gave."""
    started = time.perf_counter()
    n = 0
    for _ in ds:
        n += 1
    return time.perf_counter() - started, n


def dir_bytes(directory: str) -> int:
    total = 0
    try:
        with os.scandir(directory) as found:
            for item in found:
                try:
                    if item.is_file(follow_symlinks=False):
                        total += item.stat(follow_symlinks=False).st_size
                except FileNotFoundError:  # evicted or published meanwhile
                    continue
    except FileNotFoundError:
        return 0
    return total


class Sampler(threading.Thread):
    """Sums the cache directory's file sizes every millisecond until stopped."""

    def __init__(self, directory: str) -> None:
        super().__init__(daemon=True)
        self.directory = directory
        self.largest = 0
        self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.001):
            self.largest = max(self.largest, dir_bytes(self.directory))
            self.samples += 1


def measure(
    url: str, local: list[str], storage: dict[str, Any], rounds: int, scratch: Path
) -> dict[str, Any]:
    total = sum(os.path.getsize(p) for p in local)
    cache_dir = str(scratch / "full")

    def cached() -> streamrec.Dataset:
        return streamrec.open_dataset(
            url, storage_options=storage, cache_dir=cache_dir, cache_bytes=total + MIB
        )

    fill_s, records = epoch(cached())
    if dir_bytes(cache_dir) < total:
        raise SystemExit("the fill epoch did not cache every shard")
    epoch(cached())  # warm-up of both sides
    epoch(streamrec.open_dataset(local))
    times: dict[str, list[float]] = {"cache": [], "local": []}
    for k in range(rounds):
        for name in ("cache", "local") if k % 2 == 0 else ("local", "cache"):
            ds = cached() if name == "cache" else streamrec.open_dataset(local)
            seconds, n = epoch(ds)
            if n != records:
                raise SystemExit(f"{name}: {n} records, expected {records}")
            times[name].append(seconds)
    # the bound: a quarter of the shards fit, four downloads at once
    small_dir = str(scratch / "small")
    limit = 4 * max(os.path.getsize(p) for p in local) + 1
    sampler = Sampler(small_dir)
    sampler.start()
    bound = streamrec.open_dataset(
        url, storage_options=storage, cache_dir=small_dir, cache_bytes=limit, cycle_length=4
    )
    try:
        for k in range(2):
            bound.set_epoch(k)
            epoch(bound)
    finally:
        sampler.done.set()
        sampler.join()
    return {
        "total": total,
        "records": records,
        "fill_s": fill_s,
        "times": times,
        "limit": limit,
        "largest": sampler.largest,
        "samples": sampler.samples,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 MiB shards")
    parser.add_argument("--shard-mib", type=int, default=32, help="MiB per shard (default 32)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, help="write the table into this markdown file")
    parser.add_argument("--json", type=Path, help=JSON_HELP)
    args = parser.parse_args(argv)
    shard_mib = 2 if args.quick else args.shard_mib
    started = time.monotonic()
    paths = write_random_shards(
        DATA_DIR / "cache" / f"{shard_mib}", SHARDS, RECORD_BYTES, shard_mib * MIB, shard_mib * MIB
    )
    scratch = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    load_before = os.getloadavg()
    try:
        with FakeGcsServer(log_dir=scratch) as server:
            server.create_bucket("bench")
            for path in paths:
                server.put("bench", f"cache/{path.name}", path.read_bytes())
            storage = {**server.storage_options}
            got = measure(
                "gs://bench/cache/*.tfrecord",
                [str(p) for p in paths],
                storage,
                args.rounds,
                scratch,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()
    times = got["times"]
    total = got["total"]
    ratios = [lo / c for c, lo in zip(times["cache"], times["local"], strict=True)]
    best_cache, best_local = min(times["cache"]), min(times["local"])
    command = "python benchmarks/bench_cache.py" + (" --quick" if args.quick else "")
    if args.shard_mib != 32 and not args.quick:
        command += f" --shard-mib {args.shard_mib}"
    if args.rounds != 9:
        command += f" --rounds {args.rounds}"
    section = "\n".join(
        [
            f"Command: `{command}{given_outputs(args)}` ({now()}, {args.rounds} rounds, "
            f"{time.monotonic() - started:.0f} s in all).",
            "",
            f"Machine: {cpu_model(platform.processor() or platform.machine())}, "
            f"{os.cpu_count()} cores (shared: load average {load_before[0]:.2f} before, "
            f"{load_after[0]:.2f} after), Python {platform.python_version()}, C framing: "
            f"{framing.accelerated}. Source: {source_state()}. {SHARDS} shards of "
            f"{shard_mib} MiB ({total / MIB:.0f} MiB, {got['records']:,} records of ~1 KiB), "
            f"page cache warm. Fill epoch (download from fake-gcs-server on loopback, written "
            f"through to the cache): {got['fill_s']:.2f} s.",
            "",
            "| read | s best | s median | MB/s (best) |",
            "|---|--:|--:|--:|",
            f"| second epoch from the cache | {best_cache:.3f} "
            f"| {statistics.median(times['cache']):.3f} | {total / MB / best_cache:,.0f} |",
            f"| local files | {best_local:.3f} | {statistics.median(times['local']):.3f} "
            f"| {total / MB / best_local:,.0f} |",
            "",
            f"Cache / local speed: **{best_local / best_cache:.2f}** (best times), "
            f"{statistics.median(ratios):.2f} (median of the rounds' pairs; per round: "
            f"{' '.join(f'{r:.2f}' for r in ratios)}); target >= 0.9.",
            "",
            f"Bound: two epochs through a cache of `cache_bytes` = {got['limit']:,} bytes (4 "
            f"shards), cycle_length 4: the directory held at most **{got['largest']:,}** bytes "
            f"over {got['samples']:,} samples (one per ms): "
            f"{'never more than cache_bytes' if got['largest'] <= got['limit'] else 'OVER'}.",
        ]
    )
    print(section)
    if args.out is not None:
        intro = (
            "## Local shard cache (bench_cache.py)\n\n"
            "A second epoch read from the local cache against the same shards read as local "
            "files, and the cache directory's size sampled while shards stream in and are "
            "evicted (see the module docstring of `bench_cache.py`).\n\n"
        )
        replace_section(args.out, START, END, section, intro)
    save_results(args.json, "bench_cache", section, ["cache vs local files"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
