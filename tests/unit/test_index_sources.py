"""Index sidecars in listings and their loading, on local files: ``.idx`` names are never taken
as shards, the sidecars a listing returns travel with their shards (``ObjectInfo.index``), and
each is checked against its shard (size before reading, validity after)."""

from __future__ import annotations

import asyncio
import gzip
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from tfrecord.tools.tfrecord2idx import create_index

from streamrec.errors import IndexMismatchError, ObjectNotFoundError
from streamrec.format.framing import RecordEncoder
from streamrec.format.index.core import index_size_limit
from streamrec.pipeline.listing.plan import plan_shards, planned_records
from streamrec.pipeline.listing.sidecars import find_indexes, load_indexes_and_codecs, record_counts
from streamrec.pipeline.listing.urls import list_sources
from streamrec.storage.base import ObjectInfo
from streamrec.storage.registry import StoreSet
from streamrec.storage.retry import RetryPolicy

RETRY = RetryPolicy(max_attempts=1)


def shard_bytes(count: int, size: int = 10) -> bytes:
    return RecordEncoder().encode_many([bytes([k % 251]) * size for k in range(count)])


def write_shards(directory: Path, counts: Sequence[int], indexed: Sequence[int] = ()) -> None:
    """``part-<k>.tfrecord`` with ``counts[k]`` records; the ``indexed`` ones get a sidecar
    written by the tfrecord package."""
    directory.mkdir(parents=True, exist_ok=True)
    for k, count in enumerate(counts):
        path = directory / f"part-{k}.tfrecord"
        path.write_bytes(shard_bytes(count))
        if k in indexed:
            create_index(str(path), str(path) + ".idx")


def listing(*urls: str) -> list[ObjectInfo]:
    async def run() -> list[ObjectInfo]:
        async with StoreSet(None) as stores:
            return await list_sources(list(urls), stores.get, RETRY)

    return asyncio.run(run())


def names(shards: list[ObjectInfo]) -> list[str]:
    return [os.path.basename(s.url) for s in shards]


