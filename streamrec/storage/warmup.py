"""Start-up work done ahead, in background threads: what a store's first client needs and a
process can compute once (botocore's parsed service model, the TLS context), started when a
dataset is opened so that the time the caller spends between ``open_dataset`` and the first
record (building a model, joining a process group) hides it.

The rules that keep it harmless:

* a job only fills process-wide caches that the normal path fills too, and is an
  optimisation only: its errors are dropped (logged at debug level) and the normal path, which
  redoes the work, raises them as it does without a warm-up;
* nothing is started on an event loop: a job is one plain thread (no loop, no task, no
  connection), which ends by itself within a few tens of milliseconds;
* whoever is about to do the same work waits for the jobs first instead of doing it twice
  (:func:`settled` from a loop, :func:`wait` from plain code): ``Dataset.close()`` waits, and
  so does every ``fork()`` (``os.register_at_fork``), so that no child inherits a lock a
  half-done job holds (a job is waited for from the moment it is listed; a child starts
  with none of its parent's listed).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout  # (builtin from 3.11)

__all__ = ["pending", "settled", "start", "wait"]

logger = logging.getLogger("streamrec")

_lock = threading.Lock()
_jobs: list[tuple[threading.Thread, Future[None], bool]] = []  # (thread, done, settles)

WAIT_S = 10.0
"""The longest :func:`wait` waits for a job (they take milliseconds; a bound, not a pace)."""


def start(name: str, job: Callable[[], None], *, settles: bool = True) -> None:
    """Run ``job`` in a new daemon thread ``streamrec-warmup-<name>``; ``settles=False``:
    :func:`settled` does not wait for it (its result has a way of its own to be awaited)."""
    done: Future[None] = Future()
    done.set_running_or_notify_cancel()  # never cancelled: a waiter's cancel is its own
    thread = threading.Thread(
        target=_run, args=(job, done), name=f"streamrec-warmup-{name}", daemon=True
    )
    entry = (thread, done, settles)
    with _lock:
        _jobs.append(entry)
    try:
        thread.start()
    except BaseException:  # (no thread): nothing to wait for
        with _lock:
            _jobs.remove(entry)
        raise


def _run(job: Callable[[], None], done: Future[None]) -> None:
    time.sleep(0)  # the GIL back to the thread that started this one first
    try:
        job()
    except Exception:  # an optimisation only: the normal path redoes it and says what fails
        logger.debug("streamrec: a start-up warm-up job failed", exc_info=True)
    finally:
        done.set_result(None)


def _unfinished() -> list[tuple[threading.Thread, Future[None], bool]]:
    with _lock:
        # a job whose thread is not alive may not have started yet (start() is between
        # listing it and starting its thread): it is finished once its work is done
        _jobs[:] = [job for job in _jobs if job[0].is_alive() or not job[1].done()]
        return list(_jobs)


def _after_fork_in_child() -> None:
    """The child has none of its parent's threads (and maybe a lock one of them held)."""
    global _lock
    _lock = threading.Lock()
    _jobs.clear()


def pending() -> int:
    """How many warm-up threads are still running."""
    return len(_unfinished())


def wait(timeout_s: float = WAIT_S) -> None:
    """Wait (blocking) until every warm-up thread has ended (also those a job started)."""
    current = threading.current_thread()
    deadline = time.monotonic() + timeout_s
    while True:
        running = [(thread, done) for thread, done, _ in _unfinished() if thread is not current]
        if not running or time.monotonic() >= deadline:
            return
        for thread, done in running:
            try:  # its work first (a thread not started yet cannot be joined)
                done.result(max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                continue
            thread.join(max(0.0, deadline - time.monotonic()))


async def settled() -> None:
    """Wait, without blocking the event loop, until every warm-up job that settles has done
    its work."""
    while running := [done for _, done, settles in _unfinished() if settles and not done.done()]:
        for done in running:
            await asyncio.wrap_future(done)


os.register_at_fork(before=wait, after_in_child=_after_fork_in_child)
