"""``_portal.iterate_ahead``: a plain ``for`` over an async generator that runs ahead of the
consumer in a background loop, by at most ``max_waiting`` items, and leaves nothing behind
however the consumer stops (end, error, break, KeyboardInterrupt while blocked)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from streamrec._portal import EventLoopThread, _Handover, iterate_ahead, iterate_blocking

REPO = Path(__file__).resolve().parents[2]


def new_threads(before: set[threading.Thread]) -> set[threading.Thread]:
    return set(threading.enumerate()) - before


@pytest.mark.parametrize("max_waiting", [1, 3])
def test_the_generator_runs_ahead_by_at_most_max_waiting_items(max_waiting: int) -> None:
    consumed = [0]
    outstanding: list[int] = []  # when item i is made: items made before it and not consumed
    alive = [0, 0]  # items alive now, most ever

    class Item:
        def __init__(self, i: int) -> None:
            self.i = i
            alive[0] += 1
            alive[1] = max(alive)

        def __del__(self) -> None:
            alive[0] -= 1

    async def items() -> AsyncIterator[Item]:
        for i in range(200):
            outstanding.append(i - consumed[0])
            yield Item(i)

    got = []
    for item in iterate_ahead(items, max_waiting=max_waiting):
        got.append(item.i)
        time.sleep(0.0005)  # the consumer's work: the generator is free to run ahead
        consumed[0] += 1
        del item
    assert got == list(range(200))
    # max_waiting waiting besides the one in the consumer's hand (the next being made)
    assert max(outstanding) == max_waiting  # it does run ahead, as far as allowed
    assert alive[1] <= max_waiting + 1  # (the item in hand dropped before the next asked)


def test_an_item_left_for_a_waiting_consumer_does_not_pause_the_generator() -> None:
    portal = EventLoopThread()
    handover: _Handover[int] = _Handover(portal, 1)
    left: list[int] = []  # when item i is made: the items left, not yet taken

    async def items() -> AsyncIterator[int]:
        while not handover._consumer_waiting:  # the consumer waits (holding no item)
            await asyncio.sleep(0)
        for i in range(3):
            left.append(len(handover._items))
            yield i

    try:
        portal.call(handover.start(items))
        got = [handover.take(), handover.take(), handover.take()]
        portal.call(handover.stop())
    finally:
        portal.close()
    assert got == [[0], [1], [2]]
    # item 1 was made while item 0 waited for its consumer to wake up (a pump that paused on
    # every item handed over would have waited until item 0 was taken: left [0, 0, ...])
    assert left[:2] == [0, 1]


def test_items_before_an_error_arrive_then_the_error() -> None:
    async def items() -> AsyncIterator[int]:
        for i in range(3):
            yield i
        raise ValueError("broken at 3")

    got = []
    with pytest.raises(ValueError, match="broken at 3"):
        for item in iterate_ahead(items, max_waiting=4):
            got.append(item)
    assert got == [0, 1, 2]


def test_an_empty_generator_ends_the_loop() -> None:
    async def items() -> AsyncIterator[int]:
        return
        yield  # an async generator

    before = set(threading.enumerate())
    assert list(iterate_ahead(items)) == []
    assert new_threads(before) == set()


def test_break_closes_the_generator_and_its_thread() -> None:
    closed = threading.Event()

    async def items() -> AsyncIterator[int]:
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    before = set(threading.enumerate())
    iterator = iterate_ahead(items, max_waiting=2)
    for item in iterator:
        if item == 5:
            break
    iterator.close()
    assert closed.is_set()
    assert new_threads(before) == set()


def test_the_consumers_wait_is_reported() -> None:
    async def slow() -> AsyncIterator[int]:
        for i in range(4):
            await asyncio.sleep(0.1)
            yield i

    waits: list[float] = []
    assert list(iterate_ahead(slow, waits.append)) == [0, 1, 2, 3]
    assert len(waits) == 5  # four hand-overs and the end
    assert 0.38 <= sum(waits) < 2


def _blocked_in_take(ident: int) -> bool:
    frame = sys._current_frames().get(ident)
    return frame is not None and frame.f_code.co_name == "take"


def interrupt_once_blocked(main: int, timeout_s: float = 10.0) -> None:
    """SIGINT to the main thread once it sits blocked in the hand-over (as Ctrl-C would)."""
    deadline = time.monotonic() + timeout_s
    while not _blocked_in_take(main):
        assert time.monotonic() < deadline, "the consumer never blocked"
        time.sleep(0.001)
    # a signal that lands before the thread sleeps in the lock is handled only when it is
    # woken: press again while the very same wait is still blocked
    while _blocked_in_take(main):
        signal.pthread_kill(main, signal.SIGINT)
        assert time.monotonic() < deadline, "the consumer did not react to SIGINT"
        time.sleep(0.05)


def test_keyboard_interrupt_while_blocked_cancels_the_generator() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    cancelled = threading.Event()
    main = threading.main_thread().ident
    assert main is not None

    async def stalls() -> AsyncIterator[int]:
        yield 0
        try:
            await asyncio.Event().wait()  # never set: only a cancel ends this
        except asyncio.CancelledError:
            cancelled.set()
            raise

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    before = set(threading.enumerate())
    presser = threading.Thread(target=interrupt_once_blocked, args=(main,))
    try:
        got = []
        with pytest.raises(KeyboardInterrupt):
            for item in iterate_ahead(stalls):
                got.append(item)
                if item == 0:
                    presser.start()
    finally:
        presser.join()
        signal.signal(signal.SIGINT, previous)
    assert got == [0]
    assert cancelled.is_set()
    assert new_threads(before) == set()


def run_with_deadline(body: Callable[[], None], deadline_s: float = 10.0) -> dict[str, Any]:
    """``body()`` in a helper thread, joined within ``deadline_s`` (a hang fails the test
    instead of stalling the run): what it raised, and whether it hung."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            body()
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(deadline_s)
    outcome["hung"] = thread.is_alive()
    return outcome


