"""Large records of a local file read straight into their final ``bytes`` (blocking: called
from worker threads by :mod:`streamrec.pipeline.stream.direct`).

:func:`walk` reads record headers from one to the next (the next header's offset is known as
soon as one header is read) and lists the clean large records; :func:`read_records` reads
consecutive walked records, each payload by ``pread`` straight into its final object in
:data:`STEP_BYTES` steps, each step's CRC32C computed right after it was read (still in the
cache), then its footer. With the C extension ``streamrec.storage._cread`` both run with the
GIL released throughout (the CRC kernel is the format core's, through its capsule); without it
(no compiler, ``STREAMREC_PURE_PYTHON=1``) the same contract runs in Python, on
:class:`~streamrec.format.payload.PayloadBuffer` and ``os.preadv``.

Nothing here raises for what the file holds: a record that is not a clean large one ends the
walk or the read, and the block path reads it (and says what is wrong with it).
"""

from __future__ import annotations

import sys
import threading
from array import array
from collections.abc import Callable

from streamrec.format.accel import load_accelerator
from streamrec.format.framing import OVERHEAD_BYTES
from streamrec.format.payload import (
    FOOTER_BYTES,
    HEADER_BYTES,
    PayloadBuffer,
    read_header,
    uninitialised,
)
from streamrec.storage.local.store import LocalFile

__all__ = [
    "END",
    "HANDOFF",
    "MORE",
    "PURE_MIN_RECORD_BYTES",
    "STEP_BYTES",
    "PayloadPool",
    "Pooled",
    "Plan",
    "Stop",
    "min_record_bytes",
    "payload_pool",
    "read_records",
    "walk",
]

STEP_BYTES = 1 << 20
"""Bytes read into a payload at a time before their CRC is computed (well within a core's L2,
4 MiB on the machine measured)."""

# walk()'s stop reasons: listed enough, reached the end exactly, found what the block path reads
MORE, END, HANDOFF = 0, 1, 2

Plan = tuple[int, int]  # (header offset, payload length) of one walked record

PURE_MIN_RECORD_BYTES = 1 << 20
"""The smallest record (framing included) the pure-Python twin reads directly: it walks and
reads record by record in Python, holding the GIL in between, and copies each payload once more;
below this the block path is faster (measured: 100 KiB records at 0.6x of the block path,
10 MiB at 1.3x)."""

_cread = load_accelerator("_cread", "streamrec.storage")


def min_record_bytes(threshold: int) -> int:
    """The smallest record read directly, given the caller's ``threshold`` for the C path."""
    return threshold if _cread is not None else max(threshold, PURE_MIN_RECORD_BYTES)


class Stop:
    """Set by the loop thread on close: reads stop at their next step."""

    def __init__(self) -> None:
        self.flag = bytearray(1)

    def set(self) -> None:
        self.flag[0] = 1

    @property
    def stopped(self) -> bool:
        return bool(self.flag[0])


