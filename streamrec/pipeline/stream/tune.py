"""Read-ahead that sizes itself to the link: block size and reads in flight, per store.

By Little's law a reader with ``c`` range reads of ``b`` bytes in flight, each paying a round
trip ``rtt`` before its body arrives at ``rate`` bytes/s per connection, pulls at most
``c x b / (rtt + b / rate)`` bytes/s, and holds ``c x b`` bytes of the budget doing so. Larger
blocks mean fewer requests (less CPU, fewer billed GETs) but, for a fixed budget, fewer reads
in flight: on a link with long round trips and slow connections (150 ms, 10 MB/s each) 16
reads of 4 MiB fill 64 MiB and still pull only ~118 MB/s, where 32 of 2 MiB pull ~186.

:func:`choose` is that decision, a pure function of numbers (unit-tested over link shapes):
of the blocks in :data:`BLOCK_LADDER` (never above the starting block), with as many reads as
the budget holds (``concurrency x block <= room_bytes``: ``prefetch_bytes``, or a stream's
share of it; at most :data:`MAX_TUNED_CONCURRENCY`), it takes the largest block whose
predicted throughput is within :data:`GOOD_ENOUGH` of the best, or already :data:`HEADROOM`
times what the consumer takes (a consumer slower than the link gains nothing from more
requests). :class:`ReadTuner` is one store's state: it starts from the defaults, collects
completed range reads (:meth:`ReadTuner.record`: bytes, seconds, first-byte seconds) and
re-decides every :data:`SAMPLES` reads (a turn of the reads in flight, at least, and
:data:`WINDOW_S`) from their medians. Measured
under a full link, a connection's rate is its share of the link, which the model cannot tell
from a slow connection: so a step to more, smaller reads is a trial, kept only if the next
window pulls :data:`GAIN` times more bytes/s (a window that starts once the reads asked for
before the step are in); else the tuner steps back and stays. The budget
itself stays the hard bound; the tuner only chooses how the reads inside it are cut.

What a tuner learned outlives it: :data:`LINKS`, a small process-local table keyed by the
store's identity (scheme, endpoint, bucket or host: :class:`LinkKey`), keeps each store's
last *verified* settings (a trial still unconfirmed is not kept) and its estimate. The next
iteration - a second epoch, ``set_epoch``, another dataset of the same store - starts there
(:func:`start_from`, fitted to its own room and to the settings given) instead of at the
defaults; a store whose trial was taken back starts settled. The table holds at most
:data:`MAX_STORES` stores (least recently used first out) and :meth:`LinkMemory.forget`
empties it (tests; a process that moved to another network).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, NamedTuple

from streamrec.storage.cache.store import cache_namespace
from streamrec.storage.registry import split_scheme, store_key

__all__ = [
    "BLOCK_LADDER",
    "GAIN",
    "GOOD_ENOUGH",
    "HEADROOM",
    "LINKS",
    "MAX_STORES",
    "MAX_TUNED_CONCURRENCY",
    "SAMPLES",
    "WINDOW_S",
    "Learned",
    "LinkEstimate",
    "LinkKey",
    "LinkMemory",
    "ReadTuner",
    "choose",
    "first_enough",
    "indexed_concurrency",
    "link_key",
    "predicted_bps",
    "start_from",
]

BLOCK_LADDER = (4 << 20, 2 << 20, 1 << 20)
"""Block sizes tried, largest first (4 MiB, the fixed default, measured best at 60 ms; below
1 MiB the per-request CPU shows on fast links)."""
MAX_TUNED_CONCURRENCY = 32
"""Most range reads in flight per stream the tuner chooses (the connection pool is sized for
it)."""
GOOD_ENOUGH = 0.9
"""A larger block is kept while it predicts at least this share of the best throughput."""
HEADROOM = 1.25
"""Predicted throughput this many times the consumer's rate is enough."""
SAMPLES = 8
"""Completed range reads between two decisions, at least (and before the first)."""
WINDOW_S = 0.5
"""Seconds between two decisions, at least: each window measures what the settings pulled."""
GAIN = 1.05
"""A step to more, smaller reads is kept only if the next window pulls this much more."""
MAX_STORES = 64
"""Stores :data:`LINKS` remembers at most (least recently used first out)."""
_MIN_SAMPLE_BYTES = 128 << 10  # a smaller read's rate is mostly its round trip


