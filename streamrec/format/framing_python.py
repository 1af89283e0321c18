"""The pure-Python twins of the ``_cframing`` accelerator's functions (what users without a C
compiler run): :func:`scan` frames the records of one buffer, :func:`new_payload` and
:func:`fill` build a big record's payload with its CRC computed as its bytes are copied. Each has
the C function's contract exactly; ``tests/unit/test_framing.py`` checks that they agree.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from typing import Any

import crc32c as _crc32c_package

from streamrec.format.crc import BytesLike

__all__ = ["fill", "framed_bytes", "mask", "new_payload", "scan"]

HEADER_BYTES = 12
FOOTER_BYTES = 4

# scan() stop reasons (the C scanner's too)
NEED_MORE, BAD_LENGTH_CRC, BAD_PAYLOAD_CRC = 0, 1, 2

_HEADER = struct.Struct("<QI")
_U32 = struct.Struct("<I")

# (payloads, pos, status, stored, computed); payloads: a list of bytes, or with lengths_only
# the bytes of an array("q") of the payloads' lengths (native int64)
ScanResult = tuple[Any, int, int, int, int]


def scan(
    buf: BytesLike,
    start: int,
    verify: bool,
    large_crc: object,
    large_threshold: int,
    lengths_only: bool = False,
) -> ScanResult:
    """Pure-Python twin of ``_cframing.scan`` (same arguments, same result)."""
    del large_crc, large_threshold  # the package CRC is used for every size here
    records: list[bytes] = []
    lengths = array("q")
    append = lengths.append if lengths_only else records.append
    unpack_header = _HEADER.unpack_from
    unpack_u32 = _U32.unpack_from
    crc = _crc32c_package.crc32c
    view = memoryview(buf)
    if view.itemsize != 1 or view.ndim != 1:  # the C scanner sees bytes too
        view = view.cast("B")
    end = len(view)
    pos = start

    def out() -> list[bytes] | bytes:
        return lengths.tobytes() if lengths_only else records

    try:
        while end - pos >= HEADER_BYTES:
            length, stored = unpack_header(view, pos)
            if verify:
                c = crc(view[pos : pos + 8])
                computed = (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
                if computed != stored:
                    return out(), pos, BAD_LENGTH_CRC, stored, computed
            payload_end = pos + HEADER_BYTES + length
            if payload_end + FOOTER_BYTES > end:
                break
            payload = view[pos + HEADER_BYTES : payload_end]
            if verify:
                (stored,) = unpack_u32(view, payload_end)
                c = crc(payload)
                computed = (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
                if computed != stored:
                    return out(), pos, BAD_PAYLOAD_CRC, stored, computed
            append(length if lengths_only else bytes(payload))  # type: ignore[arg-type]
            pos = payload_end + FOOTER_BYTES
        return out(), pos, NEED_MORE, 0, 0
    finally:
        view.release()


def new_payload(length: int) -> bytearray:
    """Pure-Python twin of ``_cframing.new_payload``: a buffer for :func:`fill`."""
    return bytearray(length)


def fill(payload: bytearray, at: int, data: BytesLike, crc: int, verify: bool) -> int:
    """Pure-Python twin of ``_cframing.fill``: copy ``data`` into ``payload[at:]``; return the
    unmasked CRC32C ``crc`` continued over it (unchanged when not ``verify``)."""
    view = memoryview(data)
    if at < 0 or view.nbytes > len(payload) - at:
        raise ValueError("fill() past the end of the payload")
    payload[at : at + view.nbytes] = view
    return _crc32c_package.crc32c(view, crc) if verify else crc


def framed_bytes(records: Sequence[BytesLike]) -> int:
    """The bytes ``records`` take framed: each payload plus its 16 bytes of header and CRCs."""
    return sum(map(len, records)) + 16 * len(records)


def mask(crc: int) -> int:
    """The masked form TFRecord stores of an (unmasked) CRC32C."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
