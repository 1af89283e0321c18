"""What a file is when it is not what the reader expected, from its first bytes (sans-I/O).

Used where the first record of a stream fails its length CRC (:func:`explain`) and where a
gzip / zlib stream fails on its first bytes: instead of "length CRC mismatch" or zlib's
"incorrect header check", the message says what the bytes look like and what to try.
"""

from __future__ import annotations

import struct

import crc32c as _crc32c_package

from streamrec.errors import FormatError
from streamrec.format.crc import BytesLike, mask

__all__ = ["HEAD_BYTES", "explain", "looks_like", "not_tfrecord"]

HEAD_BYTES = 16
"""How many first bytes the checks look at."""

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"PK\x03\x04", "a zip archive"),
    (b"PAR1", "a Parquet file"),
    (b"%PDF", "a PDF document"),
    (b"BZh", "bzip2 data"),
    (b"\xfd7zXZ\x00", "xz data"),
    (b"(\xb5/\xfd", "zstd data"),
    (b"\x93NUMPY", "a NumPy .npy file"),
)


def _is_tfrecord_header(head: bytes) -> bool:
    if len(head) < 12:
        return False
    (stored,) = struct.unpack_from("<I", head, 8)
    return bool(mask(_crc32c_package.crc32c(head[:8])) == stored)


def _is_zlib(head: bytes) -> bool:
    return len(head) >= 2 and head[0] == 0x78 and (head[0] << 8 | head[1]) % 31 == 0


def _text_kind(head: bytes) -> str | None:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:  # a multi-byte character cut off at the end is fine
        if exc.start < len(head) - 3:
            return None
        text = head[: exc.start].decode("utf-8")
    if not text or not all(c.isprintable() or c in "\t\r\n" for c in text):
        return None
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        return "JSON"
    if stripped.startswith("<"):
        return "HTML or XML"
    return "text"


def looks_like(first_bytes: BytesLike) -> str | None:
    """A short description of what ``first_bytes`` look like (``"gzip"``, ``"a PNG image"``,
    ``"text"``, ``"a TFRecord file"``...), or None when they are nothing known."""
    head = bytes(first_bytes[:HEAD_BYTES])
    if not head:
        return None
    if _is_tfrecord_header(head):
        return "an uncompressed TFRecord file"
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if _is_zlib(head):
        return "zlib data"
    return _text_kind(head)


def not_tfrecord(first_bytes: BytesLike) -> str:
    """Why a stream starting with ``first_bytes`` is not framed as TFRecords, and what to try."""
    kind = looks_like(first_bytes)
    if kind == "gzip":
        return "not a TFRecord file (looks like gzip: try compression='auto' or 'gzip')"
    if kind == "zlib data":
        return "not a TFRecord file (looks like zlib: try compression='auto' or 'zlib')"
    if kind is None:
        return "not a TFRecord file, or damaged at its start (no valid record header)"
    return f"not a TFRecord file (looks like {kind})"


def explain(error: FormatError, first_bytes: BytesLike) -> FormatError:
    """``error`` (the first record of a stream failed) with :func:`not_tfrecord` in front."""
    error.problem = f"{not_tfrecord(first_bytes)}: {error.problem}"
    error.args = (error._render(),)
    return error
