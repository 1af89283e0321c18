"""A local shard replaced or changed while it is read: never a splice of two versions.

A reader pins the file it reads (one descriptor, opened by its first read): a file replaced
by an atomic rename (a writer's commit, a reshard) is read to its end as it was; a file
changed in place is an ObjectChangedError, as a replaced remote object is. Before, every
block opened the path again: the records of both versions came out (or a CorruptRecordError
at the seam, or with ``on_corrupt="skip"`` no error at all).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.errors import ObjectChangedError
from streamrec.format.framing import RecordEncoder

KIB, MIB = 1 << 10, 1 << 20
# small records: the block path; large ones (over the pure-Python twin's 1 MiB threshold
# too): read directly (pipeline/stream/direct.py)
SHAPES = {"blocks": (2000, KIB), "direct": (10, MIB + 100 * KIB)}
# a budget far below the file: most of it is read after the change
READ = {
    "blocks": {"block_bytes": 16 * KIB, "prefetch_bytes": 64 * KIB},
    "direct": {"block_bytes": 256 * KIB, "prefetch_bytes": 2 * MIB},
}
TAKEN = 5  # records consumed before the file changes


def records(tag: bytes, shape: str, sizes_from: int = 0) -> list[bytes]:
    count, size = SHAPES[shape]
    return [(b"%s-%06d-" % (tag, i)).ljust(size + sizes_from * (i % 3), b".") for i in range(count)]


def write(path: Path, payloads: list[bytes]) -> None:
    path.write_bytes(RecordEncoder().encode_many(payloads))


def options(shape: str, on_corrupt: str) -> dict[str, Any]:
    return {"max_concurrency": 1, "on_corrupt": on_corrupt, **READ[shape]}


async def consume(ds: Any, iteration: str, then: Any) -> list[bytes]:
    """The records of ``ds``; ``then()`` is called once TAKEN of them were consumed."""
    got: list[bytes] = []
    if iteration == "sync":
        for record in ds:
            got.append(record)
            if len(got) == TAKEN:
                then()
    else:
        async for record in ds:
            got.append(record)
            if len(got) == TAKEN:
                then()
    return got


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("iteration", ["sync", "async"])
@pytest.mark.parametrize("on_corrupt", ["raise", "skip"])
@pytest.mark.parametrize("sizes", ["same sizes", "other sizes"])
async def test_a_file_replaced_mid_read_is_read_to_its_end_as_it_was(
    tmp_path: Path, scanner: str, shape: str, iteration: str, on_corrupt: str, sizes: str
) -> None:
    old = records(b"old", shape)
    # records of the very same lengths: a splice would frame cleanly, only the data tells
    new = records(b"new", shape, sizes_from=0 if sizes == "same sizes" else 7)
    path, successor = tmp_path / "shard.tfrecord", tmp_path / "next.tfrecord"
    write(path, old)
    write(successor, new)
    ds = streamrec.open_dataset(str(path), **options(shape, on_corrupt))
    got = await consume(ds, iteration, lambda: os.replace(successor, path))
    assert [r[:11] for r in got] == [r[:11] for r in old]
    assert got == old
    assert ds.stats.corrupt_skipped == 0
    assert list(streamrec.open_dataset(str(path))) == new  # a new read: the new file


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("iteration", ["sync", "async"])
@pytest.mark.parametrize("on_corrupt", ["raise", "skip"])
@pytest.mark.parametrize("change", ["rewritten", "truncated"])
async def test_a_file_changed_in_place_mid_read_is_an_error(
    tmp_path: Path, scanner: str, shape: str, iteration: str, on_corrupt: str, change: str
) -> None:
    old = records(b"old", shape)
    path = tmp_path / "shard.tfrecord"
    write(path, old)
    os.utime(path, ns=(10**18, 10**18))  # long ago: a write now changes the mtime

    def change_it() -> None:
        if change == "truncated":
            os.truncate(path, path.stat().st_size // 2)
            return
        with open(path, "r+b") as file:  # same size, other records: only the mtime tells
            file.write(RecordEncoder().encode_many(records(b"new", shape)))

    ds = streamrec.open_dataset(str(path), **options(shape, on_corrupt))
    with pytest.raises(ObjectChangedError, match="changed while it was being read") as info:
        await consume(ds, iteration, change_it)
    assert str(path) in str(info.value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="lists /proc/self/fd")
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_pinned_descriptor_is_closed_with_its_reader(
    tmp_path: Path, scanner: str, shape: str
) -> None:
    path = tmp_path / "shard.tfrecord"
    write(path, records(b"old", shape))

    def open_on_it() -> int:
        fds = Path("/proc/self/fd")
        return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path.resolve()))

    ds = streamrec.open_dataset(str(path), **options(shape, "raise"))
    it = iter(ds)
    next(it)
    assert open_on_it() >= 1  # pinned while its reader reads
    assert len(list(it)) == SHAPES[shape][0] - 1
    assert open_on_it() == 0
    ds.close()
