"""The dataset index: every shard's record index in one binary object (sans-I/O).

Writers with ``index=True``, ``streamrec reshard --index`` and ``streamrec index`` write
``_dataset_index.bin`` beside the shards (and the manifest names it). A reader fetches this one
object instead of a sidecar per shard, plans an epoch from its per-shard counts, and decodes a
shard's records only when a read needs them: memory-mapped, a dataset's index costs no
memory of its own but the pages read, shared by every process of the host.

Layout, version 1 (little-endian)::

    header    56 bytes: magic b"SRDSIDX\\x00", version u32 (1), flags u32 (0), shards u64,
              records u64, names_bytes u64, segments_bytes u64, table_crc u32 (CRC-32C of
              the rows and the names), header_crc u32 (CRC-32C of the 52 bytes before it)
    rows      72 bytes a shard: name_at u64 (in names), name_bytes u32, version_bytes u32
              (0xFFFFFFFF: no version), size u64 (stored bytes), records u64, stream_bytes u64
              (uncompressed: where its last record ends), segment_at u64 (in segments),
              segment_bytes u64, segment_crc u32 (CRC-32C of the segment), restart_points
              u32, codec u8 (0 none, 1 gzip, 2 zlib), width u8 (1, 2, 4 or 8), kind u8 (0
              plain, 1 counts only: a compressed shard without restart points, 2 restart
              points), then 5 bytes of zeros
    names     each shard's name (relative to the index's directory, as in a manifest) then
              its version, UTF-8, back to back, in shard order
    segments  each shard's, in shard order, back to back: every record's framed length minus
              16 in ``width`` bytes (offsets follow: records lie end to end from 0); then, for
              kind 2, its restart points: compressed offset, stream offset and first record,
              u64 each

A shard's entries are the same numbers as its ``.idx`` sidecar (:mod:`.core`): the plain
index's two columns, or the extended one's four, rebuilt by :meth:`DatasetIndex.shard_index`.

A dataset index is untrusted input. :class:`DatasetIndex` checks, before anything is used: the
magic and version, the header's CRC, that the object's size is exactly what the header says
(no count is believed that the bytes do not back), the rows' and names' CRC, and every row:
names inside the names, segments inside the segments, back to back, each exactly as long as
its records and restart points need, a known codec, width and kind that agree, records and
stream bytes a shard of its size can hold, and records summing to the header's. A shard's
segment is checked when it is decoded: its CRC, then every entry as a sidecar's
(:meth:`~.core.IndexParser.feed_rows`). Anything else is a
:class:`~streamrec.errors.FormatError` naming the object, the byte offset and what is wrong.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streamrec.errors import FormatError
from streamrec.format.codecs import Compression
from streamrec.format.crc import crc32c
from streamrec.format.framing import OVERHEAD_BYTES
from streamrec.format.index.core import IndexParser, ShardIndex, stream_limit

__all__ = [
    "DATASET_INDEX_NAME",
    "MAGIC",
    "VERSION",
    "DatasetIndex",
    "EncodedShard",
    "IndexedShard",
    "dataset_index_bytes",
    "encode_shard",
]

DATASET_INDEX_NAME = "_dataset_index.bin"
"""The name writers give the dataset index beside the shards."""
MAGIC = b"SRDSIDX\x00"
"""The first 8 bytes of every dataset index. A literal: it changes only with :data:`VERSION`."""
VERSION = 1

Int64Array = npt.NDArray[np.int64]

_HEADER = struct.Struct("<8sIIQQQQII")
_ROW = struct.Struct("<QIIQQQQQIIBBB5x")
_NO_VERSION = 0xFFFFFFFF
_CODECS: tuple[Compression, ...] = (None, "gzip", "zlib")
_WIDTHS: dict[int, np.dtype[np.unsignedinteger]] = {
    1: np.dtype("<u1"),
    2: np.dtype("<u2"),
    4: np.dtype("<u4"),
    8: np.dtype("<u8"),
}
_PLAIN, _COUNTS_ONLY, _RESTARTS = 0, 1, 2
_POINT_BYTES = 24  # a restart point: three u64
_DECODE_ROWS = 1 << 16  # entries checked at once: a few MiB of temporaries per shard
assert _HEADER.size == 56 and _ROW.size == 72


@dataclass(frozen=True)
class IndexedShard:
    """One shard as the dataset index describes it."""

    name: str
    """Relative to the dataset index's directory (resolve it as a manifest's names)."""
    size: int
    version: str | None
    compression: Compression
    records: int
    stream_bytes: int
    """Where its last record ends in the (uncompressed) stream: its records' framed bytes."""
    random_access: bool
    """False for a compressed shard indexed without restart points (counts only)."""


