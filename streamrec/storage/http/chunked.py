"""Decoding an HTTP/1.1 chunked body (``Transfer-Encoding: chunked``), bounded, as it arrives.

Why: AWS S3 sends its listing pages chunked, and :mod:`streamrec.storage.http.range_get` reads
them. A sans-I/O state machine: :meth:`ChunkedBody.feed` takes the bytes of each socket read
(any split: a chunk-size line, a chunk's data or its CRLF may end anywhere) and keeps the
decoded bytes in ``bytes`` pieces; it says where the body ended (its last chunk's trailers'
empty line), so the caller can tell whether bytes came past it.

Everything is checked, and bounded, before it is kept: a chunk size is 1 to 16 hex digits
(chunk extensions, ``;name=value``, are ignored), a chunk's data is followed by CRLF, every line
ends with CRLF; a chunk-size line is at most :data:`LINE_BYTES`, the framing (chunk-size lines
and the CRLF after each chunk's data) at most ``limit`` + :data:`FRAMING_BYTES` in all, the
trailers (read and ignored) at most ``trailer_bytes``. Anything else is :class:`ChunkError`.
Decoded bytes past ``limit`` are :class:`ChunkTooLong` as soon as a chunk-size line announces
them, or, for a body whose start is enough (``cut``: an error answer), the end of the body at
``limit`` (:attr:`ChunkedBody.cut_short`).

Memory: the decoded bytes (at most ``limit``), one piece being filled (at most
``piece_bytes``, copied once into its ``bytes``) and one line being read (at most
``max(LINE_BYTES, trailer_bytes)``); bytes read: at most ``2 * limit + FRAMING_BYTES +
trailer_bytes``, so a hostile answer of 1-byte chunks or endless chunk extensions ends there.
"""

from __future__ import annotations

import re

__all__ = ["FRAMING_BYTES", "LINE_BYTES", "ChunkError", "ChunkTooLong", "ChunkedBody"]

LINE_BYTES = 4 << 10
"""Most bytes of one chunk-size line (its extensions and CRLF included)."""
FRAMING_BYTES = 64 << 10
"""The framing a body may have beyond its ``limit`` in bytes: chunk-size lines and CRLFs of
at most ``limit + FRAMING_BYTES`` bytes in all (a chunk of 1 byte costs at least 5)."""

_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class ChunkError(Exception):
    """The body's chunked framing is malformed (or longer than its bounds)."""


class ChunkTooLong(Exception):
    """The decoded body is longer than its ``limit``."""


class ChunkedBody:
    """One chunked body being decoded (see the module docstring): at most ``limit`` decoded
    bytes (past it: :class:`ChunkTooLong`, or with ``cut`` the body's end), kept in ``bytes``
    pieces of at most ``piece_bytes``."""

    def __init__(self, limit: int, *, cut: bool, piece_bytes: int, trailer_bytes: int) -> None:
        self._limit = limit
        self._cut = cut
        self._piece_bytes = piece_bytes
        self._framing_left = limit + FRAMING_BYTES
        self._trailer_left = trailer_bytes
        self._state = _SIZE
        self._left = 0  # data bytes of the current chunk still to come
        self._crlf = 0  # bytes of the CRLF after a chunk's data seen
        self._line = bytearray()  # a line's start, read so far
        self._got = 0  # decoded bytes
        self._pieces: list[bytes] = []
        self._piece = bytearray()
        self.cut_short = False
        """True once the body was cut at ``limit`` (``cut``): its end was not read."""

    def feed(self, data: bytearray, start: int, end: int) -> int:
        """Decode ``data[start:end]``, what came next: -1 when the body goes on past it (all of
        it used), else where in ``data`` the body ended (bytes from there on are not the
        body's)."""
        pos = start
        while pos < end:
            if self._state == _DATA:
                take = min(self._left, end - pos)
                self._keep(data, pos, take)
                pos += take
                self._left -= take
                if not self._left:
                    if self.cut_short:
                        self._state = _DONE
                        return pos
                    self._state = _DATA_END
            elif self._state == _DATA_END:
                if data[pos] != b"\r\n"[self._crlf]:
                    raise ChunkError(f"no CRLF after a chunk's data (decoded byte {self._got})")
                pos += 1
                self._crlf += 1
                self._framed(1)
                if self._crlf == 2:
                    self._crlf, self._state = 0, _SIZE
            elif self._state == _SIZE:
                line, pos = self._read_line(data, pos, end, LINE_BYTES, "a chunk-size line")
                if line is None:
                    continue
                self._framed(len(line) + 2)
                if self._chunk(_size(line, self._got)):
                    return pos
            elif self._state == _TRAILER:
                line, pos = self._read_line(data, pos, end, self._trailer_left, "the trailers")
                if line is None:
                    continue
                self._trailer_left -= len(line) + 2
                if not line:
                    self._state = _DONE
                    return pos
            else:
                return pos  # (ended already: nothing more is the body's)
        return -1

    def pieces(self) -> list[bytes]:
        """The decoded bytes, in pieces (once the body has ended)."""
        if self._piece:
            self._pieces.append(bytes(self._piece))
            self._piece = bytearray()
        return self._pieces

    def _chunk(self, size: int) -> bool:
        """A chunk of ``size`` bytes announced; True when the body ends here (cut)."""
        if not size:
            self._state = _TRAILER
            return False
        if size > self._limit - self._got:
            if not self._cut:
                raise ChunkTooLong(f"a chunk of {size} bytes after {self._got}")
            self.cut_short = True
            size = self._limit - self._got
            if not size:
                self._state = _DONE
                return True
        self._left, self._state = size, _DATA
        return False

    def _framed(self, nbytes: int) -> None:
        self._framing_left -= nbytes
        if self._framing_left < 0:
            raise ChunkError(
                f"chunk framing of more than {self._limit + FRAMING_BYTES} bytes "
                f"(decoded byte {self._got})"
            )

    def _read_line(
        self, data: bytearray, pos: int, end: int, most: int, what: str
    ) -> tuple[bytes | None, int]:
        """The next line of ``data[pos:end]`` (with the start kept from earlier reads), its
        CRLF cut off, and where it ended; None and ``end`` when it goes on past ``end``."""
        newline = data.find(b"\n", pos, end)
        stop = end if newline < 0 else newline + 1
        if len(self._line) + stop - pos > most:
            raise ChunkError(f"{what} longer than {most} bytes (decoded byte {self._got})")
        if newline < 0:
            self._line += data[pos:stop]
            return None, stop
        if self._line:
            self._line += data[pos:stop]
            line = bytes(self._line)
            self._line.clear()
        else:
            line = bytes(data[pos:stop])
        if not line.endswith(b"\r\n"):
            raise ChunkError(f"{what} not ended by CRLF (decoded byte {self._got})")
        return line[:-2], stop

    def _keep(self, data: bytearray, pos: int, nbytes: int) -> None:
        self._got += nbytes
        with memoryview(data) as view:
            while nbytes:
                take = min(self._piece_bytes - len(self._piece), nbytes)
                self._piece += view[pos : pos + take]
                pos += take
                nbytes -= take
                if len(self._piece) == self._piece_bytes:
                    self._pieces.append(bytes(self._piece))
                    self._piece = bytearray()


def _size(line: bytes, got: int) -> int:
    """The chunk size a chunk-size line gives (its extensions ignored)."""
    text = line.split(b";", 1)[0].rstrip(b" \t")
    if not _HEX.fullmatch(text):
        raise ChunkError(
            f"a chunk size that is not 1 to 16 hex digits: {line[:40]!r} (decoded byte {got})"
        )
    return int(text, 16)
