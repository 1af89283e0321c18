"""The local shard cache's directory (storage/cache/store.py), driven directly: keys, the size
bound,
least-recently-used eviction, publish and abort, dead downloads, waiting for another holder.
The read path through a real S3 server is tested in tests/integration/test_cache.py."""

from __future__ import annotations

import asyncio
import fcntl
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from streamrec.format.crc import crc32c
from streamrec.pipeline.options import ReadOptions
from streamrec.storage.base import ObjectInfo
from streamrec.storage.cache.store import (
    CacheFill,
    CacheHit,
    ShardCache,
    cache_namespace,
    is_cacheable,
)


def obj(name: str, size: int = 100, version: str | None = "v1") -> ObjectInfo:
    return ObjectInfo(f"s3://bucket/{name}", size, version)


def dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


async def fill(cache: ShardCache, info: ObjectInfo) -> str:
    """Download ``info`` into the cache (its bytes: its name repeated) and publish it."""
    route = await cache.open(info)
    assert isinstance(route, CacheFill)
    data = (info.url.encode() * info.size)[: info.size]
    half = info.size // 2
    await route.write(half, [data[half:]])  # out of order, as blocks may complete
    await route.write(0, [data[:half]])
    assert await route.publish()
    return route.path


def test_keys_never_collide_on_base_names_versions_or_endpoints(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 1 << 20)
    same_name = [
        ObjectInfo("s3://a/train/shard-0.tfrecord", 10, "e1"),
        ObjectInfo("s3://b/train/shard-0.tfrecord", 10, "e1"),
        ObjectInfo("s3://a/val/shard-0.tfrecord", 10, "e1"),
        ObjectInfo("gs://a/train/shard-0.tfrecord", 10, "e1"),
        ObjectInfo("s3://a/train/shard-0.tfrecord", 10, "e2"),  # replaced: new ETag
        ObjectInfo("s3://a/train/shard-0.tfrecord", 11, "e1"),
    ]
    paths = {cache.entry_path(info) for info in same_name}
    paths.add(cache.entry_path(same_name[0], "http://127.0.0.1:9000"))
    assert len(paths) == len(same_name) + 1
    assert cache_namespace("s3://a/x", {"client_kwargs": {"endpoint_url": "http://h:1"}}) == (
        "http://h:1"
    )
    assert cache_namespace("gs://a/x", {"s3": {"endpoint_url": "http://h:1"}}) == ""
    assert is_cacheable("s3://a/x") and is_cacheable("https://h/x")
    assert not is_cacheable("/data/x") and not is_cacheable("file:///x")
    assert not is_cacheable("memory://x")


async def test_publish_abort_and_hits(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 1000)
    path = await fill(cache, obj("a"))
    hit = await cache.open(obj("a"))
    assert isinstance(hit, CacheHit) and hit.path == path
    assert await hit.store.read_range(hit.obj, 0, 5) == b"s3://"
    await hit.close()
    # a partial download leaves nothing: no entry, no .part, no .lock
    route = await cache.open(obj("b"))
    assert isinstance(route, CacheFill)
    await route.write(0, [b"x" * 50])
    assert not await route.publish()  # half of it: never published
    assert {p.name for p in tmp_path.iterdir()} == {"streamrec-cache.lock", Path(path).name}
    # objects without a version, empty or larger than the cache are not cached
    assert await cache.open(obj("c", version=None)) is None
    assert await cache.open(obj("c", size=1001)) is None
    assert await cache.open(obj("c", size=0)) is None
    # a reader that starts mid-object does not fill
    assert await cache.open(obj("c"), fill=False) is None


async def test_size_bound_and_least_recently_used_eviction(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 350)
    paths = [await fill(cache, obj(name)) for name in "abc"]
    for age, path in enumerate(paths):  # a used first, then b, then c
        os.utime(path, ns=(age, age))
    hit = await cache.open(obj("a"))  # ... now a is the most recently used
    assert isinstance(hit, CacheHit)
    await hit.close()
    assert os.stat(paths[0]).st_mtime_ns > 2
    await fill(cache, obj("d"))  # 400 > 350: the least recently used (b) goes
    assert [os.path.exists(p) for p in paths] == [True, False, True]
    assert dir_bytes(tmp_path) <= 350
    # space is reserved before a byte is written: downloads in progress count
    first = await cache.open(obj("e", size=300))
    assert isinstance(first, CacheFill)
    assert dir_bytes(tmp_path) <= 350
    assert await cache.open(obj("f", size=200)) is None  # no room beside e's download
    assert dir_bytes(tmp_path) <= 350
    await first.abort()


