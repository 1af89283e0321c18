"""The writer's upload settings, sized to the link: part size and uploads in flight.

Memory is the fixed part: the bytes of the parts in flight never exceed the writer's room
(:data:`DEFAULT_ROOM_BYTES`, 128 MiB: the old fixed 8 parts of 16 MiB; the
:class:`~streamrec.storage.sink_base.UploadWindow` enforces it whatever is decided here). Inside
it, smaller parts mean more of them in flight. By Little's law ``c`` uploads of ``p`` bytes,
each paying a round trip ``rtt`` and sending at ``rate`` bytes/s per connection, push at most
``c x p / (rtt + p / rate)`` bytes/s: on a link of long round trips and slow connections
(150 ms, 10 MB/s each) 8 parts of 16 MiB push ~73 MB/s, 16 of 8 MiB ~136.

:func:`choose_part` is that decision, a pure function of numbers: of the sizes in
:data:`PART_LADDER` (all >= 5 MiB, S3's least part but the last, and multiples of 256 KiB, GCS's
chunk unit) with as many uploads as the room holds (at most :data:`MAX_UPLOADS`), the largest
part (fewest requests) whose predicted rate is within :data:`GOOD_ENOUGH` of the best, or
already :data:`HEADROOM` times what the caller produces (a caller slower than the link gains
nothing from more requests). :class:`UploadTuner` feeds it: the round trip from the requests
that start uploads (CreateMultipartUpload, a GCS session), each connection's rate from the data
requests that completed (``bytes / (seconds - rtt)``), the caller's rate from the time the writer
did not wait for room; it re-decides every :data:`SAMPLES` uploads (and :data:`WINDOW_S`). As
the reader's tuner (:mod:`streamrec.pipeline.stream.tune`): under a full link a connection's rate
is its share, which the model cannot tell from a slow connection, so a step to more, smaller parts
is a trial, kept only if the uploads measured at the new size push :data:`GAIN` times more; else
the tuner steps back and stays. A shard's part size is fixed when its sink opens (some stores
want every part of an upload but the last alike): a decision applies to the shards opened after
it.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from streamrec.pipeline.stream.tune import GOOD_ENOUGH, HEADROOM, first_enough, predicted_bps
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.sink_base import DEFAULT_MAX_CONCURRENCY, DEFAULT_PART_BYTES, SinkContext

__all__ = [
    "DEFAULT_ROOM_BYTES",
    "GAIN",
    "GOOD_ENOUGH",
    "HEADROOM",
    "MAX_UPLOADS",
    "PART_LADDER",
    "SAMPLES",
    "START_PART_BYTES",
    "WINDOW_S",
    "UploadEstimate",
    "UploadSettings",
    "UploadTuner",
    "choose_part",
    "predicted_bps",
    "upload_context",
    "upload_settings",
    "uploads_for",
]

DEFAULT_ROOM_BYTES = 128 << 20
"""Bytes of parts in flight at most, at the defaults (8 x 16 MiB, as the fixed defaults were)."""
PART_LADDER = (16 << 20, 8 << 20, 5 << 20)
"""Part sizes tried, largest first: S3's least part (5 MiB) is the smallest."""
START_PART_BYTES = 8 << 20
"""The part size before anything is measured (16 in flight in the default room)."""
MAX_UPLOADS = 32
"""Most data requests in flight the tuner lets the room hold (the S3 pool holds 64)."""
SAMPLES = 8
"""Completed uploads between two decisions, at least (and before the first)."""
WINDOW_S = 0.5
"""Seconds between two decisions, at least."""
GAIN = 1.05
"""A step to more, smaller parts is kept only if its uploads push this much more."""
_MIN_SAMPLE_BYTES = 1 << 20  # a shard's short last part says little about the rate


class UploadEstimate(NamedTuple):
    """What completed uploads measured on one writer's store."""

    rtt_s: float
    """Seconds of a request that starts an upload (about one round trip)."""
    rate_bps: float
    """One connection's sending rate, bytes/s."""
    producer_bps: float | None = None
    """Bytes/s the caller hands over when it never waits for room (``None``: not known)."""


