"""What the prefetch budget keeps for a record the decoder has not completed (issue 29 E.24).

A reader keeps the bytes of the pieces it handed on reserved until the decoder asks for more,
minus nothing for the part of an incomplete record the decoder still holds
(``ObjectReader.carries``) - of an uncompressed shard only: a compressed shard's decoder holds
inflated bytes, not the reader's, and its pieces are dropped once inflated.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from contextlib import aclosing

import fsspec
import pytest

import streamrec
from streamrec.format.shard import ShardEncoder
from streamrec.pipeline.budget import ByteBudget

MIB = 1 << 20
KIB = 1 << 10


def _records() -> list[bytes]:
    # 4 MiB records that deflate to about half: an incomplete record inflated so far is
    # larger than the stored bytes handed on for it
    return [os.urandom(2 * MIB) + bytes(2 * MIB) for _ in range(3)]


@pytest.fixture(scope="module")
def gzip_shards() -> Iterator[tuple[str, str, list[bytes]]]:
    """The same gzip shard twice in memory://: named ``.gz``, and named as if plain (its
    compression found by sniffing its first bytes)."""
    root = f"/streamrec-budget-carries/{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    records = _records()
    encoder = ShardEncoder("gzip")
    data = encoder.encode(records) + encoder.finish()
    fs.pipe(f"{root}/named.tfrecord.gz", data)
    fs.pipe(f"{root}/sniffed.tfrecord", data)
    fs.glob(f"{root}/*", detail=True)
    yield f"memory:/{root}/named.tfrecord.gz", f"memory:/{root}/sniffed.tfrecord", records
    fs.rm(root, recursive=True)


@pytest.mark.parametrize("which", [0, 1], ids=["named", "sniffed"])
def test_a_gzip_shard_keeps_no_inflated_record_in_the_budget(
    gzip_shards: tuple[str, str, list[bytes]], which: int
) -> None:
    # (found by a review: a gzip shard whose name does not say so was sniffed after the
    # decoder's reader was told to keep what the framing holds: the inflated part of each
    # record kept up to all of its stored bytes reserved, 2 MiB with a 1 MiB budget)
    url, records = gzip_shards[which], gzip_shards[2]
    block = 256 * KIB
    ds = streamrec.open_dataset(url, prefetch_bytes=MIB, block_bytes=block)
    assert list(ds) == records
    assert ds.stats.peak_prefetch_bytes <= MIB + block


@pytest.fixture(scope="module")
def large_records() -> Iterator[tuple[str, list[bytes]]]:
    """12 plain shards in memory:// of records up to 4x a 256 KiB budget, and small ones."""
    root = f"/streamrec-budget-carries/{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    everything: list[bytes] = []
    for shard in range(12):
        sizes = [(shard * 7 + i * 5) % 4 for i in range(5)]
        records = [
            f"{shard}:{i}:".encode() + os.urandom(s * 320 * KIB) for i, s in enumerate(sizes)
        ]
        everything += records
        fs.pipe(f"{root}/s{shard:02d}.tfrecord", ShardEncoder(None).encode(records))
    fs.glob(f"{root}/*", detail=True)
    yield f"memory:/{root}/*.tfrecord", everything
    fs.rm(root, recursive=True)


@pytest.mark.parametrize("cycle_length", [1, 4, 12])
@pytest.mark.parametrize("deterministic", [True, False])
def test_records_larger_than_the_budget_all_come_and_the_budget_drains(
    large_records: tuple[str, list[bytes]],
    cycle_length: int,
    deterministic: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (a review's guard: every stream of a cycle may carry an incomplete record larger than
    # the whole budget; the one the consumer waits for still overdraws, nothing hangs, and
    # every byte reserved comes back)
    url, records = large_records
    budgets: list[ByteBudget] = []
    init = ByteBudget.__init__

    def tracked(budget: ByteBudget, limit: int) -> None:
        init(budget, limit)
        budgets.append(budget)

    monkeypatch.setattr(ByteBudget, "__init__", tracked)
    ds = streamrec.open_dataset(
        url,
        cycle_length=cycle_length,
        deterministic=deterministic,
        prefetch_bytes=256 * KIB,
        block_bytes=64 * KIB,
    )

    async def read() -> tuple[list[bytes], list[bytes]]:
        whole = [record async for record in ds]
        part: list[bytes] = []
        async with aclosing(ds.__aiter__()) as records:  # closed early, mid-record of some
            async for record in records:
                part.append(record)
                if len(part) == 7:
                    break
        return whole, part

    whole, part = asyncio.run(asyncio.wait_for(read(), 60))
    assert sorted(whole) == sorted(records)
    assert len(part) == 7 and set(part) <= set(records)
    if deterministic:
        assert part == whole[:7]
    ds.close()
    assert budgets
    assert [budget.reserved for budget in budgets] == [0] * len(budgets)
