"""The read-ahead tuner's decisions (streamrec.pipeline.stream.tune): a pure function of link
numbers, so every shape of link is a case here, and the budget bound is a property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrec.pipeline.options import ReadOptions, read_ahead
from streamrec.pipeline.stream.tune import (
    BLOCK_LADDER,
    MAX_TUNED_CONCURRENCY,
    SAMPLES,
    LinkEstimate,
    ReadTuner,
    choose,
    predicted_bps,
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
    prefetch=st.integers(min_value=1, max_value=1 << 33),
    rtt=st.floats(min_value=0.0, max_value=2.0),
    rate=st.floats(min_value=1e3, max_value=1e11),
    consumer=st.one_of(st.none(), st.floats(min_value=1.0, max_value=1e11)),
    max_block=st.sampled_from([1, 64 << 10, 1 * MIB, 4 * MIB, 8 * MIB, 64 * MIB]),
    max_concurrency=st.integers(min_value=1, max_value=64),
    fixed_block=st.booleans(),
)
def test_choice_never_exceeds_the_budget(
    prefetch: int,
    rtt: float,
    rate: float,
    consumer: float | None,
    max_block: int,
    max_concurrency: int,
    fixed_block: bool,
) -> None:
    block, concurrency = choose(
        prefetch,
        LinkEstimate(rtt, rate, consumer),
        max_block_bytes=max_block,
        max_concurrency=max_concurrency,
        fixed_block=fixed_block,
    )
    assert block * concurrency <= max(prefetch, 1) or (block == prefetch and concurrency == 1)
    assert 1 <= block <= min(max_block, prefetch)
    assert 1 <= concurrency <= max_concurrency
    if fixed_block:
        assert block == min(max_block, prefetch)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_defaults_reach_the_link_on_every_shape(shape: str) -> None:
    """With a consumer faster than the link, the choice predicts >= 0.9x of the link's cap
    within 64 MiB, where today's fixed 4 MiB x 16 does not on the slowest shape."""
    rtt, rate, cap = SHAPES[shape]
    block, concurrency = choose(64 * MIB, LinkEstimate(rtt, rate, 10 * cap))
    assert min(cap, predicted_bps(block, concurrency, rtt, rate)) >= 0.9 * cap
    assert block * concurrency <= 64 * MIB


def test_slow_links_get_smaller_blocks_and_more_reads() -> None:
    rtt, rate, cap = SHAPES["150ms/10MBps/1gbit"]
    assert predicted_bps(4 * MIB, 16, rtt, rate) < 0.95 * cap  # the fixed defaults fall short
    block, concurrency = choose(64 * MIB, LinkEstimate(rtt, rate, None))
    assert block < 4 * MIB and concurrency > 16


def test_a_slow_consumer_keeps_large_blocks() -> None:
    """No more requests than the consumer needs: 4 MiB x 16 already outruns 20 MB/s."""
    rtt, rate, _ = SHAPES["150ms/10MBps/1gbit"]
    assert choose(64 * MIB, LinkEstimate(rtt, rate, 20 * MB)) == (4 * MIB, 16)


def test_fast_local_links_keep_the_defaults_for_a_cpu_bound_consumer() -> None:
    assert choose(64 * MIB, LinkEstimate(0.001, 500 * MB, 300 * MB)) == (4 * MIB, 16)


def test_tiny_budgets_read_one_block_of_the_budget() -> None:
    assert choose(100 << 10, LinkEstimate(0.15, 10 * MB)) == (100 << 10, 1)
    assert choose(3 * MIB, LinkEstimate(0.15, 10 * MB))[0] <= 3 * MIB


class Link:
    """A link as numbers: a round trip, a per-connection rate, an aggregate cap; what a read
    of ``block`` measures with ``concurrency`` in flight (a full link shares its cap)."""

    def __init__(self, rtt: float, rate: float, cap: float) -> None:
        self.rtt, self.rate, self.cap = rtt, rate, cap
        self.now = 0.0

    def pulled(self, block: int, concurrency: int) -> float:
        return min(self.cap, predicted_bps(block, concurrency, self.rtt, self.rate))

    def feed(self, tuner: ReadTuner, windows: int) -> None:
        """``windows`` decision windows of reads at the tuner's current settings."""
        for _ in range(windows):
            for _ in range(SAMPLES * 50):
                block, concurrency = tuner.block_bytes, tuner.max_concurrency
                pulled = self.pulled(block, concurrency)
                seconds = concurrency * block / pulled  # a read's time in flight
                self.now += block / pulled
                before = tuner.estimate
                tuner.record(block, seconds, self.rtt, now=self.now)
                if tuner.estimate is not before:
                    break


