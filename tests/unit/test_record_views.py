"""``ds.record_views()``: zero-copy views equal the ``bytes`` path (the corpus, any piece
chunking), a held view keeps its piece alive and counted in the prefetch budget until released,
and damage raises as the ``bytes`` path does (url and offset). Run with
``STREAMREC_PURE_PYTHON=1`` too: the fallback gives views of ``bytes`` chunks (the ``scanner``
fixture's patched scanner is not used: the span mode is the C scan's, or off in that build)."""

from __future__ import annotations

import asyncio
import gc
import random
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamrec
from streamrec.errors import CorruptRecordError
from streamrec.format.framing import RecordEncoder
from streamrec.format.payload import RecordSpans
from streamrec.format.shard import ShardDecoder
from streamrec.pipeline.stream.views import ChunkHold, chunk_views
from streamrec.storage.local.records import PayloadPool, payload_pool
from support.corpus import MANIFEST

VALID_FILES = sorted(MANIFEST["files"])
SIZES = [0, 5, 300, 70_000, 1_200_000, 17, 1024]  # empty, small, direct-read, big, ...


def _payloads(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(SIZES[i % len(SIZES)]) for i in range(count)]


def _write(path: Path, payloads: list[bytes]) -> str:
    path.write_bytes(RecordEncoder().encode_many(payloads))
    return str(path)


@pytest.mark.parametrize("name", VALID_FILES)
async def test_views_equal_the_bytes_path_on_the_corpus(name: str, corpus_dir: Path) -> None:
    ds = streamrec.open_dataset(str(corpus_dir / name))
    expected = list(ds)
    assert [bytes(v) for v in ds.record_views()] == expected
    assert [bytes(v) async for v in ds.record_views()] == expected


@pytest.mark.parametrize(
    "options",
    [
        {"cycle_length": 3, "block_bytes": 50_000},
        {"shuffle_buffer": 40, "seed": 1},
        {"cycle_length": 2, "deterministic": False, "shuffle_buffer": 7},
    ],
)
async def test_views_follow_interleave_and_shuffle(tmp_path: Path, options: Any) -> None:
    for shard in range(4):
        _write(tmp_path / f"part-{shard}.tfrecord", _payloads(shard, 30))
    ds = streamrec.open_dataset(str(tmp_path / "part-*.tfrecord"), **options)
    expected = list(ds)
    if options.get("deterministic", True):
        assert [bytes(v) for v in ds.record_views()] == expected
    views = ds.record_views()
    got = sorted([bytes(v) async for v in views])
    assert got == sorted(expected)
    await asyncio.sleep(0)  # (the holds given back run)
    assert views.held_bytes == 0  # (the last view went with the loop's variable)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 3000), max_size=40),
    cuts=st.lists(st.integers(1, 10**6), max_size=12),
)
def test_views_of_any_chunking_are_the_payloads(sizes: list[int], cuts: list[int]) -> None:
    rng = random.Random(len(sizes))
    payloads = [rng.randbytes(n) for n in sizes]
    data = RecordEncoder().encode_many(payloads)
    places = sorted({c % len(data) for c in cuts if c % len(data)}) if data else []
    decoder = ShardDecoder(compression=None, size=len(data), spans=True)
    loop = asyncio.new_event_loop()
    live: set[ChunkHold] = set()
    try:
        views = []
        for start, stop in zip([0, *places], [*places, len(data)], strict=True):
            hold = ChunkHold(None, loop, live)
            views += chunk_views(decoder.feed(data[start:stop]), hold)
            hold.start()
        views += chunk_views(decoder.close(), ChunkHold(None, loop, live))
    finally:
        loop.close()
    assert [v.tobytes() for v in views] == payloads
    assert all(v.readonly for v in views)


async def test_views_are_slices_of_the_pieces(tmp_path: Path) -> None:
    payloads = [bytes([i % 256]) * 200 for i in range(500)]
    ds = streamrec.open_dataset(_write(tmp_path / "a.tfrecord", payloads))
    owners = {id(v.obj) async for v in ds.record_views()}
    # (the C build reads spans: a few pieces for 500 records; the fallback joins each chunk)
    assert len(owners) < 20


