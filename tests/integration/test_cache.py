"""The local shard cache through the whole read path, against real servers (moto S3 and
fake-gcs-server behind the fault proxy, which counts every request): later epochs read the
copies with no GET of a shard; a replaced object is downloaded again, never served stale;
the directory never holds more than cache_bytes; two shards with one base name never share an
entry (webdataset#238); two processes share one cache, each shard downloaded once; an
iteration closed early leaves nothing behind; a damaged copy is found by its CRCs, named, and
removed."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.errors import CorruptRecordError
from streamrec.format.framing import RecordEncoder
from support.fault_proxy import FaultProxy
from support.server_fixtures import unique_name
from support.servers import FakeGcsServer, MotoS3Server

ROOT = Path(__file__).resolve().parents[2]


def payloads(shard: int, count: int, size: int = 100) -> list[bytes]:
    return [f"{shard:03d}-{i:05d}-".encode().ljust(size, b"p") for i in range(count)]


def put_shards(server: MotoS3Server, bucket: str, prefix: str, shards: int, count: int) -> dict:
    """``shards`` shards of ``count`` records under ``prefix``; {key: (bytes, payloads)}."""
    made = {}
    for shard in range(shards):
        records = payloads(shard, count)
        data = RecordEncoder().encode_many(records)
        key = f"{prefix}/shard-{shard:02d}.tfrecord"
        server.put(bucket, key, data)
        made[key] = (data, records)
    return made


def options(proxy: FaultProxy) -> dict[str, Any]:
    return {"client_kwargs": {"endpoint_url": proxy.url}}


def shard_bytes(proxy: FaultProxy) -> Counter[str]:
    """Bytes of each shard's range GETs (``/bucket/key``, any query dropped) the proxy passed
    on (``len()`` looks for index sidecars too: not shards)."""
    got: Counter[str] = Counter()
    for record in proxy.records:
        target = record.target.partition("?")[0]
        if record.method == "GET" and record.range and target.endswith(".tfrecord"):
            first, last = record.range.removeprefix("bytes=").split("-")
            got[target] += int(last) - int(first) + 1
    return got


def regular_files(directory: Path) -> Iterator[tuple[str, os.stat_result]]:
    """The directory's regular files, as a reader sees them while the reading thread evicts
    and publishes entries (a file listed may be gone before it is looked at: not counted)."""
    for path in directory.iterdir():
        try:
            info = path.stat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode):
            yield path.name, info


def files(directory: Path) -> dict[str, int]:
    """The directory's files and sizes (see :func:`regular_files`)."""
    return {name: info.st_size for name, info in regular_files(directory)}


def held_bytes(directory: Path) -> int:
    """Bytes the directory holds, counted by inode: a ``.part`` renamed to its ``.shard``
    between the listing and the stat calls is listed under both names."""
    return sum({info.st_ino: info.st_size for _, info in regular_files(directory)}.values())


def downloads(directory: Path) -> list[str]:
    """Downloads in progress (or left behind): their .part files and per-shard locks."""
    return [
        name
        for name in files(directory)
        if name.endswith(".part") or (name.endswith(".lock") and name != "streamrec-cache.lock")
    ]


