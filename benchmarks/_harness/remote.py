"""Workers that more than one remote benchmark runs, and how a script runs its workers.

A remote benchmark measures every read in a fresh process: it runs its own script with
``--worker <job json>`` (:func:`run_worker`), and the script hands the job to
:func:`worker_main` with its own workers; the ones here are always there besides:

* ``bulk``, the ``link limit`` reader: one bulk transfer, no parsing: 16 concurrent 8 MiB
  range GETs over all objects of the glob (aiobotocore / gcsfs's aiohttp session / the Azure
  SDK's aio ``download_blob`` directly, bodies streamed and dropped). The most any reader
  can pull through that store and link.
* ``upload``: put local files into a store (4 at a time) and check their sizes.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import BUCKET, MB, MIB
from .datasets import Dataset
from .procs import print_result, reset_peak_rss, run_script, status_kib
from .servers import Services, storage_options

__all__ = [
    "PRELOAD",
    "WORKERS",
    "Worker",
    "measured_read",
    "run_worker",
    "timed_iteration",
    "timeout_for",
    "upload_all",
    "worker_main",
]

BULK_CONNECTIONS = 16
BULK_RANGE = 8 * MIB
# imported by a worker before its measurement starts (and before RSS is reset)
PRELOAD = ("aiohttp", "crc32c", "gcsfs", "s3fs", "streamrec")

Worker = Callable[[dict[str, Any]], dict[str, Any]]


def strip_scheme(url: str) -> str:
    return url.split("://", 1)[1]


def timed_iteration(ds: Any, consumer_s_per_mb: float = 0.0) -> tuple[float, float, int]:
    """``for record in ds`` to the end: (seconds, seconds to the first record, records). With
    ``consumer_s_per_mb`` the consumer sleeps that long per MB of records, once per 1 MB
    taken (a consumer slower than the link: a training step)."""
    t0 = time.perf_counter()
    first = None
    n = 0
    taken = 0
    for record in ds:
        if first is None:
            first = time.perf_counter()
        n += 1
        if consumer_s_per_mb:
            taken += len(record)
            if taken >= MB:
                time.sleep(consumer_s_per_mb * taken / MB)
                taken = 0
    return time.perf_counter() - t0, (first or t0) - t0, n


def measured_read(ds: Any, consumer_s_per_mb: float = 0.0) -> dict[str, Any]:
    """A remote worker's result for ``ds`` read to the end (a consumer sleeping
    ``consumer_s_per_mb`` per MB of records): its times, records, bytes, stats, RSS before it
    and CPU seconds."""
    base = reset_peak_rss()
    cpu0 = time.process_time()
    elapsed, first, n = timed_iteration(ds, consumer_s_per_mb)
    stats = ds.stats.as_dict()
    return {
        "seconds": elapsed,
        "first": first,
        "records": n,
        "nbytes": stats["bytes_read"],
        "rss_base": base,
        "stats": stats,
        "settings": dict(ds.stats.settings),  # what it read with (chosen, where tuned)
        "cpu": time.process_time() - cpu0,
    }


async def _bulk(job: dict[str, Any]) -> dict[str, Any]:
    conns = int(job.get("connections", BULK_CONNECTIONS))
    t0 = time.perf_counter()
    first: list[float] = []
    total = 0
    if job["backend"] == "az":
        fs, fetch, close = _azure_bulk(job, first)
    elif job["backend"] == "s3":
        import s3fs

        fs = s3fs.S3FileSystem(
            asynchronous=True,
            skip_instance_cache=True,
            config_kwargs={"max_pool_connections": conns},
            **storage_options("s3", job["endpoint"]),
        )
        await fs.set_session()
        client = fs._s3

        async def fetch(path: str, start: int, end: int) -> int:
            bucket, key = path.split("/", 1)
            resp = await client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
            got = 0
            async with resp["Body"] as body:
                async for chunk in body.iter_chunks(1 << 20):
                    if not first:
                        first.append(time.perf_counter())
                    got += len(chunk)
            return got

        async def close() -> None:
            await client.__aexit__(None, None, None)
    else:
        import gcsfs

        fs = gcsfs.GCSFileSystem(
            asynchronous=True, skip_instance_cache=True, **storage_options("gcs", job["endpoint"])
        )
        await fs._set_session()
        session = fs.session

        async def fetch(path: str, start: int, end: int) -> int:
            headers = fs._get_headers({"Range": f"bytes={start}-{end - 1}"})
            got = 0
            async with session.get(fs.url(path), headers=headers) as resp:
                if resp.status not in (200, 206):
                    raise RuntimeError(f"GET {path}: HTTP {resp.status}")
                async for chunk in resp.content.iter_chunked(1 << 20):
                    if not first:
                        first.append(time.perf_counter())
                    got += len(chunk)
            return got

        async def close() -> None:
            await session.close()

    setup = time.perf_counter() - t0
    try:
        found = await fs._glob(strip_scheme(job["glob"]), detail=True)
        listed = time.perf_counter() - t0
        step = int(job.get("range_bytes", BULK_RANGE))
        if "ranges_file" in job:  # a JSON list of (path, start, end), in the order to read them
            given = json.loads(Path(job["ranges_file"]).read_text())
            ranges = [(str(path), int(start), int(end)) for path, start, end in given]
        else:
            ranges = [
                (path, start, min(start + step, int(info["size"])))
                for path, info in sorted(found.items())
                for start in range(0, int(info["size"]), step)
            ]
        ranges.reverse()
        count = len(ranges)

        async def worker() -> int:
            got = 0
            while ranges:
                got += await fetch(*ranges.pop())
            return got

        total = sum(await asyncio.gather(*(worker() for _ in range(conns))))
    finally:
        await close()
    elapsed = time.perf_counter() - t0
    return {
        "seconds": elapsed,
        "first": (first[0] if first else t0) - t0,
        "records": count if "ranges_file" in job else None,
        "nbytes": total,
        "setup": setup,
        "listed": listed,
    }


def _azure_bulk(job: dict[str, Any], first: list[float]) -> tuple[Any, Any, Any]:
    """adlfs for the listing; range GETs through the Azure SDK's aio client (one request
    each: below its 32 MiB single-GET size, retries left at the SDK's defaults)."""
    import adlfs

    options = storage_options("az", job["endpoint"])
    fs = adlfs.AzureBlobFileSystem(asynchronous=True, skip_instance_cache=True, **options)
    service = fs.service_client

    async def fetch(path: str, start: int, end: int) -> int:
        container, blob = path.split("/", 1)
        client = service.get_blob_client(container, blob)
        stream = await client.download_blob(offset=start, length=end - start)
        got = 0
        async for chunk in stream.chunks():
            if not first:
                first.append(time.perf_counter())
            got += len(chunk)
        return got

    async def close() -> None:
        await service.close()

    return fs, fetch, close


