"""Payloads -> per-shard stored bytes and shard ends, as a list of ops (sans-I/O).

The planner runs in the caller's thread: it frames and compresses records
(:class:`~streamrec.format.encoder.ShardEncoder`, one per open shard), decides which shard each
one goes to (rotation by ``max_records`` / ``max_bytes``, or a fixed ``num_shards`` filled
round-robin or contiguously) and cuts the stored bytes into blocks of ``flush_bytes`` for the
sinks. With ``index=True`` each shard's end carries its record index sidecar's bytes
(:mod:`streamrec.format.index.core`). See :mod:`streamrec.write.writer` for the rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from streamrec.format.codecs import Compression
from streamrec.format.crc import BytesLike
from streamrec.format.encoder import ShardEncoder
from streamrec.format.framing import OVERHEAD_BYTES
from streamrec.format.index.core import ShardIndex
from streamrec.write.template import ShardTemplate

__all__ = ["Op", "Order", "Planner"]

Order = Literal["round_robin", "contiguous"]


def _nbytes(payload: BytesLike) -> int:
    return payload.nbytes if isinstance(payload, memoryview) else len(payload)


def _check_payload(payload: object, url: str) -> None:
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        hint = ""
        if isinstance(payload, dict):
            hint = " (encode Examples with streamrec.example.encode)"
        raise TypeError(f"{url}: a record must be bytes-like, not {type(payload).__name__}{hint}")


class Op:
    """For the sink side: bytes for shard ``index``, and/or the end of that shard (with its
    record index sidecar's bytes, ``index_data``, when the shards are indexed)."""

    __slots__ = ("data", "end", "index", "index_data", "records", "shard_index")

    def __init__(
        self,
        index: int,
        data: bytes,
        end: bool = False,
        records: int = 0,
        shard_index: ShardIndex | None = None,
    ) -> None:
        self.index = index
        self.data = data
        self.end = end
        self.records = records
        self.shard_index = shard_index
        """The shard's record index (indexed shards): its sidecar, its dataset index entries."""
        self.index_data = None if shard_index is None else shard_index.to_bytes()


class _Shard:
    """One shard being written: its encoder and the stored bytes not yet handed out."""

    __slots__ = ("encoder", "index", "pending", "pieces", "records")

    def __init__(self, index: int, compression: Compression, level: int, indexed: bool) -> None:
        self.index = index
        self.encoder = ShardEncoder(compression, level=level, index=indexed)
        self.pieces: list[bytes] = []
        self.pending = 0  # stored bytes not yet handed out
        self.records = 0  # the encoder's count, kept here too: the rotation reads it per record

    def emit(self, data: bytes | None) -> None:
        if data:
            self.pieces.append(data)
            self.pending += len(data)

    def add(self, payloads: Sequence[BytesLike]) -> None:
        self.emit(self.encoder.encode(payloads))
        self.records = self.encoder.records

    def add_one(self, payload: BytesLike) -> None:
        data = self.encoder.encode_one(payload)
        self.records += 1
        if data:
            self.pieces.append(data)
            self.pending += len(data)

    def finish(self) -> ShardIndex | None:
        """End the stream; the shard's record index (None: not indexed)."""
        self.emit(self.encoder.finish())
        return self.encoder.shard_index

    def take(self) -> bytes:
        data = b"".join(self.pieces) if len(self.pieces) != 1 else self.pieces[0]
        self.pieces = []
        self.pending = 0
        return data


class Planner:
    """Payloads -> per-shard stored bytes and shard ends, as a list of ops (no I/O)."""

    def __init__(
        self,
        template: ShardTemplate,
        *,
        compression: Compression,
        level: int,
        max_records: int | None,
        max_bytes: int | None,
        num_shards: int | None,
        order: Order,
        total_records: int | None,
        flush_bytes: int,
        index: bool = False,
    ) -> None:
        self.template = template
        self.indexed = index
        self.compression = compression
        self.level = level
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.num_shards = num_shards
        self.order = order
        self.total_records = total_records
        self.flush_bytes = flush_bytes
        self.ops: list[Op] = []
        self.open: dict[int, _Shard] = {}
        self.current: _Shard | None = None  # rotating / contiguous: the shard being filled
        self.next_index = 0
        self.records = 0
        self.finished = False
        if num_shards is None:
            self.mode = "rotate"
        else:
            self.mode = order
        if self.mode == "contiguous":
            assert num_shards is not None and total_records is not None
            quotient, remainder = divmod(total_records, num_shards)
            self.sizes = [quotient + (1 if k < remainder else 0) for k in range(num_shards)]

    # -- shards ---------------------------------------------------------------------------
    def _new_shard(self) -> _Shard:
        shard = _Shard(self.next_index, self.compression, self.level, self.indexed)
        self.open[shard.index] = shard
        self.next_index += 1
        return shard

    def _end(self, shard: _Shard) -> None:
        shard_index = shard.finish()
        self.ops.append(
            Op(shard.index, shard.take(), end=True, records=shard.records, shard_index=shard_index)
        )
        del self.open[shard.index]
        if self.current is shard:
            self.current = None

    def _collect(self, shard: _Shard) -> None:
        if shard.pending >= self.flush_bytes:
            self.ops.append(Op(shard.index, shard.take()))

    def take_ops(self) -> list[Op]:
        ops, self.ops = self.ops, []
        return ops

    # -- adding ---------------------------------------------------------------------------
    def add(self, payload: BytesLike) -> bool:
        """Encode one payload; True when ops are ready for the sink side."""
        _check_payload(payload, self.template.text)
        self._check_more(1)
        if self.mode == "round_robin":
            assert self.num_shards is not None
            shard = self._round_robin_shard(self.records % self.num_shards)
            shard.add_one(payload)
            self._collect(shard)
            self.records += 1
        else:
            self._add_sequential((payload,))
        return bool(self.ops)

    def add_many(self, payloads: Iterable[BytesLike]) -> bool:
        """Encode many payloads; True when ops are ready for the sink side."""
        chunk = payloads if isinstance(payloads, (list, tuple)) else list(payloads)
        for payload in chunk:
            _check_payload(payload, self.template.text)
        if not chunk:
            return bool(self.ops)
        self._check_more(len(chunk))
        if self.mode == "round_robin":
            assert self.num_shards is not None
            n = self.num_shards
            start = self.records % n
            for k in range(min(n, len(chunk))):
                part = chunk[k::n]
                shard = self._round_robin_shard((start + k) % n)
                shard.add(part)
                self._collect(shard)
            self.records += len(chunk)
        else:
            self._add_sequential(chunk)
        return bool(self.ops)

    def _check_more(self, count: int) -> None:
        if self.finished:
            raise RuntimeError(f"{self.template.text}: writer is closing")
        if self.mode == "contiguous":
            assert self.total_records is not None
            if self.records + count > self.total_records:
                raise ValueError(
                    f"{self.template.text}: more records than total_records={self.total_records}"
                )

    def _round_robin_shard(self, index: int) -> _Shard:
        shard = self.open.get(index)
        if shard is None:
            shard = _Shard(index, self.compression, self.level, self.indexed)
            self.open[index] = shard
        return shard

    def _sequential_shard(self) -> _Shard:
        """The shard being filled (rotating or contiguous), a new one when needed."""
        if self.current is None:
            self.current = self._new_shard()
        if self.mode == "contiguous":
            while self.current.records >= self.sizes[self.current.index]:
                self._end(self.current)
                self.current = self._new_shard()
        return self.current

    def _room(self, shard: _Shard) -> int | None:
        """Records that may still go into ``shard`` by count (None: no count limit)."""
        if self.mode == "contiguous":
            return self.sizes[shard.index] - shard.records
        if self.max_records is not None:
            return self.max_records - shard.records
        return None

    def _add_sequential(self, chunk: Sequence[BytesLike]) -> None:
        i, n = 0, len(chunk)
        limit = self.max_bytes if self.mode == "rotate" else None
        while i < n:
            shard = self._sequential_shard()
            room = self._room(shard)
            stop = n if room is None else min(n, i + room)
            j = i
            if limit is None:
                j = stop
            else:
                extra = 0
                while j < stop:
                    size = _nbytes(chunk[j]) + OVERHEAD_BYTES
                    if not shard.encoder.bound_fits(extra + size, limit) and (
                        shard.records or j > i
                    ):
                        break
                    extra += size
                    j += 1
            if j > i:
                if j - i == 1:
                    shard.add_one(chunk[i])
                else:
                    shard.add(chunk[i:j])
                self.records += j - i
                i = j
                self._collect(shard)
            if self._full(shard, limit):
                self._end(shard)  # no record can follow: commit it now, not at the next one
                continue
            if i == n:
                break
            if i < stop and self._add_exact(shard, chunk[i], limit):
                self.records += 1
                i += 1
                self._collect(shard)
                continue
            self._end(shard)  # full: the next record starts a new shard

    def _full(self, shard: _Shard, limit: int | None) -> bool:
        """True when no further record can go into ``shard``."""
        room = self._room(shard)
        if room is not None and room <= 0:
            return True
        return limit is not None and shard.encoder.no_record_fits(limit)

    def _add_exact(self, shard: _Shard, payload: BytesLike, limit: int | None) -> bool:
        """The bound said no: decide exactly whether ``payload`` still fits (compressed)."""
        if limit is None or not shard.encoder.compressed:
            return False  # uncompressed, the bound is exact
        out = shard.encoder.add_if_fits(payload, limit)
        shard.emit(out)
        shard.records = shard.encoder.records
        return out is not None

    # -- the end --------------------------------------------------------------------------
    def finish(self) -> None:
        """End every shard still open (and write the empty ones a fixed set still lacks)."""
        if self.finished:
            return
        if self.mode == "contiguous":
            assert self.total_records is not None and self.num_shards is not None
            if self.records != self.total_records:
                raise ValueError(
                    f"{self.template.text}: {self.records} records written, but "
                    f"total_records={self.total_records}"
                )
        self.finished = True
        if self.mode == "round_robin":
            assert self.num_shards is not None
            for index in range(self.num_shards):
                self._end(self._round_robin_shard(index))
            return
        if self.current is None and self.next_index == 0:
            self.current = self._new_shard()  # no record at all: one empty shard
        if self.current is not None:
            self._end(self.current)
        if self.mode == "contiguous":
            assert self.num_shards is not None
            while self.next_index < self.num_shards:
                self._end(self._new_shard())
