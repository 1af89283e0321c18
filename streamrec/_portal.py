"""Concurrency in one place: the blocking portal (an event loop in a background thread,
driven from plain code) and the helpers that keep tasks structured inside a loop.

Everything in streamrec is async underneath. Plain ``for`` loops and ``with`` blocks reach it
through :class:`EventLoopThread`: one loop in one daemon thread per dataset or writer, started
on first use and joined on close, so nothing (threads, tasks, open files) outlives its owner.
Records cross the thread boundary in chunks, so the hand-over costs nothing per record.

An iterator left open is closed at exit, while its loop's thread still runs; a loop that
cannot run any more (the interpreter finalising, a forked child) is never waited for.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import sys
import threading
import time
import weakref
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Iterable,
)
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, ParamSpec, TypeVar, cast, overload

__all__ = ["EventLoopThread", "Owned", "cancel_and_wait", "iterate_ahead", "iterate_blocking"]
__all__ += ["owned", "owned_generator", "owning", "run_all", "settle_all"]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


class EventLoopThread:
    """An asyncio event loop running in its own thread, with a blocking ``call()`` into it."""

    def __init__(self, name: str = "streamrec-loop") -> None:
        self._loop = asyncio.new_event_loop()
        # the loop's executor (local file reads, TLS set-up) is ours, so that close() can
        # wait for its threads to be really gone (see _wait_until_gone)
        self._worker_ids: list[int] = []
        self._executor = ThreadPoolExecutor(
            thread_name_prefix=f"{name}-worker",
            initializer=_record_native_id,
            initargs=(self._worker_ids,),
        )
        self._loop.set_default_executor(self._executor)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self._held: list[object] = []  # see hold()
        self._thread.start()
        _LIVE_LOOPS.add(self)

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(settle_all(pending))
                loop.run_until_complete(loop.shutdown_asyncgens())
                # not loop.shutdown_default_executor(): it starts one more thread to wait in
                self._executor.shutdown(wait=True)
            finally:
                loop.close()

    def call(self, awaitable: Awaitable[T]) -> T:
        """Run ``awaitable`` in the loop and wait for it.
        If the waiting thread is interrupted (KeyboardInterrupt), the work is cancelled and
        waited for before the interrupt propagates: nothing keeps running behind the caller.
        RuntimeError if the loop cannot run it (closed, its thread gone, the interpreter
        shutting down, or called from the loop's own thread): never a wait that cannot end."""
        if not self.running or self.is_current():
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # never to run: no "was never awaited" warning
            raise RuntimeError("the event loop thread is closed (or stopped, or the caller)")
        done = threading.Event()
        outcome: dict[str, Any] = {}

        async def runner() -> None:
            try:
                outcome["value"] = await awaitable
            except BaseException as exc:  # handed to the calling thread below
                outcome["error"] = exc
            finally:
                done.set()

        future = asyncio.run_coroutine_threadsafe(runner(), self._loop)
        try:
            self._wait(done)
        except BaseException:
            future.cancel()
            self._wait(done)
            raise
        if "error" in outcome:
            error = outcome.pop("error")
            raise error
        return outcome["value"]  # type: ignore[no-any-return]

    def _wait(self, done: threading.Event) -> None:
        # for as long as the loop's thread can still set it: checked in slices, not against
        # a deadline (a call may rightly take long; a thread that stopped never sets it)
        while not done.wait(0.25):
            if not self._can_run():
                raise RuntimeError("the event loop thread stopped before the call ended")

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await ``coroutine`` run in this loop, from another event loop: the caller's loop
        is not blocked, and cancelling the caller cancels the work in this loop."""
        if self._closed:
            coroutine.close()
            raise RuntimeError("the event loop thread is closed")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return await asyncio.wrap_future(future)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop (for ``call_soon_threadsafe`` from other threads)."""
        return self._loop

    def is_current(self) -> bool:
        """True when called from this loop's own thread (where ``call`` would deadlock)."""
        return threading.current_thread() is self._thread

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def running(self) -> bool:
        """Whether :meth:`call` can work: not closed, the thread alive, the interpreter on."""
        return not self._closed and self._can_run()

    def hold(self, held: T) -> T:
        """``held`` (a generator, a task or its owner), kept alive until :meth:`close` joins the
        thread, whose frames hold this object and are collector roots even where it cannot run
        (at exit; in a forked child, which never clears them): what the loop runs is never
        finalised half-way with its owner. A forked child holds the tasks of the parent's loops
        too (one waiting on a future only its owner reaches goes with it): the parent's to close."""
        self._held.append(held)
        return held

    def _can_run(self) -> bool:
        # Once the interpreter finalises, a daemon thread never runs Python code again (and
        # still counts as alive); a forked child has the thread object but not the thread.
        return self._thread.is_alive() and not sys.is_finalizing()

    def close(self) -> None:
        """Stop the loop (cancelling what still runs in it) and join the thread; if the
        thread can no longer run (see :attr:`running`), only mark this closed."""
        if self._closed:
            return
        self._closed = True
        if not self._can_run() or self.is_current():
            return  # nothing to join: it would never end (or is this very thread)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._held.clear()  # joined: nothing of it runs again
        if self._thread.native_id is not None:
            _wait_until_gone([*self._worker_ids, self._thread.native_id])

    def __enter__(self) -> EventLoopThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_LIVE_LOOPS: weakref.WeakSet[EventLoopThread] = weakref.WeakSet()  # not yet collected
os.register_at_fork(  # (see EventLoopThread.hold)
    after_in_child=lambda: [p.hold(asyncio.all_tasks(p.loop)) for p in list(_LIVE_LOOPS)]
)


def _record_native_id(ids: list[int]) -> None:
    ids.append(threading.get_native_id())


def _wait_until_gone(thread_ids: list[int], timeout_s: float = 1.0) -> None:
    """Wait (Linux; at most ``timeout_s``) until these OS threads have really exited.
    ``Thread.join()`` returns when the thread's Python code is done, before the C library
    has run its thread-exit handlers (OpenSSL's among them, which take a process-wide lock).
    A process forked in that window - a DataLoader starting its workers right after a first
    epoch - inherits the lock held and hangs in its first TLS handshake."""
    deadline = time.monotonic() + timeout_s
    for tid in thread_ids:
        path = f"/proc/self/task/{tid}"
        while os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.0005)


