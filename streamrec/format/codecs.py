"""Streaming compression codecs for TFRecord files: none, GZIP and ZLIB (as TensorFlow writes).

Sans-I/O, like the framing: a decompressor is fed the bytes as stored and returns uncompressed
pieces; ``close()`` says whether the stream ended cleanly. Output is produced in pieces of at most
``max_piece_bytes``, and :meth:`Decompressor.stream` inflates the next piece only when the one
before it has been taken, so a small, highly compressed input (a gzip bomb) never costs more
than one piece at a time. Damage is raised after every byte that inflated before it, naming the
compressed byte where zlib failed (see :class:`_Inflater`).

GZIP streams may hold several concatenated members (``cat a.gz b.gz``); all are read, as
TensorFlow does. ``compression="auto"`` picks the codec from the file name (``.gz``/``.gzip``,
``.zlib``/``.zz``) and otherwise from the first bytes (:func:`sniff`).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import Literal, NoReturn, Protocol

import crc32c as _crc32c_package

from streamrec.errors import CompressionError
from streamrec.format.crc import BytesLike, mask
from streamrec.format.identify import looks_like

__all__ = [
    "Compression",
    "Compressor",
    "Decompressor",
    "compression_from_name",
    "compression_known",
    "make_compressor",
    "make_decompressor",
    "normalize_compression",
    "resolve_compression",
    "sniff",
]

#: A codec name after normalisation (None: stored as is).
Compression = Literal["gzip", "zlib"] | None

_GZIP_WBITS = 31  # zlib container: gzip header and trailer
_ZLIB_WBITS = 15
_MAX_PIECE_BYTES = 4 << 20
# Input steps of the calls that find where a failed call's damage is (see _Inflater): from a
# 4 MiB block, ~256 + 64 + 256 calls to the damaged byte.
_REPLAY_STEPS = (1 << 14, 1 << 8, 1)

_SUFFIXES: dict[str, Compression] = {
    ".gz": "gzip",
    ".gzip": "gzip",
    ".zlib": "zlib",
    ".zz": "zlib",
}
_ALIASES: dict[str, Compression] = {
    "": None,
    "none": None,
    "gzip": "gzip",
    "gz": "gzip",
    "zlib": "zlib",
}


def normalize_compression(value: str | None) -> Compression | Literal["auto"]:
    """Accept TF spellings (``"GZIP"``, ``"ZLIB"``, ``""``) and ours; reject anything else."""
    if value is None:
        return None
    key = value.lower()
    if key == "auto":
        return "auto"
    if key not in _ALIASES:
        raise ValueError(f"unknown compression {value!r}: use 'auto', None, 'gzip' or 'zlib'")
    return _ALIASES[key]


def compression_from_name(name: str) -> Compression | Literal["unknown"]:
    """The codec a file name announces by its suffix, or ``"unknown"``."""
    lowered = name.lower().rstrip("/")
    for suffix, codec in _SUFFIXES.items():
        if lowered.endswith(suffix):
            return codec
    return "unknown"


def sniff(first_bytes: BytesLike) -> Compression:
    """Guess the codec from a stream's first bytes (at least 12 of them when available).

    A valid TFRecord header (its length CRC matches) means uncompressed; that check comes first
    because a plain stream can start with bytes that look like a zlib or gzip header (a record
    length of 0x9c78 starts ``78 9c``).
    """
    head = bytes(first_bytes[:12])
    if len(head) == 12:
        (stored,) = struct.unpack_from("<I", head, 8)
        if mask(_crc32c_package.crc32c(head[:8])) == stored:
            return None
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        return "zlib"
    return None


def compression_known(
    requested: str | None, name: str, stated: Compression | Literal["unknown"] = "unknown"
) -> Compression | Literal["unknown"]:
    """The codec for one file as far as it is known without reading it: an explicit choice
    wins, then the name's suffix, then what metadata ``stated`` (a manifest's
    ``"compression"``, a dataset index's); ``"unknown"`` when none says (its first bytes
    decide: :func:`sniff`)."""
    choice = normalize_compression(requested)
    if choice != "auto":
        return choice
    by_name = compression_from_name(name)
    if by_name != "unknown":
        return by_name
    return stated


def resolve_compression(
    requested: str | None,
    name: str,
    first_bytes: BytesLike | None,
    stated: Compression | Literal["unknown"] = "unknown",
) -> Compression:
    """The codec for one file: an explicit choice wins, then the name, then what metadata
    ``stated``, then the bytes (:func:`compression_known`)."""
    known = compression_known(requested, name, stated)
    if known != "unknown":
        return known
    return sniff(first_bytes or b"")


class Decompressor(Protocol):
    """Bytes as stored in, uncompressed pieces out."""

    def feed(self, data: BytesLike) -> list[bytes]:
        """Uncompressed pieces that ``data`` completes."""
        ...

    def stream(self, data: BytesLike) -> Iterator[bytes]:
        """The pieces of :meth:`feed`, each produced only when the one before it is taken.

        A failure is raised after the pieces before it; consume it to the end before feeding
        more.
        """
        ...

    def close(self) -> list[bytes]:
        """The last pieces; raise CompressionError if the stream ended early."""
        ...


class Compressor(Protocol):
    """Uncompressed bytes in, bytes to store out."""

    def compress(self, data: BytesLike) -> bytes:
        """Compressed bytes available so far (may be empty)."""
        ...

    def flush(self) -> bytes:
        """The rest of the stream; the compressor is finished afterwards."""
        ...


class _Passthrough:
    def feed(self, data: BytesLike) -> list[bytes]:
        return [data if isinstance(data, bytes) else bytes(data)] if data else []

    def stream(self, data: BytesLike) -> Iterator[bytes]:
        return iter(self.feed(data))

    def close(self) -> list[bytes]:
        return []

    def compress(self, data: BytesLike) -> bytes:
        return bytes(data)

    def flush(self) -> bytes:
        return b""


class _Inflater:
    """zlib / gzip decompression with bounded output pieces and multi-member gzip.

    Damage is reported where zlib finds it, to the byte, after everything inflated before it:
    each call into zlib starts from a copy of the state before it (a copy costs about a
    microsecond), and a call that fails (Python's zlib then drops the call's output) is made
    again from that copy over the same input in smaller and smaller steps
    (:data:`_REPLAY_STEPS`), down to one byte: the output before the damaged byte is handed
    on, and the error names the compressed byte that failed and the uncompressed bytes
    before it.
    """

    def __init__(self, wbits: int, url: str | None, max_piece_bytes: int) -> None:
        self._wbits = wbits
        self._url = url
        self._max_piece = max_piece_bytes
        self._inflate = zlib.decompressobj(wbits)
        self._member_open = False  # input went into the current member and it has not ended
        self._consumed = 0  # compressed bytes fed so far, for error messages
        self._produced = 0  # uncompressed bytes produced so far
        self._error: CompressionError | None = None  # raised after the pieces before it
        self._stream_done = False  # zlib: the one stream has ended

    def feed(self, data: BytesLike) -> list[bytes]:
        pieces: list[bytes] = []
        try:
            for piece in self.stream(data):
                pieces.append(piece)
        except CompressionError:
            if not pieces:
                raise
            # held back in self._error: raised on the next call, after these pieces
        return pieces

    def stream(self, data: BytesLike) -> Iterator[bytes]:
        if self._error is not None:
            raise self._error
        # a copy of anything but bytes: the caller may change its buffer while we inflate
        stored = data if isinstance(data, bytes) else bytes(data)
        return self._inflated(memoryview(stored), None)

    def _inflated(self, data: memoryview, step: int | None) -> Iterator[bytes]:
        """Inflate ``data``, giving zlib at most ``step`` bytes a call (None: all of it)."""
        at = 0  # bytes of data that zlib has consumed
        more_output = False  # the last call filled a whole piece: zlib may hold more
        while at < len(data) or more_output:
            if self._stream_done:
                self._fail(f"{len(data) - at} trailing bytes after the zlib stream")
            self._member_open = True
            fed = data[at:] if step is None else data[at : at + step]
            before = self._inflate.copy()
            try:
                piece = self._inflate.decompress(fed, self._max_piece)
            except zlib.error as exc:
                self._inflate = before
                yield from self._failed_call(fed, step, exc)
                return  # not reached: _failed_call raises
            if self._inflate.eof:
                used = len(fed) - len(self._inflate.unused_data)
                more_output = False
                self._member_open = False
                # gzip: another member may follow (``cat a.gz b.gz``); zlib: one stream only
                self._stream_done = self._wbits != _GZIP_WBITS
                self._inflate = zlib.decompressobj(self._wbits)
            else:
                used = len(fed) - len(self._inflate.unconsumed_tail)
                more_output = len(piece) == self._max_piece
            at += used
            self._consumed += used
            if piece:
                self._produced += len(piece)
                yield piece
                del piece  # the consumer holds it now, or nobody does

    def _failed_call(self, fed: memoryview, step: int | None, exc: zlib.error) -> Iterator[bytes]:
        """zlib failed somewhere in ``fed`` (the state is back to before the call): yield what
        inflates before the damaged byte, then raise, naming that byte."""
        if step is None and not self._produced and not self._member_started(fed):
            seen = looks_like(fed)
            hint = f"looks like {seen}" if seen else "unknown data"
            if seen == "an uncompressed TFRecord file":
                hint += ": read it with compression=None"
            self._fail(f"the file is not {self._kind} data ({hint})", exc)
        finer = [s for s in _REPLAY_STEPS if s < (len(fed) if step is None else step)]
        if finer:  # the same input again, in smaller calls: the finest one raises
            yield from self._inflated(fed, finer[0])
        # one byte fed (or zlib was not deterministic): the damage is at the next byte
        self._fail(f"cannot inflate: {exc}", exc, exact=True)

    def close(self) -> list[bytes]:
        if self._error is not None:
            raise self._error
        if not self._member_open:
            return []
        # A complete member always reaches eof inside feed(); an open one here is cut short.
        self._error = self._make_error("compressed stream ends early (no end-of-stream marker)")
        raise self._error

    def _member_started(self, data: BytesLike) -> bool:
        """True when ``data``, the start of the stream, begins like this codec's streams."""
        if self._wbits == _GZIP_WBITS:
            return bytes(data[:2]) == b"\x1f\x8b" or self._consumed > 0
        return looks_like(data) == "zlib data" or self._consumed > 0

    def _fail(
        self, problem: str, cause: BaseException | None = None, *, exact: bool = False
    ) -> NoReturn:
        """Damage: raised now (after the pieces before it) and again on every later call.

        ``exact``: zlib failed on the next compressed byte (not merely somewhere after the
        bytes fed so far)."""
        self._error = self._make_error(problem, exact=exact)
        self._error.__cause__ = cause
        raise self._error

    @property
    def _kind(self) -> str:
        return "gzip" if self._wbits == _GZIP_WBITS else "zlib"

    def _make_error(self, problem: str, *, exact: bool = False) -> CompressionError:
        where = ""
        if exact:
            where = (
                f" (at compressed byte {self._consumed}, after {self._produced} uncompressed bytes)"
            )
        elif self._consumed or self._produced:
            where = f" (after {self._consumed} compressed and {self._produced} uncompressed bytes)"
        return CompressionError(f"{self._kind}: {problem}{where}", url=self._url)


def make_decompressor(
    compression: Compression, *, url: str | None = None, max_piece_bytes: int = _MAX_PIECE_BYTES
) -> Decompressor:
    """A streaming decompressor for ``compression`` (None: bytes pass through)."""
    if compression is None:
        return _Passthrough()
    if compression == "gzip":
        return _Inflater(_GZIP_WBITS, url, max_piece_bytes)
    if compression == "zlib":
        return _Inflater(_ZLIB_WBITS, url, max_piece_bytes)
    raise ValueError(f"unknown compression {compression!r}")


def make_compressor(compression: Compression, *, level: int = 6) -> Compressor:
    """A streaming compressor whose output TensorFlow (and Python's zlib) inflate."""
    if compression is None:
        return _Passthrough()
    wbits = _GZIP_WBITS if compression == "gzip" else _ZLIB_WBITS
    if compression not in ("gzip", "zlib"):
        raise ValueError(f"unknown compression {compression!r}")
    # memLevel 9, as TensorFlow's ZlibOutputBuffer: the same bytes as tf.io writes
    return zlib.compressobj(level, zlib.DEFLATED, wbits, 9)
