"""Large records of local, uncompressed shards read straight into their ``bytes`` objects
(pipeline/stream/direct.py, storage/local/records.py and its C twin): the same records, errors,
resume
offsets and budget as the block path, on the C and the pure-Python path (``scanner``)."""

from __future__ import annotations

import asyncio
import os
import struct
import threading
import tracemalloc
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.errors import CorruptRecordError, FormatError, TruncatedRecordError
from streamrec.format.crc import masked_crc32c
from streamrec.format.framing import RecordEncoder
from streamrec.format.shard import ShardDecoder
from streamrec.pipeline.budget import ByteBudget
from streamrec.pipeline.stream import direct
from streamrec.pipeline.stream.direct import DIRECT_RECORD_BYTES, DirectRead
from streamrec.pipeline.stream.prefetch import ObjectReader
from streamrec.storage.base import ObjectInfo
from streamrec.storage.local import records as local_records
from streamrec.storage.local.store import LocalStore

KIB, MIB = 1 << 10, 1 << 20


def payloads(sizes: list[int], seed: int = 0) -> list[bytes]:
    rng = __import__("random").Random(seed)
    return [rng.randbytes(size) for size in sizes]


def write(path: Path, records: list[bytes]) -> str:
    path.write_bytes(b"".join(RecordEncoder().encode(r) for r in records))
    return str(path)


def header(length: int) -> bytes:
    packed = struct.pack("<Q", length)
    return packed + struct.pack("<I", masked_crc32c(packed))


def reference(path: str) -> tuple[list[bytes], FormatError | None]:
    """What the block path's decoder makes of the whole file: records, then the error."""
    data = Path(path).read_bytes()
    decoder = ShardDecoder(url=path, compression=None, size=len(data))
    got: list[bytes] = []
    try:
        got += decoder.feed(data)
        got += decoder.close()
        decoder.raise_pending()
    except FormatError as exc:
        return got, exc
    return got, None


def read_all(path: str, **options: Any) -> tuple[list[bytes], FormatError | None]:
    got: list[bytes] = []
    try:
        for record in streamrec.open_dataset(path, **options):
            got.append(record)
    except FormatError as exc:
        return got, exc
    return got, None


@pytest.fixture(autouse=True)
def same_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pure-Python twin reads from the C path's threshold here (by default it starts at
    1 MiB), so that every test exercises both on the same shards."""
    monkeypatch.setattr(local_records, "PURE_MIN_RECORD_BYTES", DIRECT_RECORD_BYTES)


@pytest.fixture
def direct_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of records each direct group read handed on (fails a test whose records
    never took the direct path)."""
    groups: list[int] = []
    read_group = direct._read_group

    def counting(*args: Any) -> tuple[list[bytes], int]:
        records, clean = read_group(*args)
        groups.append(len(records))
        return records, clean

    monkeypatch.setattr(direct, "_read_group", counting)
    return groups


SHARDS = {
    "large": [100 * KIB] * 12 + [3 * MIB, 70 * KIB],
    "threshold": [DIRECT_RECORD_BYTES - 16, DIRECT_RECORD_BYTES - 17, DIRECT_RECORD_BYTES - 16],
    "large then small": [200 * KIB] * 3 + [10, 5 * KIB, 0] + [300 * KIB] * 2 + [1],
    "small then large": [10, 20] + [200 * KIB] * 3,
    "over the budget": [3 * MIB, 100 * KIB, 3 * MIB],
}


@pytest.mark.parametrize("name", list(SHARDS))
def test_the_records_are_the_block_paths(
    tmp_path: Path, scanner: str, direct_reads: list[int], name: str
) -> None:
    records = payloads(SHARDS[name])
    path = write(tmp_path / "shard.tfrecord", records)
    got, error = read_all(path, prefetch_bytes=2 * MIB, block_bytes=512 * KIB)
    assert error is None
    assert got == records == reference(path)[0]
    leading_large = 0  # the direct path reads up to the first small record
    while leading_large < len(records) and SHARDS[name][leading_large] + 16 >= DIRECT_RECORD_BYTES:
        leading_large += 1
    assert sum(direct_reads) == leading_large


