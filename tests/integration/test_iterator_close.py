"""Nothing outlives an iteration: after break, an exception in the loop body, garbage
collection of an abandoned iterator or KeyboardInterrupt, no thread (plain ``for``) and no
asyncio task (``async for``) started by the iteration is left, for raw, parsed and batched
datasets, read sequentially and with first-ready interleaving (which runs tasks per shard)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streamrec
from streamrec.example import FixedLenFeature, VarLenFeature, encode
from streamrec.pipeline.options import ReadOptions
from streamrec.pipeline.transforms.chainable import BatchedDataset, ParsedDataset

SPEC = {"idx": FixedLenFeature(np.int64), "pad": VarLenFeature(bytes)}
KINDS = ["raw", "parsed", "batched", "raw-batched"]
READS = {"sequential": {}, "first-ready": {"cycle_length": 3, "deterministic": False}}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    directory = tmp_path_factory.mktemp("close")
    paths = []
    for shard in range(3):
        path = directory / f"shard-{shard}.tfrecord"
        with streamrec.sync.open_writer(str(path)) as w:
            w.write_many([encode({"idx": i, "pad": [b"p" * 40]}) for i in range(3000)])
        paths.append(str(path))
    return paths


def make(kind: str, files: list[str], read: str, cls: type[streamrec.Dataset] | None = None) -> Any:
    # small blocks: many chunks, several reads in flight when the consumer stops
    ds = (cls or streamrec.Dataset)(files, ReadOptions(block_bytes=16 << 10, **READS[read]))
    if kind == "raw":
        return ds
    if kind == "parsed":
        return ParsedDataset(ds, SPEC)
    if kind == "batched":
        return ParsedDataset(ds, SPEC).batch(16)
    return BatchedDataset(ds, 16)


# ------------------------------------------------------------------------ plain for


def new_threads(before: set[threading.Thread]) -> set[threading.Thread]:
    return set(threading.enumerate()) - before


def os_threads() -> set[str]:
    """The process's threads as the kernel sees them (Linux)."""
    return set(os.listdir("/proc/self/task"))


def consume_sync(source: Any, before: set[threading.Thread], stop: BaseException | None) -> None:
    """Take 5 items (checking that the iteration's thread runs), then break or raise."""
    for n, _ in enumerate(source, 1):
        assert new_threads(before), "the iteration should run a loop thread"
        if n == 5:
            if stop is not None:
                raise stop
            break


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["break", "exception", "keyboard-interrupt"])
def test_plain_for_leaves_no_thread(files: list[str], kind: str, read: str, how: str) -> None:
    source = make(kind, files, read)
    before = set(threading.enumerate())
    before_os = os_threads()
    if how == "break":
        consume_sync(source, before, None)
    elif how == "exception":
        with pytest.raises(LookupError):
            consume_sync(source, before, LookupError("consumer failed"))
    else:
        with pytest.raises(KeyboardInterrupt):
            consume_sync(source, before, KeyboardInterrupt())
    assert new_threads(before) == set()
    # gone for the kernel too (the loop and its executor's threads), not only for Python: a
    # fork in that window would inherit whatever locks their exit handlers hold
    left = os_threads() - before_os
    assert {t: Path(f"/proc/self/task/{t}/comm").read_text() for t in left} == {}
    assert list(source)  # and the dataset can be read again


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("kind", KINDS)
def test_abandoned_plain_iterator_is_closed_by_gc(files: list[str], kind: str, read: str) -> None:
    source = make(kind, files, read)
    before = set(threading.enumerate())
    iterator: Iterator[Any] | None = iter(source)
    assert iterator is not None
    next(iterator)
    assert new_threads(before)
    del iterator
    gc.collect()
    assert new_threads(before) == set()


def _blocked_in_wait(ident: int) -> bool:
    frame = sys._current_frames().get(ident)
    return frame is not None and (
        frame.f_code.co_name == "wait" and frame.f_code.co_filename.endswith("threading.py")
    )