class PayloadPool:
    """Payload objects their last user handed back (:meth:`give`), for the next reads of the
    same length (:meth:`take`): a reader of large records whose consumer lets go of each one
    (``record_views``) writes into memory already mapped and warm, not a fresh allocation per
    record. At most ``max_bytes`` wait here; thread-safe (reading threads take, whoever drops
    the last view gives). The C reader checks that nobody else holds what it writes into."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.reused = 0  # payloads taken from the pool (a counter for tests and benchmarks)
        self._free: dict[int, list[bytes]] = {}
        self._bytes = 0
        # reentrant: a collection inside the lock may free a view whose release gives here
        self._lock = threading.RLock()

    def take(self, length: int) -> bytes:
        """A payload of ``length`` bytes (undefined content) only the caller holds."""
        with self._lock:
            free = self._free.get(length)
            while free:
                payload = free.pop()
                self._bytes -= length
                # (this frame and getrefcount's argument: anyone else's, and it is not ours)
                if sys.getrefcount(payload) == 2:
                    self.reused += 1
                    return payload
        return uninitialised(length)

    def give(self, payload: bytes) -> None:
        """``payload`` is no longer used by whoever had it: keep it if there is room."""
        with self._lock:
            if self._bytes + len(payload) <= self.max_bytes:
                self._free.setdefault(len(payload), []).append(payload)
                self._bytes += len(payload)


def payload_pool(max_bytes: int) -> PayloadPool | None:
    """A :class:`PayloadPool` of at most ``max_bytes`` where reads reuse payloads (the C
    reader); None in the pure-Python build (it copies each payload out of its own buffer)."""
    return PayloadPool(max_bytes) if _cread is not None else None


class Pooled(list[bytes]):
    """Payloads read into ``pool``'s objects: a consumer done with them may :meth:`PayloadPool.
    give` them back (a list like any other to everyone else)."""

    pool: PayloadPool | None = None


def walk(
    file: LocalFile,
    offset: int,
    end: int,
    *,
    min_record_bytes: int,
    max_records: int,
    max_bytes: int,
) -> tuple[list[Plan], int, int]:
    """The clean large records from the header at ``offset`` on (at most ``max_records``,
    about ``max_bytes``), where the walk stopped and why (:data:`MORE`, :data:`END` or
    :data:`HANDOFF`: the record at the returned offset is small, damaged or cut short)."""
    if _cread is not None:
        try:
            packed, offset, status = _cread.walk(
                file.fd, offset, end, min_record_bytes, max_records, max_bytes
            )
        except OSError:
            return [], offset, HANDOFF  # the block path reads it (retried, translated)
        flat = array("q", packed)
        return list(zip(flat[0::2], flat[1::2], strict=True)), offset, status
    plans: list[Plan] = []
    header = bytearray(HEADER_BYTES)
    view = memoryview(header)
    total = 0
    while len(plans) < max_records and total < max_bytes:
        if offset == end:
            return plans, offset, END
        length = None
        if file.read_into([view], offset) == HEADER_BYTES:
            length = read_header(header)
        size = -1 if length is None else length + OVERHEAD_BYTES
        if length is None or size < min_record_bytes or size > end - offset:
            return plans, offset, HANDOFF
        plans.append((offset, length))
        offset += size
        total += size
    return plans, offset, MORE


def read_records(
    file: LocalFile, plans: list[Plan], verify: bool, stop: Stop, pool: PayloadPool | None = None
) -> tuple[list[bytes], int]:
    """The payloads of ``plans`` (consecutive walked records) read into their final objects
    (``pool``'s where it has some, C build); with how many were read: fewer than
    ``len(plans)`` when a CRC does not match or the file was short (the block path reads that
    record next)."""
    if _cread is not None:
        new: Callable[[int], bytes] = uninitialised if pool is None else pool.take
        payloads = [new(length) for _, length in plans]
        try:
            _, clean = _cread.read(file.fd, plans[0][0], payloads, verify, STEP_BYTES, stop.flag)
        except OSError:
            return [], 0  # the block path reads it (retried, translated)
        del payloads[clean:]
        return payloads, clean
    records: list[bytes] = []
    footer = bytearray(FOOTER_BYTES)
    for offset, length in plans:
        payload = _read_payload(file, offset, length, verify, memoryview(footer), stop)
        if payload is None:
            break
        records.append(payload)
    return records, len(records)


def _read_payload(
    file: LocalFile, offset: int, length: int, verify: bool, footer: memoryview, stop: Stop
) -> bytes | None:
    buffer = PayloadBuffer(length, verify)
    view = buffer.view
    at = 0
    start = offset + HEADER_BYTES
    while True:
        if stop.stopped:
            return None
        step = min(STEP_BYTES, length - at)
        last = at + step >= length
        parts = [view[at : at + step], footer] if last else [view[at : at + step]]
        want = step + FOOTER_BYTES if last else step
        if file.read_into(parts, start + at) < want:
            return None  # the file shrank under us: the block path says how
        buffer.add(at, at + step)
        at += step
        if last:
            return buffer.finish(footer)
