"""Shards written with their record index (``index=True``) and other tools: the command-line
inflaters read indexed GZIP streams whole; the ``tfrecord`` package's indexed reader splits
the writer's shards by their sidecars (plain, and the first columns of the extended format
over gzip)."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tfrecord.reader import tfrecord_iterator

import streamrec
from streamrec.format.encoder import ShardEncoder
from streamrec.format.framing import RecordEncoder


def mixed_payloads(n: int, seed: int, high: int = 5000) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        size = rng.choice([0, rng.randint(1, 50), rng.randint(51, high)])
        if rng.random() < 0.5:
            out.append(rng.randbytes(size))
        else:
            out.append((b"token%d " % rng.randint(0, 30) * (size // 7 + 1))[:size])
    return out


@pytest.mark.parametrize("tool", ["gzip -dc", "zcat"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_gzip_tools_read_an_indexed_shard_whole(tmp_path: Path, tool: str, seed: int) -> None:
    program = tool.split()[0]
    if shutil.which(program) is None:  # pragma: no cover - both ship with every Linux
        pytest.skip(f"{program} is not installed")
    payloads = mixed_payloads(600, seed)
    encoder = ShardEncoder("gzip", index=True, restart_bytes=[1, 3000, 100_000][seed])
    stored = encoder.encode(payloads[:300])
    stored += b"".join(encoder.encode_one(p) for p in payloads[300:])
    stored += encoder.finish()
    assert encoder.shard_index is not None and encoder.shard_index.restarts is not None
    assert len(set(encoder.shard_index.restarts.tolist())) > 2  # restart points in it
    path = tmp_path / "s.tfrecord.gz"
    path.write_bytes(stored)
    done = subprocess.run([*tool.split(), str(path)], capture_output=True, check=True)
    assert done.stderr == b""
    assert done.stdout == RecordEncoder().encode_many(payloads)


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_the_tfrecord_package_reads_the_writers_indexed_shards(
    tmp_path: Path, compression: str | None
) -> None:
    # shards of a few MiB (gzip: several restart points each), split by the tfrecord
    # package's indexed reader into n parts: every record read exactly once, in order
    payloads = mixed_payloads(1500, seed=3, high=30_000)
    suffix = ".gz" if compression else ""
    with streamrec.sync.open_writer(
        str(tmp_path / f"part-{{index:02d}}.tfrecord{suffix}"),
        max_records=600,
        compression=compression,
        index=True,
    ) as w:
        w.write_many(payloads)
    start = 0
    for entry in w.shards:
        group = payloads[start : start + entry.records]
        start += entry.records
        assert entry.index_url is not None
        for n in (1, 2, 3, 5):
            seen: list[bytes] = []
            for i in range(n):
                part = tfrecord_iterator(
                    entry.url, entry.index_url, shard=(i, n), compression_type=compression
                )
                seen += [bytes(view) for view in part]
            assert seen == group, (entry.url, n)
        if compression:
            restarts = np.loadtxt(entry.index_url, dtype=np.int64)[:, 2]
            assert len(set(restarts.tolist())) > 1  # restart points beyond the start
            done = subprocess.run(["gzip", "-dc", entry.url], capture_output=True, check=True)
            assert done.stdout == RecordEncoder().encode_many(group)
    assert start == len(payloads)
