"""Shards with known payloads, and stopping and resuming a dataset: shared by the resume tests
(integration/test_resume.py, unit/test_resume_buffer.py, unit/test_state_validation.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import streamrec
from streamrec.format.framing import RecordEncoder
from streamrec.format.shard import ShardEncoder

__all__ = ["payload", "resume_rest", "stop_after", "write_shards"]


def payload(shard: int, index: int) -> bytes:
    # lengths vary so that byte offsets are not a multiple of a record count
    return f"{shard}:{index}:".encode() + b"x" * ((shard * 7 + index * 13) % 40)


def write_shards(
    root: Path, sizes: list[int], compressed: frozenset[int] = frozenset()
) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for shard, size in enumerate(sizes):
        records = [payload(shard, i) for i in range(size)]
        if shard in compressed:
            encoder = ShardEncoder("gzip")
            data = encoder.encode(records) + encoder.finish()
            path = root / f"shard-{shard:03d}.tfrecord.gz"
        else:
            data = b"".join(RecordEncoder().encode(r) for r in records)
            path = root / f"shard-{shard:03d}.tfrecord"
        path.write_bytes(data)
        paths.append(str(path))
    return paths


def stop_after(ds: streamrec.Dataset, epochs: int, k: int) -> tuple[list[bytes], dict[str, Any]]:
    """Consume ``k`` records over the epochs, then take the state (JSON round trip)."""
    taken: list[bytes] = []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        if len(taken) == k:
            break
        for record in ds:
            taken.append(record)
            if len(taken) == k:
                break
        if len(taken) == k:
            break
    return taken, json.loads(json.dumps(ds.state_dict()))


def resume_rest(make: Any, state: dict[str, Any], epochs: int) -> list[bytes]:
    ds = make()
    ds.load_state_dict(state)
    rest: list[bytes] = []
    for epoch in range(state["epoch"], epochs):
        ds.set_epoch(epoch)
        rest += list(ds)
    return rest
