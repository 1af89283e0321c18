"""bench_remote.py --small-shards: many small shards read one at a time, at the defaults.

500 shards of ~130 KB (125 Example records of ~1 KiB each) on SeaweedFS through the emulated
link (60 ms round trips, 25 MB/s per connection, 1 Gbit), read by ``for rec in
open_dataset(glob)`` with every setting at its default (``cycle_length=1``: one shard at a time),
against the link's limit for such objects (``link limit N``: N connections, one GET per object,
bodies dropped) and the link's limit for large objects (the main table's ``link limit``, 16
connections x 8 MiB ranges over a 64 MiB object: what the link carries). The same 500 files
are also read from the local disk (the page cache: what the reading costs, not the disk).

With ``--base TREE`` the streamrec of that tree (a worktree of the commit before, its extension
built) is measured beside this one, in the same rounds (``tree`` column: new, old).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import KIB, MB, MIB
from .datasets import Dataset, DataSpec, ensure_dataset
from .procs import rotated
from .remote import measured_read, run_worker, upload_all
from .report import command_line, now, source_state
from .servers import RTT, Services, free_subnet, storage_options

__all__ = ["SMALL_WORKERS", "run_small_shards"]

SMALL = DataSpec("130KB", KIB, 500, 130_000)
BIG = DataSpec("64MiB", 100 * KIB, 1, 64 * MIB)  # for the link's own limit


def work_sequential(job: dict[str, Any]) -> dict[str, Any]:
    """``for rec in open_dataset(job["glob"], **job["options"])``, timed."""
    import streamrec

    tree = os.environ.get("STREAMREC_BENCH_TREE")
    if tree and not streamrec.__file__.startswith(tree):
        raise RuntimeError(f"streamrec came from {streamrec.__file__}, not {tree}")
    options = dict(job["options"])
    if job["backend"] == "s3":
        options["storage_options"] = storage_options("s3", job["endpoint"])
    ds = streamrec.open_dataset(job["glob"], **options)
    return measured_read(ds)


SMALL_WORKERS = {"sequential": work_sequential}

# (label, tree, options): tree "new" is this one, "old" the --base tree
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("streamrec defaults", "new", {}),
    ("streamrec defaults", "old", {}),
    ("streamrec cycle_length=8", "old", {"cycle_length": 8}),
]


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def run_small_shards(script: str, argv: Sequence[str] | None, base: str | None, rounds: int) -> str:
    """Measure every case ``rounds`` times (order rotated per round); the README section."""
    small = ensure_dataset(SMALL)
    big = ensure_dataset(BIG)
    trees = {"new": None, "old": str(Path(base).resolve()) if base else None}
    cases = [case for case in CASES if trees[case[1]] is not None or case[1] == "new"]
    results: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    start = time.perf_counter()
    load = [os.getloadavg()[0]]
    with (
        tempfile.TemporaryDirectory(prefix="bench-small-") as tmp,
        Services(Path(tmp), gcs=False, subnet=free_subnet()) as services,
    ):
        services.start()
        upload_all(script, services, [small, big])
        link = services.stores["s3-link"]
        local_glob = str(small.spec.directory / "shard-*.tfrecord")
        jobs: list[tuple[str, str, str, dict[str, Any]]] = []
        for label, tree, options in cases:
            jobs.append(("S3 emulated link", label, tree, {"glob": small.glob("s3"), **{
                "kind": "sequential", "backend": "s3", "options": options}}))  # fmt: skip
        for label, tree, options in cases[:2]:
            jobs.append(("local disk", label, tree, {"glob": local_glob, **{
                "kind": "sequential", "backend": "local", "options": options}}))  # fmt: skip
        for conns in (16, 64):
            jobs.append(("S3 emulated link", f"link limit {conns}", "-", {
                "kind": "bulk", "backend": "s3", "glob": small.glob("s3"),
                "connections": conns}))  # fmt: skip
        jobs.append(("S3 emulated link", "link limit, 64 MiB object", "-", {
            "kind": "bulk", "backend": "s3", "glob": big.glob("s3")}))  # fmt: skip
        for r in range(rounds):
            for where, label, tree, job in rotated(jobs, r):
                job = {**job, "endpoint": link.endpoint}
                path = trees.get(tree)
                env = {"STREAMREC_BENCH_TREE": path} if path else None
                result = run_worker(script, job, 600, env)
                data = big if "64 MiB" in label else small
                if result["nbytes"] != data.nbytes:
                    raise RuntimeError(f"{label} ({tree}): read {result['nbytes']} bytes")
                if result.get("records") not in (None, data.records):
                    raise RuntimeError(f"{label} ({tree}): read {result['records']} records")
                results.setdefault((where, label, tree), []).append(result)
                print(
                    f"    {where:17} {label:28} {tree:3} "
                    f"{data.nbytes / result['seconds'] / MB:7.1f} MB/s",
                    flush=True,
                )
            load.append(os.getloadavg()[0])
            print(f"  round {r + 1}/{rounds}: load {load[-1]:.2f}", flush=True)
    return _render(results, small, big, rounds, argv, trees, load, time.perf_counter() - start)


def _render(
    results: dict[tuple[str, str, str], list[dict[str, Any]]],
    small: Dataset,
    big: Dataset,
    rounds: int,
    argv: Sequence[str] | None,
    trees: dict[str, str | None],
    load: list[float],
    elapsed: float,
) -> str:
    def mbps(key: tuple[str, str, str], data: Dataset) -> list[float]:
        return [data.nbytes / r["seconds"] / MB for r in results[key]]

    link = _median(mbps(("S3 emulated link", "link limit, 64 MiB object", "-"), big))
    small_limit = _median(mbps(("S3 emulated link", "link limit 16", "-"), small))
    lines = [
        f"`{command_line('bench_remote.py', argv)}`, {now()}, {source_state()}"
        + "".join(f"; {label}: `{path}`" for label, path in trees.items() if path)
        + f"; {rounds} rounds, {elapsed:.0f} s, load {min(load):.2f}-{max(load):.2f}.",
        "",
        f"{SMALL.shards} shards of {small.nbytes / SMALL.shards / 1000:.0f} KB "
        f"({small.records // SMALL.shards} records of ~1 KiB each); the link carries "
        f"{link:.0f} MB/s (one 64 MiB object, 16 connections x 8 MiB ranges), "
        f"{small_limit:.1f} MB/s in one GET per small object on 16 connections.",
        "",
        "| store | reader | tree | MB/s median | MB/s best | us/record | x link | "
        "x small-object limit | first record ms | first record RTTs | prefetch peak KiB |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for (where, label, tree), runs in results.items():
        data = big if "64 MiB" in label else small
        speeds = mbps((where, label, tree), data)
        median = _median(speeds)
        seconds = _median([r["seconds"] for r in runs])
        records = "" if data is big else f"{seconds / data.records * 1e6:.0f}"
        peaks = [r["stats"]["peak_prefetch_bytes"] for r in runs if "stats" in r]
        peak = f"{max(peaks) / KIB:,.0f}" if peaks else ""
        remote = where != "local disk"
        first = _median([r["first"] for r in runs]) * 1000
        lines.append(
            f"| {where} | {label} | {tree} | {median:.1f} | {max(speeds):.1f} | {records} "
            f"| {f'{median / link:.2f}x' if remote else ''} "
            f"| {f'{median / small_limit:.2f}x' if remote else ''} "
            f"| {first:.0f} | {f'{first / 1000 / RTT:.1f}' if remote else ''} | {peak} |"
        )
    return "\n".join(lines)
