"""The writer's upload tuning (streamrec.write.tune, the window in streamrec.storage.sink_base):
decisions are pure functions of link numbers, so every link shape is a case here, and the
memory bound (the room) is a property over any estimate, any measurements, any requests."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrec.storage.gcs.sink import chunk_size
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.sink_base import SinkContext, UploadWindow
from streamrec.write.tune import (
    DEFAULT_ROOM_BYTES,
    MAX_UPLOADS,
    PART_LADDER,
    SAMPLES,
    START_PART_BYTES,
    UploadEstimate,
    UploadTuner,
    choose_part,
    predicted_bps,
    upload_context,
    upload_settings,
)

MIB = 1 << 20
MB = 10**6

# (round trip s, per-connection B/s, the aggregate cap B/s) of the benchmark's link shapes
SHAPES = {
    "10ms/100MBps/2.5gbit": (0.010, 100 * MB, 312.5 * MB),
    "60ms/25MBps/1gbit": (0.060, 25 * MB, 125 * MB),
    "150ms/10MBps/1gbit": (0.150, 10 * MB, 125 * MB),
}


@settings(max_examples=100, deadline=None)
@given(
    room=st.integers(min_value=PART_LADDER[-1], max_value=1 << 34),
    rtt=st.floats(min_value=0.0, max_value=5.0),
    rate=st.floats(min_value=1.0, max_value=1e11),
    producer=st.one_of(st.none(), st.floats(min_value=1.0, max_value=1e11)),
)
def test_choice_never_exceeds_the_room(
    room: int, rtt: float, rate: float, producer: float | None
) -> None:
    part, uploads = choose_part(room, UploadEstimate(rtt, rate, producer))
    assert part in PART_LADDER
    assert 1 <= uploads <= MAX_UPLOADS
    assert part * uploads <= room


def _simulate(
    tuner: UploadTuner, rtt: float, rate: float, link: float, windows: int, seed: int = 0
) -> None:
    """Feed ``tuner`` what uploads at its settings would measure on a link: each of ``uploads``
    parts in flight gets ``min(rate, link / uploads)`` (a part cut before a decision is still
    that size: the new size starts with the next shard, here at once)."""
    rng = random.Random(seed)
    now, waited = 0.0, [0.0]
    tuner._waited_s = lambda: waited[0]  # the producer always waits: the link is the limit
    for _ in range(windows * SAMPLES * 2):
        part, uploads = tuner.part_bytes, tuner.uploads
        share = min(rate, link / uploads) * rng.uniform(0.95, 1.05)
        seconds = rtt + part / share
        step = seconds / uploads
        now += step
        waited[0] += step * 0.9
        tuner.control(rtt * rng.uniform(1.0, 1.2))
        tuner.record(part, seconds, now=now)


@pytest.mark.parametrize("shape", SHAPES)
def test_tuner_pushes_near_the_link_on_every_shape(shape: str) -> None:
    rtt, rate, link = SHAPES[shape]
    seen: list[tuple[int, int]] = []
    tuner = UploadTuner(DEFAULT_ROOM_BYTES, lambda p, c: seen.append((p, c)))
    _simulate(tuner, rtt, rate, link, windows=12)
    part, uploads = tuner.part_bytes, tuner.uploads
    pushed = min(link, predicted_bps(part, uploads, rtt, rate))
    assert pushed >= 0.9 * link, (shape, part, uploads)
    assert all(p * c <= DEFAULT_ROOM_BYTES for p, c in seen)


def test_slow_connections_get_more_smaller_parts() -> None:
    """150 ms, 10 MB/s each: 16 MiB parts (8 in flight) push ~73 MB/s, 8 MiB ones ~136."""
    part, uploads = choose_part(DEFAULT_ROOM_BYTES, UploadEstimate(0.150, 10 * MB))
    assert part <= 8 * MIB and uploads >= 16


def test_a_slow_producer_on_a_fast_link_gets_the_largest_parts() -> None:
    estimate = UploadEstimate(0.001, 1000 * MB, producer_bps=50 * MB)
    assert choose_part(DEFAULT_ROOM_BYTES, estimate) == (16 * MIB, 8)


def test_a_step_to_smaller_parts_that_pushes_no_more_is_undone_for_good() -> None:
    """A full 1 Gbit link measured as 16 shares of 7 MB/s looks like slow connections: the
    tuner tries 5 MiB parts, sees no gain, goes back to 8 MiB and stays."""
    applied: list[tuple[int, int]] = []
    tuner = UploadTuner(DEFAULT_ROOM_BYTES, lambda p, c: applied.append((p, c)))
    _simulate(tuner, 0.060, 25 * MB, 116 * MB, windows=12)
    assert tuner.settled
    assert (tuner.part_bytes, tuner.uploads) == (START_PART_BYTES, 16)
    assert (5 * MIB, 25) in applied


@settings(max_examples=50, deadline=None)
@given(
    samples=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=64 * MIB),
            st.floats(min_value=-1.0, max_value=100.0),
            st.floats(min_value=0.0, max_value=10.0),
        ),
        max_size=300,
    ),
    rtts=st.lists(st.floats(min_value=-1.0, max_value=10.0), max_size=20),
)
def test_no_measurement_makes_the_tuner_leave_the_room(
    samples: list[tuple[int, float, float]], rtts: list[float]
) -> None:
    applied: list[tuple[int, int]] = []
    tuner = UploadTuner(DEFAULT_ROOM_BYTES, lambda p, c: applied.append((p, c)))
    for rtt in rtts:
        tuner.control(rtt)
    now = 0.0
    for nbytes, seconds, step in samples:
        now += step
        tuner.record(nbytes, seconds, now=now)
    assert applied
    for part, uploads in applied:
        assert part in PART_LADDER and part * uploads <= DEFAULT_ROOM_BYTES


@settings(max_examples=60, deadline=None)
@given(
    room=st.integers(min_value=1, max_value=64),
    max_requests=st.integers(min_value=1, max_value=8),
    sizes=st.lists(st.integers(min_value=1, max_value=80), min_size=1, max_size=40),
    seed=st.integers(min_value=0, max_value=1000),
    changes=st.lists(st.integers(min_value=1, max_value=8), max_size=5),
)
def test_window_never_holds_more_than_its_room(
    room: int, max_requests: int, sizes: list[int], seed: int, changes: list[int]
) -> None:
    """Any requests, finishing in any order, with the request limit changed meanwhile: the bytes
    in flight stay within the room (one request bigger than it goes alone), all requests run."""

    async def main() -> None:
        window = UploadWindow(room, max_requests)
        rng = random.Random(seed)
        done = []
        pending = list(changes)
        highest = [max_requests]

        async def request(nbytes: int) -> None:
            await window.acquire(nbytes)
            assert window.bytes <= room or window.requests == 1
            # (a lowered limit recalls nothing in flight: the highest one set so far bounds)
            assert window.requests <= max(highest)
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)
            if pending and rng.random() < 0.3:  # a tuner's decision while uploads run
                window.max_requests = pending.pop()
                highest.append(window.max_requests)
                window.wake()
            window.release(nbytes)
            done.append(nbytes)

        await asyncio.gather(*(request(n) for n in sizes))
        assert sorted(done) == sorted(sizes) and window.bytes == 0 and window.requests == 0

    asyncio.run(main())


def test_a_cancelled_wait_gives_its_room_back() -> None:
    async def main() -> None:
        window = UploadWindow(10, 4)
        await window.acquire(8)
        waiter = asyncio.ensure_future(window.acquire(5))
        await asyncio.sleep(0)
        waiter.cancel()
        window.release(8)
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await asyncio.wait_for(window.acquire(10), 1)
        assert window.bytes == 10 and window.requests == 1

    asyncio.run(main())


def test_a_cancelled_wait_lets_in_the_waiters_behind_it() -> None:
    """A waiter queued behind a larger one that is cancelled goes as soon as that one leaves
    the queue, not only at the next release (the room was there all along)."""

    async def main() -> None:
        window = UploadWindow(10, 4)
        await window.acquire(6)  # in flight, not released during the test
        large = asyncio.ensure_future(window.acquire(8))  # does not fit: waits
        await asyncio.sleep(0)
        small = asyncio.ensure_future(window.acquire(1))  # fits, but waits its turn
        await asyncio.sleep(0)
        assert not small.done() and window.requests == 1
        large.cancel()
        with pytest.raises(asyncio.CancelledError):
            await large
        assert window.requests == 2 and window.bytes == 7  # granted as the large one left
        await small

    asyncio.run(main())


@pytest.mark.parametrize("part_bytes", [1000, 5_000_000, 6 * MIB])
def test_a_fixed_window_holds_max_concurrency_gcs_chunks(part_bytes: int) -> None:
    """Fixed settings: ``max_concurrency`` requests of the largest size a sink sends (GCS
    rounds a chunk up to 256 KiB) fit in the default room together, as the old semaphore let
    them (a room of ``max_concurrency x part_bytes`` sent small parts one at a time)."""

    async def main() -> None:
        context = SinkContext(part_bytes=part_bytes, max_concurrency=8)
        chunk = chunk_size(part_bytes)
        waits = [asyncio.ensure_future(context.window.acquire(chunk)) for _ in range(9)]
        await asyncio.sleep(0)
        assert context.window.requests == 8  # (the ninth waits for the request limit)
        context.window.release(chunk)
        await asyncio.gather(*waits)

    asyncio.run(main())


def test_explicit_settings_fix_both_and_the_defaults_tune() -> None:
    retry = RetryPolicy()
    context, tuner = upload_context(None, None, retry)
    assert tuner is not None and context.room_bytes == DEFAULT_ROOM_BYTES
    assert (context.part_bytes, context.max_concurrency) == (START_PART_BYTES, 16)
    assert upload_settings(context, tuner).tuned
    for explicit, expected in [((6 * MIB, None), (6 * MIB, 8)), ((None, 3), (16 * MIB, 3))]:
        context, tuner = upload_context(*explicit, retry)
        assert tuner is None
        stats = upload_settings(context, tuner)
        assert (stats.part_bytes, stats.max_concurrency, stats.tuned) == (*expected, False)
        assert stats.room_bytes == expected[0] * expected[1]