def _segment(index: ShardIndex, compressed: bool) -> tuple[bytes, int, int, int]:
    """``(segment, width, kind, restart points)`` of one shard's index."""
    lengths = index.lengths - OVERHEAD_BYTES
    top = int(lengths.max()) if len(lengths) else 0
    width = next(w for w in (1, 2, 4, 8) if top < 1 << (8 * w))
    data = [lengths.astype(_WIDTHS[width]).tobytes()]
    if not compressed:
        return data[0], width, _PLAIN, 0
    if index.restarts is None or index.skips is None:
        return data[0], width, _COUNTS_ONLY, 0
    points = index.offsets - index.skips
    new = np.ones(len(points), dtype=bool)
    new[1:] = (index.restarts[1:] != index.restarts[:-1]) | (points[1:] != points[:-1])
    firsts = np.flatnonzero(new)
    table = np.stack((index.restarts[firsts], points[firsts], firsts), axis=1)
    data.append(table.astype("<u8").tobytes())
    return b"".join(data), width, _RESTARTS, len(firsts)


@dataclass(frozen=True)
class EncodedShard:
    """One shard's row and segment, ready for :func:`dataset_index_bytes` (a writer keeps
    these, a byte or two a record, not the shard's index)."""

    name: bytes
    version: bytes | None
    size: int
    records: int
    stream_bytes: int
    segment: bytes
    width: int
    kind: int
    restart_points: int
    codec: int


def encode_shard(
    name: str, size: int, version: str | None, compression: Compression, index: ShardIndex
) -> EncodedShard:
    """Shard ``name`` (relative to where the dataset index is written) of ``size`` stored
    bytes, committed as ``version``, read with ``compression``, as the dataset index holds it."""
    segment, width, kind, points = _segment(index, compression is not None)
    return EncodedShard(
        name.encode(),
        None if version is None else version.encode(),
        size,
        len(index),
        index.stream_bytes,
        segment,
        width,
        kind,
        points,
        _CODECS.index(compression),
    )


def dataset_index_bytes(shards: Sequence[EncodedShard]) -> bytes:
    """The dataset index of ``shards`` (:func:`encode_shard`), in the dataset's shard order."""
    rows, names = [], []
    names_at = segments_at = records = 0
    for shard in shards:
        version = b"" if shard.version is None else shard.version
        rows.append(
            _ROW.pack(
                names_at,
                len(shard.name),
                _NO_VERSION if shard.version is None else len(version),
                shard.size,
                shard.records,
                shard.stream_bytes,
                segments_at,
                len(shard.segment),
                crc32c(shard.segment),
                shard.restart_points,
                shard.codec,
                shard.width,
                shard.kind,
            )
        )
        names += [shard.name, version]
        names_at += len(shard.name) + len(version)
        segments_at += len(shard.segment)
        records += shard.records
    table = b"".join(rows) + b"".join(names)
    head = _HEADER.pack(
        MAGIC, VERSION, 0, len(shards), records, names_at, segments_at, crc32c(table), 0
    )[:-4]
    return b"".join(
        [head, struct.pack("<I", crc32c(head)), table, *(shard.segment for shard in shards)]
    )


