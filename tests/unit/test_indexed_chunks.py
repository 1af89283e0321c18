"""Indexed reading's chunks (streamrec.pipeline.indexed.engine): cut by the index's record lengths,
so that skewed record sizes keep the memory bound (issue 29, B.9)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from streamrec.format.index.core import IndexBuilder
from streamrec.pipeline.budget import CHUNK_PART
from streamrec.pipeline.indexed.engine import RECORD_COST_BYTES, IndexedEngine
from streamrec.pipeline.indexed.table import RecordTable
from streamrec.pipeline.options import ReadOptions
from streamrec.pipeline.stats import Stats
from streamrec.storage.base import ObjectInfo

MIB = 1 << 20


def skewed_table() -> RecordTable:
    """100,000 empty records, then 48 of 4 MiB (two shards, the large ones together)."""
    shards, indexes = [], []
    for name, lengths in (("small", [16] * 100_000), ("large", [4 * MIB + 16] * 48)):
        builder = IndexBuilder()
        builder.add_records(lengths)
        index = builder.build()
        indexes.append(index)
        shards.append(ObjectInfo(url=f"mem://{name}.tfrecord", size=index.stream_bytes))
    return RecordTable.build(shards, indexes, [None, None])


@pytest.mark.parametrize(
    "settings",
    [
        {"even": "drop", "shuffle": "block", "seed": 1},
        {"shuffle": "block", "seed": 2},
        {"shuffle": "global", "seed": 3},
        {"even": "pad"},
    ],
)
def test_chunks_hold_a_third_of_the_budget_whatever_the_sizes(settings: dict[str, Any]) -> None:
    table = skewed_table()
    options = ReadOptions(prefetch_bytes=8 * MIB, **settings)
    engine = IndexedEngine(["mem://x"], options, 0, Stats())
    plan = engine._plan(table, None)
    cut = list(engine._chunks(table, plan))
    chunks = [chunk for chunk, _ in cut]
    limit = options.prefetch_bytes // CHUNK_PART
    for chunk, size in cut:
        # what the chunk holds in the budget while read and consumed: its framed bytes and
        # the records' own cost (an empty record is not free)
        held = int(table.lengths_of(chunk).sum()) + RECORD_COST_BYTES * len(chunk)
        assert size == held
        assert held <= limit or len(chunk) == 1, (held, len(chunk))
    # every position once, in the epoch's order
    everything = plan.order.records_at(plan.part.positions(0, plan.part.length, plan.pool))
    assert np.concatenate(chunks).tolist() == everything.tolist()


def test_lengths_of_gathers_across_shards() -> None:
    table = skewed_table()
    records = np.array([100_047, 0, 100_000, 99_999, 5], dtype=np.int64)
    assert table.lengths_of(records).tolist() == [4 * MIB + 16, 16, 4 * MIB + 16, 16, 16]
