"""Retry policy for storage requests: which faults, how often, how long.

streamrec owns this policy rather than relying on the clients' defaults (s3fs and gcsfs retry
on their own for tens of seconds, and pass short reads on silently). The decision is made by
exception *type*: a store translates every foreign exception into :mod:`streamrec.errors`, and
only :class:`~streamrec.errors.TransientStorageError` is retried, with exponential backoff and
full jitter, up to ``max_attempts`` per request and within ``deadline_s`` overall.

Each retry is logged at WARNING on the ``streamrec`` logger (what, attempt, cause, next wait);
each successful request at DEBUG with its time (``streamrec -v`` shows both).
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from streamrec.errors import RetriesExhaustedError, TransientStorageError
from streamrec.redact import redact

__all__ = ["RetryPolicy", "waiting_for"]

T = TypeVar("T")
logger = logging.getLogger("streamrec")

# What the attempt in progress is waiting for besides its request (see waiting_for).
_WAITING: ContextVar[list[str] | None] = ContextVar("streamrec_retry_waiting", default=None)


def waiting_for(what: str) -> Callable[[], None]:
    """Note that the attempt in progress now waits for ``what`` (e.g. a credential lookup);
    an attempt that times out meanwhile names it. Returns the call that ends the note."""
    notes = _WAITING.get()
    if notes is None:
        return lambda: None
    notes.append(what)
    return lambda: notes.remove(what) if what in notes else None


@dataclass(frozen=True)
class RetryPolicy:
    """How a storage request is retried.

    Attributes:
        max_attempts: attempts per request, the first included.
        initial_backoff_s: sleep before the first retry (before jitter).
        max_backoff_s: cap on one sleep.
        multiplier: growth of the sleep per retry.
        deadline_s: overall time for one request, all attempts and sleeps included.
        timeout_s: time allowed for one attempt (connect and read) before it counts as failed.
    """

    max_attempts: int = 6
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    multiplier: float = 2.0
    deadline_s: float = 120.0
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, not {self.max_attempts}")
        if self.deadline_s <= 0 or self.timeout_s <= 0:
            raise ValueError("deadline_s and timeout_s must be positive")

    def backoff_s(self, retry: int, rng: random.Random | None = None) -> float:
        """Sleep before retry number ``retry`` (1-based): full jitter over an exponential cap."""
        cap = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (retry - 1))
        return (rng or random).uniform(0, cap)

    async def run(
        self,
        attempt: Callable[[], Awaitable[T]],
        *,
        describe: str,
        on_retry: Callable[[TransientStorageError], None] | None = None,
    ) -> T:
        """Await ``attempt()`` until it succeeds, retrying transient faults per the policy.

        Each attempt is bounded by ``timeout_s`` (a stall becomes a transient fault); anything
        that is not a :class:`TransientStorageError` propagates at once.
        """
        started = time.monotonic()
        for number in range(1, self.max_attempts + 1):
            remaining = self.deadline_s - (time.monotonic() - started)
            notes: list[str] = []
            noting = _WAITING.set(notes)
            try:
                result = await _within(attempt(), min(self.timeout_s, max(remaining, 0.001)))
                if logger.isEnabledFor(logging.DEBUG):
                    logger.debug("%s: %.3f s", describe, time.monotonic() - started)
                return result
            except asyncio.TimeoutError as exc:  # TimeoutError's alias from 3.11 on
                waited = f" (waiting for {notes[-1]})" if notes else ""
                error = TransientStorageError(
                    f"{describe}: no answer within {min(self.timeout_s, remaining):.1f} s{waited}"
                )
                error.__cause__ = exc
            except TransientStorageError as exc:
                error = exc
            finally:
                _WAITING.reset(noting)
            elapsed = time.monotonic() - started
            if number == self.max_attempts or elapsed >= self.deadline_s:
                break
            sleep = min(self.backoff_s(number), max(self.deadline_s - elapsed, 0))
            logger.warning(
                "%s: attempt %d of %d failed (%s); retrying in %.2f s",
                redact(describe),
                number,
                self.max_attempts,
                error,
                sleep,
            )
            if on_retry is not None:
                on_retry(error)
            await asyncio.sleep(sleep)
        raise RetriesExhaustedError(
            f"{describe}: gave up after {number} attempt(s) in "
            f"{time.monotonic() - started:.1f} s (RetryPolicy timeout_s={self.timeout_s:g} per "
            f"attempt, deadline_s={self.deadline_s:g} in all): {error}"
        ) from error


async def _within(awaitable: Awaitable[T], timeout_s: float) -> T:
    """``await awaitable`` bounded by ``timeout_s`` (TimeoutError after it).

    Python 3.10's and 3.11's ``wait_for`` can swallow a cancellation of the caller that
    arrives as the inner call completes; ``asyncio.timeout`` (3.11+) cannot, and a lost
    cancellation leaves a pipeline task running after its iterator was closed.
    """
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout_s):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout_s)
