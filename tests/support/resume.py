"""Shards with known payloads, and stopping and resuming a dataset: shared by the resume tests
(integration/test_resume.py, unit/test_resume_buffer.py, unit/test_state_validation.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import streamrec
from streamrec.format.framing import RecordEncoder
from streamrec.format.shard import ShardEncoder
from streamrec.pipeline.listing.plan import seeded_random
from streamrec.pipeline.position.buffer_codec import decode_buffer

__all__ = ["as_version", "payload", "resume_rest", "stop_after", "with_full_rng", "write_shards"]


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


def with_full_rng(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its shuffle buffer's generator as its full state (as versions 1 and 2
    saved it, and version 3 beyond a count of words) instead of the words drawn."""
    from streamrec.pipeline.position.draws import restore  # (since state version 3)

    shuffle = state.get("shuffle")
    if shuffle is None or not isinstance(shuffle["rng"], int):
        return state
    rng = seeded_random(state["config"].get("seed", 0), state["epoch"], "records")
    version, internal, gauss = restore(rng, shuffle["rng"]).rng.getstate()
    return {**state, "shuffle": {**shuffle, "rng": [version, list(internal), gauss]}}


def as_version(
    state: dict[str, Any], version: int, urls: list[str] | None = None
) -> dict[str, Any]:
    """The same position as a state of an earlier ``version`` (1 or 2) wrote it: every url
    (``urls``, where the state names them by digest: without credentials) and finished shard
    listed, the generator in full, (version 1) the buffer as a list."""
    from streamrec.pipeline.position.state_config import DEFAULTS  # (since state version 3)

    old = {**with_full_rng(state), "version": version}
    config = dict(old["config"])
    indexed = config.get("shuffle") in ("global", "block") or config.get("even")
    for key, value in DEFAULTS.items():  # every setting recorded, defaults too
        if not (indexed and key in ("num_hosts", "host_index")):
            config.setdefault(key, value)
    old["config"] = config if urls is None else {**config, "urls": list(urls)}
    assert isinstance(old["config"]["urls"], list), "an earlier version listed the urls"
    read = old["read"]
    if read is not None and read["kind"] == "ready":
        done = [o for a, b in read["done"] for o in range(a, b)]
        old["read"] = {**read, "done": done}
    if version == 1 and old["shuffle"] is not None:
        buffer = decode_buffer(old["shuffle"]["buffer"], "shuffle.buffer")
        old["shuffle"] = {**old["shuffle"], "buffer": buffer}
    return old
