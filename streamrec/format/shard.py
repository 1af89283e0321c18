"""One TFRecord file as stored: codec + framing, in both directions (sans-I/O).

:class:`ShardDecoder` turns the bytes of a file (maybe GZIP/ZLIB) into payloads;
:class:`~streamrec.format.encoder.ShardEncoder` (re-exported here) turns payloads into the
bytes to store. Readers and writers of every
storage back end drive these two and nothing else from the format core.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from streamrec.errors import CompressionError, FormatError
from streamrec.format.codecs import (
    Compression,
    Decompressor,
    compression_from_name,
    make_decompressor,
    normalize_compression,
    sniff,
)
from streamrec.format.crc import BytesLike
from streamrec.format.encoder import ShardEncoder
from streamrec.format.framing import HEADER_BYTES, OnCorrupt, RecordDecoder, Records, joined

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "DEFAULT_PIECE_BYTES", "ShardDecoder", "ShardEncoder"]

DEFAULT_MAX_RECORD_BYTES = 1 << 30
"""The largest payload a record may claim where the stream's end is unknown (compressed)."""
DEFAULT_PIECE_BYTES = 4 << 20
"""Uncompressed bytes inflated (and framed) at a time."""
# Deflate cannot do better than 1032:1: a compressed object of n bytes holds fewer than
# 1032 * n uncompressed bytes, so no record in it can claim more.
_MAX_DEFLATE_RATIO = 1032