@pytest.mark.parametrize("error", [SystemExit, KeyboardInterrupt])
def test_an_interrupt_raised_by_the_generator_reaches_the_consumer(
    error: type[BaseException],
) -> None:
    # (out of the pump's task they would stop the loop itself: the consumer's close then
    # met a closed loop or hung; repeated, as it depended on the loop thread's timing)
    async def items() -> AsyncIterator[int]:
        yield 1
        await asyncio.sleep(0)
        raise error("from the generator")

    before = set(threading.enumerate())
    for _ in range(20):
        got: list[int] = []
        outcome = run_with_deadline(lambda: got.extend(iterate_ahead(items)))  # noqa: B023
        assert not outcome["hung"]
        assert type(outcome.get("error")) is error
        assert got == [1]
    assert {t for t in new_threads(before) if t.name.startswith("streamrec")} == set()


def test_a_generator_that_loses_its_cancellation_does_not_hang_the_close() -> None:
    # (3.10/3.11's wait_for can lose a cancel: see storage/retry.py)
    parked = threading.Event()
    made: list[int] = []

    async def items() -> AsyncIterator[int]:
        yield 0
        parked.set()  # the consumer's close reaches the loop once this awaits
        with contextlib.suppress(asyncio.CancelledError):  # lost
            await asyncio.Event().wait()
        for i in range(1, 100):
            made.append(i)
            yield i

    def consume() -> None:
        for _ in iterate_ahead(items):
            parked.wait()
            break

    outcome = run_with_deadline(consume)
    assert not outcome["hung"]
    assert "error" not in outcome
    assert made == [1]  # it ended at its next item


def test_a_call_from_the_loops_own_thread_raises_instead_of_waiting_for_itself() -> None:
    portal = EventLoopThread()

    async def calls_back() -> None:
        portal.call(asyncio.sleep(0))  # the loop would wait for itself: forever

    outcome = run_with_deadline(lambda: portal.call(calls_back()))
    assert not outcome["hung"]  # (a hung loop is left behind: closing it would hang too)
    portal.close()
    assert type(outcome.get("error")) is RuntimeError


class Holder:
    """What keeps an iterator in a reference cycle (only the cycle collector frees it)."""

    it: Any
    me: Holder


@pytest.mark.parametrize("iterate", [iterate_ahead, iterate_blocking])
def test_an_iterator_collected_in_its_own_loop_thread_is_closed(
    iterate: Callable[..., Any],
) -> None:
    # A garbage collection runs in whichever thread allocates: here the iterator's own loop
    # thread (a task still running there, as a pipeline's read-ahead does), which finalises
    # the iterator a consumer left in a cycle. Closing it waited for that very loop.
    dropped, closed = threading.Event(), threading.Event()
    background: list[asyncio.Task[None]] = []

    async def collect_once_dropped() -> None:
        await asyncio.to_thread(dropped.wait)
        gc.collect()

    async def items() -> AsyncIterator[int]:
        background.append(asyncio.create_task(collect_once_dropped()))
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    before = set(threading.enumerate())
    gc.disable()  # only the loop thread's collection may find the cycle
    try:
        holder = Holder()
        holder.me, holder.it = holder, iterate(items)
        assert next(holder.it) == 0
        del holder
        dropped.set()
        assert closed.wait(30), "the iterator's close never ran"
        for thread in new_threads(before):
            thread.join(30)
    finally:
        gc.enable()
    assert new_threads(before) == set()


# A blocking iterator open at a fork: the child's copy is dropped (then collected) or left to
# the child's exit. Its generator is Owned (no loop hooks, as a pipeline's inner ones) and its
# close awaits, so finalising it outside its loop prints "async generator ignored
# GeneratorExit"; a pump waiting for room is a cycle with its task ("Task was destroyed but it
# is pending!"). ``parked`` is set by a callback the loop runs once the step that took item 1
# has ended: the pump waits for room (the consumer holds item 0 and has not asked again).
FORK_SCRIPT = r"""
import asyncio, gc, os, sys, threading
from streamrec._portal import iterate_ahead, iterate_blocking, owned_generator

iterate, child_drops = sys.argv[1], sys.argv[2] == "drop"
parked = threading.Event()

@owned_generator
async def numbers():
    try:
        for i in range(100):
            if i == 1:
                asyncio.get_running_loop().call_soon(parked.set)
            yield i
    finally:
        await asyncio.sleep(0)
        print("closed in", "child" if os.getpid() != parent else "parent", flush=True)

parent = os.getpid()
it = (iterate_ahead if iterate == "ahead" else iterate_blocking)(numbers)
assert next(it) == 0
if iterate == "ahead":
    assert parked.wait(30)
pid = os.fork()
if pid == 0:
    if child_drops:
        del it
        gc.collect()
    sys.exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
it.close()
"""


@pytest.mark.parametrize("child_drops", [True, False], ids=["dropped", "left-to-exit"])
@pytest.mark.parametrize("iterate", ["ahead", "blocking"])
def test_a_forked_childs_copy_of_an_open_iterator_is_never_finalised(
    iterate: str, child_drops: bool
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, iterate, "drop" if child_drops else "exit"],
        capture_output=True,
        text=True,
        timeout=60,  # far beyond its run: a hang, not a timing
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == "closed in parent\n"  # by the parent alone, once
