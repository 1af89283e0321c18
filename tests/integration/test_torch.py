"""streamrec.torch.IterableDataset in DataLoader: every record exactly once across workers
(fork and spawn) and across DDP ranks; items as the wrapped dataset yields them."""

from __future__ import annotations

import multiprocessing
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import streamrec
import streamrec.torch
from streamrec.example import FixedLenFeature, VarLenFeature, decode, encode
from streamrec.format.framing import RecordEncoder
from streamrec.pipeline.transforms.chainable import ParsedDataset
from support.servers import MotoS3Server

SPEC = {"idx": FixedLenFeature(np.int64), "ids": VarLenFeature(np.int64)}


def payload(i: int) -> bytes:
    return encode({"idx": i, "ids": np.arange(i % 3, dtype=np.int64)})


def shard_bytes(first: int, count: int) -> bytes:
    return RecordEncoder().encode_many([payload(first + i) for i in range(count)])


SIZES = [30, 11, 0, 25, 17]  # uneven, one empty: 83 records


def write_local(directory: Path) -> list[str]:
    paths, first = [], 0
    for shard, size in enumerate(SIZES):
        path = directory / f"part-{shard}.tfrecord"
        path.write_bytes(shard_bytes(first, size))
        paths.append(str(path))
        first += size
    return paths


def put_s3(server: MotoS3Server, bucket: str) -> str:
    first = 0
    for shard, size in enumerate(SIZES):
        server.put(bucket, f"data/part-{shard}.tfrecord", shard_bytes(first, size))
        first += size
    return f"s3://{bucket}/data/part-*.tfrecord"


def idx(record: bytes) -> int:
    return int(decode(record)["idx"][0])


ALL = Counter(range(sum(SIZES)))


def test_num_workers_0_yields_the_dataset_in_order(tmp_path: Path) -> None:
    files = write_local(tmp_path)
    ds = streamrec.open_dataset(files)
    loader = DataLoader(streamrec.torch.IterableDataset(ds), batch_size=None)
    assert [idx(bytes(r)) for r in loader] == list(range(83))
    assert ds.stats.records == 83


def test_parsed_records_are_collated_into_tensors(tmp_path: Path) -> None:
    files = write_local(tmp_path)
    parsed = ParsedDataset(streamrec.open_dataset(files), {"idx": SPEC["idx"]})
    batches = list(DataLoader(streamrec.torch.IterableDataset(parsed), batch_size=10))
    assert all(isinstance(b["idx"], torch.Tensor) for b in batches)
    assert torch.cat([b["idx"] for b in batches]).tolist() == list(range(83))


def test_batches_pass_through_with_batch_size_none(tmp_path: Path) -> None:
    files = write_local(tmp_path)
    batched = ParsedDataset(streamrec.open_dataset(files), SPEC).batch(8)
    got = list(DataLoader(streamrec.torch.IterableDataset(batched), batch_size=None))
    assert [b["idx"].shape[0] for b in got] == [8] * 10 + [3]
    assert isinstance(got[0]["idx"], torch.Tensor) and got[0]["idx"].dtype == torch.int64
    assert isinstance(got[0]["ids"], list) and len(got[0]["ids"]) == 8  # VarLen stays a list
    assert [len(v) for v in got[1]["ids"]] == [(8 + j) % 3 for j in range(8)]


def read_with_workers(source: Any, context: str) -> list[Any]:
    loader = DataLoader(
        streamrec.torch.IterableDataset(source),
        batch_size=None,
        num_workers=2,
        multiprocessing_context=context,
    )
    return list(loader)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_two_workers_read_every_s3_record_exactly_once(
    s3_server: MotoS3Server, s3_bucket: str, context: str
) -> None:
    url = put_s3(s3_server, s3_bucket)
    ds = streamrec.open_dataset(url, storage_options=s3_server.storage_options)
    list(ds)  # the parent has used the dataset (a loop, sessions) before the workers start
    got = read_with_workers(ds, context)
    assert Counter(idx(bytes(r)) for r in got) == ALL