def _closed_at_exit(
    make: Callable[P, Generator[T, None, None]],
) -> Callable[P, Generator[T, None, None]]:
    """Decorates a blocking iterator's generator function: its generators still open at
    interpreter exit are closed then (``weakref.finalize``: at ``atexit``, loops running).
    Left to the interpreter's shutdown (``next(iter(ds))`` at a script's top level), one is
    finalised only once daemon threads, its loop's among them, have stopped for good."""

    @functools.wraps(make)
    def made(*args: P.args, **kwargs: P.kwargs) -> Generator[T, None, None]:
        iterator = make(*args, **kwargs)
        weakref.finalize(iterator, _close_left_open, weakref.ref(iterator), os.getpid())
        return iterator

    return made


def _close_left_open(ref: weakref.ref[Generator[Any, None, None]], pid: int) -> None:
    iterator = ref()
    # a forked child's copy belongs to its parent's thread; one running in another thread
    # (a daemon thread blocked in it) cannot be closed from here, and ends with its thread
    if iterator is None or pid != os.getpid():
        return
    if inspect.getgeneratorstate(iterator) != inspect.GEN_RUNNING:
        iterator.close()


@_closed_at_exit
def iterate_blocking(
    make_items: Callable[[], AsyncIterator[T]],
    on_wait: Callable[[float], None] | None = None,
) -> Generator[T, None, None]:
    """Iterate, blocking, over what an async generator yields (one item per hand-over).
    The generator runs in its own background loop; closing this iterator (break, exception,
    garbage collection, KeyboardInterrupt, exit) closes the generator and joins the thread.
    ``on_wait(seconds)`` is called, in the consuming thread, with the time it spent blocked
    waiting for each item (and for the end): the consumer's whole wait, hand-over between the
    threads included, which the generator cannot see from inside the loop."""
    portal = EventLoopThread()
    items: AsyncIterator[T] | None = None
    try:
        items = portal.hold(portal.call(_make(make_items)))  # (see hold)
        while True:
            started = time.perf_counter()
            try:
                item = portal.call(_next_item(items))
            except StopAsyncIteration:
                return
            finally:
                if on_wait is not None:
                    on_wait(time.perf_counter() - started)
            yield item
            del item
    finally:
        _shut_down(portal, None if items is None else functools.partial(_aclose, items))


