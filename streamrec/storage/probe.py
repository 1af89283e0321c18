"""Measuring a store from where it runs (``streamrec probe``) and the settings that follow.

Every measurement goes through the store's own calls, the ones the readers and writers use
(``read_range_pieces``, ``open_sink``, and the listing the caller passes in: the CLI passes
``open_dataset``'s own), so the numbers are what streamrec gets from this place, not what some
other client gets:

1. the listing: how long the urls take to list, objects per second;
2. the round trip: 1-byte range reads one at a time (the first, which opens the connection,
   not counted): median and 90th percentile;
3. one connection's throughput: large range reads one after another;
4. throughput against concurrency (1, 2, 4, ...) for each block size, over the objects listed
   (cycled through when the time asks for more bytes than they hold); a block size stops
   climbing once a step gains less than :attr:`ProbePlan.growth` over its best so far (the
   link is full), or once ``concurrency x block`` passes the memory cap;
5. with ``write_url``: the same against concurrency for uploads (one object per step, parts of
   ``part_bytes``), under a prefix of its own that is removed afterwards.

Time is bounded by :attr:`ProbePlan.duration_s`, shared out as the phases go (each step gets
what is left divided by the steps still planned; a step waits for the reads it started, so a
run may end a read's time late). Each read is checked: a body shorter or longer than asked is a
:class:`~streamrec.errors.StorageError` naming the url and offset. The recommendation is the
cheapest setting (least ``concurrency x block`` of memory) within ``1 / growth`` of the best
throughput measured (see :func:`recommend`).
"""

from __future__ import annotations

import functools
import itertools
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from streamrec._portal import run_all
from streamrec.errors import StorageError
from streamrec.storage.base import ObjectInfo, ObjectStore
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.sink_base import SinkContext

__all__ = [
    "Listing",
    "Point",
    "ProbePlan",
    "ProbeResult",
    "Recommendation",
    "probe",
    "recommend",
]

MIB = 1 << 20
S3_MIN_PART_BYTES = 5 * MIB
"""S3 refuses parts smaller than this (all but the last): a recommended part is never less."""


@dataclass(frozen=True)
class ProbePlan:
    """What :func:`probe` measures and for how long.

    Attributes:
        duration_s: the time the measurements may take, all phases together (the listing
            not counted; a step waits for the reads it started).
        concurrencies: the reads in flight tried, in increasing order.
        block_sizes: the range sizes tried (bytes), each from concurrency 1 upwards.
        memory_cap_bytes: no step holds more than this in flight (``concurrency x block``),
            and no recommendation asks for more.
        round_trips: most 1-byte reads timed for the round trip.
        growth: a concurrency step that gains less than this factor over the best so far
            ends its block size; settings within ``1 / growth`` of the best count as as good.
        part_bytes: the part size of the upload measurement.
        retry: the policy each request runs under (a retried request counts its retries).
    """

    duration_s: float = 25.0
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    block_sizes: tuple[int, ...] = (1 * MIB, 4 * MIB, 16 * MIB)
    memory_cap_bytes: int = 1 << 30
    round_trips: int = 30
    growth: float = 1.1
    part_bytes: int = 8 * MIB
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.duration_s <= 0:
            raise ValueError(f"duration_s must be positive, not {self.duration_s}")
        if not self.concurrencies or min(self.concurrencies) < 1:
            raise ValueError(f"concurrencies must be >= 1, not {self.concurrencies}")
        if not self.block_sizes or min(self.block_sizes) < 1:
            raise ValueError(f"block sizes must be >= 1 byte, not {self.block_sizes}")
        if self.growth <= 1:
            raise ValueError(f"growth must be > 1, not {self.growth}")
        object.__setattr__(self, "concurrencies", tuple(sorted(set(self.concurrencies))))
        object.__setattr__(self, "block_sizes", tuple(sorted(set(self.block_sizes))))


