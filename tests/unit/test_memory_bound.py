"""What a read holds beyond ``prefetch_bytes`` does not depend on how fast bytes arrive.

The budget counts a block from the moment it is requested until its pieces are handed to the
decoder, so a starved reader (bytes received long before it gets to them) holds no more than a
quiet one. ``memory://`` is that worst case on every read: a range read completes the moment it
is requested, so the whole budget is always received and waiting. Beyond the budget a read
holds at most the one block the stream the consumer waits on may overdraw, the piece being
decoded and two lists of records (the one in the consumer's hand and the next): no queue of
decoded records or received bytes may grow past that.
"""

from __future__ import annotations

import os
import threading
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

import streamrec
from streamrec.format.shard import ShardEncoder
from support.resume import write_shards

MIB = 1 << 20


def read_traced(ds: streamrec.Dataset) -> tuple[int, int]:
    """(records read, peak bytes Python allocated while reading them)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        count = sum(1 for _ in ds)
        return count, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def shards() -> Iterator[str]:
    """4 shards of 16 MiB of 100 KiB records in memory://."""
    root = f"/streamrec-memory-bound/{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    payloads = [os.urandom(100 << 10) for _ in range(8)]
    for i in range(4):
        fs.pipe(f"{root}/s{i}.tfrecord", ShardEncoder(None).encode(payloads * 20))
    yield f"memory:/{root}/*.tfrecord"
    fs.rm(root, recursive=True)


@pytest.mark.parametrize(
    ("prefetch", "block"), [(8 * MIB, MIB), (4 * MIB, MIB), (16 * MIB, 4 * MIB)]
)
def test_a_read_holds_the_budget_and_four_blocks_at_most(
    shards: str, prefetch: int, block: int
) -> None:
    ds = streamrec.open_dataset(shards, prefetch_bytes=prefetch, block_bytes=block)
    count, peak = read_traced(ds)
    assert count == 4 * 160
    assert ds.stats.peak_prefetch_bytes <= prefetch + block
    # measured: +3.2-3.4 blocks (8/1, 4/1), +1.9-3.0 (16/4)
    assert peak <= prefetch + 4 * block


@pytest.fixture(scope="module")
def indexed_shards() -> Iterator[str]:
    """4 shards of 16 MiB of 100 KiB records in memory://, each with its index sidecar."""
    root = f"/streamrec-memory-bound/{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    payloads = [os.urandom(100 << 10) for _ in range(8)] * 20
    for i in range(4):
        encoder = ShardEncoder(None, index=True)
        data = encoder.encode(payloads) + encoder.finish()
        fs.pipe(f"{root}/s{i}.tfrecord", data)
        assert encoder.shard_index is not None
        fs.pipe(f"{root}/s{i}.tfrecord.idx", encoder.shard_index.to_bytes())
    # a memory file's first getbuffer() copies it whole (fsspec's BytesIO stops sharing the
    # bytes it was made from): done here, not inside the measured read
    fs.glob(f"{root}/*", detail=True)
    yield f"memory:/{root}/*.tfrecord"
    fs.rm(root, recursive=True)


@pytest.mark.parametrize(
    ("mode", "prefetch", "block"),
    [
        ({"shuffle": "global"}, 8 * MIB, MIB),
        ({"shuffle": "block"}, 8 * MIB, MIB),
        ({"even": "pad"}, 8 * MIB, MIB),
        # the defaults' proportions: three chunks of a third of the budget each (the
        # consumer's, the one awaited, the next), runs of 16 windows of ~1/16 chunk
        ({"shuffle": "block"}, 16 * MIB, 4 * MIB),
        ({"shuffle": "global"}, 16 * MIB, 4 * MIB),
    ],
)
def test_indexed_reading_holds_the_budget_and_four_blocks_at_most(
    indexed_shards: str, mode: dict[str, str], prefetch: int, block: int
) -> None:
    ds = streamrec.open_dataset(indexed_shards, prefetch_bytes=prefetch, block_bytes=block, **mode)
    count, peak = read_traced(ds)
    assert count == 4 * 160
    assert ds.stats.peak_prefetch_bytes <= prefetch + block
    assert peak <= prefetch + 4 * block, peak


@pytest.mark.parametrize(
    ("sizes", "options"),
    [
        # (found by a review: the reader never ended; then by fuzzing, blocks > budget)
        ([40, 0, 170, 30, 110, 1, 80], {"cycle_length": 2, "block_bytes": 1024}),
        ([170, 1, 400, 170], {"cycle_length": 4, "block_bytes": 4096}),
        ([5, 400, 400, 80, 30, 5], {"cycle_length": 3, "block_bytes": 4096, "block_length": 5}),
    ],
)
def test_an_interleave_starved_by_a_tiny_budget_still_ends(
    tmp_path: Path, sizes: list[int], options: dict[str, int]
) -> None:
    """Each stream the consumer reaches may overdraw by one block: a stream whose block the
    consumer left partly decoded must not starve the next one (it waited for ever)."""
    files = write_shards(tmp_path, sizes)
    ds = streamrec.open_dataset(files, prefetch_bytes=1024, **options)
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.append(sum(1 for _ in ds)), daemon=True)
    reader.start()
    reader.join(30)  # (a deadline, not a wait: a hang fails here instead of stalling the run)
    assert not reader.is_alive(), "the read never ends"
    assert got == [sum(sizes)]
    assert ds.stats.peak_prefetch_bytes <= 1024 + options["cycle_length"] * options["block_bytes"]


@pytest.fixture(scope="module")
def many_shards() -> Iterator[str]:
    """64 shards of ~1 MiB of 100 KiB records in memory://."""
    root = f"/streamrec-memory-bound/{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    payloads = [os.urandom(100 << 10) for _ in range(10)]
    for i in range(64):
        fs.pipe(f"{root}/s{i:02d}.tfrecord", ShardEncoder(None).encode(payloads))
    yield f"memory:/{root}/*.tfrecord"
    fs.rm(root, recursive=True)


@pytest.mark.parametrize("cycle_length", [16, 64])
def test_a_long_first_ready_cycle_keeps_decoded_chunks_in_the_budget(
    many_shards: str, cycle_length: int
) -> None:
    # every stream of a first-ready cycle had decoded records (in its pump's hands, in a
    # queue as long as the cycle, and a record being assembled) outside the budget: what a
    # read held grew with the cycle (measured at 64: 2.48x the budget before, 1.58x now;
    # what is left is a record in progress per open stream)
    prefetch = 16 * MIB
    ds = streamrec.open_dataset(
        many_shards, prefetch_bytes=prefetch, cycle_length=cycle_length, deterministic=False
    )
    count, peak = read_traced(ds)
    assert count == 64 * 10
    assert ds.stats.peak_prefetch_bytes <= prefetch + MIB
    assert peak <= 1.75 * prefetch