@_closed_at_exit
def iterate_ahead(
    make_items: Callable[[], AsyncIterator[T]],
    on_wait: Callable[[float], None] | None = None,
    max_waiting: int = 1,
) -> Generator[T, None, None]:
    """:func:`iterate_blocking` with the generator running ahead of the consumer.
    A task in the background loop pulls items and leaves them for the consumer's thread,
    pausing while ``max_waiting`` items wait besides the one in the consumer's hand; the
    consumer takes them one at a time. An item left for a consumer that was waiting is in
    its hand (the pump goes on): a consumer must drop its last item before it asks for the
    next (``Dataset`` settles its cursor), else one more is alive than ``max_waiting + 1``.
    A hand-over is then a lock and a list, not a coroutine sent into the loop and an event
    waited for: two threads that each wake the other for every item spend more on the
    switches than on the item (a quarter of the CPU of a plain ``for`` over 1 MiB pieces).
    Only for generators that share no state with what the consumer does between items:
    they now run while it does. Closing is as for :func:`iterate_blocking`."""
    portal = EventLoopThread()
    handover: _Handover[T] = portal.hold(_Handover(portal, max_waiting))  # (see hold)
    try:
        portal.call(handover.start(make_items))
        while True:
            started = time.perf_counter()
            try:
                batch = handover.take()
            finally:
                if on_wait is not None:
                    on_wait(time.perf_counter() - started)
            if batch is None:
                return
            yield from batch
            del batch
    finally:
        _shut_down(portal, handover.stop)  # (nothing to stop if start failed: harmless)


def _shut_down(portal: EventLoopThread, last: Callable[[], Awaitable[None]] | None) -> None:
    """A blocking iterator's end: ``last()`` run in its loop, then the loop closed; by
    another thread if called from the loop's own (a garbage collection ran there). A loop
    that can no longer run (the interpreter finalising, a forked child) is not waited for."""
    if portal.is_current():
        threading.Thread(
            target=_shut_down, args=(portal, last), name="streamrec-close", daemon=True
        ).start()
        return
    try:
        if last is not None and portal.running:
            portal.call(last())
    finally:
        portal.close()


class _Handover(Generic[T]):
    """Items from a task in the loop's thread to one consumer thread (see :func:`iterate_ahead`)."""

    def __init__(self, portal: EventLoopThread, max_waiting: int) -> None:
        self._loop = portal.loop
        self._max_waiting = max(1, max_waiting)
        self._mutex = threading.Lock()  # guards the fields below, shared by the two threads
        self._wake = threading.Lock()  # released (once) to wake the consumer waiting on it
        self._wake.acquire()
        self._items: list[T] = []
        self._consumer_waiting = False
        self._space: asyncio.Future[None] | None = None
        self._ended = False
        self._closing = False  # stop() was called: the pump hands on nothing more
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._source: AsyncIterator[T] | None = None

    async def start(self, make_items: Callable[[], AsyncIterator[T]]) -> None:
        self._source = make_items()
        self._task = asyncio.get_running_loop().create_task(self._pump(self._source))

    async def stop(self) -> None:
        with self._mutex:  # a pump that outlives its cancel (one lost by the generator, as
            self._closing = True  # 3.10/3.11's wait_for can) stops at its next item and
            space, self._space = self._space, None  # never waits for room again
        if space is not None:
            _release(space)
        if self._task is not None:
            await cancel_and_wait([self._task])
        if self._source is not None:
            await _aclose(self._source)
        self._items = []

    async def _pump(self, source: AsyncIterator[T]) -> None:
        try:
            async for item in source:
                with self._mutex:
                    if self._closing:
                        break
                    self._items.append(item)
                    # an item handed to a waiting consumer (which holds none) is not one
                    # waiting: the next is made while the consumer wakes up (pausing at once
                    # stalled every hand-over on that wake-up)
                    handed = self._consumer_waiting
                    self._signal()
                    space = None
                    if len(self._items) - handed >= self._max_waiting:
                        space = self._space = self._loop.create_future()
                del item
                if space is not None:
                    await space
        except asyncio.CancelledError as exc:  # stop() was called, or something else did
            self._finish(exc)  # (a consumer still waiting must not wait forever)
            raise
        except BaseException as exc:  # raised in the consumer's thread, after the items before
            # (KeyboardInterrupt and SystemExit too: raised out of a task they would stop the
            # loop itself, and the consumer's stop() would find it closed, or never run)
            self._finish(exc)
        else:
            self._finish(None)

    def _finish(self, error: BaseException | None) -> None:
        with self._mutex:
            self._ended, self._error = True, error
            self._signal()

    def _signal(self) -> None:  # with the mutex held
        if self._consumer_waiting:
            self._consumer_waiting = False
            self._wake.release()

    def take(self) -> list[T] | None:
        """The first item waiting, as a list of one (blocking until there is one); None at
        the end. The pump goes on once fewer than ``max_waiting`` wait."""
        while True:
            with self._mutex:
                if self._items:
                    batch = [self._items.pop(0)]
                    space = None
                    if len(self._items) < self._max_waiting:
                        space, self._space = self._space, None
                    break
                if self._ended:
                    error, self._error = self._error, None
                    if error is not None:
                        raise error
                    return None
                self._consumer_waiting = True
            self._wake.acquire()
        if space is not None:
            self._loop.call_soon_threadsafe(_release, space)
        return batch


