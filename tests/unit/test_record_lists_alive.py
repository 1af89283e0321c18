"""A plain ``for`` over a Dataset holds two record lists at most (the README's memory bound):
``iterate_ahead`` does not pause on a piece left for a consumer that was waiting, so the
consumer must hold none by then: ``Dataset._record_lists`` settles its cursor (which keeps
the piece in hand for ``state_dict``) before it asks for the next (from the review of
c1d3b46, which held three)."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

import fsspec
import pytest

import streamrec
import streamrec.pipeline.dataset as dataset_module
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
    assert max(peaks) <= 2, peaks  # c1d3b46 (no settle): [3, 3, 3]
