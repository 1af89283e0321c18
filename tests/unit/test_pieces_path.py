"""The body -> prefetch -> decode path without copies: bodies kept in the chunks they arrive
in, a reader's arrived pieces taken together, and their records handed on as one chunk."""

from __future__ import annotations

import uuid

import pytest

from streamrec.errors import CorruptRecordError
from streamrec.format.encoder import ShardEncoder
from streamrec.format.framing import RecordEncoder
from streamrec.format.shard import ShardDecoder
from streamrec.pipeline.budget import ByteBudget
from streamrec.pipeline.stream.prefetch import ObjectReader
from streamrec.pipeline.stream.read import GROUP_BYTES, decode_blocks
from streamrec.storage.base import ObjectInfo
from streamrec.storage.http.body import read_pieces
from streamrec.storage.local.memory import MemoryStore


class Content:
    """An aiohttp StreamReader's ``readany`` over given chunks."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    async def readany(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


async def test_big_chunks_are_kept_as_they_arrived_and_small_ones_joined() -> None:
    big = [bytes([i]) * 300 for i in range(3)]
    small = [b"a" * 40, b"b" * 40, b"c" * 40]
    pieces = await read_pieces(Content([big[0], *small, big[1], b"d" * 10, big[2]]), 100)
    assert pieces[0] is big[0]  # not copied
    assert pieces[1] == b"a" * 40 + b"b" * 40 + b"c" * 40
    assert pieces[2] is big[1]
    assert pieces[3] == b"d" * 10 + big[2]  # a small chunk waits for the next one
    assert await read_pieces(Content([b"x" * 10]), 100) == [b"x" * 10]
    assert await read_pieces(Content([]), 100) == []


class PieceStore(MemoryStore):
    """A memory store whose range reads come back in pieces of ``piece`` bytes."""

    def __init__(self, piece: int) -> None:
        super().__init__()
        self.piece = piece

    async def read_range_pieces(self, obj: ObjectInfo, start: int, end: int) -> list[bytes]:
        data = await self.read_range(obj, start, end)
        return [data[i : i + self.piece] for i in range(0, len(data), self.piece)]


async def _reader(data: bytes, piece: int, block_bytes: int) -> tuple[ObjectReader, ByteBudget]:
    store = PieceStore(piece)
    url = f"memory://pieces-path/{uuid.uuid4().hex}"
    store.fs.pipe(url, data)
    budget = ByteBudget(1 << 30)
    obj = (await store.expand(url))[0]
    return ObjectReader(store, obj, budget, block_bytes=block_bytes), budget


async def test_take_ready_hands_on_arrived_pieces_within_the_limit() -> None:
    data = bytes(range(256)) * 40  # 10,240 bytes
    reader, budget = await _reader(data, 1000, 20_000)
    first = await reader.__anext__()  # one request, the whole object, in 1000-byte pieces
    assert first == data[:1000]
    taken = reader.take_ready(3500)
    assert [len(p) for p in taken] == [1000, 1000, 1000]
    assert reader.take_ready(999) == []  # the next piece is larger than that
    rest = [p async for p in reader]
    assert first + b"".join(taken) + b"".join(rest) == data
    assert reader.take_ready(10_000) == []
    await reader.aclose()
    assert budget.reserved == 0


async def test_records_of_arrived_pieces_are_handed_on_as_one_chunk() -> None:
    payloads = [bytes([i % 256]) * 500 for i in range(400)]
    data = RecordEncoder().encode_many(payloads)
    reader, budget = await _reader(data, 4096, len(data))
    decoder = ShardDecoder(compression=None, size=len(data))
    seen: list[int] = []
    chunks = [c async for c in decode_blocks(reader, decoder, seen.append)]
    assert [r for c in chunks for r in c] == payloads
    assert sum(seen) == len(data) and max(seen) == 4096  # every piece counted
    # ~GROUP_BYTES of pieces per chunk, not one chunk per 4 KiB piece
    assert len(chunks) <= len(data) // GROUP_BYTES + 3 < len(seen)
    assert budget.reserved == 0


async def test_records_before_damage_come_first_when_pieces_are_grouped() -> None:
    payloads = [bytes([i % 256]) * 300 for i in range(50)]
    data = bytearray(RecordEncoder().encode_many(payloads))
    data[40 * 316 + 20] ^= 0xFF  # inside record 40's payload, in a later piece
    reader, _ = await _reader(bytes(data), 1000, len(data))
    decoder = ShardDecoder(compression=None, size=len(data))
    got: list[bytes] = []
    with pytest.raises(CorruptRecordError):
        async for chunk in decode_blocks(reader, decoder):
            got += chunk
    assert got == payloads[:40]


async def test_compressed_pieces_are_not_gathered() -> None:
    payloads = [bytes([i % 256]) * 2000 for i in range(300)]
    encoder = ShardEncoder("gzip")
    data = encoder.encode(payloads) + encoder.finish()
    reader, _ = await _reader(data, 512, len(data))
    decoder = ShardDecoder(compression="gzip", size=len(data), max_piece_bytes=8192)
    chunks = [chunk async for chunk in decode_blocks(reader, decoder)]
    assert [r for c in chunks for r in c] == payloads
    assert max(len(c) for c in chunks) <= 8192 // 2000 + 1  # each inflated piece on its own
