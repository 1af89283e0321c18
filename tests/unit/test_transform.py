"""Parsing and batching: exactly decode() per record / decode_batch() per batch, on both the
async and the blocking path, across chunk and shard boundaries; consumption counted exactly."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streamrec
from streamrec.errors import FeatureError
from streamrec.example import (
    FixedLenFeature,
    RawFeature,
    VarLenFeature,
    decode,
    decode_batch,
    encode,
)
from streamrec.format.example import batch as example_batch
from streamrec.pipeline.stats import Stats
from streamrec.pipeline.transforms.chainable import BatchedDataset, ParsedDataset

SPEC = {
    "idx": FixedLenFeature(np.int64),
    "pair": FixedLenFeature(np.float32, (2,)),
    "name": FixedLenFeature(bytes),
    "ids": VarLenFeature(np.int64),
    "scores": VarLenFeature(np.float32),
    "tags": VarLenFeature(bytes),
    "pixels": RawFeature(np.uint8, (2, 3)),
    "fallback": FixedLenFeature(np.int64, (2,), default=[7, 8]),
}


def example(i: int) -> bytes:
    features: dict[str, Any] = {
        "idx": i,
        "pair": [i + 0.5, -float(i)],
        "name": b"n%d" % i,
        "ids": np.arange(i % 4, dtype=np.int64),
        "scores": np.full(i % 3, i, dtype=np.float32),
        "tags": [b"t%d" % j for j in range(i % 3)],
        "pixels": bytes((i + k) % 256 for k in range(6)),
        "pad": b"x" * (i % 37),
    }
    if i % 5 == 0:
        features["fallback"] = [i, i]
    if i % 3 == 0:  # a missing VarLen feature: no values
        del features["tags"]
    return encode(features)


def write_shards(directory: Path, sizes: list[int], make: Any = example) -> list[str]:
    paths, first = [], 0
    for shard, size in enumerate(sizes):
        path = directory / f"shard-{shard:02d}.tfrecord"
        with streamrec.sync.open_writer(str(path)) as w:
            w.write_many([make(first + i) for i in range(size)])
        paths.append(str(path))
        first += size
    return paths


@pytest.fixture(params=["c", "python"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """decode_batch with the C parser and with the protobuf fallback."""
    if request.param == "python":
        monkeypatch.setattr(example_batch, "_cexample", None)
        assert not example_batch.has_c_accelerator()
    elif not example_batch.has_c_accelerator():
        pytest.skip("the C Example parser is not built")
    return str(request.param)


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    return write_shards(tmp_path, [23, 0, 41, 9])


def open_small_blocks(files: list[str], **options: Any) -> streamrec.Dataset:
    # tiny blocks: many chunks per shard, so batches and records cross chunk boundaries
    return streamrec.open_dataset(files, block_bytes=600, **options)


def collect(iterable: Any, mode: str) -> list[Any]:
    if mode == "sync":
        return list(iterable)

    async def run() -> list[Any]:
        return [item async for item in iterable]

    return asyncio.run(run())


def assert_same_value(got: Any, want: Any, where: str) -> None:
    if isinstance(want, list):
        assert isinstance(got, list), where
        assert len(got) == len(want), where
        for g, w in zip(got, want, strict=True):
            assert_same_value(g, w, where)
        return
    if isinstance(want, bytes):
        assert got == want, where
        return
    assert isinstance(got, np.ndarray), where
    assert got.dtype == want.dtype, where
    assert got.shape == want.shape, where
    assert np.array_equal(got, want), where


def assert_same_features(got: dict[str, Any], want: dict[str, Any], where: str) -> None:
    assert list(got) == list(want), where
    for name in want:
        assert_same_value(got[name], want[name], f"{where}, feature {name}")


def test_chunks_really_are_small(files: list[str]) -> None:
    async def sizes() -> list[int]:
        return [len(c) async for c in open_small_blocks(files).record_chunks()]

    chunk_sizes = asyncio.run(sizes())
    assert sum(chunk_sizes) == 73 and len(chunk_sizes) > 8  # the tests below cross boundaries


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_parsed_records_are_decode_of_each_payload(
    files: list[str], decoder: str, mode: str
) -> None:
    payloads = list(streamrec.open_dataset(files))
    records = collect(ParsedDataset(open_small_blocks(files), SPEC), mode)
    assert len(records) == len(payloads) == 73
    for i, (got, payload) in enumerate(zip(records, payloads, strict=True)):
        assert_same_features(got, decode(payload, SPEC), f"record {i}")
    assert records[3]["idx"].shape == ()  # 0-d arrays like decode(), not numpy scalars


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("batch_size", [1, 4, 10, 73, 100])
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_batches_are_decode_batch_of_consecutive_records(
    files: list[str], decoder: str, mode: str, batch_size: int, drop_remainder: bool
) -> None:
    payloads = list(streamrec.open_dataset(files))
    parsed = ParsedDataset(open_small_blocks(files), SPEC)
    batches = collect(parsed.batch(batch_size, drop_remainder), mode)
    starts = range(0, len(payloads), batch_size)
    expected = [payloads[s : s + batch_size] for s in starts]
    if drop_remainder and len(expected[-1]) < batch_size:
        expected.pop()
    assert len(batches) == len(expected)
    for b, (got, want) in enumerate(zip(batches, expected, strict=True)):
        assert_same_features(got, decode_batch(want, SPEC), f"batch {b}")
        assert got["idx"].shape == (len(want),)
        assert isinstance(got["ids"], list) and len(got["ids"]) == len(want)  # VarLen: a list
        assert got["pixels"].shape == (len(want), 2, 3)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_raw_batches_are_lists_of_payloads(files: list[str], mode: str) -> None:
    payloads = list(streamrec.open_dataset(files))
    batches = collect(BatchedDataset(open_small_blocks(files), 7), mode)
    assert [len(b) for b in batches] == [7] * 10 + [3]
    assert all(isinstance(b, list) for b in batches)
    assert [p for b in batches for p in b] == payloads
    dropped = collect(BatchedDataset(open_small_blocks(files), 7, drop_remainder=True), mode)
    assert dropped == batches[:-1]


def test_batches_span_shards_in_interleaved_order(tmp_path: Path) -> None:
    files = write_shards(tmp_path, [5, 6, 7])
    ds = streamrec.open_dataset(files, cycle_length=2, block_length=2)
    order = [int(decode(p)["idx"][0]) for p in ds]
    batches = list(ParsedDataset(ds, SPEC).batch(4))
    assert [int(i) for b in batches for i in b["idx"]] == order
    assert order != sorted(order)  # really interleaved


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_empty_dataset_gives_no_items(tmp_path: Path, mode: str) -> None:
    files = write_shards(tmp_path, [0, 0])
    ds = streamrec.open_dataset(files)
    assert collect(ParsedDataset(ds, SPEC), mode) == []
    assert collect(ParsedDataset(ds, SPEC).batch(3), mode) == []
    assert collect(BatchedDataset(ds, 3), mode) == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_empty_spec_gives_one_empty_dict_per_record(files: list[str], mode: str) -> None:
    assert collect(ParsedDataset(open_small_blocks(files), {}), mode) == [{}] * 73


def broken_at_30(i: int) -> bytes:
    return encode({"other": 1}) if i == 30 else example(i)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_parse_error_comes_after_every_good_record_before_it(
    tmp_path: Path, decoder: str, mode: str
) -> None:
    files = write_shards(tmp_path, [20, 20], make=broken_at_30)
    got: list[int] = []

    async def consume_async() -> None:
        async for features in ParsedDataset(open_small_blocks(files), SPEC):
            got.append(int(features["idx"]))

    with pytest.raises(FeatureError, match="idx"):
        if mode == "sync":
            for features in ParsedDataset(open_small_blocks(files), SPEC):
                got.append(int(features["idx"]))
        else:
            asyncio.run(consume_async())
    assert got == list(range(30))


def test_a_bad_batch_raises_naming_the_record_in_its_shard(tmp_path: Path) -> None:
    files = write_shards(tmp_path, [20, 20], make=broken_at_30)
    got = []
    # record 6 of the batch: the shard, the record's index in it and its offset are named
    with pytest.raises(FeatureError) as caught:
        for batch in ParsedDataset(streamrec.open_dataset(files), SPEC).batch(8):
            got.append(batch["idx"].tolist())
    assert str(caught.value).startswith(f"record 10 in {files[1]} at byte offset ")
    assert "of the batch" not in str(caught.value)
    assert got == [list(range(s, s + 8)) for s in (0, 8, 16)]


def test_bad_arguments_fail_at_construction(files: list[str]) -> None:
    ds = streamrec.open_dataset(files)
    with pytest.raises(TypeError, match="FixedLenFeature"):
        ParsedDataset(ds, {"x": np.int64})  # type: ignore[dict-item]
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="batch_size"):
            BatchedDataset(ds, bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot batch"):
        BatchedDataset(BatchedDataset(ds, 2), 2)  # type: ignore[call-overload]


def test_forwarding_to_the_dataset(files: list[str]) -> None:
    ds = streamrec.open_dataset(files)
    batched = ParsedDataset(ds, SPEC).batch(5)
    assert batched.dataset is ds and batched.spec == SPEC
    assert batched.stats is ds.stats
    batched.set_epoch(3)
    assert ds.epoch == 3
    list(batched)
    assert ds.stats.records == 73


def test_transforms_pickle_even_mid_iteration(files: list[str]) -> None:
    second = list(ParsedDataset(streamrec.open_dataset(files), SPEC).batch(5))[1]
    batched = ParsedDataset(streamrec.open_dataset(files), SPEC).batch(5)
    it = iter(batched)
    next(it)
    clone = pickle.loads(pickle.dumps(batched))  # the position after the batch handed out
    it.close()
    again = next(iter(clone))
    assert_same_features(again, second, "first batch after a pickle round trip")
    parsed = pickle.loads(pickle.dumps(ParsedDataset(streamrec.open_dataset(files), SPEC)))
    assert int(next(iter(parsed))["idx"]) == 0


# ------------------------------------------------------------------ counting what was consumed


class CountingSource:
    """A Dataset stand-in whose position is the number of records consumed, counted the way
    the transforms must drive a Dataset: record_chunks(auto_consume=False) + mark_consumed(n)."""

    def __init__(self, chunks: list[list[bytes]]) -> None:
        self.chunks = chunks
        self.total = sum(map(len, chunks))
        self.start = 0
        self.consumed = 0
        self.yielded = 0
        self.auto: list[bool] = []
        self.stats = Stats()
        self.epoch = 0

    async def record_chunks(self, *, auto_consume: bool = True, **consumer_hooks: Any) -> Any:
        self.auto.append(auto_consume)
        self.consumed = self.yielded = skip = self.start
        for chunk in self.chunks:
            if skip >= len(chunk):
                skip -= len(chunk)
                continue
            out, skip = chunk[skip:], 0
            self.yielded += len(out)
            if auto_consume:
                self.consumed += len(out)
            yield out

    def mark_consumed(self, n: int) -> None:
        assert n > 0
        self.consumed += n
        assert self.consumed <= self.yielded, "marked records that were never yielded"

    def state_dict(self) -> dict[str, Any]:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start = self.consumed = state["consumed"]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def counting_source() -> Any:
    sizes = [3, 1, 9, 4, 4, 12, 2, 5]  # 40 records
    payloads = [example(i) for i in range(40)]
    chunks, first = [], 0
    for size in sizes:
        chunks.append(payloads[first : first + size])
        first += size
    return CountingSource(chunks)


def make_transform(kind: str, source: Any) -> Any:
    if kind == "parsed":
        return ParsedDataset(source, SPEC)
    if kind == "parsed-batch":
        return ParsedDataset(source, SPEC).batch(6)
    if kind == "parsed-batch-drop":
        return ParsedDataset(source, SPEC).batch(6, drop_remainder=True)
    return BatchedDataset(source, 6)


def records_in(kind: str, item: Any) -> list[int]:
    if kind == "parsed":
        return [int(item["idx"])]
    if kind == "raw-batch":
        return [int(decode(p)["idx"][0]) for p in item]
    return [int(i) for i in item["idx"]]


KINDS = ["parsed", "parsed-batch", "parsed-batch-drop", "raw-batch"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_state_counts_exactly_the_records_handed_out(kind: str, mode: str) -> None:
    source = counting_source()
    transform = make_transform(kind, source)
    seen: list[int] = []
    states: list[int] = []

    def after_item(item: Any) -> None:
        seen.extend(records_in(kind, item))
        states.append(transform.state_dict()["consumed"])
        assert states[-1] == len(seen)  # every item handed out counts, nothing more

    if mode == "sync":
        for item in transform:
            after_item(item)
    else:

        async def run() -> None:
            async for item in transform:
                after_item(item)

        asyncio.run(run())
    assert source.auto == [False]
    expected = 36 if kind == "parsed-batch-drop" else 40
    assert seen == list(range(expected))
    assert transform.state_dict()["consumed"] == 40  # a dropped remainder counts at the end


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("stop_after", [1, 2, 5])
def test_resume_after_a_break_gives_exactly_the_rest(kind: str, mode: str, stop_after: int) -> None:
    full = [r for item in make_transform(kind, counting_source()) for r in records_in(kind, item)]
    source = counting_source()
    transform = make_transform(kind, source)
    head: list[int] = []
    if mode == "sync":
        for n, item in enumerate(transform, 1):
            head += records_in(kind, item)
            if n == stop_after:
                break
    else:

        async def run() -> None:
            n = 0
            async for item in transform:
                n += 1
                head.extend(records_in(kind, item))
                if n == stop_after:
                    break

        asyncio.run(run())
    state = transform.state_dict()  # after the iteration ended: what was handed out
    assert state == {"consumed": len(head)}
    resumed_source = counting_source()
    resumed = make_transform(kind, resumed_source)
    resumed.load_state_dict(state)
    tail = [r for item in resumed for r in records_in(kind, item)]
    assert head + tail == full


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_real_dataset_resumes_after_a_partial_batch_exactly(tmp_path: Path, mode: str) -> None:
    files = write_shards(tmp_path, [23, 41, 9])
    full = [
        int(i) for b in ParsedDataset(open_small_blocks(files), SPEC).batch(5) for i in b["idx"]
    ]
    batched = ParsedDataset(open_small_blocks(files), SPEC).batch(5)
    head: list[int] = []
    if mode == "sync":
        for b in batched:
            head += b["idx"].tolist()
            if len(head) == 35:
                break
    else:

        async def run() -> None:
            async for b in batched:
                head.extend(b["idx"].tolist())
                if len(head) == 35:
                    break

        asyncio.run(run())
    resumed = ParsedDataset(open_small_blocks(files), SPEC).batch(5)
    resumed.load_state_dict(batched.state_dict())
    assert head + [int(i) for b in resumed for i in b["idx"]] == full
