"""Local reading and writing through the public API, sync and async."""

from __future__ import annotations

import asyncio
import gzip
import threading
import zlib
from pathlib import Path

import pytest

import streamrec
from streamrec.errors import ObjectNotFoundError
from streamrec.format.framing import RecordEncoder


def payloads(n: int) -> list[bytes]:
    return [b"record-%05d" % i * (i % 7 + 1) for i in range(n)]


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("compression", [None, "gzip", "zlib"])
async def test_async_writer_round_trip(tmp_path: Path, compression: str | None) -> None:
    suffix = {None: "", "gzip": ".gz", "zlib": ".zlib"}[compression]
    url = str(tmp_path / f"out.tfrecord{suffix}")
    async with streamrec.open_writer(url, compression=compression, flush_bytes=4096) as w:
        for p in payloads(3000):
            await w.write(p)
        assert w.records == 3000
    assert [p async for p in streamrec.open_dataset(url)] == payloads(3000)
    assert leftovers(tmp_path) == [Path(url).name]
    stored = Path(url).read_bytes()
    framed = RecordEncoder().encode_many(payloads(3000))
    if compression == "gzip":
        assert gzip.decompress(stored) == framed
    elif compression == "zlib":
        assert zlib.decompress(stored) == framed
    else:
        assert stored == framed


def test_sync_writer_round_trip_and_write_many(tmp_path: Path) -> None:
    url = str(tmp_path / "sync.tfrecord")
    with streamrec.sync.open_writer(url, flush_bytes=1000) as w:
        w.write(b"first")
        w.write_many(payloads(500))
        w.write(bytearray(b"last"))
    assert list(streamrec.open_dataset(url)) == [b"first", *payloads(500), b"last"]


async def test_exception_inside_async_with_leaves_nothing(tmp_path: Path) -> None:
    url = tmp_path / "never.tfrecord"
    with pytest.raises(RuntimeError, match="boom"):
        async with streamrec.open_writer(str(url), flush_bytes=100) as w:
            for p in payloads(100):  # several flushes have reached the temp file
                await w.write(p)
            raise RuntimeError("boom")
    assert leftovers(tmp_path) == []


def test_exception_inside_sync_with_leaves_nothing(tmp_path: Path) -> None:
    url = str(tmp_path / "never.tfrecord")
    with pytest.raises(KeyError), streamrec.sync.open_writer(url, flush_bytes=10) as w:
        w.write_many(payloads(50))
        raise KeyError("boom")
    assert leftovers(tmp_path) == []


async def test_cancelled_writer_leaves_nothing(tmp_path: Path) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def produce() -> None:
        async with streamrec.open_writer(str(tmp_path / "c.tfrecord"), flush_bytes=10) as w:
            await w.write(b"x" * 100)
            started.set()
            await release.wait()  # cancelled here, mid-file
            await w.write(b"never")

    task = asyncio.create_task(produce())
    await started.wait()
    assert any(name.endswith(".tmp") for name in leftovers(tmp_path))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert leftovers(tmp_path) == []


async def test_existing_file_is_replaced_only_on_clean_close(tmp_path: Path) -> None:
    url = tmp_path / "data.tfrecord"
    url.write_bytes(RecordEncoder().encode(b"old"))
    with pytest.raises(ValueError):
        async with streamrec.open_writer(str(url)) as w:
            await w.write(b"new")
            raise ValueError
    assert list(streamrec.open_dataset(str(url))) == [b"old"]
    async with streamrec.open_writer(str(url)) as w:
        await w.write(b"new")
    assert list(streamrec.open_dataset(str(url))) == [b"new"]


async def test_writer_rejects_non_bytes_with_a_hint(tmp_path: Path) -> None:
    async with streamrec.open_writer(str(tmp_path / "t.tfrecord")) as w:
        with pytest.raises(TypeError, match=r"not dict \(encode Examples with streamrec.example"):
            await w.write({"label": 1})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="not str"):
            await w.write("text")  # type: ignore[arg-type]
        await w.write(b"ok")
    assert list(streamrec.open_dataset(str(tmp_path / "t.tfrecord"))) == [b"ok"]


async def test_write_after_close_is_refused(tmp_path: Path) -> None:
    w = streamrec.open_writer(str(tmp_path / "t.tfrecord"))
    await w.close()
    await w.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await w.write(b"late")


