"""TFRecord framing: a record encoder and a sans-I/O record decoder.

One record on the wire (all integers little-endian)::

    uint64 length
    uint32 masked_crc32c(length bytes)
    byte   payload[length]
    uint32 masked_crc32c(payload)

:class:`RecordDecoder` follows h11's shape: the caller owns the I/O and feeds bytes, split at any
boundary, and gets back the complete records as ``bytes``. It never trusts a length before its
CRC has been checked and never allocates by a length read from the stream, so a damaged header
claiming 2**60 bytes costs nothing but the bytes actually fed; where the stream's end (or a
maximum record size) is known, such a header is an error at once.

The hot loop (framing many small records out of one buffer) runs in the optional C extension
``_cframing`` when it is built, and in its pure-Python twin
(:func:`streamrec.format.framing_python.scan`) otherwise; both have one contract.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

import crc32c as _crc32c_package

from streamrec.errors import CorruptRecordError, FormatError, TruncatedRecordError
from streamrec.format.accel import load_accelerator
from streamrec.format.crc import BytesLike, masked_crc32c
from streamrec.format.framing_python import BAD_LENGTH_CRC as _BAD_LENGTH_CRC
from streamrec.format.framing_python import NEED_MORE as _NEED_MORE
from streamrec.format.framing_python import ScanResult
from streamrec.format.framing_python import fill as _fill_python
from streamrec.format.framing_python import framed_bytes as _framed_bytes_python
from streamrec.format.framing_python import mask as _mask
from streamrec.format.framing_python import new_payload as _new_payload_python
from streamrec.format.framing_python import scan as _scan_python
from streamrec.format.identify import HEAD_BYTES, explain
from streamrec.format.payload import RecordSpans

__all__ = [
    "FOOTER_BYTES",
    "HEADER_BYTES",
    "OnCorrupt",
    "RecordDecoder",
    "Records",
    "RecordEncoder",
    "accelerated",
    "framed_bytes",
]

HEADER_BYTES = 12
FOOTER_BYTES = 4
OVERHEAD_BYTES = HEADER_BYTES + FOOTER_BYTES

OnCorrupt = Literal["raise", "skip"]

# A record at least this large is assembled from references to the fed chunks with one copy
# (into its payload object, CRC fused) instead of growing and shifting the pending buffer.
_BIG_RECORD_BYTES = 1 << 20
# Where the stream's end is known (an uncompressed object of known size), a record at least
# this large that does not end in the chunk its header came in is copied straight into its
# final payload object as its bytes arrive (allocated at its length, checked against the end
# first), its CRC computed in the same pass: one copy, no second pass over cold memory.
_DIRECT_RECORD_BYTES = 64 << 10
# Payloads at least this large are copied first and checked in the copy, cache-sized steps at a
# time, by three interleaved hardware CRC streams (C; by the crc32c package without SSE4.2);
# below it, one inline stream over the source beats the setup.
_LARGE_CRC_BYTES = 4096

_HEADER = struct.Struct("<QI")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


# (buf, start, verify, large_crc, large_threshold[, lengths_only]) -> ScanResult
ScanFunction = Callable[..., ScanResult]

Records = list[bytes] | RecordSpans
"""A chunk of payloads: ``bytes`` objects, or (a decoder's ``spans``) left in place."""


def _bytes_as_is(payload: bytes | bytearray) -> bytes:
    """The C path's payload object is already the final ``bytes``."""
    assert isinstance(payload, bytes)
    return payload


_cframing = load_accelerator("_cframing")
_scan: ScanFunction = _scan_python if _cframing is None else _cframing.scan
accelerated = _cframing is not None
# framed_bytes(records): what a sequence of payloads takes framed (the Take events' counts)
_framed_bytes: Callable[[Sequence[BytesLike]], int] = (
    _framed_bytes_python if _cframing is None else _cframing.framed_bytes
)


def framed_bytes(records: Sequence[BytesLike]) -> int:
    """What a sequence of payloads takes framed (payloads plus 16 bytes each)."""
    if type(records) is RecordSpans:
        return records.framed_bytes()
    return _framed_bytes(records)


def joined_all(parts: list[Records]) -> Records:
    """The records of ``parts``, in order (one list, or one :class:`RecordSpans`)."""
    parts = [part for part in parts if part]
    if len(parts) <= 1:
        return parts[0] if parts else []
    if all(type(part) is list for part in parts):
        return [record for part in parts for record in part]
    return RecordSpans.join(parts)


def joined(first: Records, second: Records) -> Records:
    """The records of ``first``, then ``second`` (one list, or one :class:`RecordSpans`)."""
    if not second:
        return first
    if not first:
        return second
    if type(first) is list and type(second) is list:
        return first + second
    return RecordSpans.join([first, second])


_new_payload: Callable[[int], bytes | bytearray]
_fill: Callable[[bytes | bytearray, int, BytesLike, int, bool], int]
_finish: Callable[[bytes | bytearray], bytes]
if _cframing is None:
    _new_payload, _fill, _finish = _new_payload_python, _fill_python, bytes  # type: ignore[assignment]
else:
    _new_payload, _fill, _finish = _cframing.new_payload, _cframing.fill, _bytes_as_is


class RecordEncoder:
    """Frame payloads as TFRecord records (byte-identical to ``tf.io.TFRecordWriter``)."""

    def __init__(self) -> None:
        # Header bytes depend only on the length; datasets repeat lengths a lot.
        self._headers: dict[int, bytes] = {}

    def header(self, length: int) -> bytes:
        """The 12-byte header for a payload of ``length`` bytes."""
        header = self._headers.get(length)
        if header is None:
            length_bytes = _U64.pack(length)
            header = length_bytes + _U32.pack(masked_crc32c(length_bytes))
            if len(self._headers) >= 4096:
                self._headers.clear()
            self._headers[length] = header
        return header

    def encode(self, payload: BytesLike) -> bytes:
        """One framed record."""
        return b"".join(self.encode_parts(payload))

    def encode_parts(self, payload: BytesLike) -> tuple[bytes, BytesLike, bytes]:
        """Header, payload and footer of one record, for writers that avoid copying payloads."""
        n = len(payload) if not isinstance(payload, memoryview) else payload.nbytes
        return self.header(n), payload, _U32.pack(masked_crc32c(payload))

    def encode_many(self, payloads: Iterable[BytesLike]) -> bytes:
        """Many framed records, concatenated."""
        parts: list[BytesLike] = []
        extend = parts.extend
        encode_parts = self.encode_parts
        for payload in payloads:
            extend(encode_parts(payload))
        return b"".join(parts)


class RecordDecoder:
    """Sans-I/O TFRecord decoder: ``feed(bytes) -> [payload, ...]``, then ``close()``.

    Chunks may be split at any byte. Records before a damaged one are always returned first:
    when a chunk holds good records and then damage, ``feed`` / ``close`` return the good ones
    and hold the error back; ``raise_pending()`` (or any later call) raises it. A driver::

        for chunk in chunks:
            yield decoder.feed(chunk)
            decoder.raise_pending()
        decoder.close()

    With ``on_corrupt="skip"`` a record whose payload CRC fails is dropped alone; damage that
    breaks the framing (a bad length CRC, a truncated record) drops the rest of the stream.
    Nothing is raised then; each drop is appended to :attr:`dropped` for the caller to log and
    count. ``verify_crc=False`` skips all CRC work (damage then shows up as truncation at best).

    ``spans=True`` (with the C accelerator; a no-op without): the records of a ``bytes`` chunk
    fed are returned in place, a :class:`~streamrec.format.payload.RecordSpans` over the chunk
    (CRCs checked as always), not copied into a ``bytes`` object each; a record assembled from
    several chunks is still its own ``bytes`` (a buffer of the spans of its own).

    ``offset`` in errors is the byte offset of the record's header in this (uncompressed)
    stream, counted from ``start_offset``; ``record_index`` counts from ``start_index``.

    No length is trusted beyond what is known. ``end_offset`` is where the stream ends (an
    uncompressed object's size): a header whose record cannot fit before it raises
    :class:`TruncatedRecordError` at once, before a byte is buffered for it.
    ``max_record_bytes`` caps a payload where the end is unknown (a compressed stream): a
    header claiming more raises :class:`FormatError` at once (the cap is checked when a record
    would be buffered: it does not end in the chunk its header came in). Either way, the bad
    length ends the stream, as a bad length CRC does. Chunks may be any buffer (items of any
    size: their bytes are framed, as in a ``bytes`` copy).
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        verify_crc: bool = True,
        on_corrupt: OnCorrupt = "raise",
        start_offset: int = 0,
        start_index: int = 0,
        end_offset: int | None = None,
        max_record_bytes: int | None = None,
        lengths_only: bool = False,
        spans: bool = False,
    ) -> None:
        if on_corrupt not in ("raise", "skip"):
            raise ValueError(f"on_corrupt must be 'raise' or 'skip', not {on_corrupt!r}")
        self.url = url
        # lengths_only: each good record's payload length goes to ``lengths`` (the scanner's
        # one array per call), no payload is copied and feed() returns [] (what an index needs)
        self.lengths: array[int] | None = array("q") if lengths_only else None
        self.verify_crc = verify_crc
        self.spans = spans and _cframing is not None and not lengths_only
        self.skip_corrupt = on_corrupt == "skip"
        self.dropped: list[FormatError] = []
        self.end_offset = end_offset
        self.max_record_bytes = max_record_bytes
        self._pending = bytearray()
        self._offset = start_offset  # stream offset of _pending[0] / of the next fed byte
        self._index = start_index  # index of the next record
        self._error: FormatError | None = None
        self._discarding = False  # skip mode, after the framing broke
        self._closed = False
        # A big record in progress: its size and the bytes of it seen (from its header on);
        # either the chunks holding it (collected by reference: the stream's end is unknown)
        # or, copied in as they arrive, its payload object, the CRC so far and its footer.
        self._big: list[memoryview] = []
        self._big_have = 0
        self._big_length = -1  # payload length; -1 when no big record is in progress
        self._big_payload: bytes | bytearray | None = None
        self._big_crc = 0
        self._big_footer = bytearray()

    @property
    def offset(self) -> int:
        """Stream offset of the first byte not yet returned as part of a record."""
        return self._offset

    @property
    def record_index(self) -> int:
        """Index of the next record to be returned (or dropped)."""
        return self._index

    @property
    def buffered_bytes(self) -> int:
        """Bytes fed but not yet returned: a partial record."""
        return len(self._pending) + self._big_have

    @property
    def failed(self) -> bool:
        """True when an error is pending: the next ``feed()`` / ``close()`` raises it."""
        return self._error is not None

    def raise_pending(self) -> None:
        """Raise the error held back while the records before it were delivered, if any."""
        if self._error is not None:
            raise self._error

    def abandon(self, error: FormatError) -> None:
        """Give up on the rest of the stream after ``error`` (``on_corrupt="skip"``)."""
        self.dropped.append(error)
        self._pending.clear()
        self._big, self._big_payload = [], None
        self._discarding = True

    def feed(self, data: BytesLike) -> Records:
        """Add bytes; return every record they complete, in order.

        Raises a FormatError only when no record comes before the damage; otherwise the
        records are returned and the error is held back (see :meth:`raise_pending`).
        """
        if self._error is not None:
            raise self._error
        if self._closed:
            raise RuntimeError("feed() after close()")
        records = self._feed(data if isinstance(data, bytes) else _byte_buffer(data))
        if not records and self._error is not None:
            raise self._error
        return records

    def _feed(self, data: BytesLike) -> Records:
        """:meth:`feed` without raising: damage is held in ``_error`` (or dropped, in skip)."""
        if self._discarding or not data:
            return []
        if self._big_length >= 0:
            return self._feed_big(data)
        records: list[bytes] = []
        start = 0
        if self._pending:
            records, start = self._complete_pending(data)
            if start >= len(data) or self._discarding or self._error is not None:
                return records
            if self._big_length >= 0:  # (copied at once when its payload is allocated)
                rest = memoryview(data)[start:] if self._big_payload is not None else None
                return joined(records, self._feed_big(rest or _stable_view(data, start)))
        more, pos = self._frame(data, start)
        self._keep_tail(data, start, pos)
        return joined(records, more)

    def close(self) -> None:
        """Declare the end of the stream; raise TruncatedRecordError if it ends mid-record."""
        if self._error is not None:
            raise self._error
        self._closed = True
        if self._discarding or not (self._pending or self._big_have):
            return
        error = self._truncation_error()
        if self.skip_corrupt:
            self.abandon(error)
            return
        self._pending.clear()
        self._error = error
        raise error

    def _complete_pending(self, data: BytesLike) -> tuple[list[bytes], int]:
        """Finish the record that straddles into ``data``, taking only the bytes it needs.

        Returns the records completed and how many bytes of ``data`` were taken; the rest of
        ``data`` is then scanned in place, not copied behind the pending bytes.
        """
        view = memoryview(data)
        taken = 0
        records: list[bytes] = []
        while True:
            have = len(self._pending)
            if have < HEADER_BYTES:
                want = HEADER_BYTES - have
            else:  # a header the scanner has already checked
                (length,) = _U64.unpack_from(self._pending, 0)
                want = length + OVERHEAD_BYTES - have
            piece = view[taken : taken + want]
            self._pending += piece
            taken += len(piece)
            if len(self._pending) < HEADER_BYTES:
                return records, taken
            more, pos = self._frame(self._pending, 0)
            assert type(more) is list  # (a bytearray's records are always copied out)
            records += more
            self._keep_tail(self._pending, 0, pos)
            if (
                not self._pending
                or self._big_length >= 0
                or self._discarding
                or self._error is not None
                or taken >= len(view)
            ):
                return records, taken

    def _scan(self, buf: BytesLike, start: int) -> tuple[Records, int, int, int, int]:
        """The scanner on ``buf[start:]``; its records counted (lengths_only: kept)."""
        if self.spans and type(buf) is bytes:  # immutable: its records may stay in it
            rows, pos, status, stored, computed = _scan(
                buf, start, self.verify_crc, None, _LARGE_CRC_BYTES, 3
            )
            self._index += len(rows) // 24
            return RecordSpans.in_buffer(buf, rows), pos, status, stored, computed
        if self.lengths is None:
            result = _scan(buf, start, self.verify_crc, _crc32c_package.crc32c, _LARGE_CRC_BYTES)
            self._index += len(result[0])
            return result
        got, pos, status, stored, computed = _scan(
            buf, start, self.verify_crc, _crc32c_package.crc32c, _LARGE_CRC_BYTES, True
        )
        self.lengths.frombytes(got)
        self._index += len(got) // 8
        return [], pos, status, stored, computed

    def _frame(self, buf: BytesLike, start: int) -> tuple[Records, int]:
        """Scan ``buf[start:]``; handle damage; return the records and where framing stopped."""
        records, pos, status, stored, computed = self._scan(buf, start)
        if status == _NEED_MORE:
            return records, pos
        # (damage: the parts between dropped records are joined once, at the end: joining
        # each to all before it would cost quadratic time in a shard of many bad records)
        parts = [records]
        while status != _NEED_MORE:
            which = "length" if status == _BAD_LENGTH_CRC else "payload"
            error = self._corrupt(which, stored, computed, self._offset + pos - start)
            if status == _BAD_LENGTH_CRC and error.offset == 0:  # the file's very first bytes
                explain(error, buf[pos : pos + HEAD_BYTES])
            if not self.skip_corrupt:
                self._discarding = True
                self._error = error  # held: the good records are delivered first
                return joined_all(parts), len(buf)
            if status == _BAD_LENGTH_CRC:
                self.abandon(error)
                return joined_all(parts), len(buf)
            self.dropped.append(error)
            # A bad payload under a good header: drop just this record and go on.
            (length,) = _U64.unpack_from(buf, pos)
            self._index += 1
            more, pos, status, stored, computed = self._scan(buf, pos + OVERHEAD_BYTES + length)
            parts.append(more)
        return joined_all(parts), pos

    def _keep_tail(self, buf: BytesLike, start: int, pos: int) -> None:
        """Keep ``buf[pos:]`` (a partial record) for the next feed."""
        self._offset += pos - start
        tail = len(buf) - pos
        if not self._discarding and self._error is None and tail >= HEADER_BYTES:
            # The scanner stopped at a complete header (its CRC already checked): a length
            # that cannot be is refused before any byte is buffered for it, and a big record
            # is collected by reference rather than copied into the pending buffer.
            (length,) = _U64.unpack_from(buf, pos)
            refused = self._refuse_length(length)
            if refused is not None:
                self._pending.clear()
                self._damaged(refused)
                return
            if self.end_offset is not None and length + OVERHEAD_BYTES >= _DIRECT_RECORD_BYTES:
                # allocated at its length, which _refuse_length checked against the end
                self._big_payload = _new_payload(length)
                self._big_crc, self._big_have, self._big_length = 0, 0, length
                with memoryview(buf) as view:
                    self._fill_direct(view[pos:])
                self._pending.clear()
                return
            if length + OVERHEAD_BYTES >= _BIG_RECORD_BYTES:
                piece = _stable_view(buf, pos)
                self._pending.clear()
                self._big, self._big_have, self._big_length = [piece], tail, length
                return
        if buf is self._pending:
            del self._pending[:pos]
        elif tail:
            self._pending += memoryview(buf)[pos:]

    def _fill_direct(self, data: memoryview) -> int:
        """Copy the big record's bytes at the start of ``data`` into its payload object (CRC
        fused with the copy) and footer; return how many bytes of ``data`` it took."""
        assert self._big_payload is not None
        length, have = self._big_length, self._big_have
        take = min(len(data), length + OVERHEAD_BYTES - have)
        payload_end = HEADER_BYTES + length
        first, last = max(have, HEADER_BYTES), min(have + take, payload_end)
        if last > first:  # (the header's bytes were checked by the scanner: skipped)
            self._big_crc = _fill(
                self._big_payload,
                first - HEADER_BYTES,
                data[first - have : last - have],
                self._big_crc,
                self.verify_crc,
            )
        if have + take > payload_end:
            self._big_footer += data[max(payload_end - have, 0) : take]
        self._big_have = have + take
        return take

    def _feed_big(self, data: BytesLike) -> Records:
        """Add a chunk to the big record in progress; once it is complete, check it and go on
        framing what follows it in the chunk."""
        length = self._big_length
        total = length + OVERHEAD_BYTES
        if self._big_payload is not None:
            view = memoryview(data)
            taken = self._fill_direct(view)
            if self._big_have < total:
                return []
            crc, footer = self._big_crc, bytes(self._big_footer)
            payload = _finish(self._big_payload)
            rest: BytesLike = view[taken:]
        else:
            self._big.append(_stable_view(data, 0))
            self._big_have += len(self._big[-1])
            if self._big_have < total:
                return []
            # One copy into the payload object, the CRC computed as the bytes are copied.
            built = _new_payload(length)
            crc, at = 0, 0
            for piece in _slices(self._big, HEADER_BYTES, HEADER_BYTES + length):
                crc = _fill(built, at, piece, crc, self.verify_crc)
                at += len(piece)
            payload = _finish(built)
            footer = b"".join(_slices(self._big, HEADER_BYTES + length, total))
            # The record ends inside the last piece (the ones before it fell short): what
            # follows it is a view of that piece, not a copy.
            last = self._big[-1]
            rest = last[len(last) - (self._big_have - total) :]
        self._big, self._big_have, self._big_length = [], 0, -1
        self._big_payload, self._big_crc, self._big_footer = None, 0, bytearray()
        records: list[bytes] = []
        stored = _U32.unpack(footer)[0]
        computed = _mask(crc) if self.verify_crc else stored
        if computed == stored and self.lengths is not None:
            self.lengths.append(length)
        elif computed == stored:
            records.append(payload)
        else:
            error = self._corrupt("payload", stored, computed, self._offset)
            if not self.skip_corrupt:
                self._damaged(error)
                return records
            self.dropped.append(error)
        self._offset += total
        self._index += 1
        return joined(records, self._feed(rest)) if rest else records

    def _damaged(self, error: FormatError) -> None:
        """Damage that ends the stream: held back (raise mode) or dropped with the rest."""
        if self.skip_corrupt:
            self.abandon(error)
        else:
            self._discarding = True
            self._error = error

    def _refuse_length(self, length: int) -> FormatError | None:
        """The error for a record header claiming ``length`` bytes that cannot be there."""
        end = self.end_offset
        if end is not None and self._offset + length + OVERHEAD_BYTES > end:
            # the object ends inside this record: say so now, as close() would at its end
            return self._truncation_error(max(end - self._offset, HEADER_BYTES), length)
        if self.max_record_bytes is not None and length > self.max_record_bytes:
            return FormatError(
                f"the header claims a {length}-byte payload, more than the "
                f"{self.max_record_bytes} bytes a record of this stream may have",
                url=self.url,
                offset=self._offset,
                record_index=self._index,
            )
        return None

    def _corrupt(self, which: str, stored: int, computed: int, offset: int) -> CorruptRecordError:
        return CorruptRecordError(
            which, stored, computed, url=self.url, offset=offset, record_index=self._index
        )

    def _truncation_error(self, have: int | None = None, length: int = -1) -> TruncatedRecordError:
        """The stream ends ``have`` bytes into the record at ``_offset`` (default: buffered)."""
        if have is None:
            have = self.buffered_bytes
        if have < HEADER_BYTES:
            problem = f"stream ends inside a record header ({have} of {HEADER_BYTES} bytes)"
        else:
            if length < 0:
                length = self._big_length
            if length < 0:
                (length,) = _U64.unpack_from(self._pending, 0)
            body = have - HEADER_BYTES
            if body <= length:
                problem = f"stream ends inside a payload ({body} of {length} bytes)"
            else:
                got = body - length
                problem = f"stream ends inside a payload CRC ({got} of {FOOTER_BYTES} bytes)"
        error = TruncatedRecordError(
            problem, url=self.url, offset=self._offset, record_index=self._index
        )
        if self._offset == 0 and have < HEADER_BYTES:  # too short for even one header
            explain(error, self._pending)
        return error


def _byte_buffer(data: BytesLike) -> BytesLike:
    """``data`` as one flat run of bytes (``len`` and slices count bytes, not items)."""
    if isinstance(data, bytearray):
        return data
    view = memoryview(data)
    if view.ndim == 1 and view.itemsize == 1:
        return data
    return view.cast("B") if view.c_contiguous else view.tobytes()


def _stable_view(data: BytesLike, start: int) -> memoryview:
    """A view of ``data[start:]`` that stays valid: a view of immutable bytes, else a copy."""
    if isinstance(data, bytes):
        return memoryview(data)[start:]
    if isinstance(data, memoryview) and isinstance(data.obj, bytes):
        return data[start:]
    return memoryview(bytes(memoryview(data)[start:]))


def _slices(pieces: list[memoryview], start: int, stop: int) -> list[memoryview]:
    """Views of bytes ``start:stop`` of the concatenation of ``pieces`` (no copying)."""
    views: list[memoryview] = []
    position = 0
    for piece in pieces:
        end = position + len(piece)
        if end > start and position < stop:
            views.append(piece[max(start - position, 0) : min(stop, end) - position])
        position = end
        if position >= stop:
            break
    return views
