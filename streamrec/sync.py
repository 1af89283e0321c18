"""The one blocking facade: an event loop in a background thread, driven from plain code.

Everything in streamrec is async underneath. Plain ``for`` loops and ``with`` blocks reach it
through :class:`EventLoopThread`: one loop in one daemon thread per dataset or writer, started
on first use and joined on close, so nothing (threads, tasks, open files) outlives its owner.
Records cross the thread boundary in chunks, so the hand-over costs nothing per record.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

__all__ = ["EventLoopThread", "iterate_blocking", "iterate_chunks", "open_writer"]

T = TypeVar("T")


class EventLoopThread:
    """An asyncio event loop running in its own thread, with a blocking ``call()`` into it."""

    def __init__(self, name: str = "streamrec-loop") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self._thread.start()

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
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()

    def call(self, awaitable: Awaitable[T]) -> T:
        """Run ``awaitable`` in the loop and wait for it.

        If the waiting thread is interrupted (KeyboardInterrupt), the work is cancelled and
        waited for before the interrupt propagates: nothing keeps running behind the caller.
        """
        if self._closed:
            raise RuntimeError("the event loop thread is closed")
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
            done.wait()
        except BaseException:
            future.cancel()
            done.wait()
            raise
        if "error" in outcome:
            error = outcome.pop("error")
            raise error
        return outcome["value"]  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the loop (cancelling what still runs in it) and join the thread."""
        if self._closed:
            return
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    def __enter__(self) -> EventLoopThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def iterate_chunks(
    make_chunks: Callable[[], AsyncIterator[list[T]]],
    on_wait: Callable[[float], None] | None = None,
) -> Iterator[T]:
    """Iterate, blocking, over the items of the chunks an async generator yields.

    The generator runs in its own background loop; closing this iterator (break, exception,
    garbage collection, KeyboardInterrupt) closes the generator and joins the thread.
    ``on_wait`` is as for :func:`iterate_blocking`.
    """
    for chunk in iterate_blocking(make_chunks, on_wait):
        yield from chunk
        del chunk  # hold one chunk at a time, not two, while the next is fetched


def iterate_blocking(
    make_items: Callable[[], AsyncIterator[T]],
    on_wait: Callable[[float], None] | None = None,
) -> Iterator[T]:
    """Iterate, blocking, over what an async generator yields (one item per hand-over).

    The generator runs in its own background loop; closing this iterator (break, exception,
    garbage collection, KeyboardInterrupt) closes the generator and joins the thread.

    ``on_wait(seconds)`` is called, in the consuming thread, with the time it spent blocked
    waiting for each item (and for the end): the consumer's whole wait, hand-over between the
    threads included, which the generator cannot see from inside the loop.
    """
    portal = EventLoopThread()
    try:
        items = portal.call(_make(make_items))
        try:
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
            portal.call(_aclose(items))
    finally:
        portal.close()


async def _make(make_items: Callable[[], AsyncIterator[T]]) -> AsyncIterator[T]:
    return make_items()


async def _next_item(items: AsyncIterator[T]) -> T:
    return await items.__anext__()


async def _aclose(items: AsyncIterator[T]) -> None:
    aclose = getattr(items, "aclose", None)
    if aclose is not None:
        await aclose()


def open_writer(url: str, **options: Any) -> Any:
    """Blocking twin of :func:`streamrec.open_writer`.

    ``with streamrec.sync.open_writer(path) as w: w.write(payload)``
    """
    from streamrec.writer import BlockingShardWriter

    return BlockingShardWriter(url, **options)
