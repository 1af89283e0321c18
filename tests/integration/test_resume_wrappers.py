"""Exact resume through whatever wrapper the consumer iterates.

The README's loop iterates ``ds.parse(spec).batch(n)`` and saves ``ds.state_dict()`` - the
dataset's state, not the wrapper's. Both must describe exactly the records handed to the
consumer so far, in every reading mode, so that a fresh dataset loaded with either state gives
exactly the records that would have come next (with ``deterministic=False``: the multiset).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

import streamrec
import streamrec.torch
from streamrec.example import FixedLenFeature, decode, encode

SPEC = {"idx": FixedLenFeature(np.int64), "pad": FixedLenFeature(bytes)}
SIZES = [310, 0, 455, 120, 388, 207]  # 1,480 records; one empty shard
BATCH = 64


def write(root: Path, compression: str | None) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    paths, first = [], 0
    suffix = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    for shard, size in enumerate(SIZES):
        path = root / f"train-{shard:03d}{suffix}"
        records = [
            encode({"idx": first + i, "pad": b"p" * ((first + i) * 7 % 50)}) for i in range(size)
        ]
        with streamrec.sync.open_writer(str(path), compression=compression) as w:
            w.write_many(records)
        paths.append(str(path))
        first += size
    return paths


def torch_loader(ds: streamrec.Dataset) -> Pipe:
    adapter = streamrec.torch.IterableDataset(ds.parse(SPEC).batch(BATCH))
    return DataLoader(adapter, batch_size=None, num_workers=0), adapter


#: What the consumer iterates (and the object whose state_dict() it would save), from a dataset
Pipe = tuple[Iterable[Any], Any]
#: ... and the record indices in one item of it
WRAPPERS: dict[str, tuple[Callable[[streamrec.Dataset], Pipe], Callable[[Any], list[int]]]] = {
    "parse.batch": (
        lambda ds: (ds.parse(SPEC).batch(BATCH),) * 2,
        lambda item: [int(i) for i in item["idx"]],
    ),
    "parse": (lambda ds: (ds.parse(SPEC),) * 2, lambda item: [int(item["idx"])]),
    "batch": (
        lambda ds: (ds.batch(BATCH),) * 2,
        lambda item: [int(decode(p, SPEC)["idx"]) for p in item],
    ),
    "torch DataLoader": (torch_loader, lambda item: [int(i) for i in item["idx"]]),
}

MODES: dict[str, dict[str, Any]] = {
    "plain": {},
    "gzip": {"compression": "gzip"},
    "interleave": {"cycle_length": 3, "block_length": 2},
    "shuffle": {"shuffle_shards": True, "shuffle_buffer": 100, "seed": 3},
    "host-split": {"num_hosts": 2, "host_index": 1, "cycle_length": 2},
    "first-ready": {"cycle_length": 3, "deterministic": False},
}


def dataset_maker(tmp_path: Path, mode: str) -> Callable[[], streamrec.Dataset]:
    options = dict(MODES[mode])
    compression = options.pop("compression", None)
    files = write(tmp_path / mode, compression)
    # small blocks and budget: many pieces, several per batch and several batches per piece
    options.update(prefetch_bytes=64 << 10, block_bytes=8 << 10)
    return lambda: streamrec.open_dataset(files, **options)


def take(items: Iterable[Any], records: Callable[[Any], list[int]], n: int = 0) -> list[int]:
    """The records of the first ``n`` items (all of them for 0)."""
    got: list[int] = []
    for k, item in enumerate(items, 1):
        got += records(item)
        if k == n:
            break
    return got


def same(mode: str, got: list[int], want: list[int]) -> None:
    if mode == "first-ready":  # an order of its own each run: the multiset is the promise
        assert sorted(got) == sorted(want)
        assert len(got) == len(want)
    else:
        assert got == want


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("wrapper", list(WRAPPERS))
@pytest.mark.parametrize("whose", ["dataset", "wrapper"])
def test_state_while_iterating_a_wrapper_resumes_exactly(
    tmp_path: Path, mode: str, wrapper: str, whose: str
) -> None:
    make = dataset_maker(tmp_path, mode)
    wrap, records = WRAPPERS[wrapper]
    full = take(wrap(make())[0], records)
    items = len(full) if wrapper == "parse" else -(-len(full) // BATCH)
    rng = random.Random(f"{mode}/{wrapper}/{whose}")
    stops = sorted({1, items, *rng.sample(range(2, items), 2)})
    for stop in stops:
        ds = make()
        pipe, wrapper_object = wrap(ds)
        owner = ds if whose == "dataset" else wrapper_object
        head: list[int] = []
        state: dict[str, Any] = {}
        for k, item in enumerate(pipe, 1):  # the README's loop: state taken after each step
            head += records(item)
            state = json.loads(json.dumps(owner.state_dict()))
            if k == stop:
                break
        resumed = make()
        resumed.load_state_dict(state)
        tail = take(wrap(resumed)[0], records)
        same(mode, head + tail, full)


@pytest.mark.parametrize("mode", ["plain", "shuffle", "first-ready"])
def test_resume_twice_in_a_row_through_the_readme_loop(tmp_path: Path, mode: str) -> None:
    make = dataset_maker(tmp_path, mode)
    wrap, records = WRAPPERS["parse.batch"]
    full = take(wrap(make())[0], records)
    got: list[int] = []
    state: dict[str, Any] | None = None
    for stop in (3, 5, None):  # two interruptions, then the rest
        ds = make()
        if state is not None:
            ds.load_state_dict(state)
        for k, batch in enumerate(ds.parse(SPEC).batch(BATCH), 1):
            got += records(batch)
            state = json.loads(json.dumps(ds.state_dict()))
            if k == stop:
                break
    same(mode, got, full)


@pytest.mark.parametrize("mode", ["plain", "gzip", "shuffle", "first-ready"])
def test_stats_records_counts_exactly_what_was_handed_out(tmp_path: Path, mode: str) -> None:
    make = dataset_maker(tmp_path, mode)
    total = sum(SIZES) // (2 if mode == "host-split" else 1)
    first = make()
    handed = 0
    for handed, _ in enumerate(first, 1):
        assert first.stats.records == handed  # after each record, not after each read piece
        if handed == 700:
            break
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    batches = resumed.parse(SPEC).batch(BATCH)
    for k, _ in enumerate(batches, 1):
        assert resumed.stats.records == min(k * BATCH, total - 700)
    # reading again to resume (prefix, shuffle buffer) and ahead is counted apart
    assert resumed.stats.records == total - 700
    assert resumed.stats.records_read >= resumed.stats.records