def test_two_workers_batch_their_own_shares(s3_server: MotoS3Server, s3_bucket: str) -> None:
    url = put_s3(s3_server, s3_bucket)
    ds = streamrec.open_dataset(url, storage_options=s3_server.storage_options)
    batches = read_with_workers(ParsedDataset(ds, SPEC).batch(4), "fork")
    assert Counter(i for b in batches for i in b["idx"].tolist()) == ALL
    assert all(b["idx"].shape[0] <= 4 for b in batches)


@pytest.mark.parametrize("hosts", [2, 3])
def test_hosts_times_workers_read_every_record_once(tmp_path: Path, hosts: int) -> None:
    files = write_local(tmp_path)
    got: Counter[int] = Counter()
    for host in range(hosts):
        ds = streamrec.open_dataset(files, num_hosts=hosts, host_index=host)
        got.update(idx(bytes(r)) for r in read_with_workers(ds, "fork"))
    assert got == ALL


class FakeDistributed:
    """What IterableDataset asks of torch.distributed, for one rank of a world."""

    def __init__(self, world: int, rank: int, initialized: bool = True) -> None:
        self.world, self.rank, self.initialized = world, rank, initialized

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def get_world_size(self) -> int:
        return self.world

    def get_rank(self) -> int:
        return self.rank


def test_rank_split_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = write_local(tmp_path)
    fake = FakeDistributed(4, 3, initialized=False)
    monkeypatch.setattr(torch, "distributed", fake)

    # not initialised when built: looked up again when pickled (spawn) or iterated
    wrapped = streamrec.torch.IterableDataset(streamrec.open_dataset(files))
    assert (wrapped.dataset.num_hosts, wrapped.dataset.host_index) == (1, 0)
    fake.initialized = True
    clone = pickle.loads(pickle.dumps(wrapped))
    assert (clone.dataset.num_hosts, clone.dataset.host_index) == (4, 3)

    fake.initialized = False
    late = streamrec.torch.IterableDataset(ParsedDataset(streamrec.open_dataset(files), SPEC))
    fake.initialized = True
    iter(late).close()
    assert (late.dataset.num_hosts, late.dataset.host_index) == (4, 3)

    explicit = streamrec.open_dataset(files, num_hosts=2, host_index=1)
    streamrec.torch.IterableDataset(explicit)
    assert (explicit.num_hosts, explicit.host_index) == (2, 1)  # the user's split stands
    forced = streamrec.open_dataset(files, num_hosts=2, host_index=1)
    streamrec.torch.IterableDataset(forced, split_by_rank=True)
    assert (forced.num_hosts, forced.host_index) == (4, 3)
    off = streamrec.open_dataset(files)
    streamrec.torch.IterableDataset(off, split_by_rank=False)
    assert (off.num_hosts, off.host_index) == (1, 0)

    fake.initialized = False
    required = streamrec.torch.IterableDataset(streamrec.open_dataset(files), split_by_rank=True)
    with pytest.raises(RuntimeError, match="not initialised"):
        iter(required)


def _ddp_rank(rank: int, init_file: str, files: list[str], results: Any) -> None:
    import torch.distributed as dist

    # built before the process group exists: the rank is found when the loader pickles it
    wrapped = streamrec.torch.IterableDataset(streamrec.open_dataset(files))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", world_size=2, rank=rank)
    try:
        loader = DataLoader(
            wrapped, batch_size=None, num_workers=2, multiprocessing_context="spawn"
        )
        mine = [idx(bytes(r)) for r in loader]
        unsplit = streamrec.torch.IterableDataset(
            streamrec.open_dataset(files), split_by_rank=False
        )
        everything = [idx(r) for r in unsplit]
        results.put((rank, mine, everything, wrapped.dataset.num_hosts))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two DDP processes