class DatasetIndex:
    """A dataset index read from ``data`` (bytes, or a memory map of the object), checked as
    the module docstring says; ``source`` names it in errors. Only the header, the rows and
    the names are read here; a shard's segment when :meth:`shard_index` decodes it."""

    def __init__(self, data: bytes | memoryview | mmap.mmap, *, source: str) -> None:
        self.source = source
        self._data = memoryview(data).cast("B")
        size = len(self._data)
        if size < _HEADER.size:
            raise self._bad(0, f"{size} bytes, fewer than the header's {_HEADER.size}")
        magic, version, flags, shards, records, names_bytes, segments_bytes, table_crc, head_crc = (
            _HEADER.unpack_from(self._data)
        )
        if magic != MAGIC:
            raise self._bad(0, f"starts with {bytes(magic)!r}, not a dataset index ({MAGIC!r})")
        if version != VERSION:
            raise self._bad(
                8, f"version {version}; this streamrec reads version {VERSION} (upgrade it)"
            )
        if crc32c(self._data[: _HEADER.size - 4]) != head_crc:
            raise self._bad(0, "its header's CRC does not match (damaged)")
        if flags:
            raise self._bad(12, f"unknown flags {flags:#x}")
        rows_at = _HEADER.size
        expected = rows_at + shards * _ROW.size + names_bytes + segments_bytes
        if expected != size:
            raise self._bad(0, f"its header describes {expected} bytes, but the object has {size}")
        self._names_at = rows_at + shards * _ROW.size
        self._segments_at = self._names_at + names_bytes
        if crc32c(self._data[rows_at : self._segments_at]) != table_crc:
            raise self._bad(rows_at, "its shard table's CRC does not match (damaged)")
        self.records = records
        self._rows = [_ROW.unpack_from(self._data, rows_at + k * _ROW.size) for k in range(shards)]
        self.shards = [self._check_row(k, names_bytes, segments_bytes) for k in range(shards)]
        total = sum(shard.records for shard in self.shards)
        if total != records:
            raise self._bad(24, f"its shards hold {total} records, its header says {records}")

    def _bad(self, offset: int, problem: str) -> FormatError:
        return FormatError(f"{self.source} (byte {offset}): not a valid dataset index: {problem}")

    def _check_row(self, k: int, names_bytes: int, segments_bytes: int) -> IndexedShard:
        (
            name_at,
            name_bytes,
            version_bytes,
            size,
            records,
            stream_bytes,
            segment_at,
            segment_bytes,
            _crc,
            points,
            codec,
            width,
            kind,
        ) = self._rows[k]
        at = _HEADER.size + k * _ROW.size

        def bad(problem: str) -> FormatError:
            return self._bad(at, f"shard {k}: {problem}")

        strings = name_bytes + (0 if version_bytes == _NO_VERSION else version_bytes)
        previous_end = 0
        if k:
            before = self._rows[k - 1]
            previous_end = before[0] + before[1] + (0 if before[2] == _NO_VERSION else before[2])
        if name_at != previous_end or name_at + strings > names_bytes or not name_bytes:
            raise bad("its name is not where the names say, or empty")
        previous_segment = 0
        if k:
            before = self._rows[k - 1]
            previous_segment = before[6] + before[7]
        if segment_at != previous_segment or segment_at + segment_bytes > segments_bytes:
            raise bad("its segment is not back to back with the one before, or past the end")
        if k == len(self._rows) - 1 and (
            segment_at + segment_bytes != segments_bytes or name_at + strings != names_bytes
        ):
            raise bad("the names or segments go on past the last shard")
        if codec >= len(_CODECS):
            raise bad(f"unknown codec {codec}")
        compression = _CODECS[codec]
        if width not in _WIDTHS:
            raise bad(f"a width of {width} bytes (1, 2, 4 or 8)")
        if kind > _RESTARTS or (kind == _PLAIN) != (compression is None):
            raise bad(f"kind {kind} with codec {compression}")
        if kind != _RESTARTS and points:
            raise bad("restart points in a shard indexed without them")
        if kind == _RESTARTS and records and not points:
            raise bad("records but no restart point")
        if points > records:
            raise bad(f"{points} restart points for {records} records")
        longest = stream_limit(size, compression is not None)
        if stream_bytes > longest or records * OVERHEAD_BYTES > stream_bytes:
            raise bad(
                f"{records} records in {stream_bytes} stream bytes, more than a shard of "
                f"{size} bytes holds"
            )
        if compression is None and stream_bytes != size:
            raise bad(f"its records end at byte {stream_bytes}, but the shard has {size} bytes")
        if segment_bytes != records * width + points * _POINT_BYTES:
            raise bad(f"a segment of {segment_bytes} bytes for {records} records")
        start = self._names_at + name_at
        try:
            name = bytes(self._data[start : start + name_bytes]).decode()
            version = (
                None
                if version_bytes == _NO_VERSION
                else bytes(
                    self._data[start + name_bytes : start + name_bytes + version_bytes]
                ).decode()
            )
        except UnicodeDecodeError as exc:
            raise bad(f"its name or version is not UTF-8 ({exc.reason})") from exc
        return IndexedShard(
            name, size, version, compression, records, stream_bytes, kind != _COUNTS_ONLY
        )

    def segment_digest(self, k: int) -> bytes:
        """A BLAKE2b digest of what shard ``k``'s entries are (its row's counts, codec, width
        and kind, and its segment's bytes), without decoding them: the key its verified
        boundaries are kept under. Cryptographic: the segment's CRC-32C, which anyone can
        match to chosen entries, would let a forged index pass as one already checked."""
        row = self._rows[k]
        start = self._segments_at + row[6]
        digest = hashlib.blake2b(digest_size=16)
        digest.update(struct.pack("<QQQIBBB", row[4], row[5], row[7], row[9], *row[10:13]))
        digest.update(self._data[start : start + row[7]])
        return digest.digest()

    def lengths(self, k: int) -> npt.NDArray[np.integer]:
        """Shard ``k``'s framed lengths minus 16, as stored (a view of the data, unchecked)."""
        row = self._rows[k]
        start = self._segments_at + row[6]
        return np.frombuffer(self._data[start : start + row[4] * row[11]], dtype=_WIDTHS[row[11]])

    def shard_index(self, k: int, *, checked: bool = False) -> ShardIndex:
        """Shard ``k``'s index, its segment's CRC and every entry checked (FormatError);
        ``checked``: this object checked it before (decoded again, not checked again)."""
        shard, row = self.shards[k], self._rows[k]
        start = self._segments_at + row[6]
        segment = self._data[start : start + row[7]]
        if not checked and crc32c(segment) != row[8]:
            raise self._bad(start, f"shard {k} ({shard.name}): its segment's CRC does not match")
        compressed = shard.compression is not None
        raw = self.lengths(k)
        if not checked and len(raw) and int(raw.max()) > shard.stream_bytes:
            raise self._bad(
                start,
                f"shard {k} ({shard.name}): a record of {int(raw.max()) + OVERHEAD_BYTES} "
                f"bytes, more than its {shard.stream_bytes}",
            )
        if not shard.records:
            empty = np.zeros(0, dtype=np.int64)
            if row[12] == _RESTARTS:  # as the builder gives it: random access to nothing
                return ShardIndex(empty, empty, empty, empty)
            return ShardIndex(empty, empty, counts_only=compressed)
        lengths = raw.astype(np.int64) + OVERHEAD_BYTES  # (each at most the stream: no wrap)
        offsets = np.zeros(len(lengths), dtype=np.int64)
        if len(lengths) > 1:
            np.cumsum(lengths[:-1], out=offsets[1:])
        if row[12] == _PLAIN:  # end to end from 0, each >= 16: they must end at its size
            end = int(offsets[-1] + lengths[-1])
            if not checked and end != shard.size:
                raise self._bad(
                    start,
                    f"shard {k} ({shard.name}): its records end at byte {end}, but the shard "
                    f"has {shard.size} bytes",
                )
            return ShardIndex(offsets, lengths)
        columns = [offsets, lengths]
        if row[12] == _RESTARTS:
            points = np.frombuffer(segment[len(lengths) * row[11] :], dtype="<u8").reshape(-1, 3)
            firsts = points[:, 2].astype(np.int64)
            if len(firsts) and (
                firsts[0] != 0
                or np.any(firsts[1:] <= firsts[:-1])
                or firsts[-1] >= len(lengths)
                or points[:, :2].max() >= 1 << 62
            ):
                raise self._bad(start, f"shard {k} ({shard.name}): restart points out of order")
            counts = np.diff(np.append(firsts, len(lengths)))
            columns.append(np.repeat(points[:, 0].astype(np.int64), counts))
            columns.append(offsets - np.repeat(points[:, 1].astype(np.int64), counts))
        if checked:
            if len(columns) == 2:
                return ShardIndex(offsets, lengths, counts_only=True)
            return ShardIndex(offsets, lengths, columns[2], columns[3])
        parser = IndexParser(
            source=f"{self.source} (shard {k}, {shard.name})",
            stored_size=shard.size,
            compressed=compressed,
        )
        table = np.stack(columns, axis=1)
        for low in range(0, len(table), _DECODE_ROWS):
            parser.feed_rows(table[low : low + _DECODE_ROWS])
        parser.finish()
        index = parser.index()
        if index.stream_bytes != shard.stream_bytes:
            raise self._bad(
                at_row(k),
                f"shard {k} ({shard.name}): its records end at "
                f"{index.stream_bytes}, its row says {shard.stream_bytes}",
            )
        return index


def at_row(k: int) -> int:
    """The byte offset of shard ``k``'s row."""
    return _HEADER.size + k * _ROW.size
