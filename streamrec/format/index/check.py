"""Whether an index's records are the shard's records (sans-I/O).

:func:`~streamrec.format.index.core.parse_index` checks that an index is consistent in itself and
with the shard's size; that is not enough. A shard's records are where its own framing puts
them, from byte 0 on: each record's 8-byte length says where the next one starts. An index
that cuts the shard at other boundaries that happen to add up (inside a payload that holds a
framed record, say) would make a reader return bytes of one record's payload as a record,
with both CRCs right. So an entry is a record only once every entry before it is checked
against the shard's own length fields, from the stream's start:

* :func:`check_lengths`: the length field at each entry's offset is its framed length less
  16. By induction from offset 0 (entry 0 starts there, every entry where the one before
  ends), every entry so checked starts where the shard's own framing puts a record. The
  length CRCs and payloads are checked when the records are read, as always.
* :class:`CompressedCheck` (a GZIP/ZLIB shard with an extended index): the shard inflated from
  its start, the length fields checked in the stream, its end where the index's last record
  ends, and each restart point checked to *be* one: a raw inflater started there over the
  stored bytes up to the next restart point must produce exactly the stream's bytes from the
  point's stream offset (compared by BLAKE2b digests, piece by piece, never held whole). A
  reader starting there then reads the shard's own bytes, whatever the index says.

Memory is bounded: stored bytes are fed in pieces, inflated :data:`PIECE_BYTES` at a time.
"""

from __future__ import annotations

import hashlib
import zlib

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from streamrec.errors import IndexMismatchError
from streamrec.format.codecs import Compression, make_decompressor
from streamrec.format.crc import BytesLike
from streamrec.format.framing import OVERHEAD_BYTES
from streamrec.format.index.core import ShardIndex

__all__ = ["PIECE_BYTES", "CompressedCheck", "check_entries", "check_lengths"]

Int64Array = npt.NDArray[np.int64]
PIECE_BYTES = 1 << 20
"""Uncompressed bytes inflated at a time."""
_LENGTH_BYTES = 8
_RAW_DEFLATE = -15


def _invented(url: str, record: int, offset: int, claimed: int, found: int | None) -> Exception:
    there = "no record" if found is None else f"a record of {found + OVERHEAD_BYTES} framed bytes"
    return IndexMismatchError(
        f"the record index says record {record} starts here with {claimed} framed bytes, but "
        f"the shard's own framing has {there} here: the index does not follow the shard's "
        "records (it may cut a record's payload into records that are not there); rebuild it "
        f"with `streamrec index --force {url}`",
        url=url,
        offset=offset,
        record_index=record,
    )


def check_lengths(
    data: BytesLike, at: int, index: ShardIndex, first: int, stop: int, url: str
) -> None:
    """Check entries ``first .. stop-1`` of ``index`` against ``data``, the stream's bytes
    from offset ``at``, which must hold each entry's 8 length bytes (IndexMismatchError
    naming the first entry whose length field disagrees)."""
    if stop <= first:
        return
    check_entries(data, at, index.offsets[first:stop], index.lengths[first:stop], first, url)


def check_entries(
    data: BytesLike, at: int, offsets: Int64Array, lengths: Int64Array, first: int, url: str
) -> None:
    """:func:`check_lengths` of the entries given as their columns: ``offsets`` and
    ``lengths`` of entries ``first, first + 1, ...`` (a range of an index, decoded alone)."""
    if not len(offsets):
        return
    view = sliding_window_view(np.frombuffer(data, dtype=np.uint8), _LENGTH_BYTES)
    found = np.ascontiguousarray(view[offsets - at]).view("<u8").reshape(-1)
    claimed = lengths - OVERHEAD_BYTES
    wrong = np.flatnonzero(found != claimed.astype(np.uint64))
    if len(wrong):
        k = int(wrong[0])
        raise _invented(url, first + k, int(offsets[k]), int(claimed[k]) + 16, int(found[k]))


class _Run:
    """One restart point's run being checked: its raw inflater and both digests."""

    def __init__(self, point: int) -> None:
        self.point = point  # its stream offset
        self.inflater = zlib.decompressobj(_RAW_DEFLATE)
        self.produced = 0
        self.failed = False
        self.ours = hashlib.blake2b()  # of what the raw inflater makes
        self.stream = hashlib.blake2b()  # of the stream's bytes meanwhile

    def feed(self, data: bytes) -> None:
        pending = data
        while not self.inflater.eof and not self.failed:
            try:
                out = self.inflater.decompress(pending, PIECE_BYTES)
            except zlib.error:
                self.failed = True  # not a restart point: no deflate stream starts there
                return
            pending = self.inflater.unconsumed_tail
            if not out and not pending:
                return
            self.produced += len(out)
            self.ours.update(out)


