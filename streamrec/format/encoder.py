"""Payloads -> the bytes of one TFRecord file as stored, with its exact size (sans-I/O).

:class:`ShardEncoder` frames records (:class:`~streamrec.format.framing.RecordEncoder`) and
compresses them (GZIP / ZLIB with TensorFlow's settings, so the bytes are TensorFlow's). It
always knows how many bytes it has put out, and answers the question a writer rotating shards
by ``max_bytes`` asks before every record: *does this record still fit?*

* :meth:`bound_fits` answers from a worst-case bound on deflate's output (no work at all);
* near the limit, :meth:`add_if_fits` decides exactly: the compressor is sync-flushed
  (``Z_SYNC_FLUSH``: the stream stays one standard gzip member / zlib stream, with a few empty
  stored blocks every inflater skips) so that its output so far is known, and a copy is given
  the record and finished: the record goes in if and only if that finished size is within the
  limit. Uncompressed, sizes are exact by arithmetic.

**Indexing** (``index=True``): the encoder also builds the shard's record index
(:mod:`streamrec.format.index.core`), available as :attr:`ShardEncoder.shard_index` after
:meth:`~ShardEncoder.finish`. Uncompressed, that is the plain index (each record's offset and
framed length). Compressed, the stream gets *restart points*: before the record that would
take the framed bytes since the last restart point past ``restart_bytes`` (1 MiB by default),
the compressor is flushed with ``Z_FULL_FLUSH``. That ends the output on a byte boundary and
forgets the history, so a raw inflater (``zlib.decompressobj(-15)``) can start at that
compressed offset; the stream stays ONE gzip member / ONE zlib stream (TensorFlow's ZLIB reader
stops at the end of a zlib stream), which every inflater reads whole as before. The stream's
start is the restart point ``(0, 0)`` (read with the codec's own header). Each record's index
line is its offset and length in the uncompressed stream, its restart point's compressed
offset and its distance from it (the extended index format). Restart points fall only between
records; a record bigger than ``restart_bytes`` gets one of its own. A full flush is also a
sync point for the ``max_bytes`` fit test, which stays exact: a record that needs a restart
point fits if and only if the file finished after the flush and the record is within the limit.
Without ``index`` the bytes are exactly as before (TensorFlow's).
"""

from __future__ import annotations

import zlib
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from streamrec.format.codecs import Compression, make_compressor, normalize_compression
from streamrec.format.crc import BytesLike
from streamrec.format.framing import OVERHEAD_BYTES, RecordEncoder
from streamrec.format.index.core import IndexBuilder, ShardIndex

__all__ = ["RESTART_BYTES", "ShardEncoder", "deflate_bound"]

_DEFLATE_SLACK = 128  # header, trailer and block overhead beyond zlib's own bound
_FLUSH_COST = 16  # most a full flush adds beyond deflate_bound (block ends, an empty stored block)

RESTART_BYTES = 1 << 20
"""Framed bytes between restart points of an indexed compressed shard (about)."""


def deflate_bound(n: int) -> int:
    """An upper bound on the deflate output (gzip/zlib framing included) for ``n`` bytes in."""
    return n + (n >> 3) + (n >> 6) + _DEFLATE_SLACK