def test_a_record_larger_than_the_budget_is_read_alone(tmp_path: Path, scanner: str) -> None:
    records = payloads([3 * MIB, 200 * KIB, 200 * KIB, 4 * MIB])
    path = write(tmp_path / "big.tfrecord", records)

    async def run() -> tuple[list[bytes], ByteBudget]:
        budget = ByteBudget(1 * MIB)
        reader = ObjectReader(LocalStore(), ObjectInfo(path, os.path.getsize(path)), budget)
        read = DirectRead(reader, start_offset=0, start_index=0, verify_crc=True)
        got: list[bytes] = []
        async with aclosing(read.chunks()) as chunks:
            async for chunk in chunks:
                got += chunk
        assert read.handoff is None
        return got, budget

    got, budget = asyncio.run(run())
    assert got == records
    assert budget.reserved == 0
    # never more than the budget plus the one record the consumer waits for
    assert budget.peak <= 1 * MIB + 4 * MIB + 16


def test_resume_from_every_record_boundary(
    tmp_path: Path, scanner: str, direct_reads: list[int]
) -> None:
    records = payloads([80 * KIB, 300 * KIB, 1 * MIB + 3, 64 * KIB, 150 * KIB, 2 * MIB, 90 * KIB])
    path = write(tmp_path / "resume.tfrecord", records)
    options = {"prefetch_bytes": 1 * MIB}

    async def first(k: int) -> tuple[list[bytes], dict[str, Any]]:
        ds = streamrec.open_dataset(path, **options)
        taken: list[bytes] = []
        async with aclosing(ds.__aiter__()) as items:
            async for record in items:
                taken.append(record)
                if len(taken) == k:
                    break
        return taken, ds.state_dict()

    for k in range(1, len(records) + 1):
        taken, state = asyncio.run(first(k))
        assert taken == records[:k]
        resumed = streamrec.open_dataset(path, **options)
        resumed.load_state_dict(state)
        direct_reads.clear()
        assert list(resumed) == records[k:], f"resumed after {k}"
        assert sum(direct_reads) == len(records) - k  # read directly from the saved offset


HOSTILE = {
    "length beyond the object": "huge",
    "payload CRC": "flip",
    "truncated payload": "cut payload",
    "truncated footer": "cut footer",
    "bad length CRC": "bad header",
}


@pytest.mark.parametrize("damage", list(HOSTILE.values()), ids=list(HOSTILE))
def test_damage_raises_the_block_paths_error(tmp_path: Path, scanner: str, damage: str) -> None:
    records = payloads([100 * KIB, 200 * KIB, 300 * KIB, 120 * KIB])
    path = tmp_path / "bad.tfrecord"
    write(path, records)
    data = bytearray(path.read_bytes())
    third = 2 * 16 + 300 * KIB  # header offset of the third record
    if damage == "huge":
        data[third : third + 12] = header(1 << 40)
    elif damage == "flip":
        data[third + 12 + 1000] ^= 0x40
    elif damage == "cut payload":
        del data[len(data) - 500 :]
    elif damage == "cut footer":
        del data[len(data) - 2 :]
    elif damage == "bad header":
        data[third + 3] ^= 1
    path.write_bytes(bytes(data))
    want, expected = reference(str(path))
    got, error = read_all(str(path))
    assert expected is not None and error is not None
    assert got == want
    assert (type(error), error.offset, error.record_index, str(error)) == (
        type(expected),
        expected.offset,
        expected.record_index,
        str(expected),
    )
    if damage in ("huge", "cut payload", "cut footer"):
        assert isinstance(error, TruncatedRecordError)
    if damage == "flip":
        assert isinstance(error, CorruptRecordError) and len(got) == 2


