"""Transforms across processes: ``map`` on worker processes (order, resume, early close, an
exception in ``fn``), resume of every kind of chain in a fresh process, and chains in PyTorch
DataLoader workers."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import pickle
import subprocess
import sys
from collections import Counter
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import streamrec.torch
from support.chains import CHAINS, heavy, keep, key, make_dataset, model, shards, stop_and_save, tag

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return shards(tmp_path_factory.mktemp("chain-procs"))


def in_processes(files: list[str], **options: Any) -> Any:
    return make_dataset(files).map(heavy, 2, worker_type="process", task_items=5, **options)


def expected_heavy(files: list[str]) -> list[Any]:
    return [key(heavy(r)) for r in make_dataset(files)]


def test_process_workers_keep_the_order_and_resume_exactly(files: list[str]) -> None:
    full = expected_heavy(files)
    assert [key(x) for x in in_processes(files)] == full
    for k in (1, 31):
        head, state = stop_and_save(in_processes(files), k)
        resumed = in_processes(files)
        resumed.load_state_dict(state)
        assert head + [key(x) for x in resumed] == full
    assert multiprocessing.active_children() == []


def test_early_close_leaves_no_worker_process_and_no_task(files: list[str]) -> None:
    it = iter(in_processes(files))
    next(it)
    assert multiprocessing.active_children()  # the workers run
    it.close()
    assert multiprocessing.active_children() == []

    async def run() -> set[asyncio.Task[Any]]:
        async with aclosing(in_processes(files).__aiter__()) as items:
            async for _ in items:
                break
        return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]

    assert asyncio.run(run()) == set()
    assert multiprocessing.active_children() == []


def fail_on_4_2(record: bytes) -> Any:
    if record.startswith(b"4:2:"):
        raise ArithmeticError("bad record 4:2")
    return heavy(record)


def test_an_exception_in_a_worker_process_reaches_the_consumer(files: list[str]) -> None:
    got = []
    pipe = make_dataset(files).map(fail_on_4_2, 2, worker_type="process", task_items=5)
    with pytest.raises(ArithmeticError, match="bad record 4:2") as raised:
        for item in pipe:
            got.append(key(item))
    assert "fail_on_4_2" in str(raised.value.__cause__)  # the worker's traceback
    full = expected_heavy(files)
    cut = next(i for i, (name, _) in enumerate(full) if name.startswith("4:2:"))
    assert got == full[: len(got)] and cut - 5 < len(got) <= cut
    assert multiprocessing.active_children() == []


_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from support.chains import CHAINS, make_dataset, stop_and_save
files, cuts = json.loads(sys.argv[2]), json.loads(sys.argv[3])
out = {}
for name, k in cuts.items():
    out[name] = stop_and_save(CHAINS[name][0](make_dataset(files, shuffle_buffer=7)), k)
print(json.dumps(out))
"""


def test_every_chain_resumes_in_a_fresh_process(files: list[str]) -> None:
    cuts = {name: 3 + 5 * i for i, name in enumerate(CHAINS)}
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(TESTS), json.dumps(files), json.dumps(cuts)],
        check=True,
        capture_output=True,
        text=True,
    )
    saved = json.loads(child.stdout)
    for name, (head, state) in saved.items():
        full = model(name, files, shuffle_buffer=7)
        assert head == full[: cuts[name]], name
        resumed = CHAINS[name][0](make_dataset(files, shuffle_buffer=7))
        resumed.load_state_dict(state)
        assert head + [key(x) for x in resumed] == full, name


def test_chains_in_dataloader_workers_read_every_record_once(files: list[str]) -> None:
    chain = make_dataset(files).filter(keep).map(tag).batch(3)
    loader = DataLoader(streamrec.torch.IterableDataset(chain), batch_size=None, num_workers=2)
    got = Counter(x for batch in loader for x in batch)
    assert got == Counter(tag(r) for r in make_dataset(files) if keep(r))
    unbatched = streamrec.torch.IterableDataset(make_dataset(files).batch(4).unbatch())
    loader = DataLoader(unbatched, batch_size=None, num_workers=2)
    assert Counter(bytes(r) for r in loader) == Counter(make_dataset(files))
    # spawned workers get the chain pickled (module-level functions): as test_torch's spawn
    # test does for a dataset, without paying for two more interpreters here
    copy = pickle.loads(pickle.dumps(streamrec.torch.IterableDataset(chain)))
    assert [x for batch in copy for x in batch] == [tag(r) for r in make_dataset(files) if keep(r)]
