"""The shuffle buffer's record locations in a resume state: one short, checked string.

A buffer of ``n`` locations ``[ordinal, index, offset, length]`` is stored as columns over the
locations sorted by ``(ordinal, index, offset, length)``, where neighbours are alike:

1. ordinal minus the previous entry's ordinal (first: the ordinal);
2. index minus the previous index of the same shard (first in a shard: the index);
3. offset minus where the previous entry of the same shard ends, ``offset + length + 16``
   (first in a shard: the offset) -- 0 for consecutive records;
4. length;
5. the buffer's order: for each buffer slot, the position of its location in the sorted list.

Values are taken modulo 2**64 (so any location list encodes and decodes exactly). Each column
is one byte giving its width (1, 2, 4 or 8 bytes) and ``n`` little-endian values of that width;
the columns follow ``n`` (8 bytes), the whole is zlib-compressed (level 9) and base64-encoded.
The same buffer always gives the same string with the same zlib.

:func:`decode_buffer` trusts nothing: the string's length, the inflated size (bounded before
inflating), every width and value, and that the order is a permutation are checked, and any
fault is a :class:`~streamrec.errors.StateError` naming the field.
"""

from __future__ import annotations

import base64
import binascii
import struct
import sys
import zlib
from collections.abc import Sequence

from streamrec.errors import StateError
from streamrec.format.framing import OVERHEAD_BYTES

__all__ = ["decode_buffer", "encode_buffer", "packed_size_limit"]

_MOD = 1 << 64
_MAX = 2**63 - 1
_FRAMING = OVERHEAD_BYTES  # bytes around every payload
_COLUMNS = 5
_WIDTHS = {1: "B", 2: "H", 4: "I", 8: "Q"}


def encode_buffer(buffer: Sequence[Sequence[int]]) -> str:
    """The locations of ``buffer`` (in buffer order) as one ASCII string."""
    order = sorted(range(len(buffer)), key=lambda k: tuple(buffer[k]))
    rank = [0] * len(buffer)
    for position, k in enumerate(order):
        rank[k] = position
    columns: list[list[int]] = [[] for _ in range(_COLUMNS)]
    ordinal = index = end = 0
    for k in order:
        o, i, off, length = (int(v) for v in buffer[k])
        if o != ordinal or not columns[0]:
            columns[0].append((o - ordinal) % _MOD)
            ordinal, index, end = o, 0, 0
        else:
            columns[0].append(0)
        columns[1].append((i - index) % _MOD)
        columns[2].append((off - end) % _MOD)
        columns[3].append(length % _MOD)
        index, end = i, off + length + _FRAMING
    columns[4] = rank
    raw = bytearray(struct.pack("<Q", len(buffer)))
    for column in columns:
        width = next(w for w in _WIDTHS if max(column, default=0) < 1 << (8 * w))
        raw += struct.pack(f"<B{len(column)}{_WIDTHS[width]}", width, *column)
    return base64.b64encode(zlib.compress(bytes(raw), 9)).decode("ascii")


def packed_size_limit(entries: int) -> int:
    """Most bytes an encoded buffer of at most ``entries`` locations inflates to."""
    return 8 + _COLUMNS * (1 + 8 * entries)


def decode_buffer(packed: object, field: str, most: int = _MAX) -> list[list[int]]:
    """The locations (in buffer order) of a string from :func:`encode_buffer`, of at most
    ``most`` entries; StateError naming ``field`` when it is not one."""
    raw = _inflate(packed, field, min(packed_size_limit(most), sys.maxsize - 1))
    if len(raw) < 8:
        raise _bad(field, "is too short")
    (n,) = struct.unpack_from("<Q", raw)
    if n > most:
        raise _bad(field, f"holds {n} locations, more than the buffer's {most}")
    columns: list[tuple[int, ...]] = []
    pos = 8
    for c in range(_COLUMNS):
        width = raw[pos] if pos < len(raw) else 0
        if width not in _WIDTHS or pos + 1 + width * n > len(raw):
            raise _bad(field, f"column {c} has no valid width or is cut short")
        columns.append(struct.unpack_from(f"<{n}{_WIDTHS[width]}", raw, pos + 1))
        pos += 1 + width * n
    if pos != len(raw):
        raise _bad(field, f"has {len(raw) - pos} bytes after its columns")
    ordered: list[list[int]] = []
    ordinal = index = end = 0
    for k in range(n):
        if columns[0][k] or k == 0:
            ordinal, index, end = (ordinal + columns[0][k]) % _MOD, 0, 0
        i = (index + columns[1][k]) % _MOD
        off = (end + columns[2][k]) % _MOD
        length = columns[3][k]
        location = [ordinal, i, off, length]
        for value, name in zip(location, ("ordinal", "index", "offset", "length"), strict=True):
            if value > _MAX:
                raise _bad(field, f"entry {k} has {name} {value}, beyond 2**63 - 1")
        ordered.append(location)
        index, end = i, off + length + _FRAMING
    rank = columns[4]
    if sorted(rank) != list(range(n)):
        raise _bad(field, "has a buffer order that is not a permutation of its entries")
    return [ordered[r] for r in rank]


def _inflate(packed: object, field: str, limit: int) -> bytes:
    if not isinstance(packed, str):
        raise _bad(field, f"is {type(packed).__name__}, not a packed buffer (a string)")
    if len(packed) > 4 * (limit + limit // 1000 + 64) // 3 + 4:  # incompressible, with zlib's own
        raise _bad(field, f"is {len(packed)} characters long, too long for the buffer")
    try:
        compressed = base64.b64decode(packed.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error) as exc:
        raise _bad(field, f"is not base64 ({exc})") from None
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(compressed, limit + 1)
    except zlib.error as exc:
        raise _bad(field, f"is not zlib data ({exc})") from None
    if len(raw) > limit or not inflater.eof or inflater.unused_data:
        raise _bad(field, "inflates to more than the buffer could hold, or is not one zlib stream")
    return raw


def _bad(field: str, problem: str) -> StateError:
    return StateError(f"resume state field {field} (the packed shuffle buffer) {problem}")
