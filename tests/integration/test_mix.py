"""streamrec.mix across processes and stores: resume in a fresh process, DataLoader workers
(every record of the epoch once), the DDP split, and sources on S3 and local disk together."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import streamrec
import streamrec.torch
from streamrec.format.framing import RecordEncoder
from support.mixing import mixed
from support.servers import MotoS3Server

SIZES = (40, 23, 9)  # per source, in shards of SHARD records
SHARD = 5


def records(src: int) -> list[bytes]:
    return [f"{src}:{i}".encode() for i in range(SIZES[src])]


def write(root: Path, src: int) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    mine = records(src)
    for shard, first in enumerate(range(0, len(mine), SHARD)):
        path = root / f"s{src}-{shard:02d}.tfrecord"
        path.write_bytes(RecordEncoder().encode_many(mine[first : first + SHARD]))
        paths.append(str(path))
    return paths


@pytest.fixture
def files(tmp_path: Path) -> list[list[str]]:
    return [write(tmp_path / "data", src) for src in range(len(SIZES))]


EVERYTHING = Counter(r for src in range(len(SIZES)) for r in records(src))

SCRIPT = """
import json, sys
from itertools import islice
sys.path.insert(0, {tests!r})
from support.mixing import mixed
files, stop, cut, out = json.loads(sys.argv[1])
ds = mixed(files, stop)
if cut is None:  # the second process: resume, read the rest
    ds.load_state_dict(json.load(open(out))["state"])
    json.dump({{"rest": [r.decode() for r in islice(ds, 400)]}}, open(out, "w"))
else:
    it = iter(ds)
    head = [r.decode() for r in islice(it, cut)]
    json.dump({{"head": head, "state": ds.state_dict()}}, open(out, "w"))
    it.close()
"""


def run(args: list[Any]) -> None:
    tests = str(Path(__file__).resolve().parents[1])
    root = str(Path(streamrec.__file__).resolve().parents[1])  # this tree's streamrec
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tests=tests), json.dumps(args)],
        check=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize(("stop", "cut"), [("all", 31), ("never", 150)])
def test_resume_in_a_fresh_process(
    files: list[list[str]], tmp_path: Path, stop: str, cut: int
) -> None:
    out = str(tmp_path / "state.json")
    run([files, stop, cut, out])
    head = json.loads(Path(out).read_text())["head"]
    run([files, stop, None, out])
    rest = json.loads(Path(out).read_text())["rest"]
    expected = [r.decode() for r in islice(mixed(files, stop), cut + 400)]
    assert head + rest == expected
    assert len(head) == cut


def read_with_workers(source: Any, context: str = "fork") -> list[bytes]:
    loader = DataLoader(
        streamrec.torch.IterableDataset(source),
        batch_size=None,
        num_workers=2,
        multiprocessing_context=context,
    )
    return [bytes(r) for r in loader]


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_two_workers_read_every_record_once_with_stop_all(
    files: list[list[str]], context: str
) -> None:
    source = mixed(files, "all")
    list(source)  # the parent has iterated the mix before the workers start
    got = read_with_workers(source, context)
    assert Counter(got) == EVERYTHING


def test_two_workers_each_mix_their_shares_with_stop_first(files: list[list[str]]) -> None:
    # a worker reads its share of every source (as a host of two would) and mixes them itself
    expected: Counter[bytes] = Counter()
    for worker in range(2):
        expected.update(mixed(files, "first", num_hosts=2, host_index=worker))
    got = read_with_workers(mixed(files, "first"))
    assert Counter(got) == expected
    assert max(Counter(got).values()) == 1


def test_ddp_rank_splits_every_source(
    files: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    class FakeDistributed:
        def is_available(self) -> bool:
            return True

        def is_initialized(self) -> bool:
            return True

        def get_world_size(self) -> int:
            return 2

        def get_rank(self) -> int:
            return 1

    monkeypatch.setattr(torch, "distributed", FakeDistributed())
    mix = mixed(files, "all")
    wrapped = streamrec.torch.IterableDataset(mix.batch(4))
    assert wrapped.dataset is mix
    assert [(ds.num_hosts, ds.host_index) for ds in mix.datasets] == [(2, 1)] * 3
    assert (mix.num_hosts, mix.host_index) == (2, 1)
    ranks = [mixed(files, "all", num_hosts=2, host_index=h) for h in range(2)]
    assert sum((Counter(r) for r in ranks), Counter()) == EVERYTHING
    assert len(list(wrapped)) == -(-sum(1 for _ in ranks[1]) // 4)


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.11 on torch 2.13
def test_stateful_dataloader_resumes_each_workers_mix(files: list[list[str]]) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader() -> Any:
        return StatefulDataLoader(
            streamrec.torch.IterableDataset(mixed(files, "all")),
            batch_size=3,
            num_workers=2,
            collate_fn=list,
        )

    reference = [[bytes(r) for r in batch] for batch in loader()]
    first = loader()
    head = [[bytes(r) for r in batch] for batch in islice(first, 5)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    del first
    second = loader()
    second.load_state_dict(state)
    tail = [[bytes(r) for r in batch] for batch in second]
    assert head + tail == reference


def test_sources_on_s3_and_local_disk(
    files: list[list[str]], s3_server: MotoS3Server, s3_bucket: str
) -> None:
    for path in files[1]:
        s3_server.put(s3_bucket, f"b/{Path(path).name}", Path(path).read_bytes())
    options = s3_server.storage_options

    def make() -> streamrec.MixedDataset:
        local = streamrec.open_dataset(files[0], shuffle_buffer=8, prefetch_bytes=1 << 20)
        remote = streamrec.open_dataset(
            f"s3://{s3_bucket}/b/*.tfrecord", storage_options=options, block_bytes=64
        )
        return streamrec.mix([local, remote], [0.7, 0.3], seed=9, stop="all")

    everything = list(make())
    assert Counter(everything) == Counter(records(0) + records(1))
    source = make()
    it = iter(source)
    head = list(islice(it, 20))
    state = json.loads(json.dumps(source.state_dict()))
    it.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + list(resumed) == everything
    assert source.stats.bytes_read > 0 and source.stats.records == 20
