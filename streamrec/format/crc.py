"""TensorFlow's masked CRC32C (Castagnoli), as used by the TFRecord framing.

TFRecord stores ``mask(crc32c(data))`` rather than the raw CRC, because computing the CRC of a
string that itself contains embedded CRCs is problematic:
``mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8  (mod 2**32)``.
"""

from __future__ import annotations

import crc32c as _crc32c_package

__all__ = ["MASK_DELTA", "BytesLike", "crc32c", "mask", "masked_crc32c", "unmask"]

MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF

#: What the format core accepts as input bytes.
BytesLike = bytes | bytearray | memoryview


def crc32c(data: BytesLike) -> int:
    """The plain CRC32C of ``data`` (hardware-accelerated where the CPU allows)."""
    return int(_crc32c_package.crc32c(data))


def mask(crc: int) -> int:
    """Mask a raw CRC32C the way TFRecord stores it."""
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & _U32


def unmask(masked: int) -> int:
    """Invert :func:`mask`."""
    rotated = (masked - MASK_DELTA) & _U32
    return ((rotated >> 17) | (rotated << 15)) & _U32


def masked_crc32c(data: BytesLike) -> int:
    """``mask(crc32c(data))``: the value a TFRecord header or footer stores for ``data``."""
    crc = _crc32c_package.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & _U32