def work_bulk(job: dict[str, Any]) -> dict[str, Any]:
    """The ``link limit`` reader (``job``: backend, endpoint, glob)."""
    base = reset_peak_rss()
    cpu0 = time.process_time()
    result = asyncio.run(_bulk(job))
    result["rss_base"] = base
    result["cpu"] = time.process_time() - cpu0
    return result


async def _upload(job: dict[str, Any]) -> None:
    if job["backend"] == "az":
        import adlfs

        options = storage_options("az", job["endpoint"])
        fs = adlfs.AzureBlobFileSystem(asynchronous=True, skip_instance_cache=True, **options)
    elif job["backend"] == "s3":
        import s3fs

        fs = s3fs.S3FileSystem(
            asynchronous=True, skip_instance_cache=True, **storage_options("s3", job["endpoint"])
        )
        await fs.set_session()
    else:
        import gcsfs

        fs = gcsfs.GCSFileSystem(
            asynchronous=True, skip_instance_cache=True, **storage_options("gcs", job["endpoint"])
        )
        await fs._set_session()
    try:
        if not await fs._exists(BUCKET):
            await fs._mkdir(BUCKET)
        limit = asyncio.Semaphore(4)

        async def put(local: str, remote: str) -> None:
            async with limit:
                await fs._put_file(local, remote)

        await asyncio.gather(*(put(local, remote) for local, remote in job["files"]))
        fs.invalidate_cache()
        for local, remote in job["files"]:
            size = int((await fs._info(remote))["size"])
            if size != os.path.getsize(local):
                raise RuntimeError(f"upload of {local} to {remote}: size {size}")
    finally:
        if job["backend"] == "az":
            await fs.service_client.close()
        elif job["backend"] == "s3":
            await fs._s3.__aexit__(None, None, None)
        else:
            await fs.session.close()


def work_upload(job: dict[str, Any]) -> dict[str, Any]:
    """Upload ``job["files"]`` (pairs of local path, ``bucket/key``) to the store."""
    t0 = time.perf_counter()
    asyncio.run(_upload(job))
    return {"seconds": time.perf_counter() - t0}


WORKERS: dict[str, Worker] = {"bulk": work_bulk, "upload": work_upload}


def worker_main(
    job_json: str,
    workers: Mapping[str, Worker],
    preload: Mapping[str, Sequence[str]] | None = None,
) -> int:
    """Run one job (``job["kind"]`` names the worker: the script's own ``workers`` or those of
    :data:`WORKERS`) after importing the heavy modules (``preload[kind]``, else
    :data:`PRELOAD`); print its result with ``wall`` (start and end, wall clock) and
    ``rss_peak`` (KiB)."""
    job = json.loads(job_json)
    for name in (preload or {}).get(job["kind"], PRELOAD):
        importlib.import_module(name)
    wall0 = time.time()
    result = {**WORKERS, **workers}[job["kind"]](job)
    result["wall"] = [wall0, time.time()]
    result["rss_peak"] = status_kib("VmHWM")
    return print_result(result)


def timeout_for(data: Dataset) -> float:
    """How long one read of ``data`` may take: >= 4 MB/s or the run is broken."""
    return 60 + data.nbytes / 4e6


def run_worker(
    script: str | Path, job: dict[str, Any], timeout: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run one job with ``script --worker`` in a fresh interpreter (``env`` added to its
    environment); return its result."""
    what = f"worker {job['kind']}"
    return run_script(script, "--worker", json.dumps(job), timeout, what, env=env)


def upload_all(script: str | Path, services: Services, datasets: Sequence[Dataset]) -> None:
    """Put every dataset into each loopback store (the link's store is the loopback SeaweedFS),
    one ``upload`` worker of ``script`` per store, all at once."""
    t0 = time.perf_counter()
    jobs = [
        {
            "kind": "upload",
            "backend": store.backend,
            "endpoint": store.endpoint,
            "files": [
                (str(f), f"{BUCKET}/{data.prefix}/{f.name}")
                for data in datasets
                for f in data.files
            ],
        }
        for store in services.stores.values()
        if not store.link
    ]

    async def run_all() -> None:
        await asyncio.gather(*(asyncio.to_thread(run_worker, script, job, 900.0) for job in jobs))

    asyncio.run(run_all())
    total = sum(d.nbytes for d in datasets) * len(jobs)
    print(f"  uploaded {total / MIB:.0f} MiB in {time.perf_counter() - t0:.1f} s", flush=True)