@dataclass(frozen=True)
class Point:
    """One step: ``concurrency`` requests of ``block_bytes`` kept in flight for ``seconds``."""

    concurrency: int
    block_bytes: int
    bytes: int
    seconds: float
    requests: int

    @property
    def bytes_per_s(self) -> float:
        """Throughput of the step (bytes moved over the time from its start to its last)."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def document(self) -> dict[str, Any]:
        """The step as JSON: its fields and ``bytes_per_s``."""
        return {**asdict(self), "bytes_per_s": round(self.bytes_per_s, 1)}


@dataclass(frozen=True)
class Listing:
    """How long the urls took to list, and what they hold."""

    objects: int
    total_bytes: int
    seconds: float

    @property
    def objects_per_s(self) -> float:
        """Objects listed per second."""
        return self.objects / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Recommendation:
    """Settings for ``open_dataset`` and ``open_writer``, and why (``explanation``)."""

    max_concurrency: int
    block_bytes: int
    prefetch_bytes: int
    writer_max_concurrency: int
    part_bytes: int
    expected_bytes_per_s: float
    explanation: str

    def document(self) -> dict[str, Any]:
        """The settings as JSON, by the function they are for."""
        return {
            "open_dataset": {
                "max_concurrency": self.max_concurrency,
                "block_bytes": self.block_bytes,
                "prefetch_bytes": self.prefetch_bytes,
            },
            "open_writer": {
                "max_concurrency": self.writer_max_concurrency,
                "part_bytes": self.part_bytes,
            },
            "expected_bytes_per_s": round(self.expected_bytes_per_s, 1),
        }


@dataclass
class ProbeResult:
    """Everything :func:`probe` measured, with the recommendation."""

    url: str
    plan: ProbePlan
    listing: Listing
    round_trips_s: list[float] = field(default_factory=list)
    single: Point | None = None
    reads: list[Point] = field(default_factory=list)
    writes: list[Point] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    recommendation: Recommendation | None = None

    @property
    def round_trip_median_s(self) -> float | None:
        """Median of the 1-byte reads' times (None without any)."""
        return statistics.median(self.round_trips_s) if self.round_trips_s else None

    @property
    def round_trip_p90_s(self) -> float | None:
        """90th percentile of the 1-byte reads' times (None without any)."""
        if not self.round_trips_s:
            return None
        ordered = sorted(self.round_trips_s)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]

    def document(self) -> dict[str, Any]:
        """The result as one JSON document (``streamrec probe --json``)."""
        median, p90 = self.round_trip_median_s, self.round_trip_p90_s
        recommended = self.recommendation
        return {
            "url": self.url,
            "duration_s": round(self.seconds, 3),
            "listing": {
                "objects": self.listing.objects,
                "total_bytes": self.listing.total_bytes,
                "seconds": round(self.listing.seconds, 6),
                "objects_per_s": round(self.listing.objects_per_s, 1),
            },
            "round_trip": {
                "median_s": None if median is None else round(median, 6),
                "p90_s": None if p90 is None else round(p90, 6),
                "samples": len(self.round_trips_s),
            },
            "single_connection": None if self.single is None else self.single.document(),
            "reads": [point.document() for point in self.reads],
            "writes": [point.document() for point in self.writes],
            "recommended": None if recommended is None else recommended.document(),
            "explanation": None if recommended is None else recommended.explanation,
            "notes": list(self.notes),
        }


Lister = Callable[[], Awaitable[list[ObjectInfo]]]


async def probe(
    url: str,
    store: ObjectStore,
    list_objects: Lister,
    plan: ProbePlan,
    *,
    write_url: str | None = None,
    on_step: Callable[[str], None] | None = None,
) -> ProbeResult:
    """Measure ``store`` on the objects ``list_objects()`` returns (see the module docstring).

    ``write_url``: a prefix (ending in ``/``) under which the upload measurement writes its
    objects, each removed once timed (nothing is written without it). ``on_step`` is told
    each step as it starts (progress). Raises what the store raises (after ``plan.retry``).
    """
    tell = on_step or (lambda _: None)
    started = time.monotonic()
    tell("listing")
    objects = await list_objects()
    listed_s = time.monotonic() - started
    listing = Listing(len(objects), sum(o.size for o in objects), listed_s)
    result = ProbeResult(url, plan, listing)
    deadline = time.monotonic() + plan.duration_s
    readable = [o for o in objects if o.size > 0]
    if not readable:
        result.notes.append("no object under the url holds any bytes: nothing to read")
    else:
        # shares of the time: the round trip a tenth, one connection a sixth, the rest the
        # concurrency steps (reads and, with write_url, uploads half each)
        tell("round trip")
        await _round_trips(result, store, readable, plan, time.monotonic() + plan.duration_s / 10)
        tell("one connection")
        largest = max(o.size for o in readable)
        block = max([b for b in plan.block_sizes if b <= largest] or [min(plan.block_sizes)])
        single_end = time.monotonic() + plan.duration_s / 6
        result.single = await _step(store, readable, 1, block, single_end, plan.retry)
        sweep_end = deadline if write_url is None else (time.monotonic() + deadline) / 2
        await _read_sweep(result, store, readable, plan, sweep_end, tell)
    if write_url is not None:
        await _write_sweep(result, store, write_url, plan, deadline, tell)
    result.recommendation = recommend(result)
    result.seconds = time.monotonic() - started
    return result


async def _round_trips(
    result: ProbeResult, store: ObjectStore, objects: list[ObjectInfo], plan: ProbePlan, end: float
) -> None:
    """1-byte reads one at a time until ``end`` or ``plan.round_trips`` of them; the first
    (which may open the connection, resolve names, fetch credentials) not counted."""
    obj = objects[0]
    await _read(store, obj, 0, 1, plan.retry)
    for _ in range(plan.round_trips):
        began = time.monotonic()
        await _read(store, obj, 0, 1, plan.retry)
        result.round_trips_s.append(time.monotonic() - began)
        if time.monotonic() >= end:
            break