def test_globs_and_directories_never_take_sidecars_as_shards(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_shards(data, [3, 2, 4], indexed=[0, 2])
    write_shards(data / "sub", [1], indexed=[0])
    expected = ["part-0.tfrecord", "part-1.tfrecord", "part-2.tfrecord"]
    assert names(listing(str(data))) == expected
    assert names(listing(str(data) + "/")) == expected
    assert names(listing(f"{data}/*")) == expected
    assert names(listing(f"{data}/part-?.tfrecord*")) == expected
    assert names(listing(f"{data}/**")) == [*expected, "part-0.tfrecord"]
    # named explicitly (or by a glob whose literal part names it), a sidecar is an object
    assert names(listing(f"{data}/part-0.tfrecord.idx")) == ["part-0.tfrecord.idx"]
    assert names(listing(f"{data}/*/part-0.tfrecord.idx")) == ["part-0.tfrecord.idx"]
    with pytest.raises(ObjectNotFoundError, match=r"or ending in '\.idx'"):
        listing(f"{data}/*.idx")
    # a directory of sidecars only holds no shards
    only = tmp_path / "only"
    only.mkdir()
    (only / "a.tfrecord.idx").write_bytes(b"")
    with pytest.raises(ObjectNotFoundError, match="holds no shard files"):
        listing(str(only))


def test_sidecars_a_listing_returns_travel_with_their_shards(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_shards(data, [3, 2, 4], indexed=[0, 2])
    sizes = {k: os.path.getsize(data / f"part-{k}.tfrecord.idx") for k in (0, 2)}
    for url in (str(data), f"{data}/*", f"{data}/part-*"):
        shards = listing(url)
        assert [s.index_known for s in shards] == [True, True, True], url
        assert [None if s.index is None else (s.index.url, s.index.size) for s in shards] == [
            (f"{data}/part-0.tfrecord.idx", sizes[0]),
            None,
            (f"{data}/part-2.tfrecord.idx", sizes[2]),
        ], url
    # a glob that cannot match the sidecars, and an object named explicitly: unknown
    for url in (f"{data}/*.tfrecord", f"{data}/part-0.tfrecord"):
        assert all(not s.index_known and s.index is None for s in listing(url)), url


def test_a_directory_with_a_manifest_is_not_listed_its_other_sidecars_found_later(
    tmp_path: Path,
) -> None:
    import streamrec

    with streamrec.sync.open_writer(f"{tmp_path}/out/p-{{index}}.tfrecord", max_records=2) as w:
        w.write_many([b"a", b"b", b"c"])
    create_index(f"{tmp_path}/out/p-1.tfrecord", f"{tmp_path}/out/p-1.tfrecord.idx")
    # the directory's manifest is read first and nothing listed, as when it is named by its
    # url: a sidecar it does not name (added later) is unknown to the listing...
    for url in (f"{tmp_path}/out", f"{tmp_path}/out/", f"{tmp_path}/out/_manifest.json"):
        shards = listing(url)
        assert [s.records for s in shards] == [2, 1]
        assert [s.index_known for s in shards] == [False, False], url

        async def found(shards: list[ObjectInfo] = shards) -> list[str | None]:
            async with StoreSet(None) as stores:
                sidecars = await find_indexes(shards, stores.get, RETRY)
                return [None if s is None else os.path.basename(s.url) for s in sidecars]

        # ... and found when the sidecars are wanted
        assert asyncio.run(found()) == [None, "p-1.tfrecord.idx"]
    # a manifest written with the indexes names them: known, no lookup
    with streamrec.sync.open_writer(
        f"{tmp_path}/named/p-{{index}}.tfrecord", max_records=2, index=True
    ) as w:
        w.write_many([b"a", b"b", b"c"])
    shards = listing(f"{tmp_path}/named")
    assert [s.index_known for s in shards] == [True, True]
    assert [os.path.basename(s.index.url) for s in shards if s.index is not None] == [
        "p-0.tfrecord.idx",
        "p-1.tfrecord.idx",
    ]


def indexes_of(shards: list[ObjectInfo], **kwargs: object) -> list[object]:
    async def run() -> list[object]:
        async with StoreSet(None) as stores:
            found = await load_indexes_and_codecs(shards, stores.get, RETRY, **kwargs)  # type: ignore[arg-type]
            return [None if i is None else len(i[0]) for i in found]

    return asyncio.run(run())


@pytest.mark.parametrize("many", [False, True])
def test_unknown_sidecars_are_looked_up_or_listed_per_directory(tmp_path: Path, many: bool) -> None:
    counts = [3, 0, 2, 5, 1, 4, 2, 3, 6] if many else [3, 0, 2]  # 9 >= one listing's worth
    write_shards(tmp_path, counts, indexed=[0, 2, 8])
    shards = listing(f"{tmp_path}/*.tfrecord")
    assert not any(s.index_known for s in shards)
    expected = [c if k in (0, 2, 8) else None for k, c in enumerate(counts)]
    assert indexes_of(shards) == expected

    async def found() -> list[str | None]:
        async with StoreSet(None) as stores:
            sidecars = await find_indexes(shards, stores.get, RETRY)
            return [None if s is None else os.path.basename(s.url) for s in sidecars]

    assert asyncio.run(found()) == [
        f"part-{k}.tfrecord.idx" if k in (0, 2, 8) else None for k in range(len(counts))
    ]


def test_an_oversized_sidecar_is_refused_by_its_size_before_it_is_read(tmp_path: Path) -> None:
    write_shards(tmp_path, [3])
    shard = tmp_path / "part-0.tfrecord"
    sidecar = Path(str(shard) + ".idx")
    with open(sidecar, "wb") as f:  # sparse: claims a terabyte, reading it would allocate it
        f.truncate(1 << 40)
    limit = index_size_limit(shard.stat().st_size, compressed=False)
    with pytest.raises(IndexMismatchError) as info:
        indexes_of(listing(str(tmp_path)))
    message = str(info.value)
    assert f"{sidecar} has {1 << 40} bytes, more than any index" in message
    assert str(shard) in message and "streamrec index --force" in message
    assert limit < 1 << 40


def test_a_stale_sidecar_names_both_urls_and_the_command(tmp_path: Path) -> None:
    write_shards(tmp_path, [3, 4], indexed=[0, 1])
    (tmp_path / "part-1.tfrecord").write_bytes(shard_bytes(5))  # rewritten: its index is stale
    with pytest.raises(IndexMismatchError) as info:
        indexes_of(listing(str(tmp_path)))
    message = str(info.value)
    assert f"in {tmp_path}/part-1.tfrecord:" in message
    assert f"{tmp_path}/part-1.tfrecord.idx" in message
    assert f"streamrec index --force {tmp_path}/part-1.tfrecord" in message
    assert "end at byte" in message


def test_compression_is_decided_as_the_reader_decides_it(tmp_path: Path) -> None:
    # a gzip shard without a .gz name: sniffed from its first bytes; its plain index has its
    # offsets in the uncompressed stream, so it fits only when read as compressed
    plain = shard_bytes(4)
    (tmp_path / "a.tfrecord").write_bytes(gzip.compress(plain))
    (tmp_path / "plain.tfrecord").write_bytes(plain)
    create_index(str(tmp_path / "plain.tfrecord"), str(tmp_path / "a.tfrecord.idx"))
    (tmp_path / "plain.tfrecord").unlink()
    shards = listing(str(tmp_path))
    assert indexes_of(shards) == [4]
    with pytest.raises(IndexMismatchError, match="end at byte"):
        indexes_of(shards, compression=None)  # forced uncompressed: the offsets do not fit

    async def counts() -> list[int | None]:
        async with StoreSet(None) as stores:
            return await record_counts(shards, stores.get, RETRY)

    assert asyncio.run(counts()) == [4]


@pytest.mark.parametrize("num_hosts", [1, 2, 3, 7, 9])
@pytest.mark.parametrize("num_workers", [1, 2, 5])
def test_planned_records_counts_what_the_split_keeps(num_hosts: int, num_workers: int) -> None:
    counts = [5, 0, 3, 8, 1, 6, 2]
    for host in range(num_hosts):
        for worker in range(num_workers):
            for shuffle in (False, True):
                plan = plan_shards(
                    range(len(counts)),
                    shuffle=shuffle,
                    seed=3,
                    epoch=1,
                    num_hosts=num_hosts,
                    host_index=host,
                    num_workers=num_workers,
                    worker_index=worker,
                    quiet=True,
                )
                kept = sum(
                    len(range(counts[s])[plan.record_offset :: plan.record_stride])
                    for s in plan.shards
                )
                assert planned_records(plan, counts.__getitem__) == kept
    # and every record is some consumer's, exactly once
    total = 0
    for host in range(num_hosts):
        for worker in range(num_workers):
            plan = plan_shards(
                range(len(counts)),
                num_hosts=num_hosts,
                host_index=host,
                num_workers=num_workers,
                worker_index=worker,
                quiet=True,
            )
            total += planned_records(plan, counts.__getitem__)
    assert total == sum(counts)
