"""Exact resume: stop anywhere, restore into a fresh dataset, get exactly the rest."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamrec
from streamrec.errors import StateError
from streamrec.format.framing import RecordEncoder
from streamrec.pipeline.position.buffer_codec import decode_buffer
from support.resume import payload, resume_rest, stop_after, write_shards


def run_epochs(ds: streamrec.Dataset, epochs: int, first: int = 0) -> list[list[bytes]]:
    out = []
    for epoch in range(first, epochs):
        ds.set_epoch(epoch)
        out.append(list(ds))
    return out


CONFIGS = [
    {},
    {"cycle_length": 3, "block_length": 2},
    {"cycle_length": 4, "block_length": 1, "shuffle_shards": True},
    {"shuffle_buffer": 7, "seed": 5},
    {"cycle_length": 2, "block_length": 3, "shuffle_buffer": 50, "shuffle_shards": True},
    {"cycle_length": 3, "block_length": 2, "deterministic": False},
    {"cycle_length": 3, "deterministic": False, "shuffle_buffer": 9},
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: json.dumps(c, sort_keys=True))
def test_resume_anywhere_equals_uninterrupted_run(tmp_path: Path, config: dict[str, Any]) -> None:
    sizes = [5, 0, 17, 3, 11, 1, 8]
    files = write_shards(tmp_path, sizes, compressed=frozenset({2, 5}))

    def make() -> streamrec.Dataset:
        return streamrec.open_dataset(files, **config)

    epochs = 2
    reference = run_epochs(make(), epochs)
    flat = [r for epoch in reference for r in epoch]
    assert len(flat) == 2 * sum(sizes)
    deterministic = config.get("deterministic", True)
    for k in [0, 1, 2, 9, 22, 44, 45, 46, 60, 89, 90]:
        taken, state = stop_after(make(), epochs, k)
        rest = resume_rest(make, state, epochs)
        if deterministic:
            assert taken + rest == flat, f"stopped after {k}"
        else:
            assert Counter(taken + rest) == Counter(flat), f"stopped after {k}"
            assert len(taken + rest) == len(flat)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=7),
    cycle=st.integers(1, 4),
    block=st.integers(1, 3),
    buffer=st.sampled_from([0, 0, 1, 4, 30]),
    deterministic=st.booleans(),
    gz=st.sets(st.integers(0, 6), max_size=3),
    stop=st.floats(0, 1),
)
def test_resume_property(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    cycle: int,
    block: int,
    buffer: int,
    deterministic: bool,
    gz: set[int],
    stop: float,
) -> None:
    files = write_shards(tmp_path_factory.mktemp("d"), sizes, frozenset(gz))
    config = {
        "cycle_length": cycle,
        "block_length": block,
        "shuffle_buffer": buffer,
        "deterministic": deterministic,
        "shuffle_shards": True,
        "seed": 3,
    }

    def make() -> streamrec.Dataset:
        return streamrec.open_dataset(files, **config)

    flat = [r for epoch in run_epochs(make(), 2) for r in epoch]
    k = round(stop * len(flat))
    taken, state = stop_after(make(), 2, k)
    rest = resume_rest(make, state, 2)
    if deterministic or cycle == 1:
        assert taken + rest == flat
    else:
        assert sorted(taken + rest) == sorted(flat)


def test_resume_twice_in_a_row(tmp_path: Path) -> None:
    files = write_shards(tmp_path, [9, 4, 12, 7])
    config = {"cycle_length": 2, "block_length": 2, "shuffle_buffer": 5}
    flat = list(streamrec.open_dataset(files, **config))
    first = streamrec.open_dataset(files, **config)
    a = [r for _, r in zip(range(10), first, strict=False)]
    second = streamrec.open_dataset(files, **config)
    second.load_state_dict(first.state_dict())
    b = [r for _, r in zip(range(7), second, strict=False)]
    third = streamrec.open_dataset(files, **config)
    third.load_state_dict(second.state_dict())
    assert a + b + list(third) == flat


def test_async_iteration_and_chunks_resume(tmp_path: Path) -> None:
    files = write_shards(tmp_path, [30, 20, 25])
    config = {"cycle_length": 2, "block_length": 4}
    flat = list(streamrec.open_dataset(files, **config))

    async def first_part() -> tuple[list[bytes], dict[str, Any]]:
        ds = streamrec.open_dataset(files, **config)
        taken = []
        async for record in ds:
            taken.append(record)
            if len(taken) == 13:
                break
        return taken, ds.state_dict()

    taken, state = asyncio.run(first_part())

    async def rest() -> list[bytes]:
        ds = streamrec.open_dataset(files, **config)
        ds.load_state_dict(state)
        out: list[bytes] = []
        async for chunk in ds.record_chunks():
            out += chunk
        return out

    assert taken + asyncio.run(rest()) == flat


def test_resume_seeks_instead_of_rereading(tmp_path: Path) -> None:
    files = write_shards(tmp_path, [2000])
    size = Path(files[0]).stat().st_size
    ds = streamrec.open_dataset(files)
    it = iter(ds)
    for _ in range(1500):
        next(it)
    state = ds.state_dict()
    it.close()
    again = streamrec.open_dataset(files)
    again.load_state_dict(state)
    rest = list(again)
    assert rest == [payload(0, i) for i in range(1500, 2000)]
    offset = state["read"]["slots"][0][2]
    assert again.stats.bytes_read == size - offset
    assert offset == sum(len(payload(0, i)) + 16 for i in range(1500))


def test_state_is_small_json_without_record_data(tmp_path: Path) -> None:
    files = write_shards(tmp_path, [50] * 8)
    ds = streamrec.open_dataset(files, cycle_length=4, shuffle_buffer=20)
    it = iter(ds)
    for _ in range(100):
        next(it)
    state = ds.state_dict()
    it.close()
    text = json.dumps(state)
    assert b"0:1:" not in text.encode()  # locations, never payloads
    assert len(decode_buffer(state["shuffle"]["buffer"], "buffer")) == 20
    assert len(text) < 16_000  # mostly the shuffle generator's 625 words


def test_state_from_another_configuration_is_refused(tmp_path: Path) -> None:
    files = write_shards(tmp_path, [5, 5])
    ds = streamrec.open_dataset(files, cycle_length=2, seed=1)
    next(iter(ds))
    state = ds.state_dict()
    other = streamrec.open_dataset(files, cycle_length=2, seed=2)
    with pytest.raises(StateError, match="seed: state has 1, dataset has 2"):
        other.load_state_dict(state)
    with pytest.raises(StateError, match="version"):
        other.load_state_dict({"version": 99})


def test_state_over_changed_shards_is_refused(tmp_path: Path) -> None:
    files = write_shards(tmp_path, [5, 5])
    ds = streamrec.open_dataset(files)
    next(iter(ds))
    state = ds.state_dict()
    Path(files[1]).write_bytes(RecordEncoder().encode(b"changed"))
    again = streamrec.open_dataset(files)
    again.load_state_dict(state)
    with pytest.raises(StateError, match="different shards"):
        list(again)


def test_finished_epoch_resumes_empty_and_next_epoch_starts(tmp_path: Path) -> None:
    files = write_shards(tmp_path, [3, 4])
    ds = streamrec.open_dataset(files, shuffle_shards=True)
    first = list(ds)
    state = ds.state_dict()
    assert state["finished"] is True
    again = streamrec.open_dataset(files, shuffle_shards=True)
    again.load_state_dict(state)
    assert list(again) == []
    again.set_epoch(1)
    reference = streamrec.open_dataset(files, shuffle_shards=True)
    reference.set_epoch(1)
    assert list(again) == list(reference)
    assert sorted(first) == sorted(list(reference))


def test_skipped_corrupt_records_resume_by_count(tmp_path: Path) -> None:
    records = [payload(0, i) for i in range(40)]
    data = bytearray(b"".join(RecordEncoder().encode(r) for r in records))
    damaged = sum(len(r) + 16 for r in records[:10]) + 12  # first payload byte of record 10
    data[damaged] ^= 0xFF
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(bytes(data))
    flat = list(streamrec.open_dataset(str(path), on_corrupt="skip"))
    assert len(flat) == 39
    ds = streamrec.open_dataset(str(path), on_corrupt="skip")
    taken = [r for _, r in zip(range(25), ds, strict=False)]
    again = streamrec.open_dataset(str(path), on_corrupt="skip")
    again.load_state_dict(ds.state_dict())
    assert taken + list(again) == flat


_CHILD = """
import json, sys
import streamrec
files = json.loads(sys.argv[1])
ds = streamrec.open_dataset(files, cycle_length=3, block_length=2, shuffle_buffer=11, seed=4)
ds.set_epoch(1)
taken = []
for record in ds:
    taken.append(record.decode())
    if len(taken) == int(sys.argv[2]):
        break
