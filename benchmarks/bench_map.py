"""``ds.map(fn)`` with a CPU-heavy ``fn``: 2 worker processes against 1, inline and 2 threads.

Run from the repository root (build the C accelerators first)::

    python benchmarks/bench_map.py [--records 20000] [--rounds 5] [--json PATH]

The data: ``--records`` ``tf.train.Example`` records (a 32x32x3 uint8 image and a label,
~3.1 KiB each) in 8 local uncompressed shards under ``benchmarks/data/map/`` (gitignored;
reused), read with the defaults (page cache warm: reading is not what is measured).

``fn`` (``augment``, module level so worker processes can unpickle it): decode the Example
(``streamrec.example.decode``), then numpy work on the image: to float32 in [0, 1], a crop
and flip chosen by the record's label, per-channel normalisation, a 4x4 average pool, per-channel
extremes; it returns the label and 153 float32 features (~0.6 KiB: results cross the process
boundary too). ``--fn light`` maps a lighter one instead (decode, to float32,
per-channel centring, a 4x4 average pool: about half the cost). Its cost per record is
measured alone first (one thread, no
pipeline), the target being ~50 us.

Configurations, each consuming every mapped item: ``num_workers=0`` (``fn`` inline in the
reading loop), 1 and 2 worker processes (``worker_type="process"``, the default start method,
256 records per task) and 2 worker threads (the GIL: no faster than inline for this ``fn``);
for reference, a bare ``ProcessPoolExecutor.map(fn, payloads, chunksize=256)`` with 1 and 2
processes over the payloads already in memory: the speed-up the machine gives two processes at
that moment, whatever else runs on it. Each round runs every configuration once, in a rotated
order; the table gives the best and median wall seconds, records/s of the best, and the speed-
up of 2 processes over 1: ``1-process s / 2-process s`` of the best times and the median of the
rounds' ratios (each round's pair ran close together, so it is the steadier figure on a shared
machine), and the CPU the main process spends per record (reading, handing tasks out, taking
results in: what the workers cannot have of the 2 cores), and the cores the run got: CPU
seconds of the main process and its workers over the wall seconds (two busy workers on an idle
2-core machine: close to 2). Target: >= 1.7x on 2 cores. The load average before and after is
printed with the table: other processes on the machine take cores from the workers.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from _harness import DATA_DIR
from _harness.report import command_line, cpu_model, now, publish, replace_section, source_state
from _harness.results import JSON_HELP, save_results

import streamrec
from streamrec.example import FixedLenFeature, RawFeature, decode, encode

SHARDS = 8
SPEC = {"image": RawFeature(np.uint8, (32, 32, 3)), "label": FixedLenFeature(np.int64)}
START, END = "<!-- bench_map:start -->", "<!-- bench_map:end -->"
CONFIGS: dict[str, dict[str, Any]] = {
    "inline (num_workers=0)": {"num_workers": 0},
    "1 process": {"num_workers": 1, "worker_type": "process"},
    "2 processes": {"num_workers": 2, "worker_type": "process"},
    "2 threads": {"num_workers": 2, "worker_type": "thread"},
    "bare pool.map, 1 process": {"bare": 1},
    "bare pool.map, 2 processes": {"bare": 2},
}


def augment(payload: bytes) -> tuple[int, np.ndarray]:
    """The mapped function: decode + numpy work (see the module documentation)."""
    example = decode(payload, SPEC)
    label = int(example["label"])
    image = example["image"].astype(np.float32) / 255.0
    dy, dx = label % 4, (label // 4) % 4
    image = image[dy : dy + 28, dx : dx + 28]
    if label % 2:
        image = image[:, ::-1]
    image = (image - image.mean(axis=(0, 1))) / (image.std(axis=(0, 1)) + 1e-6)
    pooled = image.reshape(7, 4, 7, 4, 3).mean(axis=(1, 3)).ravel()
    return label, np.concatenate([pooled, image.max(axis=(0, 1)), image.min(axis=(0, 1))])


def augment_light(payload: bytes) -> tuple[int, np.ndarray]:
    """A lighter ``fn`` (``--fn light``): decode, to float32, per-channel centring, a 4x4
    average pool."""
    example = decode(payload, SPEC)
    image = example["image"].astype(np.float32) / 255.0
    image = (image - image.mean(axis=(0, 1))) * 4.0
    return int(example["label"]), image.reshape(8, 4, 8, 4, 3).mean(axis=(1, 3)).ravel()


Mapper = Callable[[bytes], tuple[int, np.ndarray]]
FUNCTIONS: dict[str, Mapper] = {"full": augment, "light": augment_light}


def write_shards(directory: Path, records: int) -> list[str]:
    """``records`` Example records in ``SHARDS`` shards, reused when already there."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [str(directory / f"part-{s:05d}.tfrecord") for s in range(SHARDS)]
    if all(Path(p).exists() for p in paths):
        return paths
    rng = np.random.default_rng(0)
    per_shard = -(-records // SHARDS)
    for shard, path in enumerate(paths):
        with streamrec.sync.open_writer(path) as w:
            for i in range(min(per_shard, records - shard * per_shard)):
                image = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                w.write(encode({"image": image.tobytes(), "label": (shard * per_shard + i) % 97}))
    return paths


def fn_cost_us(paths: list[str], fn: Mapper = augment) -> float:
    """Microseconds per record of ``fn`` alone (best of 3 passes over 2,000 records)."""
    payloads = [p for _, p in zip(range(2000), streamrec.open_dataset(paths), strict=False)]
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for payload in payloads:
            fn(payload)
        best = min(best, time.perf_counter() - started)
    return best / len(payloads) * 1e6


def children_cpu() -> float:
    """CPU seconds of the worker processes ended and waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(
    paths: list[str], options: dict[str, Any], fn: Mapper = augment
) -> tuple[float, float, float, int]:
    """Wall seconds to map every record with ``options``, the CPU seconds of this process (all
    its threads: reading, handing tasks out and results in, inline ``fn``), those of its
    worker processes (ended with the run), and the items received. ``bare`` options:
    ``ProcessPoolExecutor.map`` over the payloads already in memory (no reading, no
    pipeline: what the machine allows at the moment)."""
    bare = options.get("bare")
    payloads = list(streamrec.open_dataset(paths)) if bare else []
    started, cpu, workers = time.perf_counter(), time.process_time(), children_cpu()
    n = 0
    if bare:
        with ProcessPoolExecutor(bare) as pool:
            for _ in pool.map(fn, payloads, chunksize=256):
                n += 1
    else:
        for _ in streamrec.open_dataset(paths).map(fn, **options):
            n += 1
    elapsed = time.perf_counter() - started
    return elapsed, time.process_time() - cpu, children_cpu() - workers, n


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the table into this markdown file")
    parser.add_argument("--json", type=Path, help=JSON_HELP)
    parser.add_argument(
        "--fn", choices=sorted(FUNCTIONS), default="full", help="the mapped function (see above)"
    )
    args = parser.parse_args(argv)
    fn = FUNCTIONS[args.fn]
    started = time.monotonic()
    paths = write_shards(DATA_DIR / "map" / str(args.records), args.records)
    cost = fn_cost_us(paths, fn)
    print(f"fn alone: {cost:.1f} us/record", flush=True)
    load_before = os.getloadavg()
    names = list(CONFIGS)
    times: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    cores: dict[str, list[float]] = {name: [] for name in names}
    run_once(paths, CONFIGS["2 processes"], fn)  # warm-up: page cache, imports, first fork
    for k in range(args.rounds):
        for name in names[k % len(names) :] + names[: k % len(names)]:
            elapsed, cpu_s, workers_s, n = run_once(paths, CONFIGS[name], fn)
            if n != args.records:
                raise SystemExit(f"{name}: {n} items, expected {args.records}")
            times[name].append(elapsed)
            cpus[name].append(cpu_s)
            cores[name].append((cpu_s + workers_s) / elapsed)
            print(f"round {k + 1} {name}: {elapsed:.3f} s, {cpu_s:.3f} CPU s here", flush=True)
    load_after = os.getloadavg()
    one, two = times["1 process"], times["2 processes"]
    ratios = [a / b for a, b in zip(one, two, strict=True)]
    bare_one, bare_two = times["bare pool.map, 1 process"], times["bare pool.map, 2 processes"]
    bare_ratios = [a / b for a, b in zip(bare_one, bare_two, strict=True)]
    rows = []
    for name in names:
        best, median = min(times[name]), statistics.median(times[name])
        vs_one = min(one) / best
        cpu_us = statistics.median(cpus[name]) / args.records * 1e6
        rows.append(
            f"| {name} | {best:.3f} | {median:.3f} | {args.records / best:,.0f} | {vs_one:.2f}x "
            f"| {cpu_us:.1f} | {statistics.median(cores[name]):.2f} |"
        )
    section = "\n".join(
        [
            f"Command: `{command_line('bench_map.py', argv)}` ({now()}, {args.rounds} rounds, "
            f"{time.monotonic() - started:.0f} s in all).",
            "",
            f"Machine: {cpu_model(platform.machine())}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}. Source: {source_state()}. Load average (1, 5, 15 "
            f"min) before: {', '.join(f'{x:.2f}' for x in load_before)}; after: "
            f"{', '.join(f'{x:.2f}' for x in load_after)}.",
            "",
            f"{args.records:,} records, fn alone {cost:.1f} us/record "
            f"({1e6 / cost:,.0f} records/s on one core).",
            "",
            "| map | s best | s median | records/s (best) | speed vs 1 process (best) "
            "| main process CPU us/record (median) | cores used (median) |",
            "|---|--:|--:|--:|--:|--:|--:|",
            *rows,
            "",
            f"**2 processes / 1 process: {min(one) / min(two):.2f}x (best times), "
            f"{statistics.median(ratios):.2f}x (median of the rounds' ratios; per round: "
            f"{' '.join(f'{r:.2f}' for r in ratios)}).** Target >= 1.7x. The same for a bare "
            f"`ProcessPoolExecutor.map` (payloads in memory): {min(bare_one) / min(bare_two):.2f}x "
            f"best, {statistics.median(bare_ratios):.2f}x median (per round: "
            f"{' '.join(f'{r:.2f}' for r in bare_ratios)}).",
        ]
    )

    def write(path: Path, text: str) -> None:
        intro = (
            "## Map on worker processes (bench_map.py)\n\n"
            '`ds.map(fn, num_workers=2, worker_type="process")` with a CPU-heavy fn against '
            "one process, inline and threads (see the module docstring of `bench_map.py`); "
            "target: 2 processes >= 1.7x one.\n\n"
        )
        replace_section(path, START, END, text, intro)

    publish(section, args.out, write)
    save_results(args.json, "bench_map", section, [f"--fn {args.fn}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
