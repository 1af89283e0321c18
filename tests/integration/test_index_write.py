"""Shards written with their record index (``index=True``): the command-line inflaters read
indexed GZIP/ZLIB streams whole."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

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