class LinkEstimate(NamedTuple):
    """What completed reads measured on one store."""

    rtt_s: float
    """First-byte latency of a range read (request sent to headers back), seconds."""
    rate_bps: float
    """One connection's transfer rate once the body flows, bytes/s."""
    consumer_bps: float | None = None
    """Bytes/s the consumer takes when it never waits (``None``: not known yet)."""


class Learned(NamedTuple):
    """What one store's tuner last verified: settings that pulled what they were chosen for."""

    block_bytes: int
    concurrency: int
    estimate: LinkEstimate | None
    """The link as last measured (``None``: no decision yet)."""
    settled: bool = False
    """A step to more, smaller reads was taken back: the link itself is what is full."""


LinkKey = tuple[str, str, str]
"""A store's identity: its kind (``"s3"``, ``"http"``, ...), its endpoint (``""``: the
default one), its bucket or host."""


class LinkMemory:
    """A bounded table of what tuners learned per store (:class:`LinkKey` -> :class:`Learned`),
    shared by the iterations of one process (:data:`LINKS`); thread-safe."""

    def __init__(self, max_stores: int = MAX_STORES) -> None:
        self.max_stores = max_stores
        self._lock = threading.Lock()
        self._table: OrderedDict[LinkKey, Learned] = OrderedDict()

    def get(self, key: LinkKey) -> Learned | None:
        with self._lock:
            learned = self._table.get(key)
            if learned is not None:
                self._table.move_to_end(key)
            return learned

    def put(self, key: LinkKey, learned: Learned) -> None:
        with self._lock:
            self._table[key] = learned
            self._table.move_to_end(key)
            while len(self._table) > self.max_stores:
                self._table.popitem(last=False)

    def forget(self) -> None:
        """Forget every store (the next iterations start from the defaults)."""
        with self._lock:
            self._table.clear()

    def __len__(self) -> int:
        return len(self._table)


def link_key(url: str, storage_options: dict[str, Any] | None) -> LinkKey:
    """The identity of the store that serves ``url``, as :data:`LINKS` keys it: its kind, its
    endpoint (:func:`~streamrec.storage.cache.store.cache_namespace`), its bucket or host."""
    _, rest = split_scheme(url)
    return store_key(url), cache_namespace(url, storage_options), rest.split("/", 1)[0]


LINKS = LinkMemory()
"""The process's table (see the module docstring)."""


