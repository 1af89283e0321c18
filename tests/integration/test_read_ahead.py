"""Sequential reading opens the next shards ahead of their turn (pipeline/stream/ahead.py).

At the default ``cycle_length=1`` small shards paid a round trip each, one after another. Now
the next shards' first reads go out while the current one is read: what a store is asked, and
when, is seen at a real HTTP server (``support.listing_server``), which holds a shard's answer
until the reads a test waits for have arrived (a deadline only fails a reader that never sends
them). What is delivered (order, exactly once, resume) and what the budget holds are those of
reading one shard at a time.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

import streamrec
from streamrec.format.framing import RecordEncoder
from streamrec.pipeline.budget import BudgetPlan
from streamrec.pipeline.options import ReadOptions
from support.listing_server import ListingServer
from support.resume import payload, resume_rest, stop_after, write_shards

SHARDS = 12


def _objects(sizes: list[int]) -> dict[str, bytes]:
    return {
        f"d/s{shard:03d}.tfrecord": RecordEncoder().encode_many(
            [payload(shard, i) for i in range(size)]
        )
        for shard, size in enumerate(sizes)
    }


def _expected(sizes: list[int]) -> list[bytes]:
    return [payload(shard, i) for shard, size in enumerate(sizes) for i in range(size)]


def _gets(server: ListingServer, what: str) -> list[str]:
    return [key for kind, key in server.gets if kind == what]


def _key(shard: int) -> str:
    return f"d/s{shard:03d}.tfrecord"


@pytest.fixture
def server() -> Iterator[ListingServer]:
    with ListingServer(_objects([5] * SHARDS)) as running:
        yield running


def test_the_next_shards_are_requested_before_the_current_one_arrives(
    server: ListingServer,
) -> None:
    # shard 1's answer waits until shards 2..11 were asked for: read one at a time (each
    # shard opened when the one before it arrived), they never were and the hold times out
    server.hold(_key(1), lambda gets: all(("get", _key(s)) in gets for s in range(2, SHARDS)))
    ds = streamrec.open_dataset("s3://bkt/d/*.tfrecord", storage_options=server.storage_options)
    assert list(ds) == _expected([5] * SHARDS)
    assert server.hold_timeouts == []
    gets = _gets(server, "get")
    assert sorted(gets) == [_key(s) for s in range(SHARDS)]  # each once: one block each
    assert gets[0] == _key(0)  # (the others went out together: any order)


def test_shards_ahead_are_bounded_by_max_concurrency(server: ListingServer) -> None:
    # 2 x 2 - 1 = three shards ahead of the one read: shard 5 is asked for only after shard 1
    # is taken
    server.hold(_key(1), lambda gets: all(("get", _key(s)) in gets for s in (2, 3, 4)))
    ds = streamrec.open_dataset(
        "s3://bkt/d/*.tfrecord", storage_options=server.storage_options, max_concurrency=2
    )
    assert list(ds) == _expected([5] * SHARDS)
    assert server.hold_timeouts == []
    log = server.gets
    assert log.index(("get", _key(5))) > log.index(("answer", _key(1)))


def test_the_first_shard_alone_until_its_first_piece(server: ListingServer) -> None:
    # the consumer's first records take the link alone (hold_ramp): nothing else is asked
    # for before shard 0 answered
    ds = streamrec.open_dataset("s3://bkt/d/*.tfrecord", storage_options=server.storage_options)
    assert list(ds) == _expected([5] * SHARDS)
    log = server.gets
    assert log.index(("get", _key(1))) > log.index(("answer", _key(0)))


@pytest.fixture
def tiny_shards() -> Iterator[tuple[str, list[int]]]:
    """200 shards of 0-9 small records in memory:// (every read completes at once: the
    budget is always full of what arrived), some empty."""
    root = f"/streamrec-read-ahead/{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    sizes = [(s * 7) % 10 for s in range(200)]
    for shard, size in enumerate(sizes):
        data = RecordEncoder().encode_many([payload(shard, i) for i in range(size)])
        fs.pipe(f"{root}/s{shard:03d}.tfrecord", data)
    yield f"memory:/{root}/*.tfrecord", sizes
    fs.rm(root, recursive=True)


@pytest.mark.parametrize(
    ("prefetch", "block"), [(1, 1), (100, 64), (1024, 4096), (4096, 1024), (64 << 20, 4 << 20)]
)
def test_many_tiny_shards_keep_the_budget_and_the_order(
    tiny_shards: tuple[str, list[int]], prefetch: int, block: int
) -> None:
    url, sizes = tiny_shards
    ds = streamrec.open_dataset(url, prefetch_bytes=prefetch, block_bytes=block)
    got: list[list[bytes]] = []
    reader = threading.Thread(target=lambda: got.append(list(ds)), daemon=True)
    reader.start()
    reader.join(60)  # (a deadline, not a wait: a hang fails here instead of stalling the run)
    assert not reader.is_alive(), "the read never ends"
    assert got == [_expected(sizes)]
    assert ds.stats.shards_opened == len(sizes)
    # (README: one block beyond the budget; a record being assembled keeps its bytes)
    record = max(len(payload(s, i)) for s, size in enumerate(sizes) for i in range(size))
    assert ds.stats.peak_prefetch_bytes <= prefetch + max(block, record + 16)


def test_shards_ahead_hold_a_part_of_the_budget(tiny_shards: tuple[str, list[int]]) -> None:
    # the first blocks of the shards after the next one add up to read_ahead_bytes at most;
    # the current shard's (whole) and the next one's come on top
    url, sizes = tiny_shards
    prefetch = 1000
    ds = streamrec.open_dataset(url, prefetch_bytes=prefetch)
    assert list(ds) == _expected(sizes)
    biggest = max(
        len(RecordEncoder().encode_many([payload(s, i) for i in range(size)]))
        for s, size in enumerate(sizes)
    )
    ahead = BudgetPlan(ReadOptions(prefetch_bytes=prefetch)).read_ahead_bytes
    assert ahead == prefetch // 4
    assert ds.stats.peak_prefetch_bytes <= ahead + 2 * biggest


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.slow)])
def test_resume_at_every_boundary_and_inside_shards(tmp_path: Path, where: str) -> None:
    sizes = [3, 0, 1, 4, 0, 0, 2, 5, 1, 3, 0, 2, 1, 1, 4]
    if where == "local":
        urls: Any = write_shards(tmp_path, sizes)
        server = None
    else:
        server = ListingServer(_objects(sizes)).start()
        urls = "s3://bkt/d/*.tfrecord"
    try:
        options = {} if server is None else {"storage_options": server.storage_options}

        def make() -> streamrec.Dataset:
            return streamrec.open_dataset(urls, **options)

        flat = _expected(sizes) * 2
        ds = make()
        assert [r for epoch in range(2) for r in (ds.set_epoch(epoch), list(ds))[1]] == flat
        stops = range(len(flat) + 1)
        if server is not None:  # (each read lists and opens anew: every boundary, and inside)
            ends = [sum(sizes[: s + 1]) for s in range(8)]
            stops = sorted({0, *ends, *(e - 1 for e in ends if e), len(flat) - 1})
        for k in stops:
            taken, state = stop_after(make(), 2, k)
            assert taken + resume_rest(make, state, 2) == flat, f"stopped after {k}"
    finally:
        if server is not None:
            server.stop()


def test_an_async_read_closed_early_closes_the_shards_ahead(server: ListingServer) -> None:
    # shards ahead are open (shard 2's answer held back) when the consumer stops at shard
    # 1's first record: closing returns at once and leaves no task behind
    server.hold(_key(2), lambda gets: False, timeout=5)
    server.hold(_key(1), lambda gets: ("get", _key(2)) in gets)  # (so it is there when 1 is)
    ds = streamrec.open_dataset("s3://bkt/d/*.tfrecord", storage_options=server.storage_options)

    async def main() -> tuple[list[bytes], set[asyncio.Task[Any]]]:
        before = asyncio.all_tasks()
        records = ds.__aiter__()
        first = [await anext(records) for _ in range(6)]
        await records.aclose()  # type: ignore[attr-defined]
        return first, asyncio.all_tasks() - before - {asyncio.current_task()}  # type: ignore[operator]

    first, left = asyncio.run(main())
    assert first == _expected([5, 1])
    assert left == set()
    assert ("get", _key(2)) in server.gets  # it was open, its answer held back