def uploads_for(room_bytes: int, part_bytes: int) -> int:
    """Uploads of ``part_bytes`` the room holds (at least one, at most :data:`MAX_UPLOADS`)."""
    return max(1, min(MAX_UPLOADS, room_bytes // part_bytes))


def choose_part(room_bytes: int, estimate: UploadEstimate) -> tuple[int, int]:
    """``(part_bytes, uploads)`` for a link that measured ``estimate``, within ``room_bytes``
    (``part_bytes x uploads <= room_bytes`` whenever the room holds one part of the ladder)."""
    candidates = []
    fitting = [part for part in PART_LADDER if part <= room_bytes] or [PART_LADDER[-1]]
    for part in fitting:
        uploads = uploads_for(room_bytes, part)
        rate = predicted_bps(part, uploads, estimate.rtt_s, estimate.rate_bps)
        candidates.append((part, uploads, rate))
    return first_enough(candidates, estimate.producer_bps)


class UploadTuner:
    """One writer's part size and uploads in flight (see the module docstring).

    ``apply(part_bytes, uploads)`` is called with every decision (the writer sets its sinks'
    context); ``waited_s()`` says how long the writer has waited for upload room so far.
    """

    def __init__(
        self,
        room_bytes: int,
        apply: Callable[[int, int], None],
        waited_s: Callable[[], float] = lambda: 0.0,
        *,
        part_bytes: int = START_PART_BYTES,
    ) -> None:
        self.room_bytes = room_bytes
        self.part_bytes = part_bytes
        self.uploads = uploads_for(room_bytes, part_bytes)
        self._apply_to = apply
        self._waited_s = waited_s
        self._rtts: deque[float] = deque(maxlen=4 * SAMPLES)
        self._times: deque[tuple[int, float]] = deque(maxlen=4 * SAMPLES)  # (bytes, seconds)
        self._since = 0
        self._window_start: float | None = None
        self._window_bytes = 0
        self._window_waited = 0.0
        self._warm = False
        self._trial: tuple[tuple[int, int], float] | None = None  # (the step back, its bytes/s)
        self.settled = False
        """A step to smaller parts pushed no more: the tuner went back and stays."""
        self.estimate: UploadEstimate | None = None
        """The last estimate decided on (``None``: still at the starting values)."""
        apply(self.part_bytes, self.uploads)

    def control(self, seconds: float) -> None:
        """A request that starts an upload took ``seconds`` (a round trip, about)."""
        if seconds > 0:
            self._rtts.append(seconds)

    def record(self, nbytes: int, seconds: float, now: float | None = None) -> None:
        """A data request of ``nbytes`` succeeded after ``seconds`` (at ``now``, perf_counter
        seconds)."""
        if self.settled or nbytes < _MIN_SAMPLE_BYTES or seconds <= 0:
            return
        now = time.perf_counter() if now is None else now
        # a part cut before a step to smaller parts: its bytes count in the trial's window
        # (they share the link), but the window starts with, and counts, the trial's own parts
        old = self._trial is not None and nbytes > self.part_bytes
        if self._window_start is None:
            if old:
                return
            self._window_start = now - seconds
            self._window_waited = self._waited_s()
        self._window_bytes += nbytes
        if not old:
            self._times.append((nbytes, seconds))
            self._since += 1
        elapsed = now - self._window_start
        if self._since >= SAMPLES and elapsed >= WINDOW_S:
            pushed = self._window_bytes / elapsed
            # the caller's own time (not waiting for room): what it produces at
            busy = elapsed - (self._waited_s() - self._window_waited)
            producer = self._window_bytes / busy if busy > 0.01 * elapsed else None
            self._since = self._window_bytes = 0
            self._window_start = now
            self._window_waited = self._waited_s()
            if self._warm:
                self._decide(pushed, producer)
            self._warm = True  # (the first window is the ramp's)

    def _decide(self, pushed_bps: float, producer_bps: float | None) -> None:
        trial, self._trial = self._trial, None
        if trial is not None and pushed_bps < GAIN * trial[1]:
            # more, smaller parts pushed no more: the link (or the caller) is what is full
            self.settled = True
            self._apply(*trial[0])
            return
        rtt = statistics.median(self._rtts) if self._rtts else 0.0
        rates = [n / (s - rtt) for n, s in self._times if s > rtt]
        if not rates:
            return
        estimate = UploadEstimate(rtt, statistics.median(rates), producer_bps)
        self.estimate = estimate
        part, uploads = choose_part(self.room_bytes, estimate)
        if part == self.part_bytes:
            return
        if part < self.part_bytes:  # more requests: kept only if they pay
            self._trial = ((self.part_bytes, self.uploads), pushed_bps)
        self._times.clear()
        self._window_start = None  # the next window starts with a part of the new size
        self._apply(part, uploads)

    def _apply(self, part_bytes: int, uploads: int) -> None:
        self.part_bytes, self.uploads = part_bytes, uploads
        self._apply_to(part_bytes, uploads)


@dataclass(frozen=True)
class UploadSettings:
    """A writer's upload settings as they stand (``w.stats``)."""

    part_bytes: int
    """The part size of the shards opened from now on."""
    max_concurrency: int
    """Data requests in flight at most (at that part size)."""
    room_bytes: int
    """Bytes of data requests in flight at most: the memory bound, tuned or not."""
    tuned: bool
    """Whether the writer chooses them (neither ``part_bytes`` nor ``max_concurrency`` given)."""
    settled: bool = False
    """A tuned writer's step to smaller parts pushed no more: it went back and stays."""
    estimate: UploadEstimate | None = None
    """What the last decision measured (``None``: none yet)."""


def upload_context(
    part_bytes: int | None, max_concurrency: int | None, retry: RetryPolicy
) -> tuple[SinkContext, UploadTuner | None]:
    """The sinks' context of a writer given these settings, and its tuner (``None``: either
    setting given, and both then fixed, the other at its old default)."""
    if part_bytes is not None or max_concurrency is not None:
        fixed = SinkContext(
            part_bytes=part_bytes or DEFAULT_PART_BYTES,
            max_concurrency=max_concurrency or DEFAULT_MAX_CONCURRENCY,
            retry=retry,
        )
        return fixed, None
    context = SinkContext(part_bytes=START_PART_BYTES, retry=retry, room_bytes=DEFAULT_ROOM_BYTES)
    tuner = UploadTuner(
        DEFAULT_ROOM_BYTES, context.set_upload_settings, lambda: context.window.waited_s
    )
    context.on_upload = lambda nbytes, seconds: tuner.record(nbytes, seconds)
    context.on_control = tuner.control
    return context, tuner


def upload_settings(context: SinkContext, tuner: UploadTuner | None) -> UploadSettings:
    """What ``context`` (and ``tuner``, if any) stand at."""
    if tuner is None:
        return UploadSettings(
            context.part_bytes, context.max_concurrency, context.room_bytes, tuned=False
        )
    return UploadSettings(
        tuner.part_bytes, tuner.uploads, tuner.room_bytes, True, tuner.settled, tuner.estimate
    )
