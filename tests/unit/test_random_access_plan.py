"""plan_spans: which range reads fetch a set of records of an indexed shard. Neighbours within
``gap_bytes`` share a read, a read covers at most ``span_bytes`` (a lone record may exceed it),
and a compressed shard's reads run from a record's restart point to the next one."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrec.errors import RandomAccessUnavailableError
from streamrec.format.index.core import ShardIndex
from streamrec.pipeline.indexed.table import RecordTable, Span, as_indices, plan_spans
from streamrec.storage.base import ObjectInfo


def plain_table(lengths: list[int]) -> RecordTable:
    framed = np.asarray(lengths, dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(framed)[:-1])).astype(np.int64)
    shard = ObjectInfo("mem://s", int(framed.sum()))
    return RecordTable.build([shard], [ShardIndex(offsets, framed)], [None])


def compressed_table(restarts: list[int], size: int, lengths: int = 100) -> RecordTable:
    n = len(restarts)
    framed = np.full(n, lengths, dtype=np.int64)
    offsets = np.arange(n, dtype=np.int64) * lengths
    starts = np.asarray(restarts, dtype=np.int64)
    # each restart point's stream offset: where its first record starts
    first_of = {r: k for k, r in reversed(list(enumerate(restarts)))}
    skips = offsets - np.asarray([offsets[first_of[r]] for r in restarts], dtype=np.int64)
    index = ShardIndex(offsets, framed, starts, skips)
    return RecordTable.build([ObjectInfo("mem://s.gz", size)], [index], ["gzip"])


def ranges(spans: list[Span]) -> list[tuple[int, int, int, int]]:
    return [(s.first, s.last, s.start, s.end) for s in spans]


def test_neighbours_share_a_read_and_gaps_cut() -> None:
    table = plain_table([100] * 60)
    wanted = [0, 1, 2, 10, 11, 50]
    assert ranges(plan_spans(table, 0, wanted, gap_bytes=0, span_bytes=1 << 20)) == [
        (0, 2, 0, 300),
        (10, 11, 1000, 1200),
        (50, 50, 5000, 5100),
    ]
    # records 2 and 10 are 700 bytes apart: one read when that gap is allowed, not 699
    assert ranges(plan_spans(table, 0, wanted, gap_bytes=700, span_bytes=1 << 20)) == [
        (0, 11, 0, 1200),
        (50, 50, 5000, 5100),
    ]
    assert len(plan_spans(table, 0, wanted, gap_bytes=699, span_bytes=1 << 20)) == 3
    hundred = plan_spans(table, 0, list(range(60)), gap_bytes=0, span_bytes=1 << 20)
    assert ranges(hundred) == [(0, 59, 0, 6000)]  # 60 neighbours: one read


def test_a_read_covers_at_most_span_bytes_but_a_lone_record_may_exceed_it() -> None:
    table = plain_table([100] * 10 + [1000, 100])
    spans = plan_spans(table, 0, list(range(12)), gap_bytes=1 << 20, span_bytes=350)
    assert ranges(spans) == [
        (0, 2, 0, 300),
        (3, 5, 300, 600),
        (6, 8, 600, 900),
        (9, 9, 900, 1000),
        (10, 10, 1000, 2000),  # alone, larger than span_bytes
        (11, 11, 2000, 2100),
    ]


def test_compressed_reads_run_between_restart_points() -> None:
    # records 0-3 after restart 0 (the stream's start), 4-7 after 500, 8-9 after 900
    table = compressed_table([0] * 4 + [500] * 4 + [900] * 2, size=1200)
    big = 1 << 20
    assert ranges(plan_spans(table, 0, [1], span_bytes=big)) == [(1, 1, 0, 500)]
    assert ranges(plan_spans(table, 0, [1, 2], span_bytes=big)) == [(1, 2, 0, 500)]
    assert ranges(plan_spans(table, 0, [3, 4], span_bytes=big)) == [(3, 4, 0, 900)]
    assert ranges(plan_spans(table, 0, [3, 4], span_bytes=600)) == [
        (3, 3, 0, 500),
        (4, 4, 500, 900),
    ]
    assert ranges(plan_spans(table, 0, [9], span_bytes=big)) == [(9, 9, 900, 1200)]  # to the end
    assert ranges(plan_spans(table, 0, [0, 9], gap_bytes=0, span_bytes=big)) == [
        (0, 0, 0, 500),
        (9, 9, 900, 1200),
    ]


def test_a_counts_only_index_gives_no_random_access() -> None:
    offsets = np.arange(3, dtype=np.int64) * 20
    index = ShardIndex(offsets, np.full(3, 20, dtype=np.int64), counts_only=True)
    table = RecordTable.build([ObjectInfo("s3://b/x.gz", 50)], [index], ["gzip"])
    with pytest.raises(RandomAccessUnavailableError, match=r"s3://b/x.gz.*reshard --index"):
        plan_spans(table, 0, [1], span_bytes=1 << 20)


def test_global_numbering_and_its_errors() -> None:
    one, two = plain_table([20] * 3), plain_table([20] * 4)
    table = RecordTable.build(
        [*one.shards, *two.shards], [*one.indexes, *two.indexes], [None, None]
    )
    assert len(table) == 7 and table.counts() == (3, 4)
    ordinals, local = table.locate(np.array([0, 2, 3, 6, -1, -7]))
    assert ordinals.tolist() == [0, 0, 1, 1, 1, 0] and local.tolist() == [0, 2, 0, 3, 3, 0]
    for bad in (7, -8):
        with pytest.raises(IndexError, match=rf"record index {bad} out of range.* 7 records"):
            table.locate(np.array([1, bad]))
    for wrong in (3, [1.0], [True], [[1, 2]]):
        with pytest.raises(TypeError):
            as_indices(wrong)  # type: ignore[arg-type]
    assert as_indices([]).tolist() == [] and as_indices(range(3)).tolist() == [0, 1, 2]


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(16, 400), min_size=1, max_size=80),
    data=st.data(),
    gap=st.integers(0, 1000),
    span_bytes=st.integers(1, 3000),
)
def test_any_plan_covers_each_record_once_within_its_limits(
    lengths: list[int], data: st.DataObject, gap: int, span_bytes: int
) -> None:
    table = plain_table(lengths)
    n = len(lengths)
    wanted = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1)))
    spans = plan_spans(table, 0, wanted, gap_bytes=gap, span_bytes=span_bytes)
    covered = [k for s in spans for k in wanted if s.first <= k <= s.last]
    assert covered == wanted  # each wanted record in exactly one span, in order
    offsets = table.indexes[0].offsets
    for s in spans:
        assert s.first in wanted and s.last in wanted
        assert s.start == offsets[s.first] and s.end == offsets[s.last] + lengths[s.last]
        assert s.end - s.start <= span_bytes or s.first == s.last
    for before, after in itertools.pairwise(spans):
        # cut only where the gap is too wide or one read would be too long
        assert after.start - before.end > gap or after.end - before.start > span_bytes


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=60),
    st.data(),
    st.sampled_from([1.0, 1.5, 2.0, 4.0]),
)
def test_reads_fetch_at_most_the_amplification_bound(
    lengths: list[int], data: st.DataObject, ratio: float
) -> None:
    table = plain_table(lengths)
    wanted = sorted(data.draw(st.sets(st.integers(0, len(lengths) - 1), min_size=1)))
    spans = plan_spans(table, 0, wanted, span_bytes=1 << 20, max_amplification=ratio)
    needed = sum(lengths[k] for k in wanted)
    assert sum(s.end - s.start for s in spans) <= ratio * needed
    # every wanted record in exactly one span
    covered = [k for s in spans for k in wanted if s.first <= k <= s.last]
    assert covered == wanted


def test_amplification_bridges_a_gap_while_the_run_keeps_the_ratio() -> None:
    table = plain_table([100] * 10)
    # 0-1 touch (200 B); 3 is 100 B further (400 B for 300: 1.33x); 6 is 200 B further
    # (700 B for 400: 1.75x): one read within 2x
    spans = plan_spans(table, 0, [0, 1, 3, 6], span_bytes=1 << 20, max_amplification=2.0)
    assert ranges(spans) == [(0, 6, 0, 700)]
    # 0 and 6 alone: 700 B for 200 (3.5x): two reads
    spans = plan_spans(table, 0, [0, 6], span_bytes=1 << 20, max_amplification=2.0)
    assert ranges(spans) == [(0, 0, 0, 100), (6, 6, 600, 700)]
    # without the bound, everything within gap_bytes shares one read
    assert ranges(plan_spans(table, 0, [0, 6], span_bytes=1 << 20)) == [(0, 6, 0, 700)]
    # 1.0: only touching records share a read
    tight = plan_spans(table, 0, [0, 1, 3, 6], span_bytes=1 << 20, max_amplification=1.0)
    assert ranges(tight) == [(0, 1, 0, 200), (3, 3, 300, 400), (6, 6, 600, 700)]
    # the run is judged as a whole: 0, 2, 4 (500 B for 300) would take 8 at 900 B for 400
    spans = plan_spans(table, 0, [0, 2, 4, 8], span_bytes=1 << 20, max_amplification=2.0)
    assert ranges(spans) == [(0, 4, 0, 500), (8, 8, 800, 900)]


def test_compressed_amplification_counts_distinct_blocks() -> None:
    # restart points at 0, 0, 50, 50, 400 (records 0-1, 2-3, 4 in three blocks); size 500
    table = compressed_table([0, 0, 50, 50, 400], 500)
    # record 4's block (400-500) is 350 B after record 0's (0-50): more than its 100 B
    spans = plan_spans(table, 0, [0, 4], span_bytes=1 << 20, max_amplification=1.0)
    assert [(s.start, s.end) for s in spans] == [(0, 50), (400, 500)]
    # records 0 and 1 share a block (no gap); 350 B <= 7 x 100 B: bridged
    spans = plan_spans(table, 0, [0, 1, 4], span_bytes=1 << 20, max_amplification=8.0)
    assert [(s.start, s.end) for s in spans] == [(0, 500)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=40), min_size=2, max_size=40),
    st.data(),
    st.sampled_from([1.0, 2.0, 3.0]),
)
def test_compressed_reads_fetch_at_most_the_bound(
    steps: list[int], data: st.DataObject, ratio: float
) -> None:
    restarts = list(itertools.accumulate(steps))  # non-decreasing: records share blocks
    size = restarts[-1] + data.draw(st.integers(1, 50))
    table = compressed_table(restarts, size)
    wanted = sorted(data.draw(st.sets(st.integers(0, len(restarts) - 1), min_size=1)))
    spans = plan_spans(table, 0, wanted, span_bytes=1 << 20, max_amplification=ratio)
    wanted_blocks = set()
    for k in wanted:
        start = restarts[k]
        end = next((r for r in restarts if r > start), size)
        wanted_blocks.add((start, end))
    union = sum(e - s for s, e in wanted_blocks)
    assert sum(s.end - s.start for s in spans) <= ratio * union
    assert [k for s in spans for k in wanted if s.first <= k <= s.last] == wanted