async def test_an_entry_of_the_wrong_size_is_dropped(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 1000)
    path = await fill(cache, obj("a"))
    with open(path, "ab") as f:
        f.write(b"more")
    route = await cache.open(obj("a"))
    assert isinstance(route, CacheFill)  # not served: downloaded again
    await route.abort()
    assert not os.path.exists(path)


async def test_dead_downloads_are_swept(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 1000)
    dead = Path(cache.entry_path(obj("dead"))).with_suffix(".part")
    dead.write_bytes(b"x" * 900)  # its writer died: no lock held
    route = await cache.open(obj("a"))  # would not fit beside it
    assert isinstance(route, CacheFill)
    assert not dead.exists()
    await route.abort()


async def test_waits_for_another_processes_download_then_reads_it(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 1000)
    info = obj("a")
    entry = cache.entry_path(info)
    # another process downloads it: it holds the object's lock
    holder = os.open(entry[: -len(".shard")] + ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    waiting = asyncio.ensure_future(cache.open(info))
    part = entry[: -len(".shard")] + ".part"
    Path(part).write_bytes(b"y" * info.size)
    os.rename(part, entry)  # ... publishes it
    os.close(holder)
    hit = await waiting
    assert isinstance(hit, CacheHit)
    await hit.close()


async def test_takes_over_when_the_holder_dies(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 1000)
    info = obj("a")
    holder = os.open(cache.entry_path(info)[: -len(".shard")] + ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    waiting = asyncio.ensure_future(cache.open(info))
    os.close(holder)  # the holder died: the kernel releases its lock
    route = await waiting
    assert isinstance(route, CacheFill)
    await route.abort()


async def test_a_stalled_holder_is_not_waited_for_forever(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 1000, stall_s=0.0)
    info = obj("a")
    holder = os.open(cache.entry_path(info)[: -len(".shard")] + ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        assert await cache.open(info) is None  # read without the cache
    finally:
        os.close(holder)


def test_options_are_validated() -> None:
    assert ReadOptions(cache_dir="file:///tmp/c", cache_bytes=1).cache_dir == "/tmp/c"
    with pytest.raises(ValueError, match="cache_bytes"):
        ReadOptions(cache_dir="/tmp/c")
    with pytest.raises(ValueError, match="cache_dir"):
        ReadOptions(cache_bytes=1 << 20)
    with pytest.raises(ValueError, match="positive"):
        ReadOptions(cache_dir="/tmp/c", cache_bytes=0)
    with pytest.raises(ValueError, match="local directory"):
        ReadOptions(cache_dir="s3://bucket/cache", cache_bytes=1)


async def test_a_cache_that_cannot_be_written_reads_without_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    not_a_directory = tmp_path / "cache"
    not_a_directory.write_bytes(b"")
    cache = ShardCache(str(not_a_directory), 1000)
    assert await cache.open(obj("a")) is None
    assert "not using the cache" in caplog.text and str(not_a_directory) in caplog.text


async def test_a_planted_link_is_never_written_through(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.makedirs(cache.directory)
    os.symlink(victim, cache.entry_path(obj("a")))  # an "entry" that is a link elsewhere
    assert await cache.open(obj("a")) is None
    assert victim.read_bytes() == b"precious"


async def test_eviction_never_disturbs_a_reader(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 250)
    await fill(cache, obj("a"))
    hit = await cache.open(obj("a"))
    assert isinstance(hit, CacheHit)
    await fill(cache, obj("b"))
    await fill(cache, obj("c"))  # a is evicted (least recently used) while open
    assert not os.path.exists(hit.path)
    assert await hit.store.read_range(hit.obj, 0, 100) == (b"s3://bucket/a" * 100)[:100]
    await hit.close()


async def test_a_planted_fifo_is_never_opened_and_waited_on(tmp_path: Path) -> None:
    # an untrusted directory: a FIFO under an entry's name must not block the reader forever
    # (opening a FIFO for reading waits for a writer)
    cache = ShardCache(str(tmp_path), 1000)
    os.mkfifo(cache.entry_path(obj("a")))
    route = await cache.open(obj("a"))
    assert not isinstance(route, CacheHit)
    if isinstance(route, CacheFill):
        await route.abort()


async def test_a_publish_that_fails_does_not_fail_the_read(tmp_path: Path) -> None:
    # the name is taken meanwhile by something a rename cannot replace (a non-empty
    # directory): the read was whole and clean, so the copy is dropped, not the read
    cache = ShardCache(str(tmp_path), 1000)
    route = await cache.open(obj("a"))
    assert isinstance(route, CacheFill)
    await route.write(0, [b"x" * 100])
    os.mkdir(route.path)
    (Path(route.path) / "f").write_bytes(b"")
    assert not await route.publish()
    assert not os.path.exists(route.part_path)
    assert not os.path.exists(route.path[: -len(".shard")] + ".lock")


async def test_a_directory_lock_held_forever_is_not_waited_for_forever(tmp_path: Path) -> None:
    # another process (stopped, or hostile: the directory is untrusted) keeps the directory
    # lock: the reader reads without the cache instead of waiting for it without end
    cache = ShardCache(str(tmp_path), 1000, stall_s=0.0)
    holder = os.open(tmp_path / "streamrec-cache.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        assert await cache.open(obj("a")) is None
    finally:
        os.close(holder)
    assert {p.name for p in tmp_path.iterdir()} == {"streamrec-cache.lock"}
    assert cache.given_up is not None
    assert await cache.open(obj("b")) is None  # given up for the run: no wait per shard
    route = await ShardCache(str(tmp_path), 1000).open(obj("a"))  # the next run caches again
    assert isinstance(route, CacheFill)
    await route.abort()


async def test_the_directory_and_its_files_are_private(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    cache = ShardCache(str(directory), 1000)
    entry = await fill(cache, obj("a"))
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(os.stat(entry).st_mode) == 0o600
    assert stat.S_IMODE((directory / "streamrec-cache.lock").stat().st_mode) == 0o600
    route = await cache.open(obj("b"))
    assert isinstance(route, CacheFill)
    assert stat.S_IMODE(os.stat(route.part_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(route.path[: -len(".shard")] + ".lock").st_mode) == 0o600
    await route.abort()


async def test_a_directory_others_may_write_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "writable-by-all"
    directory.mkdir()
    directory.chmod(0o777)  # anyone could plant an entry with valid CRCs here
    cache = ShardCache(str(directory), 1000)
    assert await cache.open(obj("a")) is None  # read without the cache
    assert list(directory.iterdir()) == []
    assert "may be written by other users (mode 777)" in caplog.text
    assert str(directory) in caplog.text


async def test_an_entry_others_may_write_is_not_served(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 1000)
    entry = await fill(cache, obj("a"))
    os.chmod(entry, 0o666)
    assert await cache.open(obj("a")) is None
    assert cache.given_up is not None and "may be written by other users" in cache.given_up


@pytest.mark.skipif(os.getuid() != 0, reason="planting another user's file needs root")
async def test_an_entry_of_another_user_is_not_served(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 1000)
    entry = await fill(cache, obj("a"))
    os.chown(entry, 4321, 4321)
    assert await cache.open(obj("a")) is None
    assert cache.given_up == f"{entry} belongs to user 4321, not to this user"


async def test_a_linked_directory_lock_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep")
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    (directory / "streamrec-cache.lock").symlink_to(target)
    cache = ShardCache(str(directory), 1000)
    assert await cache.open(obj("a")) is None
    assert target.read_bytes() == b"keep"


async def test_a_holder_that_only_touches_its_part_is_not_waited_for(tmp_path: Path) -> None:
    # a hostile (or broken) process holds an entry's lock and keeps its .part "in progress"
    cache = ShardCache(str(tmp_path), 1000, stall_s=0.05)
    info = obj("a")
    base = cache.entry_path(info)[: -len(".shard")]
    holder = os.open(base + ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    Path(base + ".part").write_bytes(b"x" * info.size)
    stop = threading.Event()

    def touch() -> None:
        while not stop.is_set():  # the adversary's behaviour, not a synchronisation
            now = time.time_ns()
            os.utime(base + ".part", ns=(now, now))
            stop.wait(0.005)

    toucher = threading.Thread(target=touch)
    toucher.start()
    try:
        assert await cache.open(info) is None
        assert cache.given_up is not None and "stalls" in cache.given_up
        assert await cache.open(obj("b")) is None  # no second wait in this run
    finally:
        stop.set()
        toucher.join()
        os.close(holder)


async def test_a_copy_that_does_not_match_the_manifests_crc32c_is_not_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plain = obj("a")
    data = (plain.url.encode() * plain.size)[: plain.size]  # what fill() writes
    known = ObjectInfo(plain.url, plain.size, plain.version, crc32c=crc32c(data))
    cache = ShardCache(str(tmp_path), 1000)
    entry = await fill(cache, known)
    hit = await cache.open(known)
    assert isinstance(hit, CacheHit)  # it matches
    await hit.close()
    planted = bytearray(data)
    planted[7] ^= 1  # the same size, owner and mode: only the CRC tells
    Path(entry).write_bytes(bytes(planted))
    route = await cache.open(known)
    assert isinstance(route, CacheFill)  # not served: downloaded again
    assert not os.path.exists(entry)
    assert "does not match the CRC-32C its manifest lists" in caplog.text
    await route.abort()