def test_later_epochs_read_the_cache_with_no_get(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    made = put_shards(s3_server, s3_bucket, "train", shards=3, count=400)
    proxy = fault_proxy(s3_server.endpoint_url)
    cache = tmp_path / "cache"
    ds = streamrec.open_dataset(
        f"s3://{s3_bucket}/train/*.tfrecord",
        storage_options=options(proxy),
        cache_dir=str(cache),
        cache_bytes=1 << 20,
        block_bytes=8 << 10,  # several blocks per shard, completing in any order
        cycle_length=2,
    )
    first = list(ds)
    assert sorted(first) == sorted(r for _, records in made.values() for r in records)
    assert shard_bytes(proxy) == {f"/{s3_bucket}/{k}": len(d) for k, (d, _) in made.items()}
    entries = sorted(v for k, v in files(cache).items() if k.endswith(".shard"))
    assert entries == sorted(len(d) for d, _ in made.values())
    assert not downloads(cache)
    assert ds.stats.cache_hits == 0
    for epoch in (1, 2):
        proxy.clear_records()
        ds.set_epoch(epoch)
        assert list(ds) == first
        assert shard_bytes(proxy) == {}  # only the listing went to the server
        assert ds.stats.cache_hits == 3 * epoch
    # a fresh dataset (another job, later) reads the copies too
    proxy.clear_records()
    again = streamrec.open_dataset(
        f"s3://{s3_bucket}/train/*.tfrecord",
        storage_options=options(proxy),
        cache_dir=str(cache),
        cache_bytes=1 << 20,
    )
    assert list(again) == [r for _, records in made.values() for r in records]
    assert shard_bytes(proxy) == {}


def test_a_shard_named_twice_is_read_twice_at_once(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    made = put_shards(s3_server, s3_bucket, "twice", shards=1, count=500)
    ((key, (data, records)),) = made.items()
    proxy = fault_proxy(s3_server.endpoint_url)
    ds = streamrec.open_dataset(
        [f"s3://{s3_bucket}/{key}"] * 2,
        storage_options=options(proxy),
        cache_dir=str(tmp_path),
        cache_bytes=1 << 20,
        block_bytes=8 << 10,
        cycle_length=2,  # both open at once: the second does not wait for the first's copy
    )
    assert sorted(ds) == sorted(records * 2)
    assert [p.read_bytes() for p in tmp_path.glob("*.shard")] == [data]
    assert not downloads(tmp_path)


def test_a_record_split_reader_does_not_wait_for_another_consumers_download(
    s3_server: MotoS3Server, s3_bucket: str, tmp_path: Path
) -> None:
    # fewer shards than consumers (2 ranks of one host here; DataLoader workers alike): every
    # consumer reads the whole shard at its own consumer's pace, in lockstep with the others
    # (DDP, the DataLoader's round robin). Waiting for another's download waits for a reader
    # paced by a consumer that waits for us: up to stall_s (the attempt timeout) per shard.
    import fcntl

    from streamrec.storage.cache.store import ShardCache
    from streamrec.storage.retry import RetryPolicy

    made = put_shards(s3_server, s3_bucket, "split", shards=1, count=200)
    ((key, (_, records)),) = made.items()
    storage = {"client_kwargs": {"endpoint_url": s3_server.endpoint_url}}
    url = f"s3://{s3_bucket}/{key}"

    def rank(index: int) -> streamrec.Dataset:
        return streamrec.open_dataset(
            url,
            storage_options=storage,
            cache_dir=str(tmp_path),
            cache_bytes=1 << 20,
            num_hosts=2,
            host_index=index,
            retry=RetryPolicy(timeout_s=3600),  # stall_s: never reached by a passing run
        )

    (shard,) = asyncio.run(rank(0).shards())
    entry = ShardCache(str(tmp_path), 1 << 20).entry_path(shard, s3_server.endpoint_url)
    holder = os.open(entry[: -len(".shard")] + ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # rank 0 (another process) is downloading the shard
    try:
        assert list(rank(1)) == records[1::2]  # read without the cache meanwhile
    finally:
        os.close(holder)


def test_local_shards_are_never_cached(tmp_path: Path) -> None:
    path = tmp_path / "local.tfrecord"
    path.write_bytes(RecordEncoder().encode_many(payloads(0, 10)))
    cache = tmp_path / "cache"
    ds = streamrec.open_dataset(str(path), cache_dir=str(cache), cache_bytes=1 << 20)
    assert list(ds) == payloads(0, 10)
    assert not cache.exists() or not any(cache.iterdir())


def _put_gcs(server: FakeGcsServer, bucket: str, key: str, data: bytes) -> None:
    server.put(bucket, key, data)


def behind_proxy(
    kind: str, request: pytest.FixtureRequest, fault_proxy: Any
) -> tuple[Any, str, FaultProxy, dict[str, Any]]:
    """The ``kind`` ("s3" or "gs") test server, a bucket, a counting proxy in front of it and
    the storage options that read through the proxy."""
    server = request.getfixturevalue(f"{'s3' if kind == 's3' else 'gcs'}_server")
    bucket = request.getfixturevalue(f"{'s3' if kind == 's3' else 'gcs'}_bucket")
    proxy = fault_proxy(server.endpoint_url)
    if kind == "s3":
        return server, bucket, proxy, options(proxy)
    return server, bucket, proxy, {**server.storage_options, "endpoint_url": proxy.url}


@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_a_replaced_object_is_downloaded_again(
    kind: str, request: pytest.FixtureRequest, fault_proxy: Any, tmp_path: Path
) -> None:
    server, bucket, proxy, storage = behind_proxy(kind, request, fault_proxy)

    def gets() -> list[Any]:  # of the shard (len() also looks for data.tfrecord.idx)
        return [
            r
            for r in proxy.records
            if r.range and "data.tfrecord" in r.target.split("?")[0] and ".idx" not in r.target
        ]

    def read() -> list[bytes]:
        ds = streamrec.open_dataset(
            f"{kind}://{bucket}/data*.tfrecord",  # (a single url is looked up by a range GET)
            storage_options=storage,
            cache_dir=str(tmp_path),
            cache_bytes=1 << 20,
        )
        return list(ds)

    server.put(bucket, "data.tfrecord", RecordEncoder().encode_many(payloads(1, 50)))
    assert read() == payloads(1, 50)
    proxy.clear_records()
    assert read() == payloads(1, 50)
    assert not gets()  # from the cache
    # the same url, new contents of the same size: a new ETag / generation
    server.put(bucket, "data.tfrecord", RecordEncoder().encode_many(payloads(2, 50)))
    assert read() == payloads(2, 50)  # never the stale copy
    assert gets()
    proxy.clear_records()
    assert read() == payloads(2, 50)
    assert not gets()


def test_shards_with_one_base_name_never_share_an_entry(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    other = s3_server.create_bucket(unique_name())
    urls = []
    for n, (bucket, prefix) in enumerate([(s3_bucket, "a"), (s3_bucket, "b"), (other, "a")]):
        # the same size and base name; only the bucket or prefix tells them apart
        s3_server.put(
            bucket, f"{prefix}/shard.tfrecord", RecordEncoder().encode_many(payloads(n, 20))
        )
        urls.append(f"s3://{bucket}/{prefix}/shard*.tfrecord")  # (listed: no lookup GET)
    proxy = fault_proxy(s3_server.endpoint_url)
    for _ in range(2):  # downloaded, then from the cache
        for n, url in enumerate(urls):
            ds = streamrec.open_dataset(
                url, storage_options=options(proxy), cache_dir=str(tmp_path), cache_bytes=1 << 20
            )
            assert list(ds) == payloads(n, 20)
    assert sum(1 for name in files(tmp_path) if name.endswith(".shard")) == 3
    size = len(RecordEncoder().encode_many(payloads(0, 20)))
    assert shard_bytes(proxy) == {url[4:].replace("*", ""): size for url in urls}  # once each


def test_the_cache_never_exceeds_cache_bytes(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    made = put_shards(s3_server, s3_bucket, "many", shards=10, count=60)  # ~6.8 KB each
    size = len(next(iter(made.values()))[0])
    big_shard = RecordEncoder().encode_many(payloads(99, 240))  # bigger than the whole cache
    s3_server.put(s3_bucket, "many/shard-99.tfrecord", big_shard)
    limit = int(2.5 * size)
    cache = tmp_path / "cache"
    proxy = fault_proxy(s3_server.endpoint_url)
    ds = streamrec.open_dataset(
        f"s3://{s3_bucket}/many/shard-0*.tfrecord",
        storage_options=options(proxy),
        cache_dir=str(cache),
        cache_bytes=limit,
        cycle_length=3,  # three downloads at once: one of them never fits
    )
    largest = 0
    for epoch in range(2):
        ds.set_epoch(epoch)
        for _ in ds:  # sampled after every record, while shards stream in
            largest = max(largest, held_bytes(cache) if cache.exists() else 0)
    assert 0 < largest <= limit
    assert held_bytes(cache) <= limit
    big = streamrec.open_dataset(
        f"s3://{s3_bucket}/many/shard-99.tfrecord",
        storage_options=options(proxy),
        cache_dir=str(cache),
        cache_bytes=limit,
    )
    assert list(big) == payloads(99, 240)
    assert held_bytes(cache) <= limit
    assert not downloads(cache)


async def test_closing_early_leaves_no_temporary_file(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    put_shards(s3_server, s3_bucket, "early", shards=2, count=2000)  # ~220 KB each
    proxy = fault_proxy(s3_server.endpoint_url)
    ds = streamrec.open_dataset(
        f"s3://{s3_bucket}/early/*.tfrecord",
        storage_options=options(proxy),
        cache_dir=str(tmp_path),
        cache_bytes=1 << 20,
        block_bytes=16 << 10,
        cycle_length=2,
    )
    async with aclosing(ds.__aiter__()) as records:
        async for _ in records:
            break  # mid-way through both shards
    assert files(tmp_path) == {"streamrec-cache.lock": 0}


def test_a_damaged_copy_is_named_removed_and_downloaded_again(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    made = put_shards(s3_server, s3_bucket, "bad", shards=1, count=100)
    proxy = fault_proxy(s3_server.endpoint_url)

    def read() -> list[bytes]:
        return list(
            streamrec.open_dataset(
                f"s3://{s3_bucket}/bad/*.tfrecord",
                storage_options=options(proxy),
                cache_dir=str(tmp_path),
                cache_bytes=1 << 20,
            )
        )

    records = next(iter(made.values()))[1]
    assert read() == records
    (entry,) = tmp_path.glob("*.shard")
    data = bytearray(entry.read_bytes())
    data[len(data) // 2 + 20] ^= 0x01  # one bit of the payload of record 50 (of 100)
    entry.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as raised:
        read()
    assert str(entry) in str(raised.value) and "bad/shard-00.tfrecord" in str(raised.value)
    assert "local cache" in str(raised.value)
    assert not entry.exists()
    proxy.clear_records()
    assert read() == records  # downloaded again, and cached again
    assert sum(shard_bytes(proxy).values()) == len(data)
    assert entry.exists()
    # on_corrupt="skip": the damaged record is dropped (with a warning), the copy removed
    entry.write_bytes(bytes(data))
    skipped = streamrec.open_dataset(
        f"s3://{s3_bucket}/bad/*.tfrecord",
        storage_options=options(proxy),
        cache_dir=str(tmp_path),
        cache_bytes=1 << 20,
        on_corrupt="skip",
    )
    assert len(list(skipped)) == len(records) - 1
    assert skipped.stats.corrupt_skipped == 1 and skipped.stats.cache_hits == 1
    assert not entry.exists()


_CHILD = """
import hashlib, sys
import streamrec
print("ready", flush=True)
sys.stdin.readline()  # both processes start reading together
ds = streamrec.open_dataset(sys.argv[1], storage_options={"client_kwargs": {"endpoint_url":
    sys.argv[2]}}, cache_dir=sys.argv[3], cache_bytes=int(sys.argv[4]), block_bytes=64 << 10)
records = list(ds)
print(len(records), hashlib.sha256(b"".join(records)).hexdigest(), flush=True)
"""


def test_two_processes_share_one_cache(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    made = put_shards(s3_server, s3_bucket, "together", shards=4, count=3000)  # ~330 KB each
    proxy = fault_proxy(s3_server.endpoint_url)
    cache = tmp_path / "cache"
    args = [f"s3://{s3_bucket}/together/*.tfrecord", proxy.url, str(cache), str(8 << 20)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.close()
        outputs = [child.stdout.read() for child in children if child.stdout is not None]
        for child in children:
            child.wait(timeout=120)
    finally:
        for child in children:
            child.kill() if child.poll() is None else None
    assert all(child.returncode == 0 for child in children)
    expected = [r for _, records in made.values() for r in records]
    import hashlib

    digest = hashlib.sha256(b"".join(expected)).hexdigest()
    assert outputs == [f"{len(expected)} {digest}\n"] * 2  # both got every record
    # each shard went over the wire once, for both processes together
    assert shard_bytes(proxy) == {f"/{s3_bucket}/{k}": len(d) for k, (d, _) in made.items()}
    for data, _ in made.values():  # no torn copy: every entry is a whole shard
        assert any(p.read_bytes() == data for p in cache.glob("*.shard"))
    assert not downloads(cache)


@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_a_warm_cache_costs_no_get_of_a_shard_named_by_url(
    kind: str, request: pytest.FixtureRequest, fault_proxy: Any, tmp_path: Path
) -> None:
    """Shards named one by one are looked up by a HEAD when the cache serves them (the
    lookup's GET of the first 256 KiB would download from the store every epoch)."""
    server, bucket, proxy, storage = behind_proxy(kind, request, fault_proxy)
    urls, expected = [], []
    for shard in range(6):
        records = payloads(shard, 3000)  # ~350 KB: more than one lookup's 256 KiB
        server.put(bucket, f"warm/shard-{shard}.tfrecord", RecordEncoder().encode_many(records))
        urls.append(f"{kind}://{bucket}/warm/shard-{shard}.tfrecord")
        expected += records
    settings: dict[str, Any] = {"cache_dir": str(tmp_path), "cache_bytes": 64 << 20}

    def shard_gets() -> list[str]:
        return [
            r.target
            for r in proxy.records
            if r.method == "GET" and r.range and ".tfrecord" in r.target.split("?")[0]
        ]

    ds = streamrec.open_dataset(urls, storage_options=storage, **settings)
    assert list(ds) == expected
    proxy.clear_records()
    ds.set_epoch(1)
    assert list(ds) == expected
    assert shard_gets() == []
    assert ds.stats.cache_hits == 6
    fresh = streamrec.open_dataset(urls, storage_options=storage, **settings)
    assert list(fresh) == expected
    assert shard_gets() == []


def test_a_planted_copy_with_valid_crcs_is_not_served_for_a_manifest_shard(
    s3_server: MotoS3Server, s3_bucket: str, tmp_path: Path
) -> None:
    # the manifest lists each shard's CRC-32C: a copy in the cache that is not the shard
    # (planted, or written by a bug) is found out although every record's CRCs are valid
    url = f"s3://{s3_bucket}/planted"
    storage = {"client_kwargs": {"endpoint_url": s3_server.endpoint_url}}
    with streamrec.sync.open_writer(
        url + "/part-{index:05d}.tfrecord", max_records=50, storage_options=storage
    ) as writer:
        for record in payloads(1, 50):
            writer.write(record)
    cache = tmp_path / "cache"
    settings: dict[str, Any] = {"cache_dir": str(cache), "cache_bytes": 1 << 20}
    assert list(streamrec.open_dataset(url, storage_options=storage, **settings)) == payloads(1, 50)
    # (the manifest's copy beside it: issue 31, once per host)
    (entry,) = [p for p in cache.glob("*.shard") if not p.read_bytes().startswith(b"{")]
    planted = RecordEncoder().encode_many(payloads(2, 50))  # the same size, valid CRCs
    assert len(planted) == entry.stat().st_size
    entry.write_bytes(planted)
    again = streamrec.open_dataset(url, storage_options=storage, **settings)
    assert list(again) == payloads(1, 50)
    assert again.stats.cache_hits == 0
