"""``ds.get(indices)`` / ``await ds.aget(indices)``: records by their global index, compared with a
sequential read. Local files, S3 (moto) and GCS (fake-gcs-server); uncompressed, GZIP and ZLIB
shards written with ``index=True``, and uncompressed shards of other writers indexed by
``streamrec index`` or the ``tfrecord`` package; coalesced range reads counted at a proxy;
injected faults; the prefetch budget; every error case; ``aget`` inside a running loop and
``get`` inside DataLoader workers."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import json
import os
import pickle
import random
import shlex
import stat
import tempfile
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.cli import main
from streamrec.errors import (
    IndexMismatchError,
    ObjectChangedError,
    RandomAccessUnavailableError,
)
from streamrec.format.framing import RecordEncoder
from streamrec.storage.retry import RetryPolicy
from support.fault_proxy import FaultProxy
from support.servers import FakeGcsServer, MotoS3Server

FAST = RetryPolicy(max_attempts=6, initial_backoff_s=0.01, max_backoff_s=0.05, timeout_s=2)
SUFFIX = {None: "", "gzip": ".gz", "zlib": ".zz"}


def payloads(n: int, seed: int, high: int = 30_000) -> list[bytes]:
    """Records of mixed sizes (empty ones too), half random bytes, half compressible."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        size = rng.choice([0, rng.randint(1, 100), rng.randint(100, 5000), rng.randint(0, high)])
        if rng.random() < 0.5:
            out.append(rng.randbytes(size))
        else:
            out.append((b"token%d " % rng.randint(0, 50) * (size // 7 + 1))[:size])
    return out


def index(*args: str) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["index", "--no-progress", *args]) == 0


def write_set(
    base: str, data: list[bytes], compression: str | None, per_shard: int, **options: Any
) -> str:
    """``data`` in shards of ``per_shard`` records with their indexes; the glob of the shards."""
    template = f"{base}/part-{{index:03d}}.tfrecord{SUFFIX[compression]}"
    with streamrec.sync.open_writer(
        template, max_records=per_shard, compression=compression, index=True, **options
    ) as w:
        w.write_many(data)
    return f"{base}/part-*"


def restart_points(sidecar: bytes) -> int:
    """How many restart points an extended index names (its third column's values)."""
    return len({line.split()[2] for line in sidecar.splitlines()})


def random_indices(rng: random.Random, n: int, k: int) -> list[int]:
    """``k`` indices: unsorted, with duplicates, runs of neighbours and a few from the end."""
    picked = [rng.randrange(n) for _ in range(k)]
    start = rng.randrange(n)
    picked += list(range(start, min(n, start + 40)))
    picked += [-1, -n, picked[0], picked[0]]
    rng.shuffle(picked)
    return picked


def check_random_sets(ds: streamrec.Dataset, expected: list[bytes], seed: int) -> None:
    rng = random.Random(seed)
    n = len(expected)
    for k in (1, 7, 300):
        wanted = random_indices(rng, n, k)
        assert ds.get(wanted) == [expected[i] for i in wanted], (seed, k)
    assert ds.get([]) == []
    assert ds.get(range(n)) == expected  # everything, in order


# ---------------------------------------------------------------- local files


@pytest.mark.parametrize("compression", [None, "gzip", "zlib"])
def test_local_random_sets_match_a_sequential_read(tmp_path: Path, compression: str | None) -> None:
    data = payloads(1200, seed=1)  # ~5 MB in 3 shards
    url = write_set(str(tmp_path), data, compression, per_shard=400)
    if compression is not None:  # restart points inside each shard, not only its start
        for sidecar in tmp_path.glob("*.idx"):
            assert restart_points(sidecar.read_bytes()) > 1
    ds = streamrec.open_dataset(url)
    assert list(ds) == data
    check_random_sets(ds, data, seed=2)
    assert ds.stats.records_read >= len(data)
    # the numbering ignores host splits and shuffles: every consumer sees the same records
    other = streamrec.open_dataset(url, num_hosts=3, host_index=2, shuffle_shards=True, seed=4)
    other.set_epoch(5)
    assert other.get([0, 600, 1199]) == [data[0], data[600], data[1199]]
    assert other.num_records == 1200 and len(other) < 1200  # len: this host's share
    by_manifest = streamrec.open_dataset(str(tmp_path))  # the writer's _manifest.json
    assert by_manifest.get([1199, 0, 401]) == [data[1199], data[0], data[401]]
    ds.close()
    assert ds.get([3]) == [data[3]]  # a closed dataset opens a new session


def test_a_big_record_and_empty_shards(tmp_path: Path) -> None:
    data = [b"a", b"x" * (3 << 20), b"", b"b" * 100]  # a record bigger than a restart gap
    for compression in (None, "gzip"):
        base = tmp_path / str(compression)
        url = write_set(str(base), data, compression, per_shard=1)
        (base / "zzz-empty.tfrecord").write_bytes(b"")
        index(str(base / "zzz-empty.tfrecord"))
        ds = streamrec.open_dataset([url, str(base / "zzz-empty.tfrecord")])
        assert ds.get([3, 1, 0, 2, 1]) == [data[3], data[1], data[0], data[2], data[1]]
        assert ds.num_records == 4


def test_shards_of_other_writers_indexed_by_streamrec_or_the_tfrecord_package(
    tmp_path: Path,
) -> None:
    from tfrecord.tools.tfrecord2idx import create_index
    from tfrecord.writer import TFRecordWriter

    rng = random.Random(7)
    for shard in range(3):  # Examples written by the tfrecord package
        writer = TFRecordWriter(str(tmp_path / f"a-{shard}.tfrecord"))
        for k in range(50 + 40 * shard):
            writer.write({"blob": (rng.randbytes(rng.randint(0, 900)), "byte"), "k": (k, "int")})
        writer.close()
    for shard in range(3):  # plain payloads framed by RecordEncoder
        records = payloads(70, seed=shard)
        (tmp_path / f"b-{shard}.tfrecord").write_bytes(RecordEncoder().encode_many(records))
    index(f"{tmp_path}/a-*.tfrecord")  # streamrec index
    for shard in range(3):  # the tfrecord package's own index (DALI's format)
        name = str(tmp_path / f"b-{shard}.tfrecord")
        create_index(name, name + ".idx")
    ds = streamrec.open_dataset([f"{tmp_path}/a-*.tfrecord", f"{tmp_path}/b-*.tfrecord"])
    expected = list(ds)
    assert len(expected) == ds.num_records == 50 + 90 + 130 + 3 * 70
    check_random_sets(ds, expected, seed=8)


def test_the_prefetch_budget_bounds_what_is_in_flight(tmp_path: Path) -> None:
    data = [random.Random(k).randbytes(2000 + k % 3000) for k in range(1500)]
    url = write_set(str(tmp_path), data, None, per_shard=100)
    wanted = random.Random(3).sample(range(len(data)), 600)
    budget = 64 << 10
    small = streamrec.open_dataset(url, prefetch_bytes=budget, max_concurrency=16)
    assert small.get(wanted) == [data[i] for i in wanted]
    assert 0 < small.stats.peak_prefetch_bytes <= budget
    roomy = streamrec.open_dataset(url, max_concurrency=16)
    assert roomy.get(wanted) == [data[i] for i in wanted]
    assert roomy.stats.peak_prefetch_bytes > budget  # the bound above is the budget's doing


def test_the_table_is_kept_and_shared_with_the_counts(tmp_path: Path) -> None:
    data = payloads(200, seed=5)
    url = write_set(str(tmp_path), data, None, per_shard=60)
    ds = streamrec.open_dataset(url)
    assert ds.get([150]) == [data[150]]
    for sidecar in tmp_path.glob("*.idx"):
        sidecar.unlink()
    (tmp_path / "_manifest.json").unlink(missing_ok=True)
    assert ds.get([7, 199]) == [data[7], data[199]]  # no sidecar read again
    assert (ds.num_records, len(ds)) == (200, 200)  # counts from the table: nothing listed
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned DataLoader worker gets
    assert copy.get([42]) == [data[42]]
    assert streamrec.open_dataset(url).get([0]) == [data[0]]  # the dataset index has it
    (tmp_path / "_dataset_index.bin").unlink()
    with pytest.raises(RandomAccessUnavailableError):
        streamrec.open_dataset(url).get([0])  # a new dataset looks again


# ---------------------------------------------------------------- errors


def test_a_shard_without_index_names_the_command(tmp_path: Path) -> None:
    for shard in range(3):
        records = payloads(5, seed=shard)
        (tmp_path / f"p-{shard}.tfrecord").write_bytes(RecordEncoder().encode_many(records))
    url = f"{tmp_path}/p-*.tfrecord"
    index(str(tmp_path / "p-0.tfrecord"))
    ds = streamrec.open_dataset(url)
    with pytest.raises(RandomAccessUnavailableError) as info:
        ds.get([0])
    assert isinstance(info.value, TypeError)
    message = str(info.value)
    assert "2 of 3 shards have none" in message and f"e.g. {tmp_path}/p-1.tfrecord" in message
    assert f"`streamrec index {shlex.quote(url)}`" in message
    index(url)
    assert ds.get([14]) == [payloads(5, seed=2)[4]]  # the failure is not kept


def test_a_compressed_shard_with_a_counts_only_index(tmp_path: Path) -> None:
    data = payloads(30, seed=3)
    with streamrec.sync.open_writer(str(tmp_path / "c.tfrecord.gz"), compression="gzip") as w:
        w.write_many(data)
    index(str(tmp_path / "c.tfrecord.gz"))  # counts only for a compressed shard
    ds = streamrec.open_dataset(str(tmp_path / "c.tfrecord.gz"))
    with pytest.raises(RandomAccessUnavailableError) as info:
        ds.get([1])
    message = str(info.value)
    assert str(tmp_path / "c.tfrecord.gz") in message
    assert "index=True" in message and "streamrec reshard --index" in message
    assert "read sequentially" in message
    assert len(ds) == 30 and list(ds) == data  # counts and sequential reads still work


def test_out_of_range_and_wrong_types(tmp_path: Path) -> None:
    data = payloads(10, seed=4)
    url = write_set(str(tmp_path), data, None, per_shard=4)
    ds = streamrec.open_dataset(url)
    with pytest.raises(IndexError, match=r"record index 10 out of range: the dataset has 10 rec"):
        ds.get([0, 10])
    with pytest.raises(IndexError, match=r"record index -11 out of range"):
        ds.get([-11])
    with pytest.raises(TypeError, match=r"ds.get\(\[i\]\)\[0\]"):
        ds.get(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="integers"):
        ds.get([1.5])  # type: ignore[list-item]
    assert ds.get([9, -10]) == [data[9], data[0]]


def test_stale_indexes_name_the_shard(tmp_path: Path) -> None:
    shard = tmp_path / "s.tfrecord"
    shard.write_bytes(RecordEncoder().encode_many([b"a" * 10, b"b" * 20, b"c" * 30]))
    index(str(shard))
    shard.write_bytes(RecordEncoder().encode_many([b"a" * 10, b"b" * 20]))  # shorter now
    with pytest.raises(IndexMismatchError) as info:
        streamrec.open_dataset(str(shard)).get([0])
    assert f"in {shard}:" in str(info.value) and f"streamrec index --force {shard}" in str(
        info.value
    )
    # the same size, other records: found before record 1 is read, at the first entry that
    # disagrees with the shard's own framing (issue 29, B.8: record 0's, at offset 0)
    shard.write_bytes(RecordEncoder().encode_many([b"b" * 20, b"a" * 10, b"c" * 30]))
    index("--force", str(shard))
    shard.write_bytes(RecordEncoder().encode_many([b"a" * 10, b"b" * 20, b"c" * 30]))
    with pytest.raises(IndexMismatchError) as caught:
        streamrec.open_dataset(str(shard)).get([1])
    assert caught.value.url == str(shard) and caught.value.offset == 0
    assert str(shard) in str(caught.value) and "offset 0" in str(caught.value)
    # read from record 0 on, the span itself finds it
    with pytest.raises(IndexMismatchError) as caught:
        streamrec.open_dataset(str(shard)).get([0])
    assert caught.value.url == str(shard)


def test_a_manifest_count_that_disagrees_with_the_index(tmp_path: Path) -> None:
    data = payloads(8, seed=6)
    write_set(str(tmp_path), data, None, per_shard=8)
    shard = tmp_path / "part-000.tfrecord"
    size = shard.stat().st_size
    (tmp_path / "part-000.tfrecord.idx").write_text(f"0 {size}\n")  # fits the size: 1 record
    (tmp_path / "_dataset_index.bin").unlink()  # (the sidecar's case; the dataset index's:
    # tests/integration/test_dataset_index.py)
    with pytest.raises(IndexMismatchError, match="manifest says 8 records, its record index has 1"):
        streamrec.open_dataset(str(tmp_path)).get([0])


# ---------------------------------------------------------------- async, threads, DataLoader


def test_aget_inside_a_running_loop(tmp_path: Path) -> None:
    data = payloads(400, seed=9)
    url = write_set(str(tmp_path), data, "gzip", per_shard=100)
    ds = streamrec.open_dataset(url, prefetch_bytes=256 << 10)

    async def run() -> None:
        wanted = [random_indices(random.Random(k), len(data), 50) for k in range(4)]
        got = await asyncio.gather(*(ds.aget(w) for w in wanted))
        assert got == [[data[i] for i in w] for w in wanted]
        task = asyncio.ensure_future(ds.aget(range(len(data))))
        await asyncio.sleep(0)  # started, then cancelled: its reads stop, its budget returns
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # a leaked reservation would make this wait forever on the small budget
        assert await asyncio.wait_for(ds.aget(range(400)), 60) == data

    asyncio.run(run())
    assert ds.get([5]) == [data[5]]  # the same session serves blocking calls


def get_threads(before: frozenset[threading.Thread] = frozenset()) -> list[str]:
    """The loop threads of get() started since ``before`` (their executors' workers, reading
    local files, aside)."""
    return [t.name for t in threading.enumerate() if t.name == "streamrec-get" and t not in before]


def get_workers(before: frozenset[threading.Thread] = frozenset()) -> list[str]:
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith("streamrec-get-worker") and t not in before
    ]


def test_close_and_garbage_collection_end_the_loop_thread(tmp_path: Path) -> None:
    data = payloads(20, seed=19)
    url = write_set(str(tmp_path), data, None, per_shard=10)
    gc.collect()
    # (datasets of earlier tests may still hold theirs until collected: only new ones count)
    old = frozenset(threading.enumerate())
    assert get_threads(old) == []
    ds = streamrec.open_dataset(url)
    assert ds.get([1, 2]) == data[1:3] and ds.get([3]) == [data[3]]
    assert get_threads(old) == ["streamrec-get"]  # one thread, kept between calls
    ds.close()
    assert get_threads(old) == get_workers(old) == []
    assert ds.get([4]) == [data[4]] and get_threads(old) == ["streamrec-get"]
    del ds
    gc.collect()
    assert get_threads(old) == get_workers(old) == []  # the dataset's end closes it


def test_get_from_threads_at_once(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    data = payloads(300, seed=10)
    url = write_set(str(tmp_path), data, None, per_shard=70)
    ds = streamrec.open_dataset(url, prefetch_bytes=96 << 10)
    sets = [random_indices(random.Random(k), len(data), 30) for k in range(8)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(ds.get, sets))
    assert results == [[data[i] for i in w] for w in sets]
    assert ds.stats.peak_prefetch_bytes <= 96 << 10  # one budget for all the calls


def test_get_inside_dataloader_workers(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    data = payloads(300, seed=11)
    url = write_set(str(tmp_path), data, None, per_shard=64)
    ds = streamrec.open_dataset(url)
    assert ds.get([0]) == [data[0]]  # the parent has a table and a session when it forks

    class ByRecord(torch.utils.data.Dataset):  # type: ignore[misc]
        def __len__(self) -> int:
            return ds.num_records

        def __getitem__(self, i: int) -> bytes:
            return ds.get([i])[0]  # one request per record

    class ByBatch(ByRecord):
        def __getitems__(self, indices: list[int]) -> list[bytes]:
            return ds.get(indices)  # one call per batch: coalesced, concurrent

    order = random.Random(12).sample(range(len(data)), len(data))
    for kind in (ByRecord, ByBatch):
        loader = torch.utils.data.DataLoader(
            kind(), batch_size=16, sampler=order, num_workers=2, collate_fn=list
        )
        got = [record for batch in loader for record in batch]
        assert got == [data[i] for i in order], kind
    assert ds.get([299]) == [data[299]]  # the parent's session still serves


# ---------------------------------------------------------------- S3 and GCS


@dataclass
class Remote:
    kind: str
    base: str
    storage_options: dict[str, Any]
    upstream: str
    get: Callable[[str], bytes]  # an object's bytes by its name under base
    put: Callable[[str, bytes], object]  # an object written by its name under base

    def via(self, proxy: FaultProxy) -> dict[str, Any]:
        if self.kind == "s3":
            return {**self.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
        return {**self.storage_options, "endpoint_url": proxy.url}


@pytest.fixture(params=["s3", "gs"])
def remote(request: pytest.FixtureRequest) -> Remote:
    if request.param == "s3":
        s3: MotoS3Server = request.getfixturevalue("s3_server")
        bucket = request.getfixturevalue("s3_bucket")
        return Remote(
            "s3",
            f"s3://{bucket}/set",
            s3.storage_options,
            s3.endpoint_url,
            lambda name: s3.get(bucket, f"set/{name}"),
            lambda name, data: s3.put(bucket, f"set/{name}", data),
        )
    gcs: FakeGcsServer = request.getfixturevalue("gcs_server")
    bucket = request.getfixturevalue("gcs_bucket")
    return Remote(
        "gs",
        f"gs://{bucket}/set",
        gcs.storage_options,
        gcs.endpoint_url,
        lambda name: gcs.get(bucket, f"set/{name}"),
        lambda name, data: gcs.put(bucket, f"set/{name}", data),
    )


@pytest.mark.parametrize("compression", [None, "gzip", "zlib"])
def test_remote_random_sets_match_a_sequential_read(
    remote: Remote, compression: str | None
) -> None:
    data = payloads(600, seed=13, high=50_000)  # shards of >1 MiB: restart points in each
    options = remote.storage_options
    url = write_set(remote.base, data, compression, per_shard=200, storage_options=options)
    if compression is not None:
        for shard in range(3):
            sidecar = remote.get(f"part-{shard:03d}.tfrecord{SUFFIX[compression]}.idx")
            assert restart_points(sidecar) > 1
    ds = streamrec.open_dataset(url, storage_options=options)
    assert list(ds) == data
    check_random_sets(ds, data, seed=14)


def test_a_shard_replaced_after_the_table_was_built_is_an_error_not_other_data(
    remote: Remote,
) -> None:
    """The table pins each shard's version (ETag / generation) when it is built; every range
    read asks for that version. A shard rewritten since - here with records of the very same
    lengths, so that its index still fits and only the versions tell - raises
    ObjectChangedError naming it, instead of handing out the new object's records."""
    data = [b"%05d" % k * 200 for k in range(600)]  # 1 KiB records, 3 shards of 200
    url = write_set(remote.base, data, None, per_shard=200, storage_options=remote.storage_options)
    ds = streamrec.open_dataset(url, storage_options=remote.storage_options, retry=FAST)
    assert ds.get([250, 0]) == [data[250], data[0]]  # the table is built
    other = [b"%05d" % (k + 1) * 200 for k in range(200, 400)]
    replacement = RecordEncoder().encode_many(other)
    assert len(replacement) == len(remote.get("part-001.tfrecord"))
    remote.put("part-001.tfrecord", replacement)
    with pytest.raises(ObjectChangedError, match=r"part-001\.tfrecord"):
        ds.get([250])
    assert ds.get([599, 0]) == [data[599], data[0]]  # the shards not replaced still read
    ds.close()


def span_reads(proxy: FaultProxy) -> list[str]:
    """The names of the shards (not index sidecars) the proxy saw range GETs of (S3's path
    ends with the key, GCS's carries it url-encoded before the query)."""
    names = [
        urllib.parse.unquote(r.target.partition("?")[0]).rsplit("/", 1)[-1]
        for r in proxy.records
        if r.method == "GET" and r.range is not None
    ]
    return [name for name in names if not name.endswith(".idx")]


def test_neighbours_cost_one_request_and_the_table_none(
    remote: Remote, fault_proxy: Callable[..., FaultProxy]
) -> None:
    data = [b"%05d" % k * 200 for k in range(600)]  # 1 KiB records, 3 shards of 200
    url = write_set(remote.base, data, None, per_shard=200, storage_options=remote.storage_options)
    proxy = fault_proxy(remote.upstream)
    ds = streamrec.open_dataset(url, storage_options=remote.via(proxy))
    assert ds.get([0]) == [data[0]]  # lists; the dataset index: no sidecar, no first bytes
    reads = span_reads(proxy)
    assert reads.count("part-000.tfrecord") == 1 and reads.count("_dataset_index.bin") == 1
    assert not [name for name in reads if name.endswith(".idx")]
    proxy.clear_records()
    assert ds.get(range(250, 350)) == data[250:350]  # 100 neighbours in one shard
    # one read, nothing listed: from the shard's start, the length fields of the records
    # before them checked from its bytes (issue 29, B.8: an entry is a record once those
    # before it are checked; issue 31: the check costs no request of its own)
    assert len(span_reads(proxy)) == len(proxy.records) == 1
    assert str(proxy.records[0].range).startswith("bytes=0-")
    proxy.clear_records()
    assert ds.get(range(260, 300)) == data[260:300]  # checked already: one read
    assert len(span_reads(proxy)) == len(proxy.records) == 1
    proxy.clear_records()
    assert ds.get([599, 200, 399, 201]) == [data[599], data[200], data[399], data[201]]
    # shard 2: 599 read with the check of its records before it; shard 1: 200-201 in one
    # read; 399, 197 KiB further (more than its own 1 KiB: within max_read_amplification=2
    # only alone), read with the check of 350-398 (from 350, the verified point)
    assert len(span_reads(proxy)) == len(proxy.records) == 3
    proxy.clear_records()
    assert ds.get([0, 590]) == [data[0], data[590]]
    assert len(proxy.records) == 2  # different shards
    assert ds.num_records == 600 and len(proxy.records) == 2  # counts from the table


def test_counts_listed_first_are_not_listed_again(
    remote: Remote, fault_proxy: Callable[..., FaultProxy]
) -> None:
    data = payloads(100, seed=15)
    url = write_set(remote.base, data, "gzip", per_shard=30, storage_options=remote.storage_options)
    proxy = fault_proxy(remote.upstream)
    ds = streamrec.open_dataset(url, storage_options=remote.via(proxy))
    assert len(ds) == 100
    listings = [r.target for r in proxy.records if r.range is None]
    assert listings  # len() listed the shards
    proxy.clear_records()
    assert ds.get([99, 0]) == [data[99], data[0]]
    assert [r.target for r in proxy.records if r.range is None] == []  # get() did not list


FAULTS: dict[str, Callable[[FaultProxy], object]] = {
    "reset mid-body": lambda p: p.reset_mid_body(3000, method="GET", range_only=True, times=3),
    "truncated body": lambda p: p.truncate_body(3000, method="GET", range_only=True, times=3),
    "short 206": lambda p: p.short_206(1000, method="GET", range_only=True, times=4),
    "503 burst": lambda p: p.status(503, method="GET", range_only=True, times=4),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_faults_heal_with_the_exact_records(
    remote: Remote, fault_proxy: Callable[..., FaultProxy], fault: str
) -> None:
    data = payloads(240, seed=16, high=20_000)
    options = remote.storage_options
    url = write_set(remote.base, data, "gzip", per_shard=60, storage_options=options)
    proxy = fault_proxy(remote.upstream)
    ds = streamrec.open_dataset(url, storage_options=remote.via(proxy), retry=FAST)
    assert ds.get([0]) == [data[0]]  # the table first: the faults hit span reads
    injected = FAULTS[fault](proxy)
    wanted = random_indices(random.Random(17), len(data), 80)
    assert ds.get(wanted) == [data[i] for i in wanted]
    assert injected.fired >= 1  # type: ignore[attr-defined]
    assert ds.stats.retries >= 1


def test_remote_budget_and_concurrency(remote: Remote) -> None:
    data = [random.Random(k).randbytes(3000) for k in range(400)]
    options = remote.storage_options
    url = write_set(remote.base, data, None, per_shard=100, storage_options=options)
    wanted = random.Random(18).sample(range(len(data)), 150)
    budget = 48 << 10
    ds = streamrec.open_dataset(url, storage_options=options, prefetch_bytes=budget)
    assert ds.get(wanted) == [data[i] for i in wanted]
    assert 0 < ds.stats.peak_prefetch_bytes <= budget
    assert ds.stats.bytes_read == len(wanted) * (3000 + 16)  # the records' framed bytes
    assert ds.stats.bytes_fetched >= ds.stats.bytes_read
    roomy = streamrec.open_dataset(url, storage_options=options)
    assert roomy.get(wanted) == [data[i] for i in wanted]
    assert roomy.stats.peak_prefetch_bytes > budget  # the bound above is the budget's doing


def ranged_bytes(proxy: FaultProxy) -> int:
    """Bytes of the shards (not sidecars or the dataset index's lookup; nor the first 12 bytes
    each listing reads to tell the codec) the proxy's range GETs asked for."""
    total = 0
    for r in proxy.records:
        name = urllib.parse.unquote(r.target.partition("?")[0]).rsplit("/", 1)[-1]
        if (
            r.method == "GET"
            and r.range not in (None, "bytes=0-11")
            and not name.endswith((".idx", "_dataset_index.bin"))
        ):
            first, _, last = r.range.removeprefix("bytes=").partition("-")
            total += int(last) - int(first) + 1
    return total


@pytest.mark.parametrize("remote", ["s3"], indirect=True)
def test_boundary_checks_cost_no_second_read_in_order_and_are_kept_across_epochs(
    remote: Remote, fault_proxy: Callable[[str], FaultProxy]
) -> None:
    """Issue 29, B.8: a span is read only from a verified boundary. Read in order, the spans
    before it verify it (every byte is read once); shuffled, the length fields of records no
    span read before are read once per dataset, not per epoch."""
    data = [b"%05d" % k * 200 for k in range(600)]  # 1 KiB records, 3 shards of 200
    url = write_set(remote.base, data, None, per_shard=200, storage_options=remote.storage_options)
    stored = sum(len(remote.get(f"part-{k:03d}.tfrecord")) for k in range(3))
    proxy = fault_proxy(remote.upstream)
    small = {"storage_options": remote.via(proxy), "prefetch_bytes": 96 << 10}
    ds = streamrec.open_dataset(url, even="drop", block_bytes=16 << 10, **small)
    assert list(ds) == data
    assert ranged_bytes(proxy) == stored
    proxy.clear_records()
    ds = streamrec.open_dataset(url, shuffle="global", seed=1, block_bytes=4 << 10, **small)
    assert sorted(ds) == data
    first = ranged_bytes(proxy)
    proxy.clear_records()
    ds.set_epoch(1)
    assert sorted(ds) == data
    second = ranged_bytes(proxy)
    assert second < first <= 2 * second  # the checks: at most one more pass, in epoch 0


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_an_index_is_checked_once_per_host(
    remote: Remote, tmp_path: Path, compression: str | None
) -> None:
    """A versioned shard checked by one process is not read again to check it by the host's
    others (a new dataset stands for another process: its own trust in memory); a record that
    is damaged, or in a directory others may write, is not believed."""
    data = [b"%05d" % k * 200 for k in range(600)]  # 1 KiB records, 3 shards of 200
    options = remote.storage_options
    url = write_set(remote.base, data, compression, per_shard=200, storage_options=options)
    cache = tmp_path / "cache"
    wanted = [399, 150, 599]

    def checked() -> int:
        ds = streamrec.open_dataset(
            url, storage_options=options, cache_dir=str(cache), cache_bytes=1 << 30
        )
        assert ds.get(wanted) == [data[i] for i in wanted]
        copy = pickle.loads(pickle.dumps(ds))  # a DataLoader worker's copy
        assert copy.get([398]) == [data[398]]
        total = ds.stats.bytes_checked + copy.stats.bytes_checked
        ds.close()
        copy.close()
        return total

    assert checked() > 0  # the first process checks
    assert checked() == 0  # the next ones take its word
    [record] = (cache / "checks").glob("*.checks")
    damaged = bytearray(record.read_bytes())
    for at in range(32, len(damaged), 32):
        damaged[at] ^= 0x01  # every slot's count: its tag no longer matches
    record.write_bytes(bytes(damaged))
    assert checked() > 0  # checked again, and recorded again
    assert checked() == 0
    (cache / "checks").chmod(0o777)
    assert checked() > 0  # others could have written it: not believed
    (cache / "checks").chmod(0o700)


def test_the_default_record_is_private_under_any_umask(
    remote: Remote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no cache_dir, the record lives in <temp>/streamrec-<uid>/checks, made 0700 even
    where the umask lets the group write (user-private groups: umask 002)."""
    data = [b"%05d" % k * 200 for k in range(400)]
    url = write_set(remote.base, data, None, per_shard=200, storage_options=remote.storage_options)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old = os.umask(0o002)
    try:
        for expected_checks in (True, False):
            ds = streamrec.open_dataset(url, storage_options=remote.storage_options)
            assert ds.get([399]) == [data[399]]
            assert (ds.stats.bytes_checked > 0) is expected_checks
            ds.close()
    finally:
        os.umask(old)
    root = tmp_path / f"streamrec-{os.getuid()}"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert list(root.glob("checks/*.checks"))


def test_a_symlinked_record_directory_is_not_used(remote: Remote, tmp_path: Path) -> None:
    data = [b"%05d" % k * 200 for k in range(400)]
    url = write_set(remote.base, data, None, per_shard=200, storage_options=remote.storage_options)
    cache, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    cache.mkdir(mode=0o700)
    elsewhere.mkdir(mode=0o700)
    (cache / "checks").symlink_to(elsewhere)  # planted by someone else, say
    for _ in range(2):
        ds = streamrec.open_dataset(
            url, storage_options=remote.storage_options, cache_dir=str(cache), cache_bytes=1 << 30
        )
        assert ds.get([399]) == [data[399]]
        assert ds.stats.bytes_checked > 0  # checked each time: no record followed the link
        ds.close()
    assert not list(elsewhere.iterdir())


@pytest.mark.parametrize("stated_version", [False, True])
def test_local_shards_are_not_recorded(tmp_path: Path, stated_version: bool) -> None:
    """A local file is read as it is, whatever version a manifest states: a check of it holds
    for its process only."""
    data = [b"%05d" % k * 200 for k in range(400)]
    write_set(str(tmp_path / "set"), data, None, per_shard=200)
    manifest = tmp_path / "set" / "_manifest.json"
    if stated_version:
        document = json.loads(manifest.read_text())
        for shard in document["shards"]:
            shard["version"] = '"v1"'
        manifest.write_text(json.dumps(document))
    for _ in range(2):
        ds = streamrec.open_dataset(
            str(tmp_path / "set"), cache_dir=str(tmp_path / "cache"), cache_bytes=1 << 30
        )
        assert ds.get([399]) == [data[399]]
        assert ds.stats.bytes_checked > 0
        ds.close()
    assert not list((tmp_path / "cache").glob("checks/*.checks"))