class CompressedCheck:
    """A compressed shard's stored bytes, fed in order from its start -> the index checked
    against them (see the module docstring); :meth:`close` at the end."""

    def __init__(
        self, *, url: str, compression: Compression, index: ShardIndex, stored_size: int
    ) -> None:
        assert compression is not None and index.restarts is not None and index.skips is not None
        self.url = url
        self.index = index
        self.stored_size = stored_size
        self._stream = make_decompressor(compression, url=url, max_piece_bytes=PIECE_BYTES)
        firsts = np.flatnonzero(np.diff(index.restarts, prepend=-1))
        # each run's restart point (stored offset) and its stream offset; the stream's start
        # first (read with the codec's own inflater, as a reader does)
        self._restarts: list[int] = index.restarts[firsts].tolist()
        self._points: list[int] = (index.offsets[firsts] - index.skips[firsts]).tolist()
        if not self._restarts or self._restarts[0] != 0:
            self._restarts.insert(0, 0)
            self._points.insert(0, 0)
        self._end = index.stream_bytes
        self._run_number = 0  # the run the next stored byte belongs to
        self._run: _Run | None = None  # its check (none for the stream's start)
        self._fed = 0  # stored bytes fed
        self._produced = 0  # stream bytes inflated
        self._next = 0  # the next entry whose length field is to be checked
        self._tail = b""  # the stream's last bytes, from the next entry's offset

    def feed(self, data: bytes) -> None:
        """The shard's next stored bytes."""
        while data:
            boundary = self._boundary()
            cut = min(len(data), boundary - self._fed)
            piece, data = data[:cut], data[cut:]
            self._feed_run(piece)
            if self._fed == boundary and boundary < self.stored_size:
                self._next_run()

    def close(self) -> None:
        """The end of the stored bytes: the stream, the last run and every entry checked."""
        for out in self._stream.close():
            self._stream_bytes(out)
        self._finish_run()
        if self._produced != self._end:
            raise self._mismatch(
                f"the shard's stream has {self._produced} bytes, its record index's records "
                f"end at {self._end}",
                min(self._produced, self._end),
            )
        if self._next < len(self.index):
            raise _invented(
                self.url,
                self._next,
                int(self.index.offsets[self._next]),
                int(self.index.lengths[self._next]),
                None,
            )

    def _boundary(self) -> int:
        following = self._run_number + 1
        if following < len(self._restarts):
            return int(self._restarts[following])
        return self.stored_size

    def _feed_run(self, piece: bytes) -> None:
        self._fed += len(piece)
        if self._run is not None:
            self._run.feed(piece)
        for out in self._stream.stream(piece):
            self._stream_bytes(out)

    def _stream_bytes(self, out: bytes) -> None:
        if self._run is not None:
            self._run.stream.update(out)
        at = self._produced - len(self._tail)
        self._produced += len(out)
        data = self._tail + out if self._tail else out
        offsets = self.index.offsets
        stop = int(np.searchsorted(offsets, self._produced - _LENGTH_BYTES, side="right"))
        check_lengths(data, at, self.index, self._next, stop, self.url)
        self._next = max(self._next, stop)
        keep = int(offsets[self._next]) if self._next < len(offsets) else self._produced
        self._tail = data[keep - at :] if keep < self._produced else b""

    def _next_run(self) -> None:
        self._finish_run()
        self._run_number += 1
        point = int(self._points[self._run_number])
        if self._produced != point:
            raise self._mismatch(
                f"a restart point at stored byte {self._fed} is at stream offset "
                f"{self._produced}, not {point} as the record index says",
                point,
            )
        self._run = _Run(point)

    def _finish_run(self) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        made = self._produced - run.point
        if run.failed or run.produced != made or run.ours.digest() != run.stream.digest():
            raise self._mismatch(
                f"the restart point at stream offset {run.point} is not one: inflating from "
                "it does not give the shard's stream",
                run.point,
            )

    def _mismatch(self, problem: str, offset: int) -> IndexMismatchError:
        return IndexMismatchError(
            f"{problem}: the record index does not match the shard; rebuild it "
            f"(`streamrec reshard --index`)",
            url=self.url,
            offset=offset,
        )