def interrupt_main_once_blocked(timeout: float = 10.0) -> None:
    """SIGINT to the main thread once it sits blocked waiting (as Ctrl-C would arrive)."""
    main = threading.main_thread().ident
    assert main is not None
    deadline = time.monotonic() + timeout
    while not _blocked_in_wait(main):
        if time.monotonic() > deadline:
            raise AssertionError("the consumer never blocked waiting for records")
        os.sched_yield()
    blocked = sys._current_frames()[main]
    signal.pthread_kill(main, signal.SIGINT)
    # A signal that lands after the thread's last check for signals but before it sleeps in
    # the lock is handled only when something wakes it: the same race a real Ctrl-C has. If
    # the very same wait is still blocked a while later, that one was lost: press again.
    resend = time.monotonic() + 0.5
    while sys._current_frames().get(main) is blocked:
        if time.monotonic() > resend:
            signal.pthread_kill(main, signal.SIGINT)
            resend = time.monotonic() + 0.5
        if time.monotonic() > deadline:
            raise AssertionError("the consumer did not react to SIGINT")
        os.sched_yield()


class StallingDataset(streamrec.Dataset):
    """Hands out one chunk; asked for the next, interrupts the consumer and never answers."""

    async def record_chunks(self, **options: Any) -> AsyncGenerator[list[bytes], None]:
        async with aclosing(super().record_chunks(**options)) as chunks:
            yield await chunks.__anext__()
            interrupt_main_once_blocked()
            await asyncio.Event().wait()  # until cancelled


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("kind", ["parsed", "batched", "raw-batched"])
def test_keyboard_interrupt_while_blocked_in_next_leaves_no_thread(
    files: list[str], kind: str, read: str
) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        source = make(kind, files, read, StallingDataset)
        before = set(threading.enumerate())
        with pytest.raises(KeyboardInterrupt):
            for _ in source:
                pass
        assert new_threads(before) == set()
    finally:
        signal.signal(signal.SIGINT, previous)


# ------------------------------------------------------------------------ async for


def other_tasks(before: set[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
    return asyncio.all_tasks() - before - {asyncio.current_task()}  # type: ignore[arg-type]


async def assert_no_task_left(before: set[asyncio.Task[Any]]) -> None:
    """The loop closes an abandoned async generator in a task of its own (the asyncgen
    finalizer); wait (bounded) for those closers only, then nothing else may be left."""
    await asyncio.sleep(0)  # one loop turn: the finalizer's call_soon creates the closer task
    closers = {
        t for t in other_tasks(before) if type(t.get_coro()).__name__ == "async_generator_athrow"
    }
    if closers:
        _, pending = await asyncio.wait(closers, timeout=10)
        assert not pending, "closing the abandoned iteration did not finish"
    assert other_tasks(before) == set()


async def consume_async(source: Any, before: set[asyncio.Task[Any]], read: str, stop: Any) -> None:
    n = 0
    async for _ in source:
        n += 1
        if read == "first-ready":
            assert other_tasks(before), "first-ready reading should run tasks"
        if n == 5:
            if stop is not None:
                raise stop
            break


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["break", "exception", "keyboard-interrupt"])
async def test_async_for_leaves_no_task(files: list[str], kind: str, read: str, how: str) -> None:
    source = make(kind, files, read)
    before = asyncio.all_tasks()
    if how == "break":
        await consume_async(source, before, read, None)
    elif how == "exception":
        with pytest.raises(LookupError):
            await consume_async(source, before, read, LookupError("consumer failed"))
    else:
        with pytest.raises(KeyboardInterrupt):
            await consume_async(source, before, read, KeyboardInterrupt())
    await assert_no_task_left(before)


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("kind", KINDS)
async def test_abandoned_async_iterator_is_closed(files: list[str], kind: str, read: str) -> None:
    source = make(kind, files, read)
    before = asyncio.all_tasks()
    iterator: Any = source.__aiter__()
    await iterator.__anext__()
    del iterator
    gc.collect()
    await assert_no_task_left(before)


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("kind", KINDS)
async def test_aclose_leaves_no_task_at_once(files: list[str], kind: str, read: str) -> None:
    source = make(kind, files, read)
    before = asyncio.all_tasks()
    async with aclosing(source.__aiter__()) as iterator:
        await iterator.__anext__()
        if read == "first-ready":
            assert other_tasks(before)
    assert other_tasks(before) == set()  # no waiting: closing is complete when aclose returns


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("kind", KINDS)
def test_breaking_out_of_a_dataloader_leaves_no_thread(
    files: list[str], kind: str, read: str
) -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    import streamrec.torch

    loader = torch_data.DataLoader(
        streamrec.torch.IterableDataset(make(kind, files, read)), batch_size=None
    )
    before = set(threading.enumerate())
    consume_sync(loader, before, None)
    assert new_threads(before) == set()