class ShardDecoder:
    """Bytes of one file as stored -> TFRecord payloads.

    ``compression="auto"`` decides from ``url``'s suffix, else from the first 12 bytes fed
    (until then, bytes are held back). See :class:`RecordDecoder` for ``verify_crc``,
    ``on_corrupt``, error delivery and :attr:`dropped`; ``start_offset`` / ``start_index``
    describe where the bytes fed begin (resuming mid-file, uncompressed only).
    ``lengths_only``: no payloads are returned; their lengths collect in ``framing.lengths``.
    ``spans``: records are returned in place where they can be (see :class:`RecordDecoder`).

    Record lengths are checked against what is known before anything is buffered for them:
    ``size`` is the file's stored size. Uncompressed, a record must fit in the file
    (``TruncatedRecordError`` at once otherwise). Compressed, the uncompressed size is
    unknown, so a record may claim at most ``max_record_bytes`` (default 1 GiB) and less than
    1032x ``size`` (deflate's best ratio); a header claiming more raises ``FormatError`` at
    once. A record is buffered whole, so one (good) record costs its size; nothing else grows
    with the compression ratio: :meth:`stream` inflates ``max_piece_bytes`` at a time and
    hands on each piece's records before inflating the next.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        compression: str | None = "auto",
        verify_crc: bool = True,
        on_corrupt: OnCorrupt = "raise",
        start_offset: int = 0,
        start_index: int = 0,
        size: int | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        max_piece_bytes: int = DEFAULT_PIECE_BYTES,
        lengths_only: bool = False,
        spans: bool = False,
    ) -> None:
        self.url = url
        self.size = size
        self.max_record_bytes = max_record_bytes
        self.max_piece_bytes = max_piece_bytes
        self.framing = RecordDecoder(
            url=url,
            verify_crc=verify_crc,
            on_corrupt=on_corrupt,
            start_offset=start_offset,
            start_index=start_index,
            lengths_only=lengths_only,
            spans=spans,
        )
        self._decompressor: Decompressor | None = None
        self.inflate_s = 0.0  # seconds in the codec's stream calls (a reader's stats split it)
        self._head = bytearray()  # bytes held back while "auto" sniffs
        self._held: FormatError | None = None  # a codec failure, raised again on later calls
        self.compression: Compression = None
        choice = normalize_compression(compression)
        if choice == "auto":
            by_name = compression_from_name(url or "")
            if by_name != "unknown":
                self._use(by_name)
        else:
            self._use(choice)

    @property
    def dropped(self) -> list[FormatError]:
        """Errors skipped under ``on_corrupt="skip"``, oldest first."""
        return self.framing.dropped

    @property
    def failed(self) -> bool:
        """True when an error is held back: ``raise_pending()`` raises it."""
        return self.framing.failed or self._held is not None

    def feed(self, data: BytesLike) -> Records:
        """Add stored bytes; return all the payloads they complete (see :meth:`stream`).

        Raises only when no payload comes before the damage; otherwise the error is held
        back for :meth:`raise_pending`. All of ``data``'s records are returned at once: a
        reader of untrusted compressed data uses :meth:`stream`.
        """
        records: Records = []
        try:
            for chunk in self.stream(data):
                records = joined(records, chunk)
        except FormatError:
            if not records:
                raise
            # held back (by the framing or in _held): raise_pending() raises it
        return records

    def stream(self, data: BytesLike) -> Iterator[Records]:
        """Add stored bytes; yield the payloads they complete, in chunks (non-empty lists).

        Compressed data is inflated ``max_piece_bytes`` at a time, and each piece's records
        are yielded before the next piece is inflated. Damage is raised after every record
        before it has been yielded (``on_corrupt="skip"``: dropped instead). Consume the
        iterator to its end before feeding more.
        """
        self.raise_pending()
        if self._decompressor is None:
            self._head += data
            if len(self._head) < HEADER_BYTES:
                return
            data, self._head = self._head, bytearray()
            self._use(sniff(data))
        assert self._decompressor is not None
        pieces = self._decompressor.stream(data)
        while True:
            try:
                started = time.perf_counter()
                piece = next(pieces, None)
                if self.compression is not None:  # (stored bytes: nothing inflated)
                    self.inflate_s += time.perf_counter() - started
            except CompressionError as exc:
                self._compression_failed(exc)  # raises, unless skipping
                return
            if piece is None:
                return
            records = self.framing.feed(piece)
            del piece
            if records:
                yield records
            self.framing.raise_pending()

    def close(self) -> Records:
        """End of file: return the last payloads; raise if the file ends badly."""
        records: Records = []
        if self._decompressor is None:
            self._use(sniff(self._head))
            records = self.feed(self._head) if self._head else []
        assert self._decompressor is not None
        try:
            records = joined(records, self._frame(self._decompressor.close()))
        except CompressionError as exc:
            return joined(records, self._compression_failed(exc))
        if not records:
            self.framing.close()
            return records
        with contextlib.suppress(FormatError):
            # held back: raise_pending() raises it after these records are delivered
            self.framing.close()
        return records

    def raise_pending(self) -> None:
        """Raise the error held back while the records before it were delivered, if any."""
        self.framing.raise_pending()
        if self._held is not None:
            raise self._held

    def _use(self, compression: Compression) -> None:
        self.compression = compression
        self._decompressor = make_decompressor(
            compression, url=self.url, max_piece_bytes=self.max_piece_bytes
        )
        size, framing = self.size, self.framing
        if compression is None and size is not None:
            framing.end_offset = size
        else:
            limit = self.max_record_bytes
            if size is not None:
                limit = min(limit, _MAX_DEFLATE_RATIO * size)
            framing.max_record_bytes = limit

    def _frame(self, pieces: list[bytes]) -> Records:
        records: Records = []
        for piece in pieces:
            try:
                records = joined(records, self.framing.feed(piece))
            except FormatError:
                if not records:
                    raise
            if self.framing.failed:
                break  # held back: raise_pending() raises it
        return records

    def _compression_failed(self, exc: CompressionError) -> list[bytes]:
        # Say which record the damage interrupted, like every other format error.
        error = CompressionError(
            exc.problem,
            url=self.url,
            offset=self.framing.offset,
            record_index=self.framing.record_index,
        )
        error.__cause__ = exc.__cause__
        if self.framing.skip_corrupt:
            self.framing.abandon(error)
            self._decompressor = _Gone()  # reported once: the rest of the stream is dropped
            return []
        self._held = error
        raise error


class _Gone:
    """The decompressor of a stream given up on: nothing more comes out of it."""

    def feed(self, data: BytesLike) -> list[bytes]:
        return []

    def stream(self, data: BytesLike) -> Iterator[bytes]:
        return iter(())

    def close(self) -> list[bytes]:
        return []
