"""Interleaving, shuffling and splitting: tf.data's order where promised, every record once."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamrec
from streamrec.example import decode
from streamrec.format.framing import RecordEncoder


def idx_order(ds: streamrec.Dataset) -> list[int]:
    return [int(decode(p)["idx"][0]) for p in ds]


@pytest.mark.parametrize("case", range(3))
def test_interleave_matches_tensorflow_references(
    corpus_dir: Path, manifest: dict[str, Any], case: int
) -> None:
    reference = manifest["interleave_reference"]
    expected = reference["results"][case]
    files = [str(corpus_dir / f) for f in reference["files"]]
    ds = streamrec.open_dataset(
        files, cycle_length=expected["cycle_length"], block_length=expected["block_length"]
    )
    assert idx_order(ds) == expected["idx_sequence"]


def test_num_parallel_reads_reference_is_interleave_with_block_1(
    corpus_dir: Path, manifest: dict[str, Any]
) -> None:
    reference = manifest["interleave_reference"]
    files = [str(corpus_dir / f) for f in reference["files"]]
    expected = reference["tfrecorddataset_num_parallel_reads_3"]
    if isinstance(expected, dict):
        expected = expected["idx_sequence"]
    assert idx_order(streamrec.open_dataset(files, cycle_length=3)) == expected


def tf_interleave_model(sizes: list[int], cycle: int, block: int) -> list[tuple[int, int]]:
    """TensorFlow's InterleaveDatasetOp, one element at a time (a reference for the tests)."""
    inputs = iter(range(len(sizes)))
    slots: list[Any] = [None] * cycle
    out: list[tuple[int, int]] = []
    end_of_input, num_open, index, block_index = False, 0, 0, 0
    while not end_of_input or num_open:
        if slots[index] is not None:
            shard, it = slots[index]
            record = next(it, None)
            if record is not None:
                out.append((shard, record))
                block_index += 1
                if block_index == block:
                    block_index, index = 0, (index + 1) % cycle
                continue
            slots[index] = None
            num_open -= 1
            block_index, index = 0, (index + 1) % cycle
        elif not end_of_input:
            shard = next(inputs, None)
            if shard is None:
                end_of_input = True
            else:
                slots[index] = (shard, iter(range(sizes[shard])))
                num_open += 1
        else:
            block_index, index = 0, (index + 1) % cycle
    return out


def write_shards(directory: Path, sizes: list[int]) -> list[str]:
    paths = []
    for shard, size in enumerate(sizes):
        path = directory / f"shard-{shard:03d}.tfrecord"
        path.write_bytes(RecordEncoder().encode_many([b"%d:%d" % (shard, r) for r in range(size)]))
        paths.append(str(path))
    return paths


def as_pairs(payloads: list[bytes]) -> list[tuple[int, int]]:
    return [tuple(map(int, p.split(b":"))) for p in payloads]  # type: ignore[misc]


shard_sizes = st.lists(st.integers(0, 12), min_size=1, max_size=9)
fixture_ok = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@fixture_ok
@given(sizes=shard_sizes, cycle=st.integers(1, 5), block=st.integers(1, 4))
def test_deterministic_interleave_is_tensorflows_order(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], cycle: int, block: int
) -> None:
    files = write_shards(tmp_path_factory.mktemp("shards"), sizes)
    ds = streamrec.open_dataset(files, cycle_length=cycle, block_length=block)
    assert as_pairs(list(ds)) == tf_interleave_model(sizes, cycle, block)


@fixture_ok
@given(
    sizes=shard_sizes,
    cycle=st.integers(1, 5),
    hosts=st.integers(1, 4),
    deterministic=st.booleans(),
    shuffle=st.booleans(),
)
def test_every_record_exactly_once_across_hosts(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    cycle: int,
    hosts: int,
    deterministic: bool,
    shuffle: bool,
) -> None:
    files = write_shards(tmp_path_factory.mktemp("shards"), sizes)
    seen: Counter[tuple[int, int]] = Counter()
    for host in range(hosts):
        ds = streamrec.open_dataset(
            files,
            cycle_length=cycle,
            deterministic=deterministic,
            shuffle_shards=shuffle,
            shuffle_buffer=5 if shuffle else 0,
            seed=7,
            num_hosts=hosts,
            host_index=host,
        )
        seen.update(as_pairs(list(ds)))
    expected = {(s, r) for s, size in enumerate(sizes) for r in range(size)}
    assert set(seen) == expected
    assert all(count == 1 for count in seen.values())


def test_shuffles_depend_on_seed_and_epoch_only(tmp_path: Path) -> None:
    files = write_shards(tmp_path, [50] * 8)

    def order(seed: int, epoch: int) -> list[bytes]:
        ds = streamrec.open_dataset(
            files, shuffle_shards=True, shuffle_buffer=64, seed=seed, cycle_length=3
        )
        ds.set_epoch(epoch)
        return list(ds)

    first = order(1, 0)
    assert order(1, 0) == first
    assert order(1, 1) != first
    assert order(2, 0) != first
    assert (
        sorted(order(1, 1))
        == sorted(first)
        == sorted(b"%d:%d" % (s, r) for s in range(8) for r in range(50))
    )


def test_shard_shuffle_reorders_whole_shards(tmp_path: Path) -> None:
    files = write_shards(tmp_path, [3] * 10)
    pairs = as_pairs(list(streamrec.open_dataset(files, shuffle_shards=True, seed=3)))
    shard_order = [shard for shard, _ in itertools.groupby(s for s, _ in pairs)]
    assert sorted(shard_order) == list(range(10)) and shard_order != list(range(10))
    assert all(r == i % 3 for i, (_, r) in enumerate(pairs))


def test_fewer_shards_than_hosts_splits_records_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = write_shards(tmp_path, [10, 7])
    with caplog.at_level(logging.WARNING, logger="streamrec"):
        parts = [
            as_pairs(list(streamrec.open_dataset(files, num_hosts=3, host_index=h)))
            for h in range(3)
        ]
    assert "splitting by record" in caplog.text
    assert sorted(p for part in parts for p in part) == [
        (s, r) for s, n in enumerate([10, 7]) for r in range(n)
    ]
    assert all(parts)  # nobody gets nothing


def test_first_ready_does_not_wait_for_a_slow_shard(http_dir: Any, fault_proxy: Any) -> None:
    for shard in range(4):
        data = RecordEncoder().encode_many([b"%d:%d" % (shard, r) for r in range(20)])
        http_dir.write(f"s{shard}.tfrecord", data)
    upstream = "/".join(http_dir.url.split("/")[:3])
    proxy = fault_proxy(upstream)
    proxy.delay(1.5, path="s0.tfrecord", range_only=True)
    # a glob: the shards are found by a listing, so every range GET of s0 is a data read (a
    # url named exactly is looked up by a range GET of its first bytes, which serves them too)
    files = http_dir.url.replace(upstream, proxy.url) + "/s[0-3].tfrecord"

    async def first_shards(deterministic: bool) -> list[int]:
        ds = streamrec.open_dataset(files, cycle_length=4, deterministic=deterministic)
        order = []
        async for chunk in ds.record_chunks():
            order.append(int(chunk[0].split(b":")[0]))
        return order

    # first-ready: the three fast shards come before the delayed one
    assert asyncio.run(first_shards(False))[-1] == 0
    # deterministic: tf.data's order, shard 0 first whatever the delay
    assert asyncio.run(first_shards(True))[0] == 0
