"""The prefetching block reader, the shared budget and the retry policy (memory:// and local)."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import fsspec
import pytest

import streamrec
from streamrec._portal import iterate_blocking
from streamrec.errors import (
    ObjectNotFoundError,
    RetriesExhaustedError,
    StorageError,
    TransientStorageError,
)
from streamrec.pipeline.budget import BudgetPlan, ByteBudget
from streamrec.pipeline.stream.prefetch import ObjectReader
from streamrec.storage.base import ObjectInfo, ObjectStore
from streamrec.storage.local.memory import MemoryStore
from streamrec.storage.retry import RetryPolicy

FAST = RetryPolicy(max_attempts=4, initial_backoff_s=0.001, max_backoff_s=0.002, timeout_s=5)


@pytest.fixture
def memory_root() -> str:
    root = f"memory://streamrec-tests/{uuid.uuid4().hex}"
    yield root
    fsspec.filesystem("memory").rm(root.replace("memory://", "/"), recursive=True)


def upload_corpus(corpus_dir: Path, root: str) -> None:
    fs = fsspec.filesystem("memory")
    for path in corpus_dir.rglob("*.tfrecord*"):
        fs.pipe(f"{root}/{path.relative_to(corpus_dir)}", path.read_bytes())


def test_memory_store_reads_the_corpus_exactly(
    corpus_dir: Path, manifest: dict, memory_root: str
) -> None:
    upload_corpus(corpus_dir, memory_root)
    for name, entry in manifest["files"].items():
        if "records" not in entry:
            continue
        ds = streamrec.open_dataset(f"{memory_root}/{name}", block_bytes=1000)
        got = [hashlib.sha256(p).hexdigest() for p in ds]
        assert got == [r["sha256"] for r in entry["records"]], name


def test_memory_glob_is_sorted_and_missing_objects_are_clear(
    corpus_dir: Path, memory_root: str
) -> None:
    upload_corpus(corpus_dir, memory_root)
    shards = asyncio.run(streamrec.open_dataset(f"{memory_root}/sharded/*.tfrecord").shards())
    assert [s.url.rsplit("/", 1)[1] for s in shards] == sorted(
        p.name for p in (corpus_dir / "sharded").iterdir()
    )
    assert shards[0].url.startswith("memory://")
    with pytest.raises(ObjectNotFoundError, match="nothing"):
        list(streamrec.open_dataset(f"{memory_root}/nothing.tfrecord"))
    with pytest.raises(ObjectNotFoundError, match="matched no object"):
        list(streamrec.open_dataset(f"{memory_root}/*.nothing"))


def test_unknown_scheme_is_refused_at_open() -> None:
    with pytest.raises(StorageError, match=r"unsupported scheme ftp://"):
        streamrec.open_dataset("ftp://host/x.tfrecord")


class ScriptedStore(ObjectStore):
    """A real MemoryStore whose reads fail or come back short on a script (for the policy)."""

    def __init__(self, data: bytes, script: list[str]) -> None:
        self.inner = MemoryStore()
        self.url = f"memory://scripted/{uuid.uuid4().hex}"
        self.inner.fs.pipe(self.url, data)
        self.script = list(script)
        self.calls: list[tuple[int, int]] = []
        self.active = 0
        self.peak_active = 0

    async def expand(self, pattern: str) -> list[ObjectInfo]:
        return await self.inner.expand(pattern)

    async def read_range(self, obj: ObjectInfo, start: int, end: int) -> bytes:
        self.calls.append((start, end))
        self.active += 1
        self.peak_active = max(self.peak_active, self.active)
        try:
            await asyncio.sleep(0)  # let other requests start: real concurrency
            action = self.script.pop(0) if self.script else "ok"
            if action == "fail":
                raise TransientStorageError(f"{obj.url}: scripted fault")
            if action == "denied":
                raise ObjectNotFoundError(f"{obj.url}: scripted 404")
            if action == "hang":
                await asyncio.Event().wait()
            data = await self.inner.read_range(obj, start, end)
            return data[: max(1, len(data) // 2)] if action == "short" else data
        finally:
            self.active -= 1


async def read_all(reader: ObjectReader) -> bytes:
    try:
        return b"".join([block async for block in reader])
    finally:
        await reader.aclose()


async def test_short_reads_and_faults_resume_at_the_exact_offset() -> None:
    data = bytes(range(256)) * 400
    store = ScriptedStore(data, ["short", "fail", "short", "ok", "fail", "short"])
    obj = (await store.expand(store.url))[0]
    reader = ObjectReader(
        store, obj, ByteBudget(1 << 20), block_bytes=10_000, max_concurrency=1, policy=FAST
    )
    assert await read_all(reader) == data
    # every request after a short read starts exactly where the short body ended
    starts = [start for start, _ in store.calls]
    assert starts[0] == 0 and starts[1] == 5000


async def test_permanent_errors_are_not_retried() -> None:
    store = ScriptedStore(b"x" * 100, ["denied"])
    obj = (await store.expand(store.url))[0]
    reader = ObjectReader(store, obj, ByteBudget(1000), policy=FAST)
    with pytest.raises(ObjectNotFoundError):
        await read_all(reader)
    assert len(store.calls) == 1


async def test_persistent_faults_end_in_retries_exhausted() -> None:
    store = ScriptedStore(b"x" * 100, ["fail"] * 10)
    obj = (await store.expand(store.url))[0]
    reader = ObjectReader(store, obj, ByteBudget(1000), policy=FAST)
    with pytest.raises(RetriesExhaustedError, match="gave up after 4 attempt") as info:
        await read_all(reader)
    assert isinstance(info.value.__cause__, TransientStorageError)
    assert len(store.calls) == 4


async def test_a_stalled_request_times_out_and_is_retried() -> None:
    store = ScriptedStore(b"y" * 100, ["hang"])
    obj = (await store.expand(store.url))[0]
    policy = RetryPolicy(max_attempts=2, initial_backoff_s=0.001, timeout_s=0.2)
    reader = ObjectReader(store, obj, ByteBudget(1000), policy=policy)
    assert await read_all(reader) == b"y" * 100
    assert len(store.calls) == 2


async def test_concurrency_and_budget_bound_what_is_in_flight() -> None:
    data = bytes(1 << 20)
    store = ScriptedStore(data, [])
    obj = (await store.expand(store.url))[0]
    budget = ByteBudget(300_000)
    reader = ObjectReader(store, obj, budget, block_bytes=100_000, max_concurrency=8)
    assert await read_all(reader) == data
    assert store.peak_active <= 3  # the budget admits 3 blocks of 100 kB at a time
    assert budget.peak <= 300_000
    assert budget.reserved == 0


async def test_closing_early_cancels_reads_and_returns_the_budget() -> None:
    store = ScriptedStore(bytes(1 << 20), [])
    obj = (await store.expand(store.url))[0]
    budget = ByteBudget(1 << 20)
    reader = ObjectReader(store, obj, budget, block_bytes=65536, max_concurrency=4)
    first = await reader.__anext__()
    assert len(first) == 65536 and budget.reserved > 0
    await reader.aclose()
    assert budget.reserved == 0
    assert store.active == 0


def test_many_shards_share_one_budget(tmp_path: Path) -> None:
    for i in range(12):
        with streamrec.sync.open_writer(str(tmp_path / f"s{i:02d}.tfrecord")) as w:
            w.write_many([bytes([i]) * 5000] * 40)
    ds = streamrec.open_dataset(
        str(tmp_path / "*.tfrecord"), prefetch_bytes=50_000, block_bytes=20_000
    )
    assert [p[0] for p in ds] == [i for i in range(12) for _ in range(40)]
    assert ds.stats.shards_opened == 12
    assert 20_000 < ds.stats.peak_prefetch_bytes <= 50_000 + 20_000


async def test_the_overall_deadline_bounds_a_request() -> None:
    import time

    store = ScriptedStore(b"x" * 100, ["fail"] * 100)
    obj = (await store.expand(store.url))[0]
    policy = RetryPolicy(
        max_attempts=100, initial_backoff_s=0.05, max_backoff_s=0.05, deadline_s=0.3
    )
    reader = ObjectReader(store, obj, ByteBudget(1000), policy=policy)
    started = time.monotonic()
    with pytest.raises(RetriesExhaustedError, match="gave up after"):
        await read_all(reader)
    assert time.monotonic() - started < 2
    assert 2 <= len(store.calls) < 100


def test_the_blocking_iterator_reports_the_consumers_wait() -> None:
    async def slow() -> AsyncIterator[int]:
        for i in range(4):
            await asyncio.sleep(0.1)
            yield i

    waits: list[float] = []
    assert list(iterate_blocking(slow, waits.append)) == [0, 1, 2, 3]
    assert len(waits) == 5  # four items and the end
    assert 0.38 <= sum(waits) < 2


def test_wait_time_is_small_when_the_consumer_is_the_bottleneck(tmp_path: Path) -> None:
    for i in range(3):
        with streamrec.sync.open_writer(str(tmp_path / f"s{i}.tfrecord")) as w:
            w.write_many([bytes([i]) * 1000] * 200)
    ds = streamrec.open_dataset(str(tmp_path / "*.tfrecord"), block_bytes=20_000)
    slept = 0.0
    for index, _ in enumerate(ds):
        if index % 100 == 0:
            time.sleep(0.2)  # a consumer slower than the local disk
            slept += 0.2
    assert slept == pytest.approx(1.2)
    assert ds.stats.wait_s < 0.25 * slept


def test_budget_wakes_streams_waiting_for_room_in_order() -> None:
    async def main() -> list[str]:
        budget = ByteBudget(100)
        woken: list[str] = []
        budget.try_reserve(100)
        budget.wake_on_release(lambda: woken.append("a"))
        budget.wake_on_release(lambda: woken.append("b"))
        budget.release(10)
        assert woken == []  # not in the releasing step: the releaser re-requests first
        await asyncio.sleep(0)
        return woken

    assert asyncio.run(main()) == ["a", "b"]


async def test_a_stream_the_consumer_waits_for_may_overdraw_by_one_block() -> None:
    budget = ByteBudget(100)
    assert budget.try_reserve(100)
    await asyncio.wait_for(budget.reserve(50, overdraw=True), 1)
    assert budget.reserved == 150  # the limit plus one block
    # another stream the consumer waits for next, holding nothing, gets its block too: the
    # first one's bytes wait for the consumer, who waits for this one (a hang, else)
    await asyncio.wait_for(budget.reserve(50, overdraw=True), 1)
    assert budget.reserved == 200
    with pytest.raises(asyncio.TimeoutError):  # a stream that only reads ahead waits
        await asyncio.wait_for(budget.reserve(50), 0.05)


async def test_a_block_its_prime_requested_while_the_consumer_waited_is_not_asked_again() -> None:
    # The consumer waits to overdraw; room comes back while a release that left the budget
    # over had queued the wake-up of the streams waiting for room: the reader's own prime()
    # (one of them) requests the block first. The consumer's reservation must not request
    # from the same byte once more (here: past the object's end, read short until retries
    # ran out).
    data = bytes(range(256)) * 125  # one block
    store = ScriptedStore(data, [])
    obj = (await store.expand(store.url))[0]
    budget = ByteBudget(100_000)
    assert budget.try_reserve(300_000)  # another stream's overdraft
    budget.wake_on_release(lambda: None)  # a stream waiting for room
    reader = ObjectReader(
        store, obj, budget, block_bytes=len(data), first_block_bytes=len(data), policy=FAST
    )
    first = asyncio.ensure_future(reader.__anext__())  # waits: the budget is overdrawn
    asyncio.get_running_loop().call_soon(budget.release, 150_000)  # room, after it waits
    budget.release(100_000)  # still over; queues the waiting streams' wake-up
    got = [await first] + [piece async for piece in reader]
    await reader.aclose()
    assert b"".join(got) == data
    assert store.calls == [(0, len(data))]
    assert budget.reserved == 50_000  # the other stream's


async def test_a_primed_reader_keeps_requesting_as_the_budget_frees() -> None:
    # The next shard's reader is primed once; as the current one hands bytes on, it must
    # request more by itself (nobody reads it yet), up to what the budget allows.
    data = bytes(1 << 20)
    current = ScriptedStore(data, [])
    upcoming = ScriptedStore(data, [])
    budget = ByteBudget(400_000)
    first = ObjectReader(
        current,
        (await current.expand(current.url))[0],
        budget,
        block_bytes=100_000,
        first_block_bytes=100_000,
    )
    first.prime()
    second = ObjectReader(
        upcoming,
        (await upcoming.expand(upcoming.url))[0],
        budget,
        block_bytes=100_000,
        first_block_bytes=100_000,
    )
    second.prime()
    assert len(upcoming.calls) == 0  # the budget is full of the first reader's blocks
    await read_all(first)
    await asyncio.sleep(0.01)
    assert len(upcoming.calls) == 4  # it took the room the first one gave back
    assert await read_all(second) == data
    assert budget.reserved == 0


async def test_pieces_are_handed_on_one_by_one_and_released_as_they_go() -> None:
    class Pieces(ScriptedStore):
        async def read_range_pieces(self, obj: ObjectInfo, start: int, end: int) -> list[bytes]:
            data = await self.read_range(obj, start, end)
            return [data[i : i + 1000] for i in range(0, len(data), 1000)]

    data = bytes(range(256)) * 100
    store = Pieces(data, [])
    budget = ByteBudget(1 << 20)
    reader = ObjectReader(store, (await store.expand(store.url))[0], budget, block_bytes=10_000)
    got = []
    async for piece in reader:
        got.append(piece)
        assert len(piece) <= 1000
    await reader.aclose()
    assert b"".join(got) == data
    assert budget.reserved == 0


async def test_streams_with_shares_keep_room_for_each_other() -> None:
    # Streams consumed side by side (an interleave) each get a share; the first one to
    # request must not take the room the other is owed, only room nobody is owed.
    data = bytes(range(256)) * 4000
    stores = [ScriptedStore(data, []) for _ in range(2)]
    budget = ByteBudget(500_000)
    readers = [
        ObjectReader(
            store,
            (await store.expand(store.url))[0],
            budget,
            block_bytes=50_000,
            first_block_bytes=10_000,
            share_bytes=200_000,
        )
        for store in stores
    ]
    budget.kept = 400_000  # the shares of the two
    readers[0].prime()
    # its share, and of the 100 kB nobody is owed what whole blocks fit
    assert 200_000 <= budget.reserved <= 300_000
    readers[1].prime()
    assert readers[1]._held >= 200_000 - 50_000  # its share was kept for it
    assert budget.reserved <= 500_000
    got = [b"", b""]
    for k, reader in enumerate(readers):
        async for piece in reader:
            got[k] += piece
            assert budget.reserved <= 500_000
        await reader.aclose()
    assert got == [data, data]
    assert budget.reserved == 0 and budget.covered == 0


async def test_raising_a_readers_share_lets_it_request_more() -> None:
    store = ScriptedStore(bytes(1 << 20), [])
    obj = (await store.expand(store.url))[0]
    budget = ByteBudget(1 << 20)
    budget.kept = 1 << 20  # the room is kept for streams' shares
    reader = ObjectReader(store, obj, budget, first_block_bytes=10_000, share_bytes=40_000)
    reader.prime()
    assert budget.reserved <= 40_000
    reader.set_share(400_000)  # its turn came: a full share
    reader.prime()
    assert 40_000 < budget.reserved <= 400_000
    await reader.aclose()
    assert budget.reserved == 0


@pytest.mark.parametrize("deterministic", [True, False])
def test_interleaved_streams_shares_fit_in_the_budget(tmp_path: Path, deterministic: bool) -> None:
    for i in range(40):
        (tmp_path / f"s{i:02d}.tfrecord").write_bytes(b"")
    ds = streamrec.open_dataset(
        str(tmp_path / "*.tfrecord"),
        cycle_length=16,
        deterministic=deterministic,
        prefetch_bytes=64 << 20,
    )
    share = BudgetPlan(ds.options).stream_share
    assert share is not None and share >= 3 << 20
    read_ahead = 16 if deterministic else 0  # the next generation, started before its turn
    assert 16 * share + read_ahead * (share // 4) <= 64 << 20
    assert list(ds) == []
    one_at_a_time = streamrec.open_dataset(str(tmp_path / "*.tfrecord")).options
    assert BudgetPlan(one_at_a_time).stream_share is None


async def test_a_limited_reader_keeps_its_limit_when_the_cache_answers() -> None:
    # A shard opened ahead of its turn requests its first block alone (limit_concurrency);
    # with a cache the answer (no copy here: the remote object is read) used to raise the
    # reader to its full concurrency at once, and it took the budget the current shard needs.
    data = bytes(1 << 20)
    store = ScriptedStore(data, [])
    budget = ByteBudget(1 << 30)

    async def no_copy() -> None:
        return None

    reader = ObjectReader(
        store,
        (await store.expand(store.url))[0],
        budget,
        block_bytes=100_000,
        first_block_bytes=100_000,
        max_concurrency=8,
        open_cache=no_copy,
    )
    reader.limit_concurrency(1)
    reader.prime()
    first = await reader.__anext__()
    assert budget.reserved <= 2 * 100_000  # the piece handed on, and one block in flight
    reader.restore_concurrency()  # its turn: the full number (8 blocks) from now on
    reader.prime()
    assert budget.reserved >= 8 * 100_000
    assert first + await read_all(reader) == data
    assert budget.reserved == 0