def test_ddp_ranks_split_the_records(tmp_path: Path) -> None:
    files = write_local(tmp_path)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    init_file = str(tmp_path / "ddp-init")
    ranks = [
        context.Process(target=_ddp_rank, args=(rank, init_file, files, results))
        for rank in range(2)
    ]
    for process in ranks:
        process.start()
    try:
        got = dict((r[0], r[1:]) for r in (results.get(timeout=120) for _ in ranks))
    finally:
        for process in ranks:
            process.join(timeout=60)
            if process.is_alive():  # pragma: no cover - only when the test fails
                process.kill()
    assert [process.exitcode for process in ranks] == [0, 0]
    mine0, everything0, hosts0 = got[0]
    mine1, everything1, hosts1 = got[1]
    assert hosts0 == hosts1 == 2
    assert Counter(mine0) + Counter(mine1) == ALL
    assert mine0 and mine1
    assert sorted(everything0) == sorted(everything1) == list(range(83))


def test_forwarding_and_pickling(tmp_path: Path) -> None:
    files = write_local(tmp_path)
    ds = streamrec.open_dataset(files)
    wrapped = streamrec.torch.IterableDataset(ParsedDataset(ds, SPEC).batch(5))
    wrapped.set_epoch(7)
    assert ds.epoch == 7
    assert wrapped.stats is ds.stats and wrapped.dataset is ds
    clone = pickle.loads(pickle.dumps(wrapped))
    assert clone.dataset.epoch == 7 and clone.dataset.urls == ds.urls
    with pytest.raises(TypeError, match="wraps a streamrec"):
        streamrec.torch.IterableDataset([1, 2, 3])  # type: ignore[arg-type]


def test_exact_resume_with_num_workers_0(tmp_path: Path) -> None:
    files = write_local(tmp_path)
    ds = streamrec.open_dataset(files)
    wrapped = streamrec.torch.IterableDataset(ds)
    head = []
    for batch in DataLoader(wrapped, batch_size=4, collate_fn=list):
        head += [idx(r) for r in batch]
        if len(head) == 20:
            break
    state = wrapped.state_dict()
    resumed = streamrec.torch.IterableDataset(streamrec.open_dataset(files))
    resumed.load_state_dict(state)
    tail = [idx(r) for b in DataLoader(resumed, batch_size=4, collate_fn=list) for r in b]
    assert head + tail == list(range(83))


def test_exact_resume_of_batches_with_num_workers_0(tmp_path: Path) -> None:
    files = write_local(tmp_path)

    def wrapped() -> Any:
        batched = ParsedDataset(streamrec.open_dataset(files, block_bytes=300), SPEC).batch(6)
        return streamrec.torch.IterableDataset(batched)

    first = wrapped()
    head = []
    for batch in DataLoader(first, batch_size=None):
        head += batch["idx"].tolist()
        if len(head) == 30:
            break
    second = wrapped()
    second.load_state_dict(first.state_dict())
    tail = [i for b in DataLoader(second, batch_size=None) for i in b["idx"].tolist()]
    assert head + tail == list(range(83))


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.11 on torch 2.13
@pytest.mark.parametrize("stop_after", [1, 4, 9])
def test_stateful_dataloader_resumes_each_worker_exactly(tmp_path: Path, stop_after: int) -> None:
    # torchdata's StatefulDataLoader saves every worker's own dataset state (state_dict() in
    # the worker, after each batch it hands out) and loads it into that worker on resume.
    from torchdata.stateful_dataloader import StatefulDataLoader

    files = write_local(tmp_path)

    def loader() -> Any:
        ds = streamrec.open_dataset(files, shuffle_buffer=5, seed=7)
        return StatefulDataLoader(
            streamrec.torch.IterableDataset(ds), batch_size=3, num_workers=2, collate_fn=list
        )

    reference = [[idx(r) for r in batch] for batch in loader()]
    assert Counter(i for batch in reference for i in batch) == ALL
    first = loader()
    head = []
    for batch in first:
        head.append([idx(r) for r in batch])
        if len(head) == stop_after:
            break
    state = pickle.loads(pickle.dumps(first.state_dict()))
    del first
    second = loader()
    second.load_state_dict(state)
    tail = [[idx(r) for r in batch] for batch in second]
    assert head + tail == reference
