"""Local single-file inputs and the readers timed on them (bench_local, bench_pipeline).

A :class:`DataFile` is one uncompressed file of ``records`` random payloads of ``size`` bytes,
written by streamrec's writer under ``benchmarks/data/`` (``local-<size>B-<MiB>MiB.tfrecord``)
and reused while its size is right. Each reader reads one file and returns the records it saw.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import streamrec
import streamrec.sync
from streamrec.format.framing import RecordEncoder

from . import DATA_DIR, MIB
from .procs import reset_peak_rss, rotated, status_kib
from .stats import Timings

__all__ = [
    "DataFile",
    "Reader",
    "ensure_file",
    "measure_readers",
    "plan_file",
    "read_async",
    "read_chunks",
    "read_raw",
    "read_sync",
    "read_views",
    "read_views_async",
]

FRAME_OVERHEAD = 16
READ_BLOCK = 4 * MIB

# reads one file, returns the number of records it saw, or (records, seconds) when it times
# itself (a reader in another interpreter: its start-up is not the read)
Reader = Callable[[str], "int | tuple[int, float]"]


@dataclass(frozen=True)
class DataFile:
    """One benchmark input: ``records`` payloads of ``size`` bytes, framed, uncompressed."""

    path: Path
    size: int
    records: int

    @property
    def nbytes(self) -> int:
        return self.records * (self.size + FRAME_OVERHEAD)


def plan_file(size: int, target_bytes: int) -> DataFile:
    """The file for ``size``-byte records holding about ``target_bytes``."""
    records = max(3, target_bytes // (size + FRAME_OVERHEAD))
    name = f"local-{size}B-{target_bytes // MIB}MiB.tfrecord"
    return DataFile(DATA_DIR / name, size, records)


def write_file(data: DataFile) -> None:
    """Write ``data`` with streamrec's writer: random payloads sliced from one random pool."""
    rng = np.random.default_rng(data.size)
    pool = rng.bytes(max(16 * MIB, 2 * data.size))
    starts = rng.integers(0, len(pool) - data.size, size=data.records)
    batch = max(1, 8 * MIB // data.size)
    data.path.parent.mkdir(parents=True, exist_ok=True)
    with streamrec.sync.open_writer(str(data.path), compression=None) as w:
        for first in range(0, data.records, batch):
            w.write_many([pool[s : s + data.size] for s in starts[first : first + batch]])


def ensure_file(data: DataFile) -> None:
    """Write ``data`` unless a file of exactly the right size is already there."""
    if data.path.exists() and data.path.stat().st_size == data.nbytes:
        return
    t0 = time.perf_counter()
    write_file(data)
    print(
        f"  wrote {data.path.name} ({data.nbytes / MIB:.0f} MiB) in "
        f"{time.perf_counter() - t0:.1f} s",
        flush=True,
    )


# ---------------------------------------------------------------- readers


def write_random_shards(
    directory: Path, shards: int, record_bytes: int, shard_bytes: int, seed: int
) -> list[Path]:
    """``shards`` files ``part-NNNNN.tfrecord`` of about ``shard_bytes`` each, of records of
    random bytes within +-25% of ``record_bytes`` (seeded: the same files every time), reused
    when already there."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths = []
    for shard in range(shards):
        path = directory / f"part-{shard:05d}.tfrecord"
        paths.append(path)
        if path.exists() and path.stat().st_size >= shard_bytes:
            continue
        block = rng.randbytes(record_bytes * 2)
        payloads, size = [], 0
        while size < shard_bytes:
            n = rng.randint(record_bytes * 3 // 4, record_bytes * 5 // 4)
            start = rng.randrange(len(block) - n)
            payloads.append(block[start : start + n])
            size += n + 16
        path.write_bytes(RecordEncoder().encode_many(payloads))
    return paths


def read_raw(path: str) -> int:
    """The ceiling: the whole file into one reused 4 MiB buffer, no parsing (returns 0)."""
    buf = bytearray(READ_BLOCK)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return 0


def read_sync(path: str) -> int:
    """streamrec, plain ``for`` (the event loop runs in a background thread)."""
    n = 0
    for _ in streamrec.open_dataset(path):
        n += 1
    return n


def read_views(path: str) -> int:
    """streamrec, ``for view in ds.record_views()``: zero-copy memoryviews, plain ``for``."""
    n = 0
    for _ in streamrec.open_dataset(path).record_views():
        n += 1
    return n


def read_views_async(path: str) -> int:
    """streamrec, ``async for view in ds.record_views()``."""

    async def consume() -> int:
        n = 0
        async for _ in streamrec.open_dataset(path).record_views():
            n += 1
        return n

    return asyncio.run(consume())


def read_async(path: str) -> int:
    """streamrec, ``async for`` record by record."""

    async def consume() -> int:
        n = 0
        async for _ in streamrec.open_dataset(path):
            n += 1
        return n

    return asyncio.run(consume())


def read_chunks(path: str) -> int:
    """streamrec, ``record_chunks()``: one Python step per chunk, not per record."""

    async def consume() -> int:
        n = 0
        async for chunk in streamrec.open_dataset(path).record_chunks():
            n += len(chunk)
        return n

    return asyncio.run(consume())


def measure_readers(
    path: str,
    records: int,
    readers: Sequence[tuple[str, Reader]],
    rounds: int,
    track_rss: bool = False,
    warm_each: bool = False,
) -> list[Timings]:
    """Every ``(label, reader)`` once per round, order rotated each round, after one untimed
    :func:`read_raw` (page cache warm; ``warm_each``: before every timed read, for files the
    page cache may not keep whole). Every read but ``read_raw``'s must see ``records``
    records; with ``track_rss`` each read's peak-RSS growth is kept (the largest)."""
    read_raw(path)  # warm the page cache, untimed
    results = [Timings() for _ in readers]
    for r in range(rounds):
        for i in rotated(range(len(readers)), r):
            label, reader = readers[i]
            if warm_each:
                read_raw(path)
            base = reset_peak_rss() if track_rss else None
            t0 = time.perf_counter()
            got = reader(path)
            elapsed = time.perf_counter() - t0
            n, elapsed = got if isinstance(got, tuple) else (got, elapsed)
            peak = status_kib("VmHWM") if base is not None else None
            if reader is not read_raw and n != records:
                raise RuntimeError(f"{label} read {n} records of {records}")
            results[i].seconds.append(elapsed)
            if base is not None and peak is not None:
                growth = max(0, peak - base)
                results[i].rss_growth_kib = max(results[i].rss_growth_kib or 0, growth)
    return results
