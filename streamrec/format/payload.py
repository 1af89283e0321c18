"""Records read straight into their final ``bytes`` (sans-I/O): the header check, and the
payload being filled with its CRC continued step by step.

A reader that owns the I/O (:mod:`streamrec.storage.local.records`, reading a local file in worker
threads) walks the headers with :func:`read_header`; with the C accelerator it reads each
payload into an :func:`uninitialised` ``bytes`` object itself (the CRC kernel comes from
``_cframing``'s capsule). Its pure-Python twin reads into a :class:`PayloadBuffer`: each step
read into :attr:`PayloadBuffer.view`, :meth:`PayloadBuffer.add` right after it (the CRC reads
what is still in the cache), :meth:`PayloadBuffer.finish` to compare the footer.

:class:`RecordSpans` is a chunk of payloads left where they arrived: the pieces of the stream
and, per record, where in which piece its payload lies. A batch decoder reads them there (no
``bytes`` object per record); everything else sees a ``Sequence[bytes]``.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, overload

import crc32c as _crc32c_package
import numpy as np
import numpy.typing as npt

from streamrec.format.accel import load_accelerator
from streamrec.format.crc import BytesLike
from streamrec.format.framing_python import FOOTER_BYTES, HEADER_BYTES, mask

__all__ = [
    "FOOTER_BYTES",
    "HEADER_BYTES",
    "PayloadBuffer",
    "RecordRef",
    "RecordSpans",
    "read_header",
    "uninitialised",
]

_HEADER = struct.Struct("<QI")
_U32 = struct.Struct("<I")

_cframing = load_accelerator("_cframing")


def uninitialised(length: int) -> bytes:
    """A fresh ``bytes`` object of ``length`` bytes for a C reader to fill before anyone else
    sees it (C accelerator only; its bytes are undefined until filled)."""
    assert _cframing is not None
    payload: bytes = _cframing.new_payload(length)
    return payload


def read_header(header: BytesLike) -> int | None:
    """The payload length a 12-byte record header claims, or None when its length CRC does
    not match (the caller then leaves the record to the framing decoder, which says why)."""
    length, stored = _HEADER.unpack_from(header, 0)
    if mask(_crc32c_package.crc32c(memoryview(header)[:8])) != stored:
        return None
    return int(length)


class PayloadBuffer:
    """One record's payload being read into a buffer, its CRC continued per step (see the
    module docstring)."""

    __slots__ = ("_buffer", "_verify", "crc", "view")

    def __init__(self, length: int, verify: bool) -> None:
        self._verify = verify
        self.crc = 0
        self._buffer = bytearray(length)
        self.view = memoryview(self._buffer)

    def add(self, start: int, stop: int) -> None:
        """Bytes ``start:stop`` of the payload were just read into :attr:`view`: continue
        the CRC over them (no-op without verification)."""
        if self._verify:
            self.crc = _crc32c_package.crc32c(self.view[start:stop], self.crc)

    def finish(self, footer: BytesLike) -> bytes | None:
        """The payload as ``bytes`` when ``footer`` (the stored masked CRC) matches the bytes
        added (always without verification); None when it does not."""
        self.view.release()
        if self._verify and mask(self.crc) != _U32.unpack_from(footer, 0)[0]:
            return None
        return bytes(self._buffer)


Spans = npt.NDArray[np.int64]


class RecordRef(NamedTuple):
    """A record left in place: its buffer (the very object) and its payload's offset there."""

    buffer: bytes
    offset: int