class ShardEncoder:
    """TFRecord payloads -> bytes to store in one file (framed, then maybe compressed).

    ``stored`` is the exact number of bytes put out so far; ``finish()`` puts out the rest.
    ``index=True``: build the shard's record index (with restart points every
    ``restart_bytes`` framed bytes when compressed; see the module docstring), the
    :attr:`shard_index` after ``finish()``.
    """

    __slots__ = (
        "_at_sync",
        "_compressor",
        "_framing",
        "_index",
        "_restart",
        "_restart_bytes",
        "_since_restart",
        "_since_sync",
        "compression",
        "raw_bytes",
        "records",
        "shard_index",
        "stored",
    )

    def __init__(
        self,
        compression: str | None = None,
        *,
        level: int = 6,
        index: bool = False,
        restart_bytes: int = RESTART_BYTES,
    ) -> None:
        choice = normalize_compression(compression)
        if choice == "auto":
            raise ValueError("a writer needs an explicit compression: None, 'gzip' or 'zlib'")
        if isinstance(restart_bytes, bool) or restart_bytes < 1:
            raise ValueError(f"restart_bytes must be a positive integer, not {restart_bytes!r}")
        self.compression: Compression = choice
        self._framing = RecordEncoder()
        self._compressor: Any = None if choice is None else make_compressor(choice, level=level)
        self.records = 0
        self.raw_bytes = 0  # framed (uncompressed) bytes so far
        self.stored = 0  # bytes put out so far (exact)
        self._at_sync = 0  # ``stored`` at the last sync flush
        self._since_sync = 0  # framed bytes given to the compressor since then
        self._index = IndexBuilder(extended=choice is not None) if index else None
        self._restart = (0, 0)  # the current restart point: (stored, raw_bytes) there
        self._since_restart = 0  # framed bytes since the current restart point
        self._restart_bytes = restart_bytes
        self.shard_index: ShardIndex | None = None
        """The record index (``index=True``), once :meth:`finish` has run."""

    @property
    def compressed(self) -> bool:
        """True for GZIP / ZLIB."""
        return self.compression is not None

    @property
    def indexed(self) -> bool:
        """True when the encoder builds the shard's record index."""
        return self._index is not None

    def frame(self, payloads: Sequence[BytesLike]) -> bytes:
        """The framed bytes of ``payloads`` (for :meth:`add_framed`)."""
        if len(payloads) == 1:
            return self._framing.encode(payloads[0])
        return self._framing.encode_many(payloads)

    def encode(self, payloads: Sequence[BytesLike]) -> bytes:
        """Frame and compress a chunk of payloads; return the bytes ready to store so far."""
        if not payloads:
            return b""
        if self._index is None:
            return self.add_framed(self.frame(payloads), len(payloads))
        lengths = [
            (p.nbytes if type(p) is memoryview else len(p)) + OVERHEAD_BYTES for p in payloads
        ]
        return self.add_framed(self.frame(payloads), len(payloads), lengths)

    def encode_one(self, payload: BytesLike) -> bytes:
        """:meth:`encode` of one payload, in one call (the per-record write path)."""
        framed = self._framing.encode(payload)
        if self._index is not None:
            return self._add_one_indexed(framed)
        self.records += 1
        self.raw_bytes += len(framed)
        if self._compressor is None:
            self.stored += len(framed)
            return framed
        self._since_sync += len(framed)
        out: bytes = self._compressor.compress(framed)
        self.stored += len(out)
        return out

    def add_framed(self, framed: bytes, count: int, lengths: Sequence[int] | None = None) -> bytes:
        """Add ``count`` records already framed; return the bytes ready to store so far.

        An indexing encoder needs each record's framed ``lengths`` (restart points fall
        between records)."""
        if self._index is not None:
            if lengths is None or len(lengths) != count or sum(lengths) != len(framed):
                raise ValueError(
                    "an indexing encoder needs the framed length of each record added "
                    f"({count} records, {len(framed)} bytes)"
                )
            if self._compressor is not None:
                return self._add_indexed(framed, lengths)
            self._index.add_records(lengths)
        self.records += count
        self.raw_bytes += len(framed)
        if self._compressor is None:
            out = framed
        else:
            self._since_sync += len(framed)
            out = self._compressor.compress(framed)
        self.stored += len(out)
        return out

    def bound_fits(self, extra_framed: int, limit: int) -> bool:
        """True when the file, finished after ``extra_framed`` more framed bytes, surely stays
        within ``limit`` bytes (False: maybe not; ask :meth:`add_if_fits`)."""
        if self._compressor is None:
            return self.stored + extra_framed <= limit
        bound = self._at_sync + deflate_bound(self._since_sync + extra_framed)
        if self._index is not None:
            # A restart point's run and the record after it hold more than restart_bytes, so
            # the extra bytes bring at most 2 * span // restart_bytes full flushes (and at
            # most one per record).
            span = 2 * (self._since_restart + extra_framed)
            if span >= self._restart_bytes:
                flushes = min(span // self._restart_bytes, extra_framed // OVERHEAD_BYTES)
                bound += _FLUSH_COST * flushes
        return bound <= limit

    def no_record_fits(self, limit: int) -> bool:
        """True when not even an empty record could be added within ``limit`` (uncompressed;
        compressed streams can always be tried)."""
        return self._compressor is None and self.stored + OVERHEAD_BYTES > limit

    def add_if_fits(self, payload: BytesLike, limit: int) -> bytes | None:
        """Add one record iff the file finished right after it is within ``limit`` bytes.

        Returns the bytes put out (maybe ``b""``), or None when the record does not fit (the
        encoder is then unchanged). Exact for every codec.
        """
        framed = self._framing.encode(payload)
        if self._compressor is None:
            if self.stored + len(framed) > limit:
                return None
            lengths = None if self._index is None else (len(framed),)
            return self.add_framed(framed, 1, lengths)
        if self._index is not None and self._needs_restart(len(framed)):
            return self._add_if_fits_at_restart(framed, limit)
        if self._since_sync:
            # Sync-flush a copy, kept only if the record then surely fits: the flush's own
            # bytes could otherwise push a file that is then closed past the limit.
            trial = self._compressor.copy()
            synced: bytes = trial.flush(zlib.Z_SYNC_FLUSH)
            if self.stored + len(synced) + deflate_bound(len(framed)) <= limit:
                self._compressor = trial
                self.stored += len(synced)
                self._at_sync, self._since_sync = self.stored, 0
                return synced + self.add_framed(framed, 1, (len(framed),))
        trial = self._compressor.copy()
        out: bytes = trial.compress(framed)
        tail: bytes = trial.copy().flush()
        if self.stored + len(out) + len(tail) > limit:
            return None
        self._compressor = trial
        if self._index is not None:
            return self._took(len(framed), (len(framed),), out)
        self.records += 1
        self.raw_bytes += len(framed)
        self._since_sync += len(framed)
        self.stored += len(out)
        return out

    def finish(self) -> bytes:
        """The rest of the stream (compressor trailer); the encoder is done afterwards (and
        :attr:`shard_index` is set when indexing)."""
        if self._index is not None and self.shard_index is None:
            self.shard_index = self._index.build()
        if self._compressor is None:
            return b""
        out: bytes = self._compressor.flush()
        self._compressor = None
        self.stored += len(out)
        return out

    # -- indexing, compressed --------------------------------------------------------------
    def _needs_restart(self, framed_length: int) -> bool:
        """True when a record of ``framed_length`` gets a new restart point before it."""
        since = self._since_restart
        return since > 0 and since + framed_length > self._restart_bytes

    def _full_flush(self) -> bytes:
        """A restart point here: flush so a raw inflater can start at ``stored``."""
        out: bytes = self._compressor.flush(zlib.Z_FULL_FLUSH)
        return self._restarted(out)

    def _restarted(self, flushed: bytes) -> bytes:
        """Account for a full flush that put out ``flushed``: a sync and a restart point."""
        self.stored += len(flushed)
        self._at_sync, self._since_sync = self.stored, 0
        self._restart = (self.stored, self.raw_bytes)
        self._since_restart = 0
        return flushed

    def _took(self, framed_bytes: int, lengths: Sequence[int], out: bytes) -> bytes:
        """Account for records of ``lengths`` given to the compressor, which put out ``out``."""
        assert self._index is not None
        self._index.add_records(lengths, self._restart)
        self.records += len(lengths)
        self.raw_bytes += framed_bytes
        self._since_sync += framed_bytes
        self._since_restart += framed_bytes
        self.stored += len(out)
        return out

    def _add_one_indexed(self, framed: bytes) -> bytes:
        n = len(framed)
        assert self._index is not None
        if self._compressor is None:
            self._index.add_records((n,))
            self.records += 1
            self.raw_bytes += n
            self.stored += n
            return framed
        since = self._since_restart
        before = self._full_flush() if since and since + n > self._restart_bytes else b""
        out = self._took(n, (n,), self._compressor.compress(framed))
        return before + out if before else out

    def _add_indexed(self, framed: bytes, lengths: Sequence[int]) -> bytes:
        """Records cut into runs between restart points, a full flush before each new one."""
        view = memoryview(framed)
        ends = list(accumulate(lengths))  # where each record ends in ``framed``
        out: list[bytes] = []
        start, count = 0, len(lengths)
        while start < count:
            base = ends[start - 1] if start else 0
            room = self._restart_bytes - self._since_restart
            stop = bisect_right(ends, base + room, start)  # records that fit in the room
            if stop == start:  # the next record would cross the threshold
                if self._since_restart:
                    out.append(self._full_flush())
                    continue
                stop = start + 1  # bigger than restart_bytes: a run of its own
            piece = view[base : ends[stop - 1]]
            compressed: bytes = self._compressor.compress(piece)
            out.append(self._took(len(piece), lengths[start:stop], compressed))
            start = stop
        return b"".join(out)

    def _add_if_fits_at_restart(self, framed: bytes, limit: int) -> bytes | None:
        """:meth:`add_if_fits` for a record that starts a new restart point: it goes in iff
        the file finished after the full flush and the record is within ``limit``."""
        trial = self._compressor.copy()
        flushed: bytes = trial.flush(zlib.Z_FULL_FLUSH)
        base = self.stored + len(flushed)
        if base + deflate_bound(len(framed)) <= limit:  # surely fits
            self._compressor = trial
            self._restarted(flushed)
            return flushed + self._took(len(framed), (len(framed),), trial.compress(framed))
        probe = trial.copy()
        out: bytes = probe.compress(framed)
        tail: bytes = probe.copy().flush()
        if base + len(out) + len(tail) > limit:
            return None
        self._compressor = probe
        self._restarted(flushed)
        return flushed + self._took(len(framed), (len(framed),), out)