async def _read_sweep(
    result: ProbeResult,
    store: ObjectStore,
    objects: list[ObjectInfo],
    plan: ProbePlan,
    end: float,
    tell: Callable[[str], None],
) -> None:
    """Throughput against concurrency, for each block size, until ``end``."""
    largest = max(o.size for o in objects)
    blocks = [b for b in plan.block_sizes if b <= largest]
    skipped = [b for b in plan.block_sizes if b > largest]
    if skipped:
        result.notes.append(
            f"block sizes {', '.join(_size(b) for b in skipped)} skipped: no object is that large"
        )
    if not blocks:
        blocks = [largest]  # every object smaller than the smallest block: read them whole
    levels = plan.concurrencies
    # concurrency by concurrency, every block size still climbing at each: when the time runs
    # out, what is missing is the highest concurrencies, for every block size alike
    best = dict.fromkeys(blocks, 0.0)  # the block sizes still climbing, their best so far
    for number, concurrency in enumerate(levels):
        climbing = list(best)
        for position, block in enumerate(climbing):
            now = time.monotonic()
            if now >= end:
                result.notes.append(
                    f"the time ran out before {concurrency} reads in flight, with throughput "
                    "still growing: a longer --duration-s may find more"
                )
                return
            if concurrency * block > plan.memory_cap_bytes:
                result.notes.append(
                    f"{_size(block)} blocks stop before concurrency {concurrency}: "
                    f"{concurrency} x {_size(block)} is over the memory cap"
                )
                del best[block]
                continue
            # the steps still planned share the time left (steps not run give theirs back)
            left = len(climbing) - position + len(best) * (len(levels) - number - 1)
            tell(f"reads: {concurrency} x {_size(block)}")
            step_end = now + (end - now) / max(left, 1)
            point = await _step(store, objects, concurrency, block, step_end, plan.retry)
            result.reads.append(point)
            if point.bytes_per_s < best[block] * plan.growth:
                del best[block]  # the link is full at this block size: more gains nothing
            else:
                best[block] = point.bytes_per_s
        if not best:
            return
    result.notes.append(
        f"throughput still grew at {levels[-1]} reads in flight (the most tried): more may "
        "gain more (--concurrency)"
    )


async def _step(
    store: ObjectStore,
    objects: list[ObjectInfo],
    concurrency: int,
    block: int,
    end: float,
    retry: RetryPolicy,
) -> Point:
    """``concurrency`` readers taking the next block of the objects (in order, cycled) until
    ``end``; each reads at least one block and finishes the read it started."""
    ranges = _ranges(objects, block)
    moved = [0, 0]  # bytes, requests

    async def reader() -> None:
        first = True
        while first or time.monotonic() < end:
            first = False
            obj, start, stop = next(ranges)
            got = await _read(store, obj, start, stop, retry)
            # (not ``moved[0] += await ...``: that reads moved[0] before the await)
            moved[0] += got
            moved[1] += 1

    began = time.monotonic()
    await run_all(reader() for _ in range(concurrency))
    return Point(concurrency, block, moved[0], time.monotonic() - began, moved[1])


def _ranges(objects: Sequence[ObjectInfo], block: int) -> Iterator[tuple[ObjectInfo, int, int]]:
    """The objects' blocks in order, forever (a reader takes the next one)."""

    def once() -> Iterator[tuple[ObjectInfo, int, int]]:
        for obj in objects:
            for start in range(0, obj.size, block):
                yield obj, start, min(start + block, obj.size)

    return itertools.chain.from_iterable(once() for _ in itertools.count())


async def _read(
    store: ObjectStore, obj: ObjectInfo, start: int, end: int, retry: RetryPolicy
) -> int:
    """Read ``obj[start:end]`` as the readers do; the bytes that came, checked to be those."""
    pieces = await retry.run(
        lambda: store.read_range_pieces(obj, start, end),
        describe=f"probe: reading {obj.url} bytes {start}-{end - 1}",
    )
    got = sum(len(piece) for piece in pieces)
    if got != end - start:
        raise StorageError(
            f"{obj.url}: a range read at offset {start} asked for {end - start} bytes and got "
            f"{got} (the object is listed as {obj.size} bytes)"
        )
    return got