def test_a_held_view_keeps_its_piece_counted_until_released(tmp_path: Path) -> None:
    payloads = [bytes([i % 256]) * 50_000 for i in range(100)]  # 5 MB, several chunks
    ds = streamrec.open_dataset(_write(tmp_path / "a.tfrecord", payloads), prefetch_bytes=1 << 20)

    async def consume() -> None:
        views = ds.record_views()
        kept: list[memoryview] = []
        view = None
        async for view in views:
            if len(kept) < 3:
                kept.append(view)
        await asyncio.sleep(0)  # (a step of the loop: the holds given back run)
        (budget,) = {hold.budget for hold in views._live}
        assert budget is not None
        held = views.held_bytes
        assert 3 * 50_000 <= held < 5_000_000  # the kept views' chunk, not the others
        assert budget.held == held
        assert [bytes(v) for v in kept] == payloads[:3]  # alive and intact, read long after
        kept.clear()
        del view  # (the last one: its chunk's hold too)
        gc.collect()
        await asyncio.sleep(0)
        assert views.held_bytes == 0
        assert budget.held == 0

    asyncio.run(consume())


def test_a_blocking_for_gives_back_what_it_releases(tmp_path: Path) -> None:
    payloads = _payloads(3, 60)
    ds = streamrec.open_dataset(_write(tmp_path / "a.tfrecord", payloads), block_bytes=64 << 10)
    views = ds.record_views()
    kept = []
    for view in views:
        kept.append(view)
    assert views.held_bytes >= sum(map(len, payloads))  # all kept: all held
    assert [bytes(v) for v in kept] == payloads
    kept.clear()
    del view
    assert views.held_bytes == 0


def test_two_iterations_at_once_hold_their_views_in_their_own_budgets(tmp_path: Path) -> None:
    payloads = [bytes([i % 256]) * 50_000 for i in range(60)]  # 3 MB, several chunks each
    ds = streamrec.open_dataset(_write(tmp_path / "a.tfrecord", payloads), prefetch_bytes=1 << 20)
    first, second = ds.record_views(), ds.record_views()
    kept_first, kept_second = [], []
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        assert bytes(a) == bytes(b) == payloads[i]
        if i >= 58:  # chunks both made long after both iterations began
            kept_first.append(a)
            kept_second.append(b)
    del a, b
    gc.collect()
    budgets_first = {hold.budget for hold in first._live}
    budgets_second = {hold.budget for hold in second._live}
    assert len(budgets_first) == len(budgets_second) == 1
    assert budgets_first.isdisjoint(budgets_second)
    (budget_first,), (budget_second,) = budgets_first, budgets_second
    assert budget_first is not None and budget_second is not None
    assert first.held_bytes >= 2 * 50_000 and second.held_bytes >= 2 * 50_000


async def test_the_budget_stays_bounded_while_views_are_dropped(tmp_path: Path) -> None:
    payloads = [bytes([i % 251]) * 30_000 for i in range(400)]  # 12 MB through a 1 MiB budget
    path = _write(tmp_path / "a.tfrecord", payloads)
    ds = streamrec.open_dataset(path, prefetch_bytes=1 << 20, block_bytes=256 << 10)
    n = 0
    async for view in ds.record_views():
        assert view[0] == n % 251
        n += 1
    assert n == len(payloads)
    # not the file: the budget, plus a read granted alone beside the held chunk in hand (about
    # a block; its views die as the consumer moves on)
    assert ds.stats.peak_prefetch_bytes <= (1 << 20) + 2 * (256 << 10)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_corrupt_payload_names_the_file_and_offset(tmp_path: Path, mode: str) -> None:
    payloads = _payloads(5, 20)
    data = bytearray(RecordEncoder().encode_many(payloads))
    offset = len(RecordEncoder().encode_many(payloads[:8]))
    data[offset + 12 + 1] ^= 0xFF  # record 8's payload (300 bytes)
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(bytes(data))
    ds = streamrec.open_dataset(str(path))
    got: list[bytes] = []

    async def read_async() -> Any:
        async for view in ds.record_views():
            got.append(bytes(view))

    with pytest.raises(CorruptRecordError) as caught:
        if mode == "sync":
            for view in ds.record_views():
                got.append(bytes(view))
        else:
            asyncio.run(read_async())
    assert got == payloads[:8]  # every good record before the damage
    assert str(path) in str(caught.value) and str(offset) in str(caught.value)