def test_writer_needs_explicit_compression(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="explicit compression"):
        streamrec.open_writer(str(tmp_path / "x"), compression="auto")


def test_missing_file_and_empty_glob_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFoundError, match=r"nothing\.tfrecord"):
        list(streamrec.open_dataset(str(tmp_path / "nothing.tfrecord")))
    with pytest.raises(ObjectNotFoundError, match=r"matched no file"):
        list(streamrec.open_dataset(str(tmp_path / "*.tfrecord")))
    with pytest.raises(FileNotFoundError):  # also a FileNotFoundError, for generic handlers
        list(streamrec.open_dataset(str(tmp_path / "nothing.tfrecord")))
    with pytest.raises(ObjectNotFoundError, match="the directory holds no shard files"):
        list(streamrec.open_dataset(str(tmp_path)))


def test_file_urls_and_lists_keep_the_given_order(tmp_path: Path) -> None:
    for name in ("b", "a"):
        with streamrec.sync.open_writer(str(tmp_path / f"{name}.tfrecord")) as w:
            w.write(name.encode())
    listed = [str(tmp_path / "b.tfrecord"), f"file://{tmp_path}/a.tfrecord"]
    assert list(streamrec.open_dataset(listed)) == [b"b", b"a"]
    assert list(streamrec.open_dataset(f"file://{tmp_path}/*.tfrecord")) == [b"a", b"b"]


def test_bad_options_are_refused_at_open() -> None:
    with pytest.raises(ValueError, match="on_corrupt"):
        streamrec.open_dataset("x", on_corrupt="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="compression"):
        streamrec.open_dataset("x", compression="brotli")
    with pytest.raises(ValueError, match="at least one"):
        streamrec.open_dataset([])
    with pytest.raises(ValueError, match="cycle_length must be a positive integer"):
        streamrec.open_dataset("x", cycle_length=0)
    with pytest.raises(ValueError, match="host_index"):
        streamrec.open_dataset("x", num_hosts=2, host_index=2)


def test_breaking_out_of_a_sync_loop_joins_the_loop_thread(tmp_path: Path) -> None:
    url = str(tmp_path / "many.tfrecord")
    with streamrec.sync.open_writer(url) as w:
        w.write_many(payloads(5000))
    before = set(threading.enumerate())
    iterator = iter(streamrec.open_dataset(url))
    assert next(iterator) == payloads(1)[0]
    assert len(set(threading.enumerate()) - before) >= 1  # the loop thread runs
    iterator.close()  # what `break` and garbage collection do
    assert set(threading.enumerate()) - before == set()


def test_exception_in_consumer_joins_the_loop_thread(tmp_path: Path) -> None:
    url = str(tmp_path / "many.tfrecord")
    with streamrec.sync.open_writer(url) as w:
        w.write_many(payloads(100))
    before = set(threading.enumerate())

    def consume() -> None:
        for i, _ in enumerate(streamrec.open_dataset(url)):
            if i == 10:
                raise LookupError("consumer failed")

    with pytest.raises(LookupError):
        consume()
    assert set(threading.enumerate()) - before == set()


def test_stats_count_records_and_bytes(tmp_path: Path) -> None:
    url = tmp_path / "s.tfrecord"
    with streamrec.sync.open_writer(str(url)) as w:
        w.write_many(payloads(10))
    ds = streamrec.open_dataset(str(url))
    assert len(list(ds)) == 10
    assert ds.stats.records == 10
    assert ds.stats.bytes_read == url.stat().st_size
    assert ds.stats.corrupt_skipped == 0


def test_dropping_a_sync_iterator_joins_the_loop_thread(tmp_path: Path) -> None:
    import gc

    url = str(tmp_path / "many.tfrecord")
    with streamrec.sync.open_writer(url) as w:
        w.write_many(payloads(100))
    before = set(threading.enumerate())
    iterator = iter(streamrec.open_dataset(url))
    next(iterator)
    del iterator
    gc.collect()
    assert set(threading.enumerate()) - before == set()


async def test_breaking_out_of_async_for_leaves_no_task(tmp_path: Path) -> None:
    url = str(tmp_path / "many.tfrecord")
    async with streamrec.open_writer(url) as w:
        await w.write_many(payloads(1000))
    before = asyncio.all_tasks()
    records = streamrec.open_dataset(url).__aiter__()
    assert await records.__anext__() == payloads(1)[0]
    await records.aclose()
    assert asyncio.all_tasks() == before
