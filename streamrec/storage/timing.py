"""Requests counted for the dataset that sent them, without passing a counter down every call.

A dataset's iteration (and its listing, and :meth:`~streamrec.pipeline.dataset.Dataset.
shards`) runs under :func:`recording`: a :class:`contextvars.ContextVar` names its counters,
and every task started meanwhile inherits it (asyncio copies the context into each new
task). The stores tell it what only they see, through the functions below, which do nothing
when no dataset is recording (a writer, a CLI command, a store used on its own):

* :func:`first_byte`: a range read of a shard was answered: the seconds from asking (a new
  connection's set-up included) to the answer's headers, the latency part of the read;
* :func:`listed_page`: one page of a listing came back (retries of a page count once);
* :func:`metadata_read`: a read of a manifest, an index sidecar, the dataset index or a
  shard's first bytes (its compression) is counted as one metadata request, and the first
  byte of the range reads it makes is not counted as a shard read's.

Reads in worker threads (local files) send no request: nothing to count there.

:func:`read_probe` also hands one range read's first-byte time to its caller (the read-ahead
tuner, :mod:`streamrec.pipeline.stream.tune`, learns the link's round trip from it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol, TypeVar

__all__ = [
    "ReadProbe",
    "Recorder",
    "first_byte",
    "listed_page",
    "metadata_read",
    "read_probe",
    "recorded",
    "recording",
]

T = TypeVar("T")


class Recorder(Protocol):
    """The counters the stores add to (:class:`~streamrec.pipeline.stats.Stats` has them)."""

    first_byte_s: float
    list_requests: int
    metadata_requests: int


_RECORDER: ContextVar[Recorder | None] = ContextVar("streamrec_recorder", default=None)
_METADATA: ContextVar[bool] = ContextVar("streamrec_metadata", default=False)


class ReadProbe:
    """What one range read's answer told (see :func:`read_probe`)."""

    __slots__ = ("first_byte_s",)

    def __init__(self) -> None:
        self.first_byte_s: float | None = None
        """Seconds from asking to the answer's headers (the last attempt's; ``None``: the
        store did not say, e.g. a local file)."""


_PROBE: ContextVar[ReadProbe | None] = ContextVar("streamrec_read_probe", default=None)


@contextmanager
def read_probe() -> Iterator[ReadProbe]:
    """The first-byte time of the range reads sent inside the block (in this task), in the
    :class:`ReadProbe` yielded."""
    probe = ReadProbe()
    token = _PROBE.set(probe)
    try:
        yield probe
    finally:
        _PROBE.reset(token)


@contextmanager
def recording(recorder: Recorder) -> Iterator[None]:
    """Count the requests sent inside the block (and by the tasks it starts) in ``recorder``.
    Entered and left in one task, between two awaits of it (never across a yield)."""
    token = _RECORDER.set(recorder)
    try:
        yield
    finally:
        _RECORDER.reset(token)


async def recorded(recorder: Recorder, work: Awaitable[T]) -> T:
    """``await work`` under :func:`recording` (a coroutine to hand to another loop's task)."""
    with recording(recorder):
        return await work


def first_byte(seconds: float) -> None:
    """A range read's answer began ``seconds`` after it was asked for."""
    recorder = _RECORDER.get()
    if recorder is not None and not _METADATA.get():
        recorder.first_byte_s += seconds
    probe = _PROBE.get()
    if probe is not None:
        probe.first_byte_s = seconds


def listed_page() -> None:
    """One listing page came back."""
    recorder = _RECORDER.get()
    if recorder is not None:
        recorder.list_requests += 1


async def metadata_read(read: Awaitable[T]) -> T:
    """``await read``, counted as one metadata request (its range reads are not shard reads)."""
    recorder = _RECORDER.get()
    if recorder is None:
        return await read
    recorder.metadata_requests += 1
    token = _METADATA.set(True)
    try:
        return await read
    finally:
        _METADATA.reset(token)
