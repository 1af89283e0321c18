"""``.map(fn)``: the user's function on each item, inline or on worker threads or processes, in
order.

Inline (``num_workers=0``), ``fn`` runs in the reading loop, a chunk at a time; an exception
comes after the items mapped before it. With workers, chunks of the source are cut into tasks
of at most ``task_items`` items; each task runs ``fn`` on its items in one worker call
(``list(map(fn, items))``: one pickling of the items and of the results per task for
processes, never per item). At most ``max_tasks`` tasks are in flight (submitted and not yet
handed on); results are handed on in submission order, so the order of the items is the
source's. The pool lives for one iteration: closing the iterator (or an error) cancels the
tasks not started and shuts the pool down, waiting for the tasks already running, so no thread
or process outlives the iteration.

An exception in ``fn`` is raised to the consumer as it was raised in the worker (a process
worker's traceback comes along as the ``__cause__``, a ``concurrent.futures.process.
_RemoteTraceback`` with the worker's formatted traceback); the items of its task before it
are not handed out (the state stays before them).
"""

from __future__ import annotations

import asyncio
import pickle
from collections import deque
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import aclosing
from typing import Any, Literal, TypeVar

from streamrec._portal import cancel_and_wait, owned_generator
from streamrec.pipeline.transforms.ledger import ItemPiece
from streamrec.pipeline.transforms.stage import Chunks, Stage, non_negative_int

__all__ = ["MapStage", "WorkerType", "apply_all", "check_picklable", "map_in_workers", "map_pieces"]

T = TypeVar("T")
WorkerType = Literal["thread", "process"]


class MapStage(Stage[T]):
    """``fn`` on each item, inline or on worker threads or processes, in order."""

    def __init__(
        self,
        source: Any,
        fn: Callable[[Any], T],
        num_workers: int = 0,
        worker_type: WorkerType = "thread",
        mp_context: str | None = None,
        task_items: int = 256,
    ) -> None:
        super().__init__(source)
        if not callable(fn):
            raise TypeError(f"map needs a callable, not {type(fn).__name__}")
        if worker_type not in ("thread", "process"):
            raise ValueError(f"worker_type must be 'thread' or 'process', not {worker_type!r}")
        if non_negative_int(num_workers, "num_workers") and worker_type == "process":
            check_picklable(fn)
        if non_negative_int(task_items, "task_items") < 1:
            raise ValueError("task_items must be at least 1")
        self.fn = fn
        self.num_workers = num_workers
        self.worker_type: WorkerType = worker_type
        self.mp_context = mp_context
        self.task_items = task_items

    def _pieces(self, chunks: Chunks) -> AsyncGenerator[ItemPiece, None]:
        if not self.num_workers:
            return map_pieces(chunks, self.fn)
        return map_in_workers(
            chunks,
            self.fn,
            self.num_workers,
            self.worker_type,
            mp_context=self.mp_context,
            task_items=self.task_items,
        )


@owned_generator
async def map_pieces(chunks: Chunks, fn: Callable[[Any], Any]) -> AsyncGenerator[ItemPiece, None]:
    """``fn`` on every item, inline; an exception comes after the items mapped before it."""
    async with aclosing(chunks) as source:
        async for chunk in source:
            out: list[Any] = []
            try:
                out.extend(map(fn, chunk))  # (keeps what was mapped before an exception)
            except BaseException:
                if out:
                    yield out, None, 0
                raise
            yield out, None, 0


def apply_all(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """One task: ``fn`` on each item (runs in the worker)."""
    return list(map(fn, items))


def check_picklable(fn: Callable[[Any], Any]) -> None:
    """Process workers receive ``fn`` pickled: refuse one that cannot be, now, clearly."""
    try:
        pickle.dumps(fn)
    except Exception as error:
        raise TypeError(
            f"map(..., worker_type='process') sends fn to worker processes, but {fn!r} "
            f"cannot be pickled ({error}): lambdas and functions defined inside other "
            "functions cannot; use a module-level function (or functools.partial of one, "
            "or an instance of a module-level class), or worker_type='thread'"
        ) from error


def _make_pool(num_workers: int, worker_type: WorkerType, mp_context: str | None) -> Executor:
    if worker_type == "thread":
        return ThreadPoolExecutor(num_workers, thread_name_prefix="streamrec-map")
    # (imported here: multiprocessing is not loaded with `import streamrec`)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if multiprocessing.current_process().daemon:
        raise RuntimeError(
            "map(..., worker_type='process') cannot start worker processes inside a daemonic "
            "process (a DataLoader worker is one): use worker_type='thread' there, or map in "
            "the DataLoader's workers themselves (num_workers=0 for the map)"
        )
    return ProcessPoolExecutor(num_workers, mp_context=multiprocessing.get_context(mp_context))


@owned_generator
async def map_in_workers(
    chunks: AsyncGenerator[list[Any], None],
    fn: Callable[[Any], Any],
    num_workers: int,
    worker_type: WorkerType,
    *,
    mp_context: str | None = None,
    task_items: int = 256,
    max_tasks: int | None = None,
) -> AsyncGenerator[ItemPiece, None]:
    """The mapped items of ``chunks``, one piece per task, in order (see the module doc)."""
    limit = max_tasks or 2 * num_workers
    async with aclosing(chunks) as source:
        pool = _make_pool(num_workers, worker_type, mp_context)
        loop = asyncio.get_running_loop()
        pending: deque[asyncio.Future[list[Any]]] = deque()
        try:
            async for chunk in source:
                for start in range(0, len(chunk), task_items):
                    part = chunk[start : start + task_items]
                    pending.append(loop.run_in_executor(pool, apply_all, fn, part))
                    while len(pending) >= limit or (pending and pending[0].done()):
                        yield await pending.popleft(), None, 0
            while pending:
                yield await pending.popleft(), None, 0
        finally:
            await cancel_and_wait(pending)
            pool.shutdown(wait=True, cancel_futures=True)
