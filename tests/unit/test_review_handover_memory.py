"""Review of c1d3b46 (iterate_ahead: an item left for a waiting consumer does not pause the
pump). The change assumes a waiting consumer "holds none"; a plain ``for`` keeps its last
item in its loop variable while it asks for the next, and ``Dataset._record_lists`` keeps
the last piece in its cursor (for ``state_dict``) until the next is taken. So the piece
handed over, the one made meanwhile and the consumer's last are alive together."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

import fsspec
import pytest

import streamrec
import streamrec.pipeline.dataset as dataset_module
from streamrec import _portal
from streamrec.format.shard import ShardEncoder

MIB = 1 << 20


class _Counted(list):  # type: ignore[type-arg]
    """A record list that counts how many of its kind are alive."""

    lock: ClassVar[threading.Lock] = threading.Lock()
    live: ClassVar[list[int]] = [0, 0]  # now, peak

    def __init__(self, records: Any) -> None:
        super().__init__(records)
        with self.lock:
            self.live[0] += 1
            self.live[1] = max(self.live)

    def __del__(self) -> None:
        with self.lock:
            self.live[0] -= 1


@pytest.fixture(scope="module")
def shards() -> Iterator[str]:
    root = f"/streamrec-review-handover/{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    payloads = [os.urandom(100 << 10) for _ in range(8)]
    for i in range(2):
        fs.pipe(f"{root}/s{i}.tfrecord", ShardEncoder(None).encode(payloads * 10))
    yield f"memory:/{root}/*.tfrecord"
    fs.rm(root, recursive=True)


def test_a_plain_for_over_a_dataset_holds_two_record_lists_at_most(
    shards: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # README: "two record lists: the one in the consumer's hand and the next"
    real = dataset_module.iterate_ahead

    def counting(make_items: Any, on_wait: Any = None, max_waiting: int = 1) -> Any:
        async def pieces() -> AsyncIterator[Any]:
            async for records, events in make_items():
                yield _Counted(records), events  # (the pump's own list is dropped here)

        return real(pieces, on_wait, max_waiting)

    monkeypatch.setattr(dataset_module, "iterate_ahead", counting)
    peaks = []
    for _ in range(3):
        _Counted.live[1] = _Counted.live[0]
        ds = streamrec.open_dataset(shards, prefetch_bytes=4 * MIB, block_bytes=MIB)
        assert sum(1 for _ in ds) == 2 * 80
        peaks.append(_Counted.live[1])
    assert max(peaks) <= 2, peaks  # c1d3b46: [3, 3, 3]; c1d3b46^: [2, 2, 2]


def test_a_plain_for_holds_max_waiting_plus_one_items_at_most() -> None:
    # iterate_ahead's docstring: "at most max_waiting + 1 are alive" (max_waiting=1). c1d3b46
    # fails this every run; its parent only intermittently (a GIL race), this change makes
    # the window the normal case: the waiting consumer still holds its last item
    lock = threading.Lock()
    made = [0, 0]  # items handed to the pump and alive: now, peak
    asking = threading.Event()

    class Item:
        def __init__(self, i: int) -> None:
            self.i = i
            with lock:
                made[0] += 1
                made[1] = max(made)

        def __del__(self) -> None:
            with lock:
                made[0] -= 1

    async def items() -> AsyncIterator[Item]:
        yield Item(0)
        while not asking.is_set():
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)  # the consumer (holding item 0) now waits in take()
        yield Item(1)  # left for a waiting consumer: the pump goes on at once
        yield Item(2)
        yield Item(3)

    got = []
    for item in _portal.iterate_ahead(items, max_waiting=1):
        got.append(item.i)
        if item.i == 0:
            asking.set()
        time.sleep(0.01)
    assert got == [0, 1, 2, 3]
    assert made[1] <= 2  # c1d3b46: 3 (item 0 in the loop variable, 1 handed over, 2 made)
