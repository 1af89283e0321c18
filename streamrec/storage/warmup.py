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
_jobs: list[tuple[threading.Thread, Future[None]]] = []

WAIT_S = 10.0
"""The longest :func:`wait` waits for a job (they take milliseconds; a bound, not a pace)."""


def start(name: str, job: Callable[[], None]) -> None:
    """Run ``job`` in a new daemon thread ``streamrec-warmup-<name>``."""
    done: Future[None] = Future()
    done.set_running_or_notify_cancel()  # never cancelled: a waiter's cancel is its own
    thread = threading.Thread(
        target=_run, args=(job, done), name=f"streamrec-warmup-{name}", daemon=True
    )
    with _lock:
        _jobs.append((thread, done))
    thread.start()


def _run(job: Callable[[], None], done: Future[None]) -> None:
    time.sleep(0)  # the GIL back to the thread that started this one first
    try:
        job()
    except Exception:  # an optimisation only: the normal path redoes it and says what fails
        logger.debug("streamrec: a start-up warm-up job failed", exc_info=True)
    finally:
        done.set_result(None)


def _unfinished() -> list[tuple[threading.Thread, Future[None]]]:
    with _lock:
        _jobs[:] = [(thread, done) for thread, done in _jobs if thread.is_alive()]
        return list(_jobs)


def pending() -> int:
    """How many warm-up threads are still running."""
    return len(_unfinished())


def wait(timeout_s: float = WAIT_S) -> None:
    """Wait (blocking) until every warm-up thread has ended."""
    current = threading.current_thread()
    for thread, _ in _unfinished():
        if thread is not current:
            thread.join(timeout_s)


async def settled() -> None:
    """Wait, without blocking the event loop, until every warm-up job has done its work."""
    for _, done in _unfinished():
        await asyncio.wrap_future(done)


os.register_at_fork(before=wait)