def test_a_length_beyond_the_object_allocates_nothing(tmp_path: Path, scanner: str) -> None:
    first = payloads([200 * KIB])[0]
    path = tmp_path / "huge.tfrecord"
    path.write_bytes(RecordEncoder().encode(first) + header(1 << 34) + bytes(200 * KIB))
    tracemalloc.start()
    try:
        got, error = read_all(str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == [first] and isinstance(error, TruncatedRecordError)
    assert error.offset == len(first) + 16
    assert peak < 64 * MIB  # nothing near the 16 GiB the header claims


def test_closing_early_returns_the_budget(tmp_path: Path, scanner: str) -> None:
    records = payloads([300 * KIB] * 40)
    path = write(tmp_path / "close.tfrecord", records)

    async def run() -> tuple[list[bytes], ByteBudget, ObjectReader]:
        budget = ByteBudget(4 * MIB)
        reader = ObjectReader(
            LocalStore(),
            ObjectInfo(path, os.path.getsize(path)),
            budget,
            block_bytes=600 * KIB,
            max_concurrency=4,
        )
        read = DirectRead(reader, start_offset=0, start_index=0, verify_crc=True)
        chunks = read.chunks()
        first = await chunks.__anext__()
        assert budget.reserved > 0  # more groups in flight
        await chunks.aclose()
        return first, budget, reader

    first, budget, reader = asyncio.run(run())
    assert first == records[: len(first)]
    assert budget.reserved == 0
    assert budget.covered == 0 or reader.share_bytes is not None


@pytest.mark.parametrize("size", [200 * KIB, 900 * KIB], ids=["groups", "one record a walk"])
def test_groups_in_flight_are_handed_on_in_file_order(
    tmp_path: Path, scanner: str, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    # 900 KiB: more than a walk's 2 x 400 KiB, so each walk lists one record, and the next
    # group must start while the one before it is still being read
    records = payloads([size] * 12)
    path = write(tmp_path / "order.tfrecord", records)
    second_done = threading.Event()
    calls: list[int] = []
    read_group = direct._read_group

    def racing(store: Any, obj: Any, plans: list[tuple[int, int]], *rest: Any) -> Any:
        calls.append(plans[0][0])
        if len(calls) == 1:  # the first group finishes only after the second
            assert second_done.wait(timeout=20), "the second group never ran concurrently"
            return read_group(store, obj, plans, *rest)
        result = read_group(store, obj, plans, *rest)
        second_done.set()
        return result

    monkeypatch.setattr(direct, "_read_group", racing)
    got, error = read_all(path, block_bytes=400 * KIB, prefetch_bytes=8 * MIB)
    assert error is None and got == records
    assert len(calls) >= 3


def test_a_failing_read_hands_the_rest_to_the_block_path(
    tmp_path: Path, scanner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = payloads([200 * KIB] * 8)
    path = write(tmp_path / "fails.tfrecord", records)
    calls: list[int] = []
    read_records = direct.read_records

    def failing(file: Any, plans: Any, verify: bool, stop: Any, pool: Any = None) -> Any:
        calls.append(len(plans))
        if len(calls) == 2:
            file.close()  # this group's reads fail (a bad descriptor): an OSError
        return read_records(file, plans, verify, stop, pool)

    monkeypatch.setattr(direct, "read_records", failing)
    got, error = read_all(path, block_bytes=400 * KIB, prefetch_bytes=1 * MIB)
    assert error is None and got == records
    assert len(calls) >= 2


def test_without_crc_checks_damage_is_not_looked_for(
    tmp_path: Path, scanner: str, direct_reads: list[int]
) -> None:
    records = payloads([100 * KIB] * 4)
    path = tmp_path / "unchecked.tfrecord"
    write(path, records)
    data = bytearray(path.read_bytes())
    data[16 + 100 * KIB + 12 + 7] ^= 1  # the second payload
    path.write_bytes(bytes(data))
    got, error = read_all(str(path), verify_crc=False)
    assert error is None and len(got) == 4
    assert got[1] != records[1] and got[0] == records[0] and got[2:] == records[2:]
    assert sum(direct_reads) == 4


def test_the_pure_python_twin_reads_only_records_of_a_mib_directly(
    tmp_path: Path, direct_reads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_records, "PURE_MIN_RECORD_BYTES", 1 << 20)
    monkeypatch.setattr(local_records, "_cread", None)
    small = payloads([100 * KIB] * 3)
    assert read_all(write(tmp_path / "small.tfrecord", small)) == (small, None)
    assert sum(direct_reads) == 0  # the block path: faster there in Python
    large = payloads([2 * MIB] * 3)
    assert read_all(write(tmp_path / "large.tfrecord", large)) == (large, None)
    assert sum(direct_reads) == 3
