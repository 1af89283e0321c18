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
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from streamrec.format.codecs import Compression, make_compressor, normalize_compression
from streamrec.format.crc import BytesLike
from streamrec.format.framing import OVERHEAD_BYTES, RecordEncoder

__all__ = ["ShardEncoder", "deflate_bound"]

_DEFLATE_SLACK = 128  # header, trailer and block overhead beyond zlib's own bound


def deflate_bound(n: int) -> int:
    """An upper bound on the deflate output (gzip/zlib framing included) for ``n`` bytes in."""
    return n + (n >> 3) + (n >> 6) + _DEFLATE_SLACK


class ShardEncoder:
    """TFRecord payloads -> bytes to store in one file (framed, then maybe compressed).

    ``stored`` is the exact number of bytes put out so far; ``finish()`` puts out the rest.
    """

    __slots__ = (
        "_at_sync",
        "_compressor",
        "_framing",
        "_since_sync",
        "compression",
        "raw_bytes",
        "records",
        "stored",
    )

    def __init__(self, compression: str | None = None, *, level: int = 6) -> None:
        choice = normalize_compression(compression)
        if choice == "auto":
            raise ValueError("a writer needs an explicit compression: None, 'gzip' or 'zlib'")
        self.compression: Compression = choice
        self._framing = RecordEncoder()
        self._compressor: Any = None if choice is None else make_compressor(choice, level=level)
        self.records = 0
        self.raw_bytes = 0  # framed (uncompressed) bytes so far
        self.stored = 0  # bytes put out so far (exact)
        self._at_sync = 0  # ``stored`` at the last sync flush
        self._since_sync = 0  # framed bytes given to the compressor since then

    @property
    def compressed(self) -> bool:
        """True for GZIP / ZLIB."""
        return self.compression is not None

    def frame(self, payloads: Sequence[BytesLike]) -> bytes:
        """The framed bytes of ``payloads`` (for :meth:`add_framed`)."""
        if len(payloads) == 1:
            return self._framing.encode(payloads[0])
        return self._framing.encode_many(payloads)

    def encode(self, payloads: Sequence[BytesLike]) -> bytes:
        """Frame and compress a chunk of payloads; return the bytes ready to store so far."""
        if not payloads:
            return b""
        return self.add_framed(self.frame(payloads), len(payloads))

    def encode_one(self, payload: BytesLike) -> bytes:
        """:meth:`encode` of one payload, in one call (the per-record write path)."""
        framed = self._framing.encode(payload)
        self.records += 1
        self.raw_bytes += len(framed)
        if self._compressor is None:
            self.stored += len(framed)
            return framed
        self._since_sync += len(framed)
        out: bytes = self._compressor.compress(framed)
        self.stored += len(out)
        return out

    def add_framed(self, framed: bytes, count: int) -> bytes:
        """Add ``count`` records already framed; return the bytes ready to store so far."""
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
        return self._at_sync + deflate_bound(self._since_sync + extra_framed) <= limit

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
            return self.add_framed(framed, 1) if self.stored + len(framed) <= limit else None
        if self._since_sync:
            # Sync-flush a copy, kept only if the record then surely fits: the flush's own
            # bytes could otherwise push a file that is then closed past the limit.
            trial = self._compressor.copy()
            synced: bytes = trial.flush(zlib.Z_SYNC_FLUSH)
            if self.stored + len(synced) + deflate_bound(len(framed)) <= limit:
                self._compressor = trial
                self.stored += len(synced)
                self._at_sync, self._since_sync = self.stored, 0
                return synced + self.add_framed(framed, 1)
        trial = self._compressor.copy()
        out: bytes = trial.compress(framed)
        tail: bytes = trial.copy().flush()
        if self.stored + len(out) + len(tail) > limit:
            return None
        self._compressor = trial
        self.records += 1
        self.raw_bytes += len(framed)
        self._since_sync += len(framed)
        self.stored += len(out)
        return out

    def finish(self) -> bytes:
        """The rest of the stream (compressor trailer); the encoder is done afterwards."""
        if self._compressor is None:
            return b""
        out: bytes = self._compressor.flush()
        self._compressor = None
        self.stored += len(out)
        return out
