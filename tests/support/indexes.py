"""Checking a shard against its record index sidecar: shared by the index tests
(unit/test_index_encoder.py, integration/test_index_write.py, integration/test_writer_remote.py,
integration/test_reshard.py)."""

from __future__ import annotations

import zlib

from streamrec.format.framing import RecordDecoder
from streamrec.format.index.core import ShardIndex, parse_index

__all__ = ["check_sidecar", "read_by_index", "record_at"]

FRAME = 16


def record_at(stored: bytes, compression: str, restart: int, skip: int, length: int) -> bytes:
    """One framed record of a compressed shard, read alone from its restart point: the
    codec's own inflater at the stream's start (0), a raw one (no header, no history) at any
    other point; ``skip`` bytes dropped."""
    data = _inflater(compression, restart).decompress(stored[restart:], skip + length)
    return data[skip : skip + length]


def _inflater(compression: str, restart: int) -> zlib._Decompress:
    if restart == 0:
        return zlib.decompressobj(31 if compression == "gzip" else 15)
    return zlib.decompressobj(-15)


def read_by_index(stored: bytes, index: ShardIndex, compression: str | None) -> list[bytes]:
    """Every record read through the index alone (both CRCs checked), in index order.

    Compressed, as a reader does: each restart point's bytes ``[restart, next restart or the
    end)`` inflated on their own (raw, unless the point is the stream's start), ``skip`` bytes
    dropped, the record read; a run must hold all of its records."""
    framed: list[bytes] = []
    if compression is None:
        for k in range(len(index)):
            offset, length = int(index.offsets[k]), int(index.lengths[k])
            framed.append(stored[offset : offset + length])
    else:
        assert index.restarts is not None and index.skips is not None
        restarts = index.restarts.tolist()
        points = sorted(set(restarts))
        ends = dict(zip(points, [*points[1:], len(stored)], strict=True))
        runs: dict[int, bytes] = {}
        for k, restart in enumerate(restarts):
            if restart not in runs:
                runs[restart] = _inflater(compression, restart).decompress(
                    stored[restart : ends[restart]]
                )
            skip, length = int(index.skips[k]), int(index.lengths[k])
            assert skip + length <= len(runs[restart]), (k, restart)  # inside its run
            framed.append(runs[restart][skip : skip + length])
    out: list[bytes] = []
    for one in framed:
        decoder = RecordDecoder()
        [payload] = decoder.feed(one)
        decoder.close()
        out.append(payload)
    return out


def check_sidecar(
    stored: bytes, sidecar: bytes, compression: str | None, payloads: list[bytes]
) -> ShardIndex:
    """``sidecar`` is a valid index of the shard ``stored`` and describes exactly
    ``payloads``: their framed lengths, each one readable alone through it (a compressed
    shard's index has restart points)."""
    index = parse_index(
        sidecar, source="sidecar", stored_size=len(stored), compressed=compression is not None
    )
    assert index.lengths.tolist() == [len(p) + FRAME for p in payloads]
    if compression is not None and payloads:
        assert index.random_access and index.restarts is not None
    assert read_by_index(stored, index, compression) == payloads
    return index