def _release(space: asyncio.Future[None]) -> None:
    if not space.done():
        space.set_result(None)


async def _make(make_items: Callable[[], AsyncIterator[T]]) -> AsyncIterator[T]:
    return make_items()


async def _next_item(items: AsyncIterator[T]) -> T:
    return await items.__anext__()


async def _aclose(items: AsyncIterator[T]) -> None:
    aclose = getattr(items, "aclose", None)
    if aclose is not None:
        await aclose()


# ---------------------------------------------------------------------------------------------
# structured concurrency inside the loop: every task started is awaited or cancelled


class Owned(AsyncGenerator[T, None]):
    """An async generator closed by the code that made it (``aclosing``), never by the loop.
    asyncio tracks every async generator a loop steps (``sys.set_asyncgen_hooks``) and, when
    ``asyncio.run`` ends, closes the ones still open all at once (``shutdown_asyncgens``). A
    pipeline's generators nest, each closing the one it reads in its ``finally``: a user who
    returns from inside ``async for`` left them all open, and the loop's close of an inner
    generator collided with its owner's ("aclose(): asynchronous generator is already
    running", "async generator ignored GeneratorExit", an aiohttp session never closed). So
    only the generator the user iterates is the loop's to close; the ones inside it are
    wrapped in ``Owned`` and closed by their owners, innermost last. A generator takes the
    thread's hooks on its first step (``asend``, ``athrow`` or ``aclose``), so that step is
    begun with none set: synchronously, nothing else runs on the thread meanwhile."""

    __slots__ = ("_agen", "_fresh")

    def __init__(self, agen: AsyncGenerator[T, None]) -> None:
        self._agen = agen
        self._fresh = True

    def __aiter__(self) -> Owned[T]:
        return self

    def __anext__(self) -> Coroutine[Any, Any, T]:
        if self._fresh:
            return self._unhooked(self._agen.__anext__)
        return self._agen.__anext__()

    def asend(self, value: None) -> Coroutine[Any, Any, T]:
        if self._fresh:
            return self._unhooked(functools.partial(self._agen.asend, value))
        return self._agen.asend(value)

    def athrow(self, *args: Any) -> Coroutine[Any, Any, T]:
        if self._fresh:
            return self._unhooked(functools.partial(self._agen.athrow, *args))
        return self._agen.athrow(*args)

    def aclose(self) -> Coroutine[Any, Any, None]:
        if self._fresh:
            return self._unhooked(self._agen.aclose)
        return self._agen.aclose()

    @property
    def ag_running(self) -> bool:
        """Whether the generator is running (stepped by someone, now)."""
        return bool(getattr(self._agen, "ag_running", False))

    def _unhooked(self, step: Callable[[], R]) -> R:
        self._fresh = False
        hooks = sys.get_asyncgen_hooks()
        sys.set_asyncgen_hooks(firstiter=None, finalizer=None)
        try:
            return step()
        finally:
            sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=hooks.finalizer)

    def __repr__(self) -> str:
        return f"Owned({self._agen!r})"


