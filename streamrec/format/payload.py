"""Records read straight into their final ``bytes`` (sans-I/O): the header check, and the
payload being filled with its CRC continued step by step.

A reader that owns the I/O (:mod:`streamrec.storage.local.records`, reading a local file in worker
threads) walks the headers with :func:`read_header`; with the C accelerator it reads each
payload into an :func:`uninitialised` ``bytes`` object itself (the CRC kernel comes from
``_cframing``'s capsule). Its pure-Python twin reads into a :class:`PayloadBuffer`: each step
read into :attr:`PayloadBuffer.view`, :meth:`PayloadBuffer.add` right after it (the CRC reads
what is still in the cache), :meth:`PayloadBuffer.finish` to compare the footer.
"""

from __future__ import annotations

import struct

import crc32c as _crc32c_package

from streamrec.format.accel import load_accelerator
from streamrec.format.crc import BytesLike
from streamrec.format.framing_python import FOOTER_BYTES, HEADER_BYTES, mask

__all__ = ["FOOTER_BYTES", "HEADER_BYTES", "PayloadBuffer", "read_header", "uninitialised"]

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