def test_spans_chunks_are_not_copied() -> None:
    payloads = _payloads(9, 30)
    data = RecordEncoder().encode_many(payloads)
    decoder = ShardDecoder(compression=None, size=len(data), spans=True)
    chunk = decoder.feed(data)
    loop = asyncio.new_event_loop()
    try:
        views = chunk_views(chunk, ChunkHold(None, loop, set()))
    finally:
        loop.close()
    if isinstance(chunk, RecordSpans):  # (the C build: one buffer, the data fed)
        assert {id(v.obj.base) for v in views} == {id(chunk.buffers[0])}
    assert [bytes(v) for v in views] == payloads[: len(views)]


@pytest.mark.skipif(payload_pool(1) is None, reason="the pure-Python reader reuses nothing")
def test_a_pool_reuses_only_payloads_nobody_holds() -> None:
    pool = PayloadPool(max_bytes=3 * 100)
    first = pool.take(100)
    pool.give(first)
    held_elsewhere = first  # (still ours: the pool must not hand it out)
    again = pool.take(100)
    assert again is not held_elsewhere and pool.reused == 0
    del held_elsewhere, first
    for _ in range(5):
        pool.give(bytes(100))  # (max_bytes: three of them kept)
    taken = [pool.take(100) for _ in range(4)]
    assert pool.reused == 3 and all(len(p) == 100 for p in taken)
    reused = taken[0]
    assert pool.take(7) is not reused  # (another length: a new one)


@pytest.mark.parametrize("keep", [False, True])
def test_reused_payloads_never_change_under_a_view(tmp_path: Path, keep: bool) -> None:
    # large records are read directly into payloads a pool hands back once their views die:
    # copies taken as we go, or every view kept to the end, equal the bytes path
    rng = random.Random(11)
    payloads = [rng.randbytes(rng.choice([70_000, 200_000, 200_000])) for _ in range(80)]
    path = _write(tmp_path / "big.tfrecord", payloads)
    ds = streamrec.open_dataset(path, prefetch_bytes=2 << 20)
    kept: list[memoryview] = []
    copies: list[bytes] = []
    for view in ds.record_views():
        copies.append(bytes(view))
        if keep:
            kept.append(view)
    assert copies == payloads
    assert [bytes(v) for v in kept] == (payloads if keep else [])


def _indexed(tmp_path: Path, payloads: list[bytes]) -> str:
    with streamrec.sync.open_writer(
        str(tmp_path / "part-{index}.tfrecord"), max_records=50, index=True
    ) as writer:
        writer.write_many(payloads)
    return str(tmp_path / "part-*.tfrecord")


@pytest.mark.parametrize("shuffle", ["global", "block"])
def test_views_kept_past_the_budget_do_not_stall_an_indexed_read(
    tmp_path: Path, shuffle: str
) -> None:
    # every view kept (4 MB of records through a 1 MiB budget, read by index): the next
    # chunk is read alone beside the kept ones, as the streaming engine's reads are; it
    # waited for room the views never give back (a for, an async for: both hung)
    rng = random.Random(5)
    payloads = [rng.randbytes(20_000) for _ in range(200)]
    url = _indexed(tmp_path, payloads)

    def opened() -> streamrec.Dataset:
        return streamrec.open_dataset(url, prefetch_bytes=1 << 20, shuffle=shuffle, seed=1)

    kept: list[memoryview] = []
    reader = threading.Thread(target=lambda: kept.extend(opened().record_views()), daemon=True)
    reader.start()
    reader.join(timeout=60)  # (a guard: it ends in well under a second)
    assert not reader.is_alive(), "the read stalled behind the views kept"
    assert sorted(bytes(v) for v in kept) == sorted(payloads)

    async def keep_all() -> list[memoryview]:
        return [view async for view in opened().record_views()]

    kept_async = asyncio.run(asyncio.wait_for(keep_all(), timeout=60))
    assert [bytes(v) for v in kept_async] == [bytes(v) for v in kept]
