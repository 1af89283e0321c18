"""The records of one span of an indexed shard: random access without reading from the start;
which records one range read covers (:func:`coalesce`).

A *span* is a byte range of a shard as stored that holds consecutive records, found with the
shard's index (:mod:`~streamrec.format.index.core`):

* uncompressed: from the first record's offset to the last record's end;
* compressed (an extended index): from the first record's restart point (a deflate full-flush
  point, or the stream's start at offset 0) to the next restart point after the last record's
  (or the object's end). Inflating starts there (raw deflate, or the codec's own header at
  offset 0) and the first ``skip`` uncompressed bytes are dropped.

:class:`SpanDecoder` is fed the span's bytes and returns its records, CRC-checked. The index is
untrusted: every record must frame exactly where and as long as the index says
(:class:`~streamrec.errors.IndexMismatchError`, a ``FormatError``, naming the shard and the
offset otherwise; a bad CRC is a ``CorruptRecordError`` as in any read),
and it never inflates more than the index's records need (what a span costs in memory is
known before it is read), :data:`PIECE_BYTES` at a time: each piece is framed (and a record
that does not match the index refused) before the next is inflated.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from streamrec.errors import CompressionError, FormatError, IndexMismatchError
from streamrec.format.codecs import Compression
from streamrec.format.crc import BytesLike
from streamrec.format.framing import OVERHEAD_BYTES, RecordDecoder

__all__ = ["SpanDecoder", "coalesce"]

PIECE_BYTES = 1 << 20
"""Uncompressed bytes inflated (and framed) at a time."""
Int64Array = npt.NDArray[np.int64]
_WBITS = {"gzip": 31, "zlib": 15}
_RAW_DEFLATE = -15


class Inflater(Protocol):
    """What the decoder uses of a ``zlib.decompressobj()`` (zlib names its type only
    privately)."""

    @property
    def unconsumed_tail(self) -> bytes:
        """Input held back by a ``max_length`` cut, to be fed again."""
        ...

    @property
    def eof(self) -> bool:
        """Whether the end of the compressed stream was reached."""
        ...

    def decompress(self, data: bytes, max_length: int = 0, /) -> bytes:
        """Up to ``max_length`` bytes (0: no limit) inflated from ``data``."""
        ...


class SpanDecoder:
    """Bytes of one span -> its records (sans-I/O).

    ``lengths``: the framed lengths of the span's records by the index; the first starts at
    stream ``offset`` and is record ``index`` of the shard. Compressed spans start at a restart
    point: ``at_stream_start`` (restart point 0: the codec's header comes first) or raw
    deflate; ``skip`` uncompressed bytes come before the first record.
    """

    def __init__(
        self,
        *,
        url: str,
        compression: Compression,
        lengths: Sequence[int],
        offset: int,
        index: int,
        skip: int = 0,
        at_stream_start: bool = False,
        verify_crc: bool = True,
    ) -> None:
        self.url = url
        self._lengths = [int(n) for n in lengths]
        # a header claiming more than the index's longest record here is refused before a
        # byte is buffered for it
        self._framing = RecordDecoder(
            url=url,
            verify_crc=verify_crc,
            start_offset=offset,
            start_index=index,
            max_record_bytes=max(self._lengths, default=OVERHEAD_BYTES) - OVERHEAD_BYTES,
        )
        self._inflater: Inflater | None = None
        if compression is not None:
            wbits = _WBITS[compression] if at_stream_start else _RAW_DEFLATE
            self._inflater = zlib.decompressobj(wbits)
        self._skip = skip
        # uncompressed bytes still wanted: the skipped prefix and the records
        self._wanted = skip + sum(self._lengths)
        self._records: list[bytes] = []
        self._consumed = 0  # stored bytes fed

    @property
    def done(self) -> bool:
        """True once every record of the span is decoded."""
        return len(self._records) == len(self._lengths)

    @property
    def records(self) -> list[bytes]:
        """The records decoded so far."""
        return self._records

    def feed(self, data: BytesLike) -> None:
        """Add the span's next stored bytes."""
        if self.done:
            return
        self._consumed += len(data)
        if self._inflater is None:
            self._frame(bytes(data))
            return
        pending = bytes(data)
        while self._wanted > 0:
            try:
                # a bounded piece at a time: what the index claims is not trusted to size one
                out = self._inflater.decompress(pending, min(self._wanted, PIECE_BYTES))
            except zlib.error as exc:
                raise CompressionError(
                    f"cannot inflate the span at its restart point ({exc}): the index does not "
                    "match the shard",
                    url=self.url,
                ) from exc
            pending = self._inflater.unconsumed_tail
            if not out and not pending:
                break  # everything fed is inflated
            self._wanted -= len(out)
            if self._skip:
                cut = min(self._skip, len(out))
                out, self._skip = out[cut:], self._skip - cut
            if out:
                self._frame(out)
            if self._inflater.eof:
                break

    def _frame(self, data: bytes) -> None:
        before = len(self._records)
        try:
            records = self._framing.feed(data)
            self._framing.raise_pending()
        except FormatError as exc:
            if type(exc) is not FormatError:  # a CRC, a truncation: the shard's own damage
                raise
            raise IndexMismatchError(
                f"{exc.problem} (the record index says at most {max(self._lengths)} framed "
                "bytes): the index does not match the shard",
                url=self.url,
                offset=exc.offset,
            ) from exc
        for k, record in enumerate(records, start=before):
            if k >= len(self._lengths) or len(record) + OVERHEAD_BYTES != self._lengths[k]:
                expected = self._lengths[k] if k < len(self._lengths) else "no record"
                raise IndexMismatchError(
                    f"the record index says {expected} framed bytes here, the shard has a record "
                    f"of {len(record) + OVERHEAD_BYTES}: the index does not match the shard",
                    url=self.url,
                    offset=self._framing.offset,
                )
            self._records.append(record)

    def close(self) -> list[bytes]:
        """The span's records; IndexMismatchError when its bytes ended before all of them."""
        if not self.done:
            raise IndexMismatchError(
                f"the span ends after {len(self._records)} of its {len(self._lengths)} records "
                f"({self._consumed} stored bytes): the index does not match the shard",
                url=self.url,
                offset=self._framing.offset,
            )
        return self._records


def coalesce(
    starts: Int64Array,
    ends: Int64Array,
    *,
    gap_bytes: int,
    span_bytes: int,
    inflated: tuple[Int64Array, Int64Array] | None = None,
    max_amplification: float | None = None,
) -> list[tuple[int, int]]:
    """Runs ``(k, j)`` of the byte ranges ``starts[i] .. ends[i]`` (sorted by start, ends
    never going backwards) that one range read each covers: records ``k .. j-1``, cut where
    the gap between neighbours exceeds ``gap_bytes`` or a run would cover more than
    ``span_bytes`` (a lone range may); with ``inflated`` (the ranges' uncompressed
    ``(starts, ends)``, likewise sorted), also more than ``span_bytes`` of those. Vectorised:
    a Python step per run, not per range.

    With ``max_amplification`` (>= 1), a gap is bridged only while the run's bytes stay
    within ``max_amplification`` times the bytes its ranges cover: ranges that touch or
    overlap are joined first (they cost nothing extra), then each such block joins the run
    before it if the gap allows and the run, with it, still keeps the ratio. Every run keeps
    it (a lone block's ratio is 1), so all of them fetch at most that many times the bytes of
    the ranges' union, for any input, but one: records sharing one compressed restart block
    that alone exceeds ``span_bytes`` (stored or inflated) are cut into several runs for
    memory's sake, and each reads that block again."""
    if max_amplification is None:
        return _runs(starts, ends, gap_bytes, span_bytes, inflated)
    if not max_amplification >= 1.0:
        raise ValueError(f"max_amplification must be >= 1, not {max_amplification!r}")
    blocks = _runs(starts, ends, 0, span_bytes, inflated)  # touching ranges: gapless extents
    if len(blocks) < 2:
        return blocks
    firsts = np.fromiter((k for k, _ in blocks), dtype=np.int64, count=len(blocks))
    lasts = np.fromiter((j - 1 for _, j in blocks), dtype=np.int64, count=len(blocks))
    begin, finish = starts[firsts].tolist(), ends[lasts].tolist()
    out_begin = out_finish = None
    if inflated is not None:
        out_begin, out_finish = inflated[0][firsts].tolist(), inflated[1][lasts].tolist()
    runs: list[tuple[int, int]] = []
    k, j = blocks[0]
    run_start, run_end, covered = begin[0], finish[0], finish[0] - begin[0]
    out_start = out_begin[0] if out_begin is not None else 0
    for b in range(1, len(blocks)):
        size = finish[b] - begin[b]
        extent = finish[b] - run_start
        joins = (
            begin[b] - run_end <= gap_bytes
            and extent <= span_bytes
            and extent <= max_amplification * (covered + size)
            and (out_finish is None or out_finish[b] - out_start <= span_bytes)
        )
        if joins:
            j, run_end, covered = blocks[b][1], finish[b], covered + size
            continue
        runs.append((k, j))
        k, j = blocks[b]
        run_start, run_end, covered = begin[b], finish[b], size
        out_start = out_begin[b] if out_begin is not None else 0
    runs.append((k, j))
    return runs


def _runs(
    starts: Int64Array,
    ends: Int64Array,
    gap_bytes: int,
    span_bytes: int,
    inflated: tuple[Int64Array, Int64Array] | None,
) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    cuts = np.flatnonzero(starts[1:] - ends[:-1] > gap_bytes) + 1
    for low, high in itertools.pairwise([0, *cuts.tolist(), len(starts)]):
        k = low
        while k < high:
            fit = int(np.searchsorted(ends[k:high], starts[k] + span_bytes, side="right"))
            if inflated is not None:
                out_starts, out_ends = inflated
                limit = out_starts[k] + span_bytes
                fit = min(fit, int(np.searchsorted(out_ends[k:high], limit, side="right")))
            j = k + max(fit, 1)  # ranges k .. j-1 (at least one)
            runs.append((k, j))
            k = j
    return runs