print(json.dumps({"taken": taken, "state": ds.state_dict()}))
"""


def test_resume_in_a_fresh_process(tmp_path: Path) -> None:
    files = write_shards(tmp_path, [14, 9, 0, 21, 6], compressed=frozenset({3}))
    config = {"cycle_length": 3, "block_length": 2, "shuffle_buffer": 11, "seed": 4}
    reference = streamrec.open_dataset(files, **config)
    reference.set_epoch(1)
    flat = list(reference)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(files), "23"],
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(child.stdout)
    ds = streamrec.open_dataset(files, **config)
    ds.load_state_dict(result["state"])
    assert ds.epoch == 1
    assert [t.encode() for t in result["taken"]] + list(ds) == flat


def test_shuffle_buffer_refetch_with_records_far_apart(tmp_path: Path) -> None:
    # 64 KiB records: the buffer's records lie more than 1 MiB apart in places, so they
    # come back through several range reads per shard
    root = tmp_path / "big"
    root.mkdir()
    files = []
    for shard in range(3):
        path = root / f"s{shard}.tfrecord"
        path.write_bytes(
            b"".join(RecordEncoder().encode(payload(shard, i) + bytes(64 << 10)) for i in range(80))
        )
        files.append(str(path))
    config = {"cycle_length": 2, "shuffle_buffer": 60, "seed": 9}
    flat = list(streamrec.open_dataset(files, **config))
    for k in (70, 150):
        first = streamrec.open_dataset(files, **config)
        taken = [r for _, r in zip(range(k), first, strict=False)]
        state = first.state_dict()
        buffer = decode_buffer(state["shuffle"]["buffer"], "buffer")
        offsets = sorted(loc[2] for loc in buffer if loc[0] == 0)
        assert offsets[-1] - offsets[0] > 2 << 20
        again = streamrec.open_dataset(files, **config)
        again.load_state_dict(state)
        assert taken + list(again) == flat


@settings(max_examples=60, deadline=None)
@given(
    cycle=st.integers(1, 5),
    block=st.integers(1, 3),
    rounds=st.integers(1, 4),
    gaps=st.sets(st.integers(0, 4)),
    start=st.integers(0, 4),
    lengths=st.lists(st.integers(0, 30), min_size=60, max_size=60),
)
def test_rounds_event_applies_as_its_take_events(
    cycle: int,
    block: int,
    rounds: int,
    gaps: set[int],
    start: int,
    lengths: list[int],
) -> None:
    """Whole rounds taken at once describe exactly the position that one event per turn
    describes, wherever the consumer stops inside them."""
    from streamrec.pipeline.position.events import rounds_event, take_event
    from streamrec.pipeline.position.trackers import CycleTracker

    open_slots = [n for n in range(cycle) if n not in gaps] or [0]
    first = start % cycle
    order = [(first + k) % cycle for k in range(cycle)]
    order = [n for n in order if n in open_slots]
    records = [b"r" * n for n in lengths[: rounds * len(order) * block]]
    step = len(order) * block
    mine: dict[int, list[bytes]] = {n: [] for n in order}
    per_turn = []
    for r in range(rounds):
        for k, n in enumerate(order):
            part = records[r * step + k * block : r * step + (k + 1) * block]
            mine[n] += part
            per_turn.append(take_event(n, part, False))
    nbytes = [sum(map(len, mine[n])) + 16 * len(mine[n]) for n in order]
    batched = [rounds_event(order, block, rounds, nbytes)]

    def tracker() -> CycleTracker:
        t = CycleTracker(cycle)
        for n in open_slots:
            t.open(n, n * 10, 2, 100 * n)
        t.index = first
        return t

    for limit in [None, *range(len(records) + 1)]:
        expected, got = tracker(), tracker()
        expected.apply(per_turn, records, limit)
        got.apply(batched, records, limit)
        assert got.state() == expected.state(), f"limit {limit}"


def test_resume_inside_whole_rounds_of_big_pieces(tmp_path: Path) -> None:
    # shards decoded in big chunks: the interleave takes many rounds per piece
    sizes = [1500, 1400, 1700, 900]
    files = write_shards(tmp_path, sizes)

    def make() -> streamrec.Dataset:
        return streamrec.open_dataset(files, cycle_length=3, block_length=2)

    flat = list(make())
    assert len(flat) == sum(sizes)
    for k in [1, 1023, 1024, 2047, 4001, 4200, 5000]:
        taken, state = stop_after(make(), 1, k)
        assert taken + resume_rest(make, state, 1) == flat, f"stopped after {k}"
