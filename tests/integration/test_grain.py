"""streamrec.interop.grain under the real grain: MapDataset, DataLoader with worker processes
and its checkpoints, and an IterDataset whose state is the dataset's exact state_dict."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import grain
import numpy as np
import pytest

import streamrec
from streamrec.errors import RandomAccessUnavailableError
from streamrec.example import FeatureSpec, FixedLenFeature, VarLenFeature, decode, encode
from streamrec.interop.grain import TFRecordDataSource, TFRecordIterDataset

pytestmark = pytest.mark.slow  # seconds a test: `pytest -m slow` (a CI step of its own)

SHARDS, PER_SHARD = 3, 100
TOTAL = SHARDS * PER_SHARD
SPEC: dict[str, FeatureSpec] = {"n": FixedLenFeature(np.int64), "tags": VarLenFeature(bytes)}


def record(n: int) -> bytes:
    return encode({"n": n, "tags": [b"t%d" % k for k in range(n % 3)]})


@pytest.fixture
def indexed(tmp_path: Path) -> str:
    for shard in range(SHARDS):
        path = tmp_path / f"part-{shard}.tfrecord"
        with streamrec.sync.open_writer(str(path), index=True) as writer:
            writer.write_many([record(shard * PER_SHARD + i) for i in range(PER_SHARD)])
    return str(tmp_path / "part-*.tfrecord")


def numbers(items: list[Any]) -> list[int]:
    return [int(item["n"]) for item in items]


def test_random_access_source(indexed: str) -> None:
    source = TFRecordDataSource(indexed, spec=SPEC)
    assert len(source) == TOTAL
    assert int(source[5]["n"]) == 5 and source[5]["tags"] == [b"t0", b"t1"]
    assert numbers(source.__getitems__([299, 7, 7, -1])) == [299, 7, 7, 299]
    assert numbers(source._getitems(np.array([3, 4]))) == [3, 4]  # grain's batched read
    raw = TFRecordDataSource(indexed)
    assert raw[10] == record(10) and raw.__getitems__([1, 2]) == [record(1), record(2)]
    assert "part-*.tfrecord" in repr(source) and "spec=['n', 'tags']" in repr(source)
    copy = pickle.loads(pickle.dumps(source))  # what grain's worker processes receive
    assert numbers(copy.__getitems__([42])) == [42]
    source.close()
    copy.close()


def test_map_dataset_shuffles_every_record_once(indexed: str) -> None:
    source = TFRecordDataSource(indexed, spec={"n": FixedLenFeature(np.int64)})
    dataset = grain.MapDataset.source(source).shuffle(seed=3).batch(64)
    got = np.concatenate([batch["n"] for batch in dataset]).tolist()
    assert sorted(got) == list(range(TOTAL)) and got != list(range(TOTAL))


def test_data_loader_workers_and_checkpoint(indexed: str) -> None:
    source = TFRecordDataSource(indexed, spec={"n": FixedLenFeature(np.int64)})
    sampler = grain.samplers.IndexSampler(TOTAL, shuffle=True, seed=0, num_epochs=1)
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[grain.transforms.Batch(32)],
        worker_count=2,
    )
    whole = np.concatenate([batch["n"] for batch in loader]).tolist()
    assert sorted(whole) == list(range(TOTAL))

    first = iter(loader)
    taken = [next(first)["n"] for _ in range(3)]
    state = first.get_state()
    resumed = iter(loader)
    resumed.set_state(state)
    rest = [batch["n"] for batch in resumed]
    assert np.concatenate(taken + rest).tolist() == whole  # the same order, nothing twice


def test_unindexed_shards_say_what_to_run(tmp_path: Path) -> None:
    with streamrec.sync.open_writer(str(tmp_path / "plain.tfrecord")) as writer:
        writer.write(record(0))
    source = TFRecordDataSource(str(tmp_path / "plain.tfrecord"))
    with pytest.raises(RandomAccessUnavailableError, match="streamrec index"):
        source.__getitems__([0])


def test_a_bad_spec_fails_at_once(indexed: str) -> None:
    with pytest.raises(TypeError):
        TFRecordDataSource(indexed, spec={"n": "int64"})  # type: ignore[dict-item]


def test_iter_dataset_resumes_from_its_json_state(indexed: str) -> None:
    def pipeline() -> Any:
        dataset = streamrec.open_dataset(indexed, shuffle_buffer=50, seed=4)
        return TFRecordIterDataset(dataset.parse(SPEC)).batch(16)

    whole = np.concatenate([batch["n"] for batch in pipeline()]).tolist()
    assert sorted(whole) == list(range(TOTAL)) and whole != list(range(TOTAL))

    first = iter(pipeline())
    taken = [next(first)["n"] for _ in range(5)]
    state = json.loads(json.dumps(first.get_state()))  # what a checkpoint keeps
    first.close()
    resumed = iter(pipeline())
    resumed.set_state(state)
    rest = [batch["n"] for batch in resumed]
    assert np.concatenate(taken + rest).tolist() == whole


def test_iter_dataset_of_raw_records(indexed: str) -> None:
    payloads = list(TFRecordIterDataset(streamrec.open_dataset(indexed)))
    assert [int(decode(p)["n"][0]) for p in payloads] == list(range(TOTAL))


def test_iterators_keep_their_own_positions(indexed: str) -> None:
    stream = TFRecordIterDataset(streamrec.open_dataset(indexed))
    first, second = iter(stream), iter(stream)
    taken = [next(first) for _ in range(10)]
    assert [int(decode(next(second))["n"][0]) for _ in range(3)] == [0, 1, 2]
    state = first.get_state()
    resumed = iter(stream)
    resumed.set_state(state)
    assert int(decode(next(resumed))["n"][0]) == 10 and len(taken) == 10
    assert len(list(stream)) == TOTAL and len(list(stream)) == TOTAL  # every pass is whole


def test_mp_prefetch_workers_read_their_own_shares(indexed: str) -> None:
    stream = TFRecordIterDataset(streamrec.open_dataset(indexed).parse(SPEC)).batch(20)
    workers = stream.mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
    got = sorted(int(n) for batch in workers for n in batch["n"])
    assert got == list(range(TOTAL))
