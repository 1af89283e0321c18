"""The remote benchmarks' inputs: sets of shards of Example records of about one size, written
once with streamrec's local writer under ``benchmarks/data/remote-<name>-<shards>x<MiB>MiB/``
(an ``index.json`` says what is there) and uploaded to the servers of each run."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from . import BUCKET, DATA_DIR, KIB, MIB

__all__ = ["DataSpec", "Dataset", "ensure_dataset", "example_body"]


def example_body(payload: int) -> int:
    """The ``data`` bytes of a ``payload``-byte Example as written here (the Example's own
    framing, ~constant, taken off)."""
    return payload - (43 if payload > 4 * KIB else 39)


@dataclass(frozen=True)
class DataSpec:
    """A dataset to build: ``shards`` files of about ``shard_bytes`` of ~``payload``-B Examples."""

    name: str
    payload: int
    shards: int
    shard_bytes: int

    @property
    def directory(self) -> Path:
        return DATA_DIR / f"remote-{self.name}-{self.shards}x{self.shard_bytes // MIB}MiB"


@dataclass(frozen=True)
class Dataset:
    """A built dataset: local shard files, and what a reader must see."""

    spec: DataSpec
    files: tuple[Path, ...]
    records: int
    nbytes: int

    @property
    def prefix(self) -> str:
        return f"{self.spec.name}-{self.spec.shards}x{self.spec.shard_bytes // MIB}"

    def glob(self, scheme: str) -> str:
        return f"{scheme}://{BUCKET}/{self.prefix}/shard-*.tfrecord"


def _example_payloads(spec: DataSpec, count: int, first: int, pool: bytes) -> list[bytes]:
    from streamrec import example

    body = example_body(spec.payload)
    out = []
    for i in range(first, first + count):
        start = (i * 7919) % (len(pool) - body)
        out.append(example.encode({"data": pool[start : start + body], "label": i}))
    return out


def ensure_dataset(spec: DataSpec) -> Dataset:
    """Write the shards unless an index says they are there with the right sizes."""
    index = spec.directory / "index.json"
    if index.exists():
        meta = json.loads(index.read_text())
        files = tuple(spec.directory / name for name in meta["files"])
        on_disk = sum(f.stat().st_size for f in files if f.exists())
        if all(f.exists() for f in files) and on_disk == meta["nbytes"]:
            return Dataset(spec, files, meta["records"], meta["nbytes"])
    import streamrec.sync

    t0 = time.perf_counter()
    spec.directory.mkdir(parents=True, exist_ok=True)
    pool = os.urandom(16 * MIB)
    per_shard = max(1, spec.shard_bytes // (spec.payload + 16))
    written: list[Path] = []
    records = 0
    for shard in range(spec.shards):
        path = spec.directory / f"shard-{shard:05d}.tfrecord"
        with streamrec.sync.open_writer(str(path), compression=None) as w:
            batch = max(1, 4 * MIB // spec.payload)
            for first in range(0, per_shard, batch):
                n = min(batch, per_shard - first)
                w.write_many(_example_payloads(spec, n, records + first, pool))
        records += per_shard
        written.append(path)
    nbytes = sum(f.stat().st_size for f in written)
    index.write_text(
        json.dumps({"files": [f.name for f in written], "records": records, "nbytes": nbytes})
    )
    print(
        f"  wrote {spec.directory.name}: {records} records, {nbytes / MIB:.0f} MiB in "
        f"{time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    return Dataset(spec, tuple(written), records, nbytes)