def _tuner(**kwargs: object) -> ReadTuner:
    return ReadTuner(64 * MIB, 4 * MIB, 16, tune_block=True, tune_concurrency=True, **kwargs)  # type: ignore[arg-type]


def test_tuner_decides_from_its_reads_and_reports_the_choice() -> None:
    """A link whose round trips bound it (150 ms, 10 MB/s a connection, 2 Gbit): smaller
    blocks, more of them, kept because they pull more."""
    heard: list[tuple[int, int]] = []
    tuner = _tuner(on_choice=lambda *c: heard.append(c))
    assert (tuner.block_bytes, tuner.max_concurrency) == (4 * MIB, 16)  # the defaults first
    link = Link(0.150, 10 * MB, 250 * MB)
    link.feed(tuner, 6)
    assert heard and heard[-1] == (tuner.block_bytes, tuner.max_concurrency)
    assert tuner.block_bytes in BLOCK_LADDER and tuner.block_bytes < 4 * MIB
    assert tuner.block_bytes * tuner.max_concurrency <= 64 * MIB
    assert tuner.max_concurrency <= MAX_TUNED_CONCURRENCY
    assert link.pulled(tuner.block_bytes, tuner.max_concurrency) > 1.4 * link.pulled(4 * MIB, 16)
    assert tuner.estimate is not None and tuner.estimate.rtt_s == pytest.approx(0.150)


def test_a_full_link_sends_the_tuner_back_to_fewer_reads() -> None:
    """Through a full link every connection measures a share of it, which looks like a slow
    connection: the step to more reads is tried, pulls no more, and is taken back."""
    link = Link(0.010, 100 * MB, 150 * MB)  # 4 MiB x 16 would pull 1.29 GB/s: full
    tuner = _tuner()
    link.feed(tuner, 6)
    assert tuner.settled
    assert (tuner.block_bytes, tuner.max_concurrency) == (4 * MIB, 16)


def _feed(tuner: ReadTuner, rtt: float, rate: float, block: int = 4 * MIB) -> None:
    Link(rtt, rate, 1e12).feed(tuner, 4)


def test_settings_the_user_gave_stay() -> None:
    fixed = ReadTuner(64 * MIB, 8 * MIB, 4, tune_block=False, tune_concurrency=False)
    _feed(fixed, 0.150, 10 * MB)
    assert (fixed.block_bytes, fixed.max_concurrency, fixed.estimate) == (8 * MIB, 4, None)
    block_given = ReadTuner(64 * MIB, 8 * MIB, 16, tune_block=False, tune_concurrency=True)
    _feed(block_given, 0.150, 10 * MB, 8 * MIB)
    assert block_given.block_bytes == 8 * MIB and block_given.max_concurrency == 8
    reads_given = ReadTuner(64 * MIB, 4 * MIB, 16, tune_block=True, tune_concurrency=False)
    _feed(reads_given, 0.150, 10 * MB)
    assert reads_given.max_concurrency <= 16
    assert reads_given.block_bytes * reads_given.max_concurrency <= 64 * MIB


def test_reads_without_a_first_byte_teach_nothing() -> None:
    """Local files (no request, no first byte) and tiny reads leave the defaults."""
    tuner = ReadTuner(64 * MIB, 4 * MIB, 16, tune_block=True, tune_concurrency=True)
    for _ in range(4 * SAMPLES):
        tuner.record(4 * MIB, 0.5, None)
        tuner.record(1 << 10, 0.5, 0.15)
    assert (tuner.block_bytes, tuner.max_concurrency, tuner.estimate) == (4 * MIB, 16, None)


def test_open_dataset_defaults_are_tuned_and_given_values_are_not() -> None:
    tuned = ReadOptions(**read_ahead(None, None))
    assert (tuned.block_bytes, tuned.max_concurrency) == (4 * MIB, 16)
    assert tuned.tune_block_bytes and tuned.tune_max_concurrency
    given_ = ReadOptions(**read_ahead(4 * MIB, None))
    assert not given_.tune_block_bytes and given_.tune_max_concurrency