async def _write_sweep(
    result: ProbeResult,
    store: ObjectStore,
    prefix: str,
    plan: ProbePlan,
    end: float,
    tell: Callable[[str], None],
) -> None:
    """Uploads against concurrency: one object of ``2 x concurrency`` parts per step, each
    removed once timed (also when the step fails)."""
    part = plan.part_bytes
    payload = (uuid.uuid4().bytes * (part // 16 + 1))[:part]
    best = 0.0
    levels = plan.concurrencies
    for number, concurrency in enumerate(levels):
        now = time.monotonic()
        if now >= end:
            result.notes.append("the time ran out before every upload step was measured")
            return
        if (concurrency + 1) * part > plan.memory_cap_bytes:
            result.notes.append(
                f"uploads stop before concurrency {concurrency}: the writer would hold "
                f"{concurrency + 1} x {_size(part)}, over the memory cap"
            )
            break
        tell(f"uploads: {concurrency} x {_size(part)}")
        url = f"{prefix}probe-{uuid.uuid4().hex[:12]}-{concurrency}.bin"
        context = SinkContext(part_bytes=part, max_concurrency=concurrency, retry=plan.retry)
        sink = store.open_sink(url, context)
        step_end = now + (end - now) / (len(levels) - number)
        began = time.monotonic()
        parts = 0
        try:
            # at least two parts per upload in flight, more while the step's time lasts
            while parts < 2 * concurrency or (
                parts < 64 * concurrency and time.monotonic() < step_end
            ):
                await sink.write(payload)
                parts += 1
            await sink.commit()
        except BaseException:
            await sink.abort()
            raise
        seconds = time.monotonic() - began
        await plan.retry.run(
            functools.partial(store.delete, url), describe=f"probe: removing {url}"
        )
        point = Point(concurrency, part, parts * part, seconds, parts)
        result.writes.append(point)
        if point.bytes_per_s < best * plan.growth:
            break
        best = max(best, point.bytes_per_s)


def recommend(result: ProbeResult) -> Recommendation:
    """Settings from what ``result`` measured.

    Reads: of the steps within ``1 / growth`` of the best throughput, the one holding the
    least in flight (``concurrency x block``, then fewer requests): its concurrency and block
    size; ``prefetch_bytes`` is ``concurrency x block`` (what keeps that many reads in flight:
    every block is reserved in the budget before it is asked for), at least two blocks, at
    most the memory cap. Uploads: the same choice among the upload steps when measured, else
    the read concurrency; parts as large as the read block, at least 5 MiB (S3's minimum),
    and ``(concurrency + 1) x part`` (the writer's memory) within the cap.
    """
    plan = result.plan
    cap = plan.memory_cap_bytes
    chosen = _cheapest_good(result.reads, plan.growth)
    if chosen is None:
        concurrency, block = 16, 4 * MIB  # open_dataset's defaults: nothing was measured
        expected = 0.0
        why = "Nothing could be read, so these are open_dataset's defaults."
    else:
        concurrency, block, expected = chosen.concurrency, chosen.block_bytes, chosen.bytes_per_s
        best = max(p.bytes_per_s for p in result.reads)
        why = (
            f"Reads: the best throughput measured was {_rate(best)}; {_reads(concurrency)} of "
            f"{_size(block)} in flight gave {_rate(expected)}, within {plan.growth:g}x of it "
            f"with the least memory in flight of the settings tried."
        )
    prefetch = min(cap, max(concurrency * block, 2 * block))
    why += (
        f" prefetch_bytes = max_concurrency x block_bytes = {_size(prefetch)} (each block is "
        "reserved in the prefetch budget before it is requested, so the budget is what lets "
        f"that many reads be in flight; capped at {_size(cap)})."
    )
    written = _cheapest_good(result.writes, plan.growth)
    if written is not None:
        writers, part = written.concurrency, written.block_bytes
        why += (
            f" Uploads (measured): {writers} part{'' if writers == 1 else 's'} of {_size(part)} "
            "in flight gave "
            f"{_rate(written.bytes_per_s)}."
        )
    else:
        part = max(S3_MIN_PART_BYTES, -(-block // MIB) * MIB)
        writers = concurrency
        why += (
            f" Uploads (not measured, from the reads: --write measures them): {writers} parts "
            f"in flight, parts as large as the read block and at least 5 MiB (S3's minimum)."
        )
    writers = max(1, min(writers, cap // part - 1))  # the writer holds (writers + 1) parts
    return Recommendation(concurrency, block, prefetch, writers, part, expected, why)


def _cheapest_good(points: Sequence[Point], growth: float) -> Point | None:
    """Of the points within ``1 / growth`` of the best, the one holding the least in flight."""
    if not points:
        return None
    best = max(p.bytes_per_s for p in points)
    good = [p for p in points if p.bytes_per_s * growth >= best]
    return min(good, key=lambda p: (p.concurrency * p.block_bytes, p.concurrency))


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << (shift - 4)) == 0:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} B"


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / MIB:.1f} MiB/s"


def _reads(n: int) -> str:
    return f"{n} read{'' if n == 1 else 's'}"
