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
  half-done job holds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

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
    with _lock:
        _jobs.append((thread, done, settles))
    thread.start()


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
        _jobs[:] = [job for job in _jobs if job[0].is_alive()]
        return list(_jobs)


def pending() -> int:
    """How many warm-up threads are still running."""
    return len(_unfinished())


def wait(timeout_s: float = WAIT_S) -> None:
    """Wait (blocking) until every warm-up thread has ended (also those a job started)."""
    current = threading.current_thread()
    deadline = time.monotonic() + timeout_s
    while True:
        running = [thread for thread, _, _ in _unfinished() if thread is not current]
        if not running or time.monotonic() >= deadline:
            return
        for thread in running:
            thread.join(max(0.0, deadline - time.monotonic()))


async def settled() -> None:
    """Wait, without blocking the event loop, until every warm-up job that settles has done
    its work."""
    while running := [done for _, done, settles in _unfinished() if settles and not done.done()]:
        for done in running:
            await asyncio.wrap_future(done)


os.register_at_fork(before=wait)
