"""The writer's upload tuning against real servers (moto S3, fake-gcs-server): a shard written at
the tuned defaults is byte-identical to one written at fixed settings, its parts are the size
chosen when it opened, explicit settings win, and the window never holds more than its room.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

import streamrec
from streamrec.storage.retry import RetryPolicy
from streamrec.write.tune import DEFAULT_ROOM_BYTES, PART_LADDER, START_PART_BYTES
from support.servers import FakeGcsServer, MotoS3Server

pytestmark = pytest.mark.slow

FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=30)
MIB = 1 << 20


def _records(total_bytes: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out, size = [], 0
    while size < total_bytes:
        n = rng.randrange(10_000, 300_000)
        out.append(os.urandom(n))
        size += n + 16
    return out


async def _write(template: str, payloads: list[bytes], options: Any, **settings: Any) -> Any:
    w = streamrec.open_writer(
        template, max_bytes=24 * MIB, storage_options=options, retry=FAST, **settings
    )
    for p in payloads:
        await w.write(p)
    await w.close()
    return w


async def test_s3_tuned_shards_equal_fixed_ones_and_parts_are_the_chosen_size(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Any
) -> None:
    payloads = _records(40 * MIB, 1)
    proxy = fault_proxy(s3_server.endpoint_url)
    options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    tuned = await _write(f"s3://{s3_bucket}/tuned/p-{{index}}", payloads, options)
    fixed = await _write(
        f"s3://{s3_bucket}/fixed/p-{{index}}", payloads, options, part_bytes=5 * MIB
    )
    names = [e.url.rsplit("/", 1)[1] for e in tuned.shards]
    assert names == [e.url.rsplit("/", 1)[1] for e in fixed.shards] and len(names) == 2
    for name in names:
        assert s3_server.get(s3_bucket, f"tuned/{name}") == s3_server.get(
            s3_bucket, f"fixed/{name}"
        )
    stats = tuned.stats
    assert stats.tuned and stats.room_bytes == DEFAULT_ROOM_BYTES
    assert stats.part_bytes in PART_LADDER
    assert stats.part_bytes * stats.max_concurrency <= DEFAULT_ROOM_BYTES
    assert not fixed.stats.tuned and fixed.stats.part_bytes == 5 * MIB
    # every part of a tuned shard but its last has the one size chosen when it opened
    sizes: dict[str, list[int]] = {}
    for r in proxy.records:
        if r.method == "PUT" and "partNumber=" in r.target and "/tuned/" in r.target:
            sizes.setdefault(r.target.split("?")[0], []).append(int(r.headers["content-length"]))
    assert len(sizes) == 2
    for parts in sizes.values():
        assert len(set(parts[:-1])) == 1 and parts[0] == START_PART_BYTES
    assert s3_server.list_multipart_uploads(s3_bucket) == []


async def test_explicit_settings_win(s3_server: MotoS3Server, s3_bucket: str) -> None:
    payloads = _records(12 * MIB, 2)
    options = s3_server.storage_options
    w = await _write(
        f"s3://{s3_bucket}/c/p-{{index}}", payloads, options, max_concurrency=3
    )  # the part size then stays at its old fixed default
    assert (w.stats.part_bytes, w.stats.max_concurrency, w.stats.tuned) == (16 * MIB, 3, False)
    w = await _write(f"s3://{s3_bucket}/p/p-{{index}}", payloads, options, part_bytes=6 * MIB)
    assert (w.stats.part_bytes, w.stats.max_concurrency, w.stats.tuned) == (6 * MIB, 8, False)
    assert w.stats.room_bytes == 48 * MIB


async def test_gcs_tuned_shard_equals_fixed_one(gcs_server: FakeGcsServer, gcs_bucket: str) -> None:
    payloads = _records(20 * MIB, 3)
    options = gcs_server.storage_options
    tuned = await _write(f"gs://{gcs_bucket}/t/p-{{index}}", payloads, options)
    fixed = await _write(f"gs://{gcs_bucket}/f/p-{{index}}", payloads, options, part_bytes=16 * MIB)
    assert [e.crc32c for e in tuned.shards] == [e.crc32c for e in fixed.shards]
    for entry in tuned.shards:
        name = entry.url.rsplit("/", 1)[1]
        assert gcs_server.get(gcs_bucket, f"t/{name}") == gcs_server.get(gcs_bucket, f"f/{name}")
