"""A host's record of index checks: which leading entries of each shard's record index were
verified against the shard, shared by the processes of one host (sans-I/O).

Checking an index costs a read of every record before the first one wanted
(:mod:`streamrec.pipeline.indexed.trust`): a global shuffle's first epoch reads nearly every
shard once per consumer. The first process of a host to check a shard writes what it verified
here; the others (DataLoader workers, DDP ranks, resumed runs) read it instead of the shard.
Only versioned shards are recorded: a version (an ETag, a generation) names bytes that never
change, so a check of them holds for as long as the version does.

Layout, version 1 (little-endian), one file per dataset (its shards in order)::

    header   32 bytes: magic b"SRCHECK\\x00", version u32 (1), flags u32 (0), shards u64,
             header_crc u32 (CRC-32C of the 24 bytes before it), 4 bytes of zeros
    slots    32 bytes a shard: entries u64 (how many leading entries are verified), tag
             (16 bytes: the first half of the SHA-256 of the shard's key digest then the
             entries' 8 bytes), 8 bytes of zeros

A shard's *key digest* is the SHA-256 of the JSON array (ASCII, escaped) ``[url, size,
version, index digest as hex]`` (:func:`key_digest`). A slot vouches only for the shard,
version and index it was written for: a slot left by another dataset, a torn write or a
flipped bit reads as "nothing verified" (0), never as more than was checked; and the tag is
cryptographic, so no index can be made (by trying variants) to match a slot another's check
left. Processes write their own slots with one aligned 32-byte write each; any value a writer
left is one that was verified.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct

from streamrec.format.crc import crc32c

__all__ = [
    "HEADER_BYTES",
    "MAGIC",
    "SLOT_BYTES",
    "VERSION",
    "decode_header",
    "decode_slot",
    "encode_header",
    "encode_slot",
    "key_digest",
]

MAGIC = b"SRCHECK\x00"
"""The first 8 bytes of a host's check record. A literal: it changes only with :data:`VERSION`."""
VERSION = 1

_HEADER = struct.Struct("<8sIIQI4x")
_SLOT = struct.Struct("<Q16s8x")
HEADER_BYTES = _HEADER.size
SLOT_BYTES = _SLOT.size


def key_digest(url: str, size: int, version: str | None, index_digest: bytes) -> bytes:
    """The 32 bytes a slot's CRC binds it to: this shard, version and index."""
    text = json.dumps([url, size, version, index_digest.hex()], ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).digest()


def encode_header(shards: int) -> bytes:
    """The header of a record of ``shards`` slots."""
    head = struct.pack("<8sIIQ", MAGIC, VERSION, 0, shards)
    return _HEADER.pack(MAGIC, VERSION, 0, shards, crc32c(head))


def decode_header(data: bytes) -> int | None:
    """The slot count a header states; None when ``data`` is not a version-1 header."""
    if len(data) < HEADER_BYTES:
        return None
    magic, version, flags, shards, crc = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or flags != 0:
        return None
    if crc != crc32c(bytes(data[: HEADER_BYTES - 8])):
        return None
    return int(shards)


def _tag(digest: bytes, entries: int) -> bytes:
    return hashlib.sha256(digest + struct.pack("<Q", entries)).digest()[:16]


def encode_slot(digest: bytes, entries: int) -> bytes:
    """A slot saying the first ``entries`` entries of the shard of ``digest`` are verified."""
    return _SLOT.pack(entries, _tag(digest, entries))


def decode_slot(data: bytes, digest: bytes) -> int:
    """How many entries the slot ``data`` vouches for the shard of ``digest``: 0 unless it is
    a whole slot written for exactly that shard, version and index."""
    if len(data) != SLOT_BYTES:
        return 0
    entries, tag = _SLOT.unpack(data)
    if not hmac.compare_digest(tag, _tag(digest, entries)) or any(data[24:]):
        return 0
    return int(entries)
