"""The read-ahead tuner's decisions (streamrec.pipeline.stream.tune): a pure function of link
numbers, so every shape of link is a case here, and the budget bound is a property."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrec.pipeline.options import ReadOptions, read_ahead
from streamrec.pipeline.stream.tune import (
    BLOCK_LADDER,
    LINKS,
    MAX_TUNED_CONCURRENCY,
    SAMPLES,
    Learned,
    LinkEstimate,
    LinkMemory,
    ReadTuner,
    choose,
    indexed_concurrency,
    link_key,
    predicted_bps,
    start_from,
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
    assert block * concurrency <= max(prefetch, 1) or concurrency == 1
    assert 1 <= concurrency <= max_concurrency
    if fixed_block:
        assert block == max_block  # as the user gave it
    else:
        assert 1 <= block <= min(max_block, prefetch)


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
    tuner = _tuner(on_choice=lambda t: heard.append((t.block_bytes, t.max_concurrency)))
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


# -- what a tuner learned, carried to the next iteration of the same store ----------------

KEY = ("s3", "http://127.0.0.1:9000", "bucket")
LINK_150MS = (0.150, 10 * MB, 250 * MB)


def test_a_second_tuner_of_the_store_starts_where_the_first_settled() -> None:
    """Epoch 1 learns the 150 ms link from the defaults; epoch 2 (a new tuner, the same
    memory and store) starts at what epoch 1 verified, with no window spent at the
    defaults; another store still starts at the defaults."""
    memory = LinkMemory()
    first = _tuner(memory=memory, key=KEY)
    Link(*LINK_150MS).feed(first, 6)
    learned = memory.get(KEY)
    assert learned is not None and learned.block_bytes < 4 * MIB
    assert (learned.block_bytes, learned.concurrency) == (first.block_bytes, first.in_flight)
    second = _tuner(memory=memory, key=KEY, learned=memory.get(KEY))
    assert (second.block_bytes, second.max_concurrency) == (
        learned.block_bytes,
        learned.concurrency,
    )
    assert second.learned == learned and second.estimate == learned.estimate
    other = _tuner(memory=memory, key=("s3", "", "other"), learned=memory.get(("s3", "", "x")))
    assert (other.block_bytes, other.max_concurrency, other.learned) == (4 * MIB, 16, None)


def test_an_unconfirmed_trial_is_not_remembered_and_a_taken_back_one_settles() -> None:
    memory = LinkMemory()
    link = Link(0.010, 100 * MB, 150 * MB)  # full at the defaults: the trial pulls no more
    tuner = _tuner(memory=memory, key=KEY)
    while tuner.estimate is None:  # up to the first decision: a trial of more, smaller reads
        link.feed(tuner, 1)
    assert (tuner.block_bytes, tuner.max_concurrency) != (4 * MIB, 16)
    assert memory.get(KEY) == Learned(4 * MIB, 16, tuner.estimate, False)  # not the trial
    link.feed(tuner, 3)
    assert tuner.settled and memory.get(KEY) == Learned(4 * MIB, 16, tuner.estimate, True)
    again = _tuner(memory=memory, key=KEY, learned=memory.get(KEY))
    assert again.settled and not again.active  # no trial paid for again each epoch


def test_the_memory_is_bounded_and_can_be_emptied() -> None:
    memory = LinkMemory(max_stores=3)
    for n in range(5):
        memory.put(("s3", "", f"b{n}"), Learned(MIB, 8, None))
    assert len(memory) == 3 and memory.get(("s3", "", "b0")) is None
    assert memory.get(("s3", "", "b4")) == Learned(MIB, 8, None)
    memory.forget()
    assert len(memory) == 0


_learned = st.one_of(
    st.none(),
    st.builds(
        Learned,
        st.integers(min_value=1, max_value=1 << 30),
        st.integers(min_value=1, max_value=1 << 10),
        st.one_of(st.none(), st.builds(LinkEstimate, st.floats(0, 2), st.floats(1e3, 1e11))),
        st.booleans(),
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    learned=_learned,
    room=st.integers(min_value=1, max_value=1 << 33),
    block=st.integers(min_value=1, max_value=64 * MIB),
    concurrency=st.integers(min_value=1, max_value=64),
    tune_block=st.booleans(),
    tune_concurrency=st.booleans(),
)
def test_where_a_tuner_starts_keeps_the_bound_and_the_given_settings(
    learned: Learned | None,
    room: int,
    block: int,
    concurrency: int,
    tune_block: bool,
    tune_concurrency: bool,
) -> None:
    """Whatever was learned (of another room, another block, a corrupt table entry), the
    start is within the room when the concurrency is tuned, never above the block the readers
    use, and exactly what the user gave where the user gave it."""
    got_block, got_concurrency = start_from(
        learned,
        room,
        block,
        concurrency,
        tune_block=tune_block,
        tune_concurrency=tune_concurrency,
    )
    assert 1 <= got_block <= block
    assert 1 <= got_concurrency <= max(concurrency, MAX_TUNED_CONCURRENCY)
    if not tune_block:
        assert got_block == block
    if not tune_concurrency:
        assert got_concurrency == concurrency
    else:
        assert got_block * got_concurrency <= room or got_concurrency == 1


@settings(max_examples=60, deadline=None)
@given(
    learned=_learned,
    room=st.integers(min_value=64 << 10, max_value=1 << 31),
    given_block=st.one_of(st.none(), st.sampled_from([256 << 10, MIB, 4 * MIB, 16 * MIB])),
    given_concurrency=st.one_of(st.none(), st.integers(min_value=1, max_value=64)),
    links=st.lists(
        st.tuples(st.floats(0.0, 0.5), st.floats(1e5, 1e10), st.floats(1e6, 1e11)),
        min_size=1,
        max_size=3,
    ),
)
def test_no_link_and_no_memory_lets_the_reads_exceed_the_room(
    learned: Learned | None,
    room: int,
    given_block: int | None,
    given_concurrency: int | None,
    links: list[tuple[float, float, float]],
) -> None:
    """The bound the reader's budget enforces, held by the decisions too: through any
    sequence of measured links, starting from anything learned, what the tuner lets in
    flight (``block x in_flight``) stays within the room, or is one block; settings given
    stay as given; and what it leaves in the memory starts the next one within the bound."""
    memory = LinkMemory()
    block = 4 * MIB if given_block is None else given_block
    concurrency = 16 if given_concurrency is None else given_concurrency
    for step in range(2):
        tuner = ReadTuner(
            room,
            block,
            concurrency,
            tune_block=given_block is None,
            tune_concurrency=given_concurrency is None,
            learned=learned if step == 0 else memory.get(KEY),
            memory=memory,
            key=KEY,
        )
        for rtt, rate, cap in links:
            Link(rtt, rate, cap).feed(tuner, 2)
            if given_block is not None:
                assert tuner.block_bytes == given_block
            if given_concurrency is not None:
                assert tuner.max_concurrency == given_concurrency
            assert tuner.block_bytes <= block
            assert tuner.block_bytes * tuner.in_flight <= room or tuner.in_flight == 1


def test_the_report_says_what_was_chosen_and_why() -> None:
    from streamrec.pipeline.stats import Stats

    base = {"prefetch_bytes": 64 * MIB, "block_bytes": 2 * MIB, "max_concurrency": 32}
    measured = Stats(settings={**base, "tuned": 1, "tuned_rtt_ms": 150, "tuned_mbps": 10})
    line = "up to 32 reads of 2.0 MiB per shard (measured: first bytes 150 ms, 10 MB/s a"
    assert line in measured.report()
    learned = Stats(settings={**base, "tuned": 2, "tuned_rtt_ms": 150, "tuned_mbps": 10})
    assert "(learned from an earlier read: first bytes 150 ms" in learned.report()
    assert "tuned" not in Stats(settings=base).report()


# -- the indexed engine: its reads in flight from what the store's streaming reads verified --


@settings(max_examples=200, deadline=None)
@given(
    learned=_learned,
    span=st.integers(min_value=1, max_value=64 * MIB),
    room=st.integers(min_value=1, max_value=1 << 33),
    default=st.integers(min_value=1, max_value=128),
)
def test_indexed_reads_in_flight_keep_the_bound(
    learned: Learned | None, span: int, room: int, default: int
) -> None:
    """Never fewer than the default (no regression on a store nothing is known of), never
    more than 32 above it, and every read above the default within the room."""
    got = indexed_concurrency(learned, span, room, default)
    assert got >= default
    if got > default:
        assert got <= MAX_TUNED_CONCURRENCY and got * span <= room
    if learned is None or learned.settled:
        assert got == default


def test_indexed_reads_carry_the_bytes_in_flight_the_store_verified() -> None:
    slow = Learned(2 * MIB, 32, LinkEstimate(0.150, 10 * MB))  # 64 MiB in flight pulled it
    assert indexed_concurrency(slow, 2 * MIB, 21 * MIB, 16) == 16  # a chunk holds 10 spans
    assert indexed_concurrency(slow, 1 * MIB, 64 * MIB, 16) == 32
    assert indexed_concurrency(slow._replace(settled=True), 1 * MIB, 64 * MIB, 16) == 16


def test_the_indexed_engine_sizes_its_reads_from_the_store_memory(tmp_path: Path) -> None:
    """Block shuffle over local shards whose store the memory knows: the gate takes the
    learned bytes in flight (ds.stats says so); a given max_concurrency stays as given."""
    import streamrec

    template = str(tmp_path / "part-{index}.tfrecord")
    with streamrec.sync.open_writer(template, max_records=64, index=True) as w:
        w.write_many([bytes(64 << 10)] * 256)  # 4 MiB shards of 64 KiB records
    url = str(tmp_path / "part-*.tfrecord")
    key = link_key(url, None)
    try:
        LINKS.put(key, Learned(MIB, 32, LinkEstimate(0.150, 10 * MB)))
        # 1 MiB windows, 32 MiB chunks: 32 reads carry the 32 MiB the store's reads verified
        ds = streamrec.open_dataset(
            url, shuffle="block", window_records=16, prefetch_bytes=96 * MIB
        )
        assert sum(1 for _ in ds) == 256
        assert ds.stats.settings["tuned"] == 2
        chosen = ds.stats.settings["max_concurrency"]  # (a window's framing: a bit over 1 MiB)
        assert 30 <= chosen <= MAX_TUNED_CONCURRENCY
        assert f"up to {chosen} reads of 1.0 MiB" in ds.stats.report()
        given_ = streamrec.open_dataset(url, shuffle="block", max_concurrency=8)
        assert sum(1 for _ in given_) == 256
        assert given_.stats.settings["max_concurrency"] == 8
        assert "tuned" not in given_.stats.settings
    finally:
        LINKS.forget()  # (no other test starts from it)