class RecordSpans(Sequence[bytes]):
    """Payloads in place: record ``i`` is ``buffers[b][o : o + n]`` for
    ``(b, o, n) = spans[i]`` (an ``(n, 3)`` int64 array; buffers are immutable ``bytes``).

    A ``Sequence[bytes]``: indexing and iterating make each record's ``bytes`` (a copy) when
    asked, slicing gives another :class:`RecordSpans` over the same buffers. The buffers live
    as long as any chunk or slice referencing them (a slice keeps all its parent's buffers;
    :meth:`compact` drops those it does not reference).
    """

    __slots__ = ("buffers", "spans")

    def __init__(self, buffers: Sequence[bytes], spans: Spans) -> None:
        self.buffers = buffers
        self.spans = spans

    @classmethod
    def of_payloads(cls, payloads: Sequence[bytes]) -> RecordSpans:
        """``payloads`` (bytes objects) as spans, one buffer each."""
        n = len(payloads)
        spans = np.zeros((n, 3), dtype=np.int64)
        spans[:, 0] = np.arange(n)
        spans[:, 2] = [len(payload) for payload in payloads]
        return cls(list(payloads), spans)

    @classmethod
    def in_buffer(cls, buffer: bytes, rows: bytes) -> RecordSpans:
        """The records of one buffer from a scan's native int64 ``(0, offset, length)`` rows
        (used in place, read-only: spans are never written, only copied)."""
        return cls([buffer], np.frombuffer(rows, dtype=np.int64).reshape(-1, 3))

    @staticmethod
    def join(parts: Sequence[Sequence[bytes]]) -> RecordSpans:
        """The records of ``parts`` (RecordSpans or lists of bytes), in order, as one."""
        chunks = [p if isinstance(p, RecordSpans) else RecordSpans.of_payloads(p) for p in parts]
        chunks = [chunk for chunk in chunks if len(chunk)] or chunks[:1]
        if len(chunks) == 1:
            return chunks[0]
        buffers: list[bytes] = []
        where: dict[int, int] = {}  # id(buffer) -> its index in buffers (each buffer once)
        arrays: list[Spans] = []
        for chunk in chunks:
            moved = np.empty(len(chunk.buffers), dtype=np.int64)
            for k, buffer in enumerate(chunk.buffers):
                at = where.get(id(buffer))
                if at is None:
                    at = where[id(buffer)] = len(buffers)
                    buffers.append(buffer)
                moved[k] = at
            spans = chunk.spans.copy()
            spans[:, 0] = moved[spans[:, 0]]
            arrays.append(spans)
        return RecordSpans(buffers, np.concatenate(arrays))

    def compact(self) -> RecordSpans:
        """The same records, over only the buffers they reference (a remainder kept while
        the rest of its chunk is gone: the other buffers may be freed)."""
        if not len(self):
            return RecordSpans([], self.spans)
        first, last = int(self.spans[:, 0].min()), int(self.spans[:, 0].max())
        if first == 0 and last == len(self.buffers) - 1:
            return self
        spans = self.spans.copy()
        spans[:, 0] -= first
        return RecordSpans(self.buffers[first : last + 1], spans)

    def ref(self, index: int) -> RecordRef:
        """What names record ``index`` where it lies (its buffer, the very object, and
        offset), for :meth:`find` in a chunk this one was sliced or joined from."""
        b, o, _ = self.spans[index].tolist()
        return RecordRef(self.buffers[b], o)

    def find(self, ref: object) -> int | None:
        """The index of the record :meth:`ref` named (None: not one of these)."""
        if not isinstance(ref, RecordRef):
            return None
        for b, buffer in enumerate(self.buffers):
            if buffer is ref.buffer:
                hits = np.flatnonzero((self.spans[:, 0] == b) & (self.spans[:, 1] == ref.offset))
                if len(hits):
                    return int(hits[0])
        return None

    def framed_bytes(self) -> int:
        """What the records take framed (payloads plus 16 bytes each)."""
        return int(self.spans[:, 2].sum()) + 16 * len(self.spans)

    def shortest(self) -> int:
        """The shortest payload's length (``sys.maxsize``: no records)."""
        return int(self.spans[:, 2].min()) if len(self.spans) else sys.maxsize

    def __len__(self) -> int:
        return len(self.spans)

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> RecordSpans: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return RecordSpans(self.buffers, self.spans[index])
        b, o, n = self.spans[index].tolist()
        return self.buffers[b][o : o + n]

    def __iter__(self) -> Iterator[bytes]:
        buffers = self.buffers
        for b, o, n in self.spans.tolist():
            yield buffers[b][o : o + n]

    def __repr__(self) -> str:
        return f"RecordSpans({len(self)} records in {len(self.buffers)} buffers)"