@overload
def owned(items: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]: ...
@overload
def owned(items: AsyncIterator[T]) -> AsyncIterator[T]: ...
def owned(items: AsyncIterator[T]) -> AsyncIterator[T]:
    """``items`` as :class:`Owned` if it is an async generator (else as it is): for a public
    generator (``record_chunks``) that streamrec itself reads and closes."""
    if inspect.isasyncgen(items):
        return Owned(cast(AsyncGenerator[T, None], items))
    return items


class owning(Generic[T]):
    """``async with owning(items) as it``: ``aclosing`` for the generator a public generator
    (one a user iterates: ``async for``, ``record_chunks``) reads.
    ``items`` becomes :class:`Owned`, and its close runs to the end in a task of its own,
    waited for through a cancellation or a ``GeneratorExit`` (raised once it is closed). A
    user who returns from inside ``async for`` under ``asyncio.run`` leaves the public
    generator to the loop: its close task is cancelled before it starts, and that first
    step throws ``CancelledError`` in, then ``GeneratorExit`` into whatever the close is
    awaiting; a close awaited in place would be torn apart half-way (every task, connection
    and byte reservation below it left open)."""

    __slots__ = ("_items",)

    def __init__(self, items: AsyncIterator[T]) -> None:
        self._items = owned(items)

    async def __aenter__(self) -> AsyncIterator[T]:
        return self._items

    async def __aexit__(self, *exc_info: object) -> None:
        aclose = getattr(self._items, "aclose", None)
        if aclose is None:
            return
        started = False

        async def close() -> None:
            nonlocal started
            started = True
            await aclose()

        interrupted: BaseException | None = None
        while True:
            # The close is begun inside the task, not handed to it as ``aclose()``: a task
            # cancelled before its first step (asyncio.run's shutdown cancels every task it
            # finds, this one too if it was made just before the loop stopped) would throw
            # CancelledError into an aclose() awaitable not started yet, which then throws
            # GeneratorExit into the close half-way on its next step (3.10-3.12). Cancelled
            # before it began, the close is begun again in a new task.
            closing: asyncio.Future[None] = asyncio.ensure_future(close())
            while not closing.done():
                try:
                    await asyncio.wait([closing])
                except (asyncio.CancelledError, GeneratorExit) as exc:
                    interrupted = exc
            if started or not closing.cancelled():
                break
        if interrupted is not None:
            if not closing.cancelled():
                closing.exception()  # retrieved: the interruption is what is raised
            raise interrupted
        closing.result()


def owned_generator(
    make: Callable[P, AsyncGenerator[T, None]],
) -> Callable[P, AsyncGenerator[T, None]]:
    """Decorates an async generator function whose generators only streamrec reads (and
    closes): each is made :class:`Owned`."""

    @functools.wraps(make)
    def owned_made(*args: P.args, **kwargs: P.kwargs) -> AsyncGenerator[T, None]:
        return Owned(make(*args, **kwargs))

    return owned_made


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until every one of them has ended.
    Their outcomes are dropped: the caller is closing or already failing, and a task that
    outlived its owner would hold connections, budget or memory."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    if pending:
        await settle_all(pending)


def settle_all(jobs: Iterable[Awaitable[T]]) -> asyncio.Future[list[T | BaseException]]:
    """Run ``jobs`` concurrently until every one has ended: each one's result or exception,
    in order. For cleanup (aborting every writer, waiting for every worker thread's call),
    where one failure must not stop the others; elsewhere :func:`run_all`. A future, not a
    task: a loop's shutdown, which cancels every task, does not end it before its jobs."""
    return asyncio.gather(*jobs, return_exceptions=True)


async def run_all(jobs: Iterable[Awaitable[T]]) -> list[T]:
    """Run ``jobs`` concurrently and return their results in order; the first error cancels
    the others (waiting for them to end) and is raised as it is. The one task group of
    streamrec (``asyncio.TaskGroup`` needs Python 3.11): nothing it starts outlives it."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        await cancel_and_wait(tasks)
        raise
