"""``streamrec index`` against ``streamrec count`` on the same local shards, in one run.

Run from the repository root (build the C accelerators first)::

    python benchmarks/bench_index.py [--quick] [--shard-mib 64] [--rounds 7] [--out FILE]

For each record size (100 B, 1 KiB, 100 KiB; lengths vary over +-25 %), 16 uncompressed shards
of ``--shard-mib`` MiB each (default 64, a common production size is 100-200 MB; ``--quick``:
4 MiB) are written to ``benchmarks/data/index/`` (gitignored; reused). Each round runs, in
this process, ``streamrec count --no-progress --json DIR/*`` and ``streamrec index --force
--no-progress --json DIR/*`` (``--force``: every round reads every shard and writes every
sidecar, fsynced and renamed into place), in alternating order, after one warm-up round of
each (page cache warm: the local disk is not what is measured). Both read the
shards the same way (the pipeline's ShardScan, 8 shards at a time, every CRC checked); the index
also collects each record's length and formats and writes the sidecar.

Columns: the best and median wall seconds of each command over the rounds, the shard MB/s
the best ones give, and ``index speed / count speed``: ``count s / index s`` of the best times
and the median of the rounds' (each round's pair ran back to back), the target being >= 0.9
(indexing runs at the sequential read speed). On a shared machine, the best times are the
steadier figure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from _harness import BENCH_DIR
from _harness.local import write_random_shards
from _harness.report import cpu_model, given_outputs, replace_section, source_state
from _harness.results import JSON_HELP, save_results

import streamrec
from streamrec.cli import main as cli_main
from streamrec.format import framing

MIB = 1 << 20
SHARDS = 16
SIZES = [("100 B", 100), ("1 KiB", 1024), ("100 KiB", 100 * 1024)]
START, END = "<!-- bench_index:start -->", "<!-- bench_index:end -->"


def timed(*args: str) -> float:
    """Seconds one ``streamrec ARGS`` takes in this process (its output dropped)."""
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        status = cli_main(list(args))
    elapsed = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"streamrec {' '.join(args)} exited with {status}")
    return elapsed


def measure(directory: Path, rounds: int) -> dict[str, list[float]]:
    pattern = f"{directory}/*"
    count = ["count", "--no-progress", "--json", pattern]
    index = ["index", "--force", "--no-progress", "--json", pattern]
    timed(*count)  # warm-up: page cache, imports
    timed(*index)
    times: dict[str, list[float]] = {"count": [], "index": []}
    for k in range(rounds):
        order = ("count", "index") if k % 2 == 0 else ("index", "count")
        for name in order:
            times[name].append(timed(*(count if name == "count" else index)))
    return times


def cpu_name() -> str:
    return cpu_model(platform.processor() or platform.machine())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 MiB shards")
    parser.add_argument("--shard-mib", type=int, default=64, help="MiB per shard (default 64)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, help="write the table into this markdown file")
    parser.add_argument("--json", type=Path, help=JSON_HELP)
    args = parser.parse_args(argv)
    shard_bytes = (4 if args.quick else args.shard_mib) * MIB
    started = time.monotonic()
    rows = []
    for label, record_bytes in SIZES:
        directory = BENCH_DIR / "data" / "index" / f"{record_bytes}-{shard_bytes // MIB}"
        write_random_shards(directory, SHARDS, record_bytes, shard_bytes, record_bytes)
        total = sum(p.stat().st_size for p in directory.glob("*.tfrecord"))
        times = measure(directory, args.rounds)
        ratios = [c / i for c, i in zip(times["count"], times["index"], strict=True)]
        best_count, best_index = min(times["count"]), min(times["index"])
        records = streamrec.open_dataset(f"{directory}/*").num_records
        rows.append(
            f"| {label} | {records:,} | {total / MIB:.0f} "
            f"| {best_count:.3f} | {statistics.median(times['count']):.3f} "
            f"| {best_index:.3f} | {statistics.median(times['index']):.3f} "
            f"| {total / 1e6 / best_count:,.0f} | {total / 1e6 / best_index:,.0f} "
            f"| {best_count / best_index:.2f} | {statistics.median(ratios):.2f} "
            f"| {' '.join(f'{r:.2f}' for r in ratios)} |"
        )
        print(rows[-1], flush=True)
    command = "python benchmarks/bench_index.py" + (" --quick" if args.quick else "")
    if args.shard_mib != 64 and not args.quick:
        command += f" --shard-mib {args.shard_mib}"
    if args.rounds != 7:
        command += f" --rounds {args.rounds}"
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = "\n".join(
        [
            f"Command: `{command}{given_outputs(args)}` ({now}, {args.rounds} rounds, "
            f"{time.monotonic() - started:.0f} s in all).",
            "",
            f"Machine: {cpu_name()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, C framing: {framing.accelerated}. "
            f"Source: {source_state()}. {SHARDS} shards per size, page cache warm.",
            "",
            "| record | records | MiB | count s best | count s median | index s best "
            "| index s median | count MB/s | index MB/s | index / count speed, best "
            "| index / count speed, median of rounds | per round |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
            *rows,
        ]
    )
    print(section)
    if args.out is not None:
        intro = (
            "## Building record indexes (bench_index.py)\n\n"
            "`streamrec index` against `streamrec count` on the same local shards (see the "
            "module docstring of `bench_index.py`); target: index speed >= 0.9 x count speed.\n\n"
        )
        replace_section(args.out, START, END, section, intro)
    save_results(args.json, "bench_index", section, ["index vs count"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