def start_from(
    learned: Learned | None,
    room_bytes: int,
    block_bytes: int,
    max_concurrency: int,
    *,
    tune_block: bool,
    tune_concurrency: bool,
) -> tuple[int, int]:
    """``(block_bytes, concurrency)`` a tuner starts with: ``block_bytes`` (the block the
    readers use) and ``max_concurrency`` (given or default), or what ``learned`` verified
    where those are to be tuned; a block never above ``block_bytes``, a given one exactly, a
    given concurrency never exceeded, and a tuned concurrency within the room (``block x
    concurrency <= room_bytes``, or one read of the block)."""
    block = max(1, block_bytes)
    concurrency = max(1, max_concurrency)
    if learned is not None and tune_block:
        block = max(1, min(block, learned.block_bytes))
    if learned is not None and tune_concurrency:
        concurrency = max(1, min(MAX_TUNED_CONCURRENCY, learned.concurrency))
    if tune_concurrency:
        concurrency = max(1, min(concurrency, room_bytes // block))
    return block, concurrency


def predicted_bps(block_bytes: int, concurrency: int, rtt_s: float, rate_bps: float) -> float:
    """Little's law: bytes/s of ``concurrency`` reads of ``block_bytes`` kept in flight."""
    return concurrency * block_bytes / (max(rtt_s, 0.0) + block_bytes / max(rate_bps, 1.0))


def choose(
    room_bytes: int,
    estimate: LinkEstimate,
    *,
    max_block_bytes: int = BLOCK_LADDER[0],
    max_concurrency: int = MAX_TUNED_CONCURRENCY,
    fixed_block: bool = False,
) -> tuple[int, int]:
    """``(block_bytes, concurrency)`` for a store whose reads measured ``estimate``, within
    ``room_bytes`` (``block x concurrency <= room_bytes``, always; see the module
    docstring). ``max_block_bytes`` / ``max_concurrency`` bound the choice; ``fixed_block``:
    only ``max_block_bytes`` (a block size the user gave), only the concurrency is chosen."""
    # a block the user gave stays as given (larger than the room: one read of it at a time)
    top = max(1, max_block_bytes if fixed_block else min(max_block_bytes, room_bytes))
    ladder = [] if fixed_block else [b for b in BLOCK_LADDER if b < top]
    candidates = []
    for block in (top, *ladder):
        concurrency = max(1, min(max_concurrency, room_bytes // block))
        rate = predicted_bps(block, concurrency, estimate.rtt_s, estimate.rate_bps)
        candidates.append((block, concurrency, rate))
    return first_enough(candidates, estimate.consumer_bps)


def first_enough(
    candidates: list[tuple[int, int, float]], other_end_bps: float | None
) -> tuple[int, int]:
    """Of ``(unit_bytes, in_flight, predicted_bps)`` candidates, largest unit first (fewest
    requests), the first predicting :data:`GOOD_ENOUGH` of the best rate, or already
    :data:`HEADROOM` times what the other end (a consumer, a producer) takes."""
    enough = GOOD_ENOUGH * max(rate for _, _, rate in candidates)
    if other_end_bps is not None:
        enough = min(enough, HEADROOM * other_end_bps)
    for unit, in_flight, rate in candidates:
        if rate >= enough:
            return unit, in_flight
    raise AssertionError("unreachable: the best candidate is always enough")


def indexed_concurrency(
    learned: Learned | None, span_bytes: int, room_bytes: int, default: int
) -> int:
    """Range reads of about ``span_bytes`` the indexed engine keeps in flight on a store of
    which ``learned`` is known (its concurrency not given; see
    :mod:`streamrec.pipeline.indexed.engine`): as many as carry the bytes in flight the
    store's streaming reads verified (``block x concurrency``: what pulled the link), never
    fewer than ``default``, at most :data:`MAX_TUNED_CONCURRENCY` and, above ``default``,
    within ``room_bytes``."""
    default = max(1, default)
    if learned is None or learned.settled:  # nothing verified, or more reads did not pay
        return default
    span = max(1, span_bytes)
    wanted = -(-learned.block_bytes * learned.concurrency // span)  # (rounded up)
    room = max(1, room_bytes // span)
    return max(default, min(wanted, MAX_TUNED_CONCURRENCY, room))


class ReadTuner:
    """One store's block size and reads in flight for one iteration (see the module
    docstring), their product within ``room_bytes`` (the budget plan's
    :attr:`~streamrec.pipeline.budget.BudgetPlan.tuning_bytes`). ``block_bytes``: the block
    the readers use (the plan's, a share's part when streams share the budget); ``tune_block``
    / ``tune_concurrency``: which of the two it may change (a setting the user gave stays as
    given). ``learned``: what an earlier iteration verified on this store (it starts there:
    :func:`start_from`); ``memory`` / ``key``: where what it verifies is kept.
    ``consumer_bps()`` says how fast the consumer takes bytes (``None`` while unknown);
    ``on_choice(tuner)`` hears every decision."""

    def __init__(
        self,
        room_bytes: int,
        block_bytes: int,
        max_concurrency: int,
        *,
        tune_block: bool,
        tune_concurrency: bool,
        consumer_bps: Callable[[], float | None] = lambda: None,
        on_choice: Callable[[ReadTuner], None] | None = None,
        learned: Learned | None = None,
        memory: LinkMemory | None = None,
        key: LinkKey | None = None,
    ) -> None:
        self.room_bytes = room_bytes  # what the reads in flight may add up to (the plan's)
        self._given = (max(1, block_bytes), max(1, max_concurrency))
        self.tune_block = tune_block
        self.tune_concurrency = tune_concurrency
        tuning = tune_block or tune_concurrency
        self.learned = learned if tuning else None
        """What it started from (``None``: the defaults or the settings given)."""
        self.block_bytes, self.max_concurrency = start_from(
            self.learned,
            room_bytes,
            block_bytes,
            max_concurrency,
            tune_block=tune_block,
            tune_concurrency=tune_concurrency,
        )
        self._consumer_bps = consumer_bps
        self._on_choice = on_choice
        self._memory = memory if key is not None else None
        self._key = key
        self._samples: deque[tuple[float, float]] = deque(maxlen=4 * SAMPLES)  # (rtt, rate)
        self._since = 0  # reads in the window
        self._window_start: float | None = None
        self._window_bytes = 0
        self._warm = False  # a window has passed (the ramp's)
        self._skip = 0  # reads of the settings before the last change still to complete
        self._trial: tuple[tuple[int, int], float] | None = None  # (the step back, its bytes/s)
        self.settled = self.learned is not None and self.learned.settled
        """A step to more, smaller reads pulled no more: the tuner went back and stays."""
        self.estimate: LinkEstimate | None
        self.estimate = None if self.learned is None else self.learned.estimate
        """The last estimate decided on (``None``: none measured or learned yet)."""

    @property
    def active(self) -> bool:
        """Whether it may still change anything."""
        return (self.tune_block or self.tune_concurrency) and not self.settled

    @property
    def in_flight(self) -> int:
        """The reads of :attr:`block_bytes` it lets in flight: :attr:`max_concurrency`, held to
        the room (a block larger than the room: one)."""
        return min(self.max_concurrency, max(1, self.room_bytes // self.block_bytes))

    def record(
        self, nbytes: int, seconds: float, first_byte_s: float | None, now: float | None = None
    ) -> None:
        """A range read of ``nbytes`` completed in ``seconds`` (at ``now``, perf_counter
        seconds), its answer's headers after ``first_byte_s`` (``None``: not measured, e.g. a
        local file: nothing to learn)."""
        if not self.active or first_byte_s is None or nbytes < _MIN_SAMPLE_BYTES:
            return
        body_s = seconds - first_byte_s
        if body_s <= 0:
            return
        now = time.perf_counter() if now is None else now
        if self._window_start is None:
            self._window_start = now - seconds
        self._samples.append((first_byte_s, nbytes / body_s))
        if self._skip:  # (see _apply)
            self._skip -= 1
            self._window_start, self._window_bytes, self._since = now, 0, 0
            return
        self._window_bytes += nbytes
        self._since += 1
        elapsed = now - self._window_start
        # a window is a turn of the reads in flight at least: reads asked for together end
        # together, and a part of a turn measures their bursts, not the settings
        if self._since >= max(SAMPLES, self.in_flight) and elapsed >= WINDOW_S:
            pulled = self._window_bytes / elapsed
            self._since = self._window_bytes = 0
            self._window_start = now
            if self._warm:
                self._decide(pulled)
            self._warm = True  # (the first window is the ramp's: no measure of the settings)

    def _decide(self, pulled_bps: float) -> None:
        """Check the last step against what the window pulled; choose the next one."""
        trial, self._trial = self._trial, None
        if trial is not None and pulled_bps < GAIN * trial[1]:
            # more, smaller reads pulled no more: the link (or the consumer) is what is full,
            # the per-connection rates measured were shares of it. Back, and stay.
            self.settled = True
            self._apply(*trial[0])
            self._remember()
            return
        estimate = LinkEstimate(
            statistics.median(rtt for rtt, _ in self._samples),
            statistics.median(rate for _, rate in self._samples),
            self._consumer_bps(),
        )
        self.estimate = estimate
        self._remember()  # what is in use pulled what it was chosen for (or nothing was tried)
        given_block, given_concurrency = self._given
        block, concurrency = choose(
            self.room_bytes,
            estimate,
            max_block_bytes=given_block,
            max_concurrency=MAX_TUNED_CONCURRENCY if self.tune_concurrency else given_concurrency,
            fixed_block=not self.tune_block,
        )
        if not self.tune_concurrency:  # as given (the budget holds it to the room)
            concurrency = given_concurrency
        now = (self.block_bytes, self.max_concurrency)
        if (block, concurrency) == now:
            return
        if block < now[0] or concurrency > now[1]:  # more requests: kept only if they pay
            self._trial = (now, pulled_bps)
            self._apply(block, concurrency)
            return
        self._apply(block, concurrency)  # fewer requests for as much: nothing to verify
        self._remember()

    def _remember(self) -> None:
        if self._memory is not None and self._key is not None:
            learned = Learned(self.block_bytes, self.in_flight, self.estimate, self.settled)
            self._memory.put(self._key, learned)

    def _apply(self, block_bytes: int, concurrency: int) -> None:
        # the reads in flight now were asked for with the old settings: a window of theirs
        # measures the change under way, not the new settings (a trial judged on it would be
        # judged on the reads it replaces); the next window starts once they are in
        self._skip = self.in_flight
        self.block_bytes, self.max_concurrency = block_bytes, concurrency
        if self._on_choice is not None:
            self._on_choice(self)
