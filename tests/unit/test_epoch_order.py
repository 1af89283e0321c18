"""The order of an indexed epoch (streamrec.pipeline.order): permutations, windows, parts of
consumers, and what remains after any consumers stopped anywhere."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrec.pipeline.budget import BudgetPlan
from streamrec.pipeline.indexed.engine import window_records
from streamrec.pipeline.options import ReadOptions
from streamrec.pipeline.order import EpochOrder, feistel_permute, part_of, remaining_after


@pytest.mark.parametrize("n", [1, 2, 3, 5, 16, 17, 1000, 65537])
def test_feistel_is_a_permutation_and_inverts(n: int) -> None:
    keys = [np.uint64(k * 7919 + 1) for k in range(4)]
    values = np.arange(n, dtype=np.int64)
    permuted = feistel_permute(values, n, keys)
    assert sorted(permuted.tolist()) == list(range(n))
    assert feistel_permute(permuted, n, keys, inverse=True).tolist() == list(range(n))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 3000),
    kind=st.sampled_from(["none", "global", "block"]),
    window=st.integers(1, 50),
    mix=st.integers(1, 200),
    seed=st.integers(0, 5),
    epoch=st.integers(0, 3),
)
def test_every_order_is_a_permutation(
    n: int, kind: str, window: int, mix: int, seed: int, epoch: int
) -> None:
    order = EpochOrder(n, kind, seed, epoch, window, mix)  # type: ignore[arg-type]
    records = order.records_at(np.arange(n, dtype=np.int64))
    assert sorted(records.tolist()) == list(range(n))
    again = order.records_at(np.arange(n, dtype=np.int64)[::-1].copy())[::-1]
    assert records.tolist() == again.tolist()  # a function of the position alone


def test_orders_depend_on_seed_and_epoch() -> None:
    positions = np.arange(1000, dtype=np.int64)
    a = EpochOrder(1000, "global", 0, 0).records_at(positions).tolist()
    assert a != EpochOrder(1000, "global", 0, 1).records_at(positions).tolist()
    assert a != EpochOrder(1000, "global", 1, 0).records_at(positions).tolist()
    assert a == EpochOrder(1000, "global", 0, 0).records_at(positions).tolist()
    assert a != list(range(1000))


def test_block_order_keeps_windows_together_before_mixing() -> None:
    order = EpochOrder(1000, "block", 3, 0, window=10, mix=1)
    records = order.records_at(np.arange(1000, dtype=np.int64)).tolist()
    for k in range(0, 1000, 10):
        window = records[k : k + 10]
        assert window == list(range(window[0], window[0] + 10))
    assert records != list(range(1000))


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(0, 500),
    generations=st.lists(
        st.tuples(st.integers(1, 7), st.lists(st.floats(0, 1), min_size=7, max_size=7)),
        min_size=1,
        max_size=4,
    ),
)
def test_elastic_resume_delivers_every_position_exactly_once(
    n: int, generations: list[tuple[int, list[float]]]
) -> None:
    """Consumers in generation after generation, each stopping anywhere in its part: what
    they took, plus a last generation reading all that remains, is every position once."""
    remaining = [(0, n)] if n else []
    seen: list[int] = []
    for consumers, fractions in generations:
        taken = []
        for c in range(consumers):
            part = part_of(remaining, consumers, c)
            count = int(fractions[c] * part.length)
            seen += part.positions(0, count, remaining).tolist()
            taken.append(count)
        remaining = remaining_after(remaining, consumers, taken)
    for c in range(3):
        part = part_of(remaining, 3, c)
        seen += part.positions(0, part.length, remaining).tolist()
    assert sorted(seen) == list(range(n))


@pytest.mark.parametrize("n", [0, 1, 10, 11, 12, 13])
@pytest.mark.parametrize("consumers", [1, 2, 3, 4, 5])
def test_even_parts(n: int, consumers: int) -> None:
    remaining = [(0, n)] if n else []
    drop = [part_of(remaining, consumers, c, "drop") for c in range(consumers)]
    assert {p.length for p in drop} == {n // consumers}
    dropped = [x for c, p in enumerate(drop) for x in p.positions(0, p.length, remaining).tolist()]
    assert len(set(dropped)) == len(dropped) == consumers * (n // consumers)
    if n:
        pad = [part_of(remaining, consumers, c, "pad") for c in range(consumers)]
        assert {p.length for p in pad} == {-(-n // consumers)}
        padded = [x for p in pad for x in p.positions(0, p.length, remaining).tolist()]
        assert set(padded) == set(range(n))


MIB = 1 << 20


@pytest.mark.parametrize(
    ("prefetch", "block", "record", "window"),
    [
        # defaults: a sixteenth of a 64/3 MiB chunk (1.33 MiB) of 100 KiB / 1 KiB records
        (64 * MIB, 4 * MIB, 100 << 10, 13),
        (64 * MIB, 4 * MIB, 1 << 10, 1365),
        # a small budget: never under MIN_WINDOW_BYTES (1 MiB), so a read carries its cost
        (8 * MIB, 4 * MIB, 100 << 10, 10),
        # a large budget: never more than one read (block_bytes)
        (1024 * MIB, 4 * MIB, 100 << 10, 40),
        # records larger than a read: one record per window
        (64 * MIB, 4 * MIB, 8 * MIB, 1),
    ],
)
def test_block_window_is_chosen_from_record_size_and_link(
    prefetch: int, block: int, record: int, window: int
) -> None:
    options = ReadOptions(prefetch_bytes=prefetch, block_bytes=block, shuffle="block")
    assert window_records(options, BudgetPlan(options), record) == window
    # a chunk (a third of the budget) holds whole runs of 16 windows at the defaults
    assert BudgetPlan(options).chunk_records(record) == max(1, prefetch // 3 // record)
    explicit = ReadOptions(shuffle="block", window_records=7)
    assert window_records(explicit, BudgetPlan(explicit), record) == 7
