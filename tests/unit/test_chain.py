"""map / filter / take / skip / repeat / unbatch: each against a plain-Python model, alone and
chained, on both the async and the blocking path; exact resume at several cut points (the map
never re-run on items handed out, filtered-out records before the last item not re-read as
deliverable); len(); thread workers; errors. Process workers, fresh-process resume and the
PyTorch adapter: integration/test_chain_processes.py."""

from __future__ import annotations

import asyncio
import json
import pickle
import threading
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.errors import StateError
from streamrec.pipeline.transforms.chain import Source
from streamrec.pipeline.transforms.ledger import Ledger
from support.chains import CHAINS, keep, key, make_dataset, model, shards, stop_and_save, tag

MODES: dict[str, dict[str, Any]] = {
    "plain": {},
    "shuffled": {"shuffle_shards": True, "shuffle_buffer": 9, "cycle_length": 2, "seed": 5},
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return shards(tmp_path_factory.mktemp("chain"))


def collect(pipe: Any, mode: str) -> list[Any]:
    if mode == "sync":
        return [key(x) for x in pipe]

    async def run() -> list[Any]:
        return [key(x) async for x in pipe]

    return asyncio.run(run())


@pytest.mark.parametrize("name", list(CHAINS))
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_chain_yields_its_model(files: list[str], name: str, mode: str) -> None:
    for options in MODES.values():
        pipe = CHAINS[name][0](make_dataset(files, **options))
        assert isinstance(pipe, Source)
        assert collect(pipe, mode) == model(name, files, **options)


def cuts_for(total: int) -> list[int]:
    return sorted({0, 1, 2, 7, total // 3, total // 2 + 1, total - 1, total})


@pytest.mark.parametrize("name", list(CHAINS))
@pytest.mark.parametrize("options", list(MODES))
def test_resume_at_cut_points_gives_exactly_the_rest(
    files: list[str], name: str, options: str
) -> None:
    build = CHAINS[name][0]
    full = model(name, files, **MODES[options])
    for k in cuts_for(len(full)):
        head, state = stop_and_save(build(make_dataset(files, **MODES[options])), k)
        assert head == full[:k]
        resumed = build(make_dataset(files, **MODES[options]))
        resumed.load_state_dict(state)
        assert head + collect(resumed, "sync") == full, f"cut after {k}"


def test_resume_through_async_iteration_and_a_second_cut(files: list[str]) -> None:
    build = CHAINS["repeat.batch.unbatch.skip"][0]
    full = model("repeat.batch.unbatch.skip", files)
    got: list[Any] = []
    state: dict[str, Any] | None = None
    for stop in (40, 75, None):  # async, then a second interruption, then the rest
        pipe = build(make_dataset(files))
        if state is not None:
            pipe.load_state_dict(state)

        async def run(pipe: Any = pipe, stop: int | None = stop) -> None:
            n = 0
            async with aclosing(pipe.__aiter__()) as items:  # closed at the break, not later
                async for item in items:
                    got.append(key(item))
                    n += 1
                    if n == stop:
                        break

        asyncio.run(run())
        state = json.loads(json.dumps(pipe.state_dict()))
    assert got == full


class Recorder:
    """A map function / predicate that records what it was called on (thread-safe)."""

    def __init__(self, fn: Callable[[bytes], Any]) -> None:
        self.fn = fn
        self.seen: list[bytes] = []
        self.lock = threading.Lock()

    def __call__(self, record: bytes) -> Any:
        with self.lock:
            self.seen.append(record)
        return self.fn(record)


@pytest.mark.parametrize("workers", [0, 2])
def test_resumed_map_never_runs_on_items_already_handed_out(files: list[str], workers: int) -> None:
    # whole shards per chunk (14, 9, ... records), mapped a chunk at a time: stopping inside
    # the second shard leaves mapped items not handed out
    first = Recorder(tag)
    pipe = make_dataset(files, block_bytes=1 << 20).map(first, num_workers=workers)
    head, state = stop_and_save(pipe, 20)
    assert len(set(first.seen)) >= 23
    again = Recorder(tag)
    resumed = make_dataset(files, block_bytes=1 << 20).map(again, num_workers=workers)
    resumed.load_state_dict(state)
    rest = collect(resumed, "sync")
    assert head + rest == model("map", files)
    assert not {r.decode() for r in again.seen} & set(head)


def test_resumed_filter_does_not_read_dropped_records_before_the_last_item_again(
    files: list[str],
) -> None:
    records = list(make_dataset(files))
    kept = [r for r in records if keep(r)]
    pipe = make_dataset(files).filter(keep)
    head, state = stop_and_save(pipe, 5)
    last = records.index(kept[4])
    again = Recorder(keep)
    resumed = make_dataset(files).filter(again)
    resumed.load_state_dict(state)
    assert head + collect(resumed, "sync") == [r.decode() for r in kept]
    assert again.seen == records[last + 1 :]  # everything after the last item, once


def test_states_carry_their_own_counters(files: list[str]) -> None:
    _, state = stop_and_save(make_dataset(files).take(30), 12)
    assert state["take"] == {"taken": 12}
    _, state = stop_and_save(make_dataset(files).skip(12), 3)
    assert state["skip"] == {"skipped": 12}
    _, state = stop_and_save(make_dataset(files).repeat(3), 70)
    assert state["repeat"] == {"pass": 1, "skip": 0} and state["source"]["epoch"] == 1
    _, state = stop_and_save(make_dataset(files).batch(5).unbatch(), 13)
    assert state["unbatch"] == {"in_batch": 3}
    # stateless transforms keep the dataset's state as it is
    ds = make_dataset(files)
    _, state = stop_and_save(ds.map(tag).filter(bool), 9)
    assert state == json.loads(json.dumps(ds.state_dict()))


def test_a_batch_spanning_two_passes_resumes_exactly(files: list[str]) -> None:
    # 67 records per pass, batches of 8: batch 9 holds the last 3 of pass 0, 5 of pass 1
    pipe = make_dataset(files).repeat(2).batch(8)
    it = iter(pipe)
    head = [key(next(it)) for _ in range(9)]
    it.close()
    state = pipe.state_dict()
    assert state["repeat"] == {"pass": 1, "skip": 0}
    resumed = make_dataset(files).repeat(2).batch(8)
    resumed.load_state_dict(state)
    assert head + collect(resumed, "sync") == model("repeat.batch", files)
    # mid-window: the map above has read into pass 1, the consumer is still in pass 0
    pipe2 = make_dataset(files).repeat(2).map(tag, num_workers=2, task_items=16)
    head2, state2 = stop_and_save(pipe2, 60)
    assert state2["repeat"]["pass"] == 0
    resumed2 = make_dataset(files).repeat(2).map(tag, num_workers=2, task_items=16)
    resumed2.load_state_dict(state2)
    assert head2 + collect(resumed2, "sync") == [key(tag(r)) for r in model_records(files, 2)]


def model_records(files: list[str], epochs: int) -> list[bytes]:
    out: list[bytes] = []
    for e in range(epochs):
        ds = make_dataset(files)
        ds.set_epoch(e)
        out += list(ds)
    return out


def test_repeat_advances_the_epoch_and_endless_repeat_keeps_going(files: list[str]) -> None:
    options = MODES["shuffled"]
    ds = make_dataset(files, **options)
    ds.set_epoch(4)
    got = [r for _, r in zip(range(67 * 3 + 5), ds.repeat(), strict=False)]
    epochs = []
    for e in (4, 5, 6, 7):
        d = make_dataset(files, **options)
        d.set_epoch(e)
        epochs += list(d)
    assert got == epochs[: 67 * 3 + 5]
    assert list(make_dataset(files).take(0).repeat()) == []  # an empty epoch ends it


def test_pickled_mid_iteration_continues_after_the_last_item(files: list[str]) -> None:
    for name in ("take", "skip", "unbatch", "repeat.batch", "filter.map.batch"):
        pipe = CHAINS[name][0](make_dataset(files))
        it = iter(pipe)
        head = [key(next(it)) for _ in range(5)]
        clone = pickle.loads(pickle.dumps(pipe))
        it.close()
        assert head + collect(clone, "sync") == model(name, files), name


def test_set_epoch_restarts_own_counters(files: list[str]) -> None:
    pipe = make_dataset(files).take(10)
    assert len(collect(pipe, "sync")) == 10
    assert pipe.state_dict()["take"] == {"taken": 10}
    pipe.set_epoch(1)
    assert pipe.state_dict()["take"] == {"taken": 0}
    assert len(collect(pipe, "sync")) == 10


def test_lengths(tmp_path: Path) -> None:
    files = shards(tmp_path)
    from streamrec.cli import main as streamrec_command

    assert streamrec_command(["index", *files]) == 0  # record counts from index sidecars
    ds = make_dataset(files)
    assert len(ds) == 67
    assert len(ds.map(tag)) == 67
    assert len(ds.take(10)) == 10 and len(ds.take(100)) == 67
    assert len(ds.skip(10)) == 57 and len(ds.skip(100)) == 0
    assert len(ds.repeat(3)) == 201
    assert len(ds.batch(5)) == 14 and len(ds.batch(5).unbatch()) == 67
    assert len(ds.batch(5, drop_remainder=True).unbatch()) == 65
    assert len(ds.skip(7).batch(6).map(len)) == 10
    for unknown in (ds.filter(keep), ds.repeat(), ds.map(tag).batch(2).map(len).unbatch()):
        with pytest.raises(TypeError):
            len(unknown)


def fail_on_3_11(record: bytes) -> str:
    if record.startswith(b"3:") and record[2:].startswith(b"11:"):
        raise KeyError("record 3:11")
    return tag(record)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_exception_in_fn_reaches_the_consumer(files: list[str], workers: int, mode: str) -> None:
    got: list[Any] = []
    pipe = make_dataset(files).map(fail_on_3_11, num_workers=workers, task_items=4)

    async def consume() -> None:
        async for item in pipe:
            got.append(item)

    before = threading.active_count()
    with pytest.raises(KeyError, match="record 3:11") as raised:
        if mode == "sync":
            for item in pipe:
                got.append(item)
        else:
            asyncio.run(consume())
    assert any(f.name == "fail_on_3_11" for f in _frames(raised.value))
    expected = [tag(r) for r in list(make_dataset(files))]
    cut = expected.index("3:11:" + "x" * ((3 * 7 + 11 * 13) % 40))
    if workers == 0:
        assert got == expected[:cut]  # everything before it first
    else:
        assert got == expected[: len(got)] and cut - 4 < len(got) <= cut  # not its task's
    assert threading.active_count() == before  # the workers are gone


def _frames(error: BaseException) -> list[Any]:
    import traceback

    return list(traceback.extract_tb(error.__traceback__))


def test_bad_arguments_fail_at_once(files: list[str]) -> None:
    ds = make_dataset(files)
    with pytest.raises(TypeError, match="lambdas"):
        ds.map(lambda r: r, num_workers=2, worker_type="process")
    with pytest.raises(ValueError, match="worker_type"):
        ds.map(tag, worker_type="fiber")  # type: ignore[arg-type]
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            ds.take(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            ds.skip(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            ds.map(tag, num_workers=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ds.repeat(-1)
    with pytest.raises(TypeError, match="callable"):
        ds.filter(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot batch"):
        ds.batch(2).batch(2)
    with pytest.raises(TypeError, match="cannot unbatch"):
        list(ds.map(len).unbatch())


def test_states_of_another_chain_are_refused(files: list[str]) -> None:
    _, take_state = stop_and_save(make_dataset(files).take(30), 3)
    with pytest.raises(StateError, match="skip"):
        make_dataset(files).skip(3).load_state_dict(take_state)
    with pytest.raises(StateError, match=r"take\.taken"):
        make_dataset(files).take(2).load_state_dict(take_state)  # 3 > n
    bad = {"take": {"taken": "3"}, "source": take_state["source"]}
    with pytest.raises(StateError, match=r"take\.taken"):
        make_dataset(files).take(30).load_state_dict(bad)
    with pytest.raises(StateError):
        make_dataset(files).map(tag).load_state_dict(take_state)  # the dataset checks it


def test_stats_count_the_records_handed_out(files: list[str]) -> None:
    ds = make_dataset(files)
    for n, _ in enumerate(ds.filter(keep), 1):
        if n == 5:
            break
    records = list(make_dataset(files))
    assert ds.stats.records == records.index([r for r in records if keep(r)][4]) + 1


def test_ledger_turns_items_into_source_records() -> None:
    ledger = Ledger()
    assert ledger.add(3, [2, 0, 1], 1) == 1  # one skipped record, counted at once
    assert ledger.peek(2) == 2 and ledger.upstream == 1
    assert ledger.consume(2) == 2 and ledger.tail == 1
    assert ledger.add(0, None, 4) == 0  # after the item still held
    assert ledger.consume(1) == 1 + 4 and ledger.tail == 0
    assert ledger.upstream == 8 and ledger.pending() == 0
    with pytest.raises(ValueError):
        ledger.consume(1)


def test_take_stops_reading_once_it_has_its_items(files: list[str]) -> None:
    ds = make_dataset(files)
    assert len(list(ds.take(3))) == 3
    assert ds.stats.records == 3 and ds.stats.records_read < 67  # the rest was never read


def test_a_mix_chains_like_a_dataset(files: list[str]) -> None:
    def make() -> Any:
        sources = [make_dataset(files[:3]), make_dataset(files[3:])]
        return streamrec.mix(sources, seed=1, stop="all").map(tag).filter(bool).take(40)

    full = collect(make(), "sync")
    assert len(full) == 40
    assert sorted(full) != full  # really drawn from both
    for k in (1, 17, 39):
        head, state = stop_and_save(make(), k)
        resumed = make()
        resumed.load_state_dict(state)
        assert head + collect(resumed, "sync") == full
