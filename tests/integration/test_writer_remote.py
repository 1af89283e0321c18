"""The shard writer against real servers on loopback: S3 (moto) multipart uploads, GCS
(fake-gcs-server) resumable uploads, Azure (Azurite) staged block blobs, memory:// and local
files; faults injected by a proxy.

What is checked on every store: the shards appear, named by the template, hold exactly the
records written (read back through open_dataset), the manifest lists them with the right sizes
and CRC32Cs; and after an exception, a cancellation or an upload fault that outlasts the retries,
no partial object is visible and no multipart upload is left open."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest

import streamrec
from streamrec.errors import RetriesExhaustedError
from streamrec.format.crc import crc32c
from streamrec.format.index.dataset import DatasetIndex
from streamrec.manifest.core import read_manifest
from streamrec.storage.gcs.sink import CHUNK_ALIGN
from streamrec.storage.retry import RetryPolicy
from support.azurite import AzuriteServer
from support.fault_proxy import FaultProxy
from support.indexes import check_sidecar
from support.servers import FakeGcsServer, MotoS3Server

FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=10)


@dataclass
class Target:
    """Where shards go, how to look at what is there, and how to reach it through a proxy."""

    kind: str
    base: str  # url of an empty "directory", no trailing slash
    storage_options: dict[str, Any] | None
    names: Callable[[], list[str]]  # every object under base, relative, sorted
    get: Callable[[str], bytes]  # an object's bytes by relative name
    uploads: Callable[[], list[str]]  # keys of multipart uploads still open (S3)
    part_bytes: int  # the smallest part the server takes
    upstream: str | None = None

    def via(self, proxy: FaultProxy) -> dict[str, Any]:
        options = dict(self.storage_options or {})
        if self.kind == "s3":
            options["client_kwargs"] = {"endpoint_url": proxy.url}
        elif self.kind == "az":
            options = {"connection_string": AzuriteServer.connection_string_for(proxy.url)}
        else:
            options["endpoint_url"] = proxy.url
        return options


def _s3(server: MotoS3Server, bucket: str) -> Target:
    return Target(
        "s3",
        f"s3://{bucket}/set",
        server.storage_options,
        lambda: [k[len("set/") :] for k in server.list(bucket, "set/")],
        lambda name: server.get(bucket, f"set/{name}"),
        lambda: [u["Key"] for u in server.list_multipart_uploads(bucket)],
        8 << 10,
        server.endpoint_url,
    )


def _gcs(server: FakeGcsServer, bucket: str) -> Target:
    return Target(
        "gs",
        f"gs://{bucket}/set",
        server.storage_options,
        lambda: [k[len("set/") :] for k in server.list(bucket, "set/")],
        lambda name: server.get(bucket, f"set/{name}"),
        lambda: [],
        CHUNK_ALIGN,
        server.endpoint_url,
    )


def _azure(server: AzuriteServer, container: str) -> Target:
    # uploads: none can stay open; staged blocks of an aborted blob are uncommitted, invisible
    return Target(
        "az",
        f"az://{container}/set",
        server.storage_options,
        lambda: [k[len("set/") :] for k in server.list(container, "set/")],
        lambda name: server.get(container, f"set/{name}"),
        lambda: [],
        8 << 10,
        server.server_url,
    )


def _memory() -> Target:
    root = f"writer-remote-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")

    def names() -> list[str]:
        found = fs.find(f"/{root}") if fs.exists(f"/{root}") else []
        return sorted(p.split(f"/{root}/", 1)[1] for p in found)

    return Target(
        "memory",
        f"memory://{root}",
        None,
        names,
        lambda name: fs.cat_file(f"/{root}/{name}"),
        lambda: [],
        8 << 10,
    )


def _local(tmp_path: Path) -> Target:
    root = tmp_path / "set"
    return Target(
        "file",
        str(root),
        None,
        lambda: sorted(p.name for p in root.iterdir()) if root.exists() else [],
        lambda name: (root / name).read_bytes(),
        lambda: [],
        8 << 10,
    )


@pytest.fixture(params=["s3", "gs", "az", "memory", "file"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "az":
        server = request.getfixturevalue("azure_server")
        yield _azure(server, request.getfixturevalue("azure_container"))
    elif request.param == "s3":
        request.getfixturevalue("s3_small_parts")
        yield _s3(request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket"))
    elif request.param == "gs":
        yield _gcs(request.getfixturevalue("gcs_server"), request.getfixturevalue("gcs_bucket"))
    elif request.param == "memory":
        yield _memory()
    else:
        yield _local(tmp_path)


@pytest.fixture(params=["s3", "gs", "az"])
def served(request: pytest.FixtureRequest) -> Target:
    if request.param == "az":
        server = request.getfixturevalue("azure_server")
        return _azure(server, request.getfixturevalue("azure_container"))
    if request.param == "s3":
        request.getfixturevalue("s3_small_parts")
        return _s3(request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket"))
    return _gcs(request.getfixturevalue("gcs_server"), request.getfixturevalue("gcs_bucket"))


def payloads(n: int, seed: int = 0, high: int = 2000) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(0, high)) for _ in range(n)]


def read_all(url: str, storage_options: dict[str, Any] | None) -> list[bytes]:
    return list(streamrec.open_dataset(url, storage_options=storage_options, retry=FAST))


# --- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "gzip"])
async def test_rotating_set_round_trip_with_manifest(
    target: Target, compression: str | None
) -> None:
    part = target.part_bytes
    data = payloads(1 + 5 * part // 1000, seed=1)  # about 2.5 shards of 2 parts each
    limit = 2 * part
    suffix = ".gz" if compression else ""
    template = f"{target.base}/part-{{index:05d}}.tfrecord{suffix}"
    async with streamrec.open_writer(
        template,
        max_bytes=limit,
        compression=compression,
        part_bytes=part,
        storage_options=target.storage_options,
        retry=FAST,
    ) as w:
        for i in range(0, len(data), 25):
            await w.write_many(data[i : i + 25])
    shards = w.shards
    assert len(shards) >= 3
    names = [f"part-{i:05d}.tfrecord{suffix}" for i in range(len(shards))]
    assert target.names() == sorted(["_manifest.json", *names])
    assert target.uploads() == []
    for name, entry in zip(names, shards, strict=True):
        stored = target.get(name)
        assert entry.url == f"{target.base}/{name}"
        assert entry.bytes == len(stored) <= limit
        assert entry.crc32c == crc32c(stored)
    glob = f"{target.base}/part-*.tfrecord{suffix}"
    assert read_all(glob, target.storage_options) == data
    entries = await read_manifest(f"{target.base}/_manifest.json", target.storage_options)
    assert entries == shards
    assert sum(e.records for e in entries) == len(data)
    # the manifest is a source too: exactly its shards, in index order
    assert read_all(f"{target.base}/_manifest.json", target.storage_options) == data


def test_tensorflow_names_round_robin_with_the_blocking_writer(target: Target) -> None:
    data = payloads(200, seed=2, high=300)
    template = f"{target.base}/train-{{index:05d}}-of-{{num_shards:05d}}.tfrecord"
    with streamrec.sync.open_writer(
        template,
        num_shards=3,
        part_bytes=target.part_bytes,
        storage_options=target.storage_options,
        retry=FAST,
    ) as w:
        for p in data:
            w.write(p)
    names = [f"train-{i:05d}-of-00003.tfrecord" for i in range(3)]
    assert target.names() == ["_manifest.json", *names]
    for k, name in enumerate(names):
        assert read_all(f"{target.base}/{name}", target.storage_options) == data[k::3]
    assert target.uploads() == []


def test_rewritten_corpus_is_byte_identical_to_tensorflow(target: Target, corpus_dir: Path) -> None:
    name = "tiny_20k.tfrecord"  # 20000 small records, 687 KB: several parts / chunks
    original = corpus_dir / "plain" / name
    data = list(streamrec.open_dataset(str(original)))
    with streamrec.sync.open_writer(
        f"{target.base}/{name}",
        part_bytes=target.part_bytes * 8,
        storage_options=target.storage_options,
        retry=FAST,
    ) as w:
        w.write_many(data)
    assert target.names() == [name]
    assert target.get(name) == original.read_bytes()


# --- how the bytes travel (observed by a proxy that injects nothing) ---------------------------


async def test_s3_parts_upload_while_writing_and_a_small_shard_is_one_put(
    s3_server: MotoS3Server, s3_bucket: str, s3_small_parts: int, fault_proxy: Any
) -> None:
    target = _s3(s3_server, s3_bucket)
    proxy = fault_proxy(target.upstream)
    part = target.part_bytes
    big = [b"x" * 1000] * (5 * part // 1016 + 3)  # just over 5 parts
    w = streamrec.open_writer(
        f"{target.base}/big-{{index}}",
        max_records=len(big),
        part_bytes=part,
        max_concurrency=2,
        storage_options=target.via(proxy),
        retry=FAST,
    )
    await w.write_many(big)  # the shard is full: sealed and committed in the background
    await w.write(b"small")  # the second shard: far smaller than one part
    await w.close()
    parts = [r for r in proxy.records if r.method == "PUT" and "partNumber=" in r.target]
    numbers = sorted(int(r.target.split("partNumber=")[1].split("&")[0]) for r in parts)
    assert numbers == [1, 2, 3, 4, 5, 6]
    assert proxy.count("POST", "?uploads") == 1  # one multipart upload: the big shard's
    assert proxy.count("POST", "uploadId=") == 1  # completed once
    small_puts = [r for r in proxy.records if r.method == "PUT" and r.target.endswith("big-1")]
    assert len(small_puts) == 1  # a single PutObject
    assert target.get("big-0") == b"".join(
        streamrec.format.framing.RecordEncoder().encode(p) for p in big
    )
    assert s3_server.list_multipart_uploads(s3_bucket) == []


async def test_gcs_chunks_are_256k_multiples_in_order_and_a_small_shard_is_one_request(
    gcs_server: FakeGcsServer, gcs_bucket: str, fault_proxy: Any
) -> None:
    target = _gcs(gcs_server, gcs_bucket)
    proxy = fault_proxy(target.upstream)
    big = [b"y" * 10_000] * 100  # 1 001 600 bytes: chunks of 256 KiB, 256 KiB, 256 KiB, rest
    w = streamrec.open_writer(
        f"{target.base}/g-{{index}}",
        max_records=100,
        part_bytes=200_000,  # rounded up to 256 KiB
        storage_options=target.via(proxy),
        retry=FAST,
    )
    await w.write_many(big)
    await w.write(b"small")
    await w.close()
    chunks = [r for r in proxy.records if r.method == "PUT" and "upload_id=" in r.target]
    assert len(chunks) == 4
    assert proxy.count("POST", "uploadType=resumable") == 1
    assert proxy.count("POST", "uploadType=media") == 2  # the small shard and the manifest
    stored = target.get("g-0")
    assert len(stored) == 100 * 10_016
    assert read_all(f"{target.base}/g-0", target.storage_options) == big
    metadata = gcs_server.stat(gcs_bucket, "set/g-0")
    assert w.shards[0].crc32c == int.from_bytes(base64.b64decode(metadata["crc32c"]), "big")


# --- nothing partial, nothing open ------------------------------------------------------------


def _open_upload_started(target: Target, proxy: FaultProxy) -> bool:
    """True once an upload is open on the server with data sent to it."""
    if target.kind == "s3":
        return bool(target.uploads()) and proxy.count("PUT", "partNumber=") >= 1
    if target.kind == "az":
        return proxy.count("PUT", "comp=block&") >= 1
    return proxy.count("PUT", "upload_id=") >= 1


def _azure_block(number: int) -> re.Pattern[str]:
    """Put Block requests of block ``number`` (ids start with the base64 of its 6 digits)."""
    digits = base64.b64encode(f"{number:06d}".encode()).decode()
    return re.compile(rf"comp=block&.*blockid={digits}")


async def test_exception_mid_shard_leaves_nothing(served: Target, fault_proxy: Any) -> None:
    proxy = fault_proxy(served.upstream)
    part = served.part_bytes
    with pytest.raises(RuntimeError, match="boom"):
        async with streamrec.open_writer(
            f"{served.base}/p-{{index}}",
            part_bytes=part,
            max_concurrency=1,  # so write() waits for earlier parts: they have been sent
            storage_options=served.via(proxy),
            retry=FAST,
        ) as w:
            await w.write_many([b"z" * 1000] * (4 * part // 1000))
            assert _open_upload_started(served, proxy)
            raise RuntimeError("boom")
    assert served.names() == []
    assert served.uploads() == []
    if served.kind == "gs":
        assert proxy.count("DELETE", "upload_id=") == 1  # the session was cancelled


async def test_cancelled_writer_leaves_nothing(served: Target, fault_proxy: Any) -> None:
    proxy = fault_proxy(served.upstream)
    part = served.part_bytes
    sent = asyncio.Event()

    async def produce() -> None:
        async with streamrec.open_writer(
            f"{served.base}/p-{{index}}",
            part_bytes=part,
            max_concurrency=1,
            storage_options=served.via(proxy),
            retry=FAST,
        ) as w:
            await w.write_many([b"c" * 1000] * (4 * part // 1000))
            sent.set()
            await asyncio.Event().wait()  # cancelled here, mid-shard

    task = asyncio.create_task(produce())
    await sent.wait()
    assert _open_upload_started(served, proxy)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert served.names() == []
    assert served.uploads() == []
    if served.kind == "gs":
        assert proxy.count("DELETE", "upload_id=") == 1


@pytest.mark.parametrize("when", ["mid-shard", "at close"])
async def test_upload_fault_outlasting_the_retries_leaves_nothing(
    served: Target, fault_proxy: Any, when: str
) -> None:
    proxy = fault_proxy(served.upstream)
    part = served.part_bytes
    count = 4 * part // 1000 - 1  # S3: 3 full parts, the 4th sent by close()
    path: str | re.Pattern[str]
    method = "PUT"
    if served.kind == "s3":
        number = 2 if when == "mid-shard" else 4
        path = re.compile(rf"partNumber={number}(&|$)")
    elif served.kind == "az":
        path = _azure_block(1 if when == "mid-shard" else 3)  # the 4th is sent by close()
    elif when == "mid-shard":
        path = "upload_id="  # a chunk of the resumable upload
    else:  # a shard smaller than a chunk: one request
        method, path, count = "POST", "uploadType=media", 10
    fault = proxy.status(503, method=method, path=path)
    with pytest.raises(RetriesExhaustedError, match=r"p-0.*gave up after 3 attempt"):
        async with streamrec.open_writer(
            f"{served.base}/p-{{index}}",
            part_bytes=part,
            storage_options=served.via(proxy),
            retry=FAST,
        ) as w:
            for _ in range(count):
                await w.write(b"f" * 984)
    assert fault.fired == 3
    assert served.names() == []
    assert served.uploads() == []
    if served.kind == "gs" and when == "mid-shard":
        assert proxy.count("DELETE", "upload_id=") == 1


async def test_the_upload_error_surfaces_on_the_next_write(
    served: Target, fault_proxy: Any
) -> None:
    proxy = fault_proxy(served.upstream)
    part = served.part_bytes
    path = re.compile(r"partNumber=1(&|$)") if served.kind == "s3" else "upload_id="
    if served.kind == "az":
        path = _azure_block(0)
    proxy.status(503, method="PUT", path=path)
    w = streamrec.open_writer(
        f"{served.base}/p-{{index}}",
        part_bytes=part,
        max_concurrency=1,
        storage_options=served.via(proxy),
        retry=FAST,
    )
    with pytest.raises(RetriesExhaustedError):
        for _ in range(100 * part // 1000):  # the window of one part fills: write() waits
            await w.write(b"e" * 984)
    with pytest.raises(RuntimeError, match="writer is failed"):
        await w.write(b"later")
    assert served.names() == [] and served.uploads() == []


async def test_transient_upload_faults_heal(served: Target, fault_proxy: Any) -> None:
    proxy = fault_proxy(served.upstream)
    part = served.part_bytes
    path = {"s3": "partNumber=", "az": "comp=block&"}.get(served.kind, "upload_id=")
    fault = proxy.status(503, method="PUT", path=path, times=2)
    data = payloads(3 * part // 500, seed=4, high=1000)
    async with streamrec.open_writer(
        f"{served.base}/h-{{index}}",
        part_bytes=part,
        storage_options=served.via(proxy),
        retry=FAST,
    ) as w:
        await w.write_many(data)
    assert fault.fired == 2
    assert read_all(f"{served.base}/h-0", served.storage_options) == data
    assert served.uploads() == []


def test_gcs_chunk_sizes_and_resume_offsets() -> None:
    from streamrec.errors import StorageError
    from streamrec.storage.gcs.sink import chunk_size, next_offset

    assert chunk_size(1) == chunk_size(CHUNK_ALIGN) == CHUNK_ALIGN
    assert chunk_size(CHUNK_ALIGN + 1) == 2 * CHUNK_ALIGN
    assert chunk_size(16 << 20) == 16 << 20
    assert next_offset(None) == next_offset("") == 0  # a 308 without Range: nothing kept
    assert next_offset("bytes=0-262143") == CHUNK_ALIGN
    with pytest.raises(StorageError, match="unexpected Range"):
        next_offset("items=3")


# --- record index sidecars (index=True) -------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "gzip", "zlib"])
@pytest.mark.parametrize("rotation", ["max_records", "max_bytes"])
async def test_indexed_set_round_trip(
    target: Target, compression: str | None, rotation: str
) -> None:
    part = target.part_bytes
    data = payloads(1 + 5 * part // 1000, seed=5)
    limit: dict[str, int] = {"max_bytes": 2 * part} if rotation == "max_bytes" else {}
    if rotation == "max_records":
        limit = {"max_records": len(data) // 3 + 1}
    template = f"{target.base}/part-{{index:05d}}.tfrecord"
    async with streamrec.open_writer(
        template,
        compression=compression,
        part_bytes=part,
        storage_options=target.storage_options,
        retry=FAST,
        index=True,
        **limit,
    ) as w:
        for i in range(0, len(data), 25):
            await w.write_many(data[i : i + 25])
    shards = w.shards
    assert len(shards) >= 3
    names = [f"part-{i:05d}.tfrecord" for i in range(len(shards))]
    assert target.names() == sorted(
        ["_dataset_index.bin", "_manifest.json", *names, *(n + ".idx" for n in names)]
    )
    assert target.uploads() == []
    start = 0
    dataset_index = DatasetIndex(target.get("_dataset_index.bin"), source="written")
    assert [s.name for s in dataset_index.shards] == names
    for k, (name, entry) in enumerate(zip(names, shards, strict=True)):
        stored, sidecar = target.get(name), target.get(name + ".idx")
        assert dataset_index.shard_index(k).to_bytes() == sidecar  # the same entries
        assert (dataset_index.shards[k].size, dataset_index.shards[k].version) == (
            entry.bytes,
            entry.version,
        )
        assert entry.bytes == len(stored) and entry.crc32c == crc32c(stored)
        assert (entry.index_url, entry.index_bytes) == (f"{target.base}/{name}.idx", len(sidecar))
        if rotation == "max_bytes":
            assert entry.bytes <= limit["max_bytes"]
        check_sidecar(stored, sidecar, compression, data[start : start + entry.records])
        start += entry.records
    assert start == len(data)
    manifest = f"{target.base}/_manifest.json"
    assert await read_manifest(manifest, target.storage_options) == shards
    document = json.loads(target.get("_manifest.json"))
    assert [item["record_index"] for item in document["shards"]] == [
        {"name": n + ".idx", "bytes": e.index_bytes} for n, e in zip(names, shards, strict=True)
    ]
    listed = await streamrec.open_dataset(manifest, storage_options=target.storage_options).shards()
    assert [(o.index and o.index.url, o.index and o.index.size) for o in listed] == [
        (e.index_url, e.index_bytes) for e in shards
    ]
    assert read_all(manifest, target.storage_options) == data


def _object_of(target: str) -> str | None:
    """The name under ``set/`` of the object a request is about: S3 paths end with the key,
    GCS ones carry it url-encoded in the path (``set%2F<name>``) or in ``name=``."""
    path, _, query = target.replace("%2F", "/").replace("%2f", "/").partition("?")
    params = dict(p.partition("=")[::2] for p in query.split("&") if p)
    for where in (params.get("name", ""), path):
        if "set/" in where:
            return where.rsplit("set/", 1)[1]
    return None


async def test_an_index_is_committed_after_its_shard_and_an_older_one_removed_before(
    served: Target, fault_proxy: Any
) -> None:
    proxy = fault_proxy(served.upstream)
    template = f"{served.base}/p-{{index}}"
    common: dict[str, Any] = {"part_bytes": served.part_bytes, "retry": FAST, "index": True}
    async with streamrec.open_writer(
        template, storage_options=served.storage_options, **common
    ) as w:
        await w.write_many(payloads(50, seed=6, high=300))  # an earlier indexed write
    data = payloads(80, seed=7, high=300)
    async with streamrec.open_writer(template, storage_options=served.via(proxy), **common) as w:
        await w.write_many(data)
    # the requests about p-0 and p-0.idx, in order; the resumable session's chunks name the
    # object only in its first request
    events = [(_object_of(r.target), r.method) for r in proxy.records]
    shard = [k for k, (name, _) in enumerate(events) if name == "p-0"]
    sidecar = [(k, method) for k, (name, method) in enumerate(events) if name == "p-0.idx"]
    assert sidecar[0][1] in ("GET", "HEAD")  # looked up first: deleted only when there
    sidecar = [(k, method) for k, method in sidecar if method not in ("GET", "HEAD")]
    if served.kind == "gs":  # chunks of the shard's session: PUTs with an upload_id
        shard += [k for k, r in enumerate(proxy.records) if "upload_id=" in r.target]
    [(removed, delete), (put, upload)] = sidecar
    assert delete == "DELETE" and upload in ("PUT", "POST")
    assert removed < max(shard) < put  # old index removed, shard committed, new index put
    check_sidecar(served.get("p-0"), served.get("p-0.idx"), None, data)


async def test_a_failed_index_upload_leaves_the_shard_unindexed_and_no_manifest(
    served: Target, fault_proxy: Any
) -> None:
    proxy = fault_proxy(served.upstream)
    template = f"{served.base}/p-{{index}}"
    common: dict[str, Any] = {"part_bytes": served.part_bytes, "retry": FAST, "index": True}
    async with streamrec.open_writer(
        template, storage_options=served.storage_options, **common
    ) as w:
        await w.write_many(payloads(50, seed=8, high=300))  # an earlier indexed write
    if served.kind in ("s3", "az"):  # one PutObject / Put Blob
        fault = proxy.status(503, method="PUT", path=re.compile(r"/set/p-0\.idx$"))
    else:
        fault = proxy.status(503, method="POST", path=re.compile(r"name=set(%2F|/)p-0\.idx"))
    with pytest.raises(RetriesExhaustedError, match=r"p-0\.idx"):
        async with streamrec.open_writer(
            template, storage_options=served.via(proxy), **common
        ) as w:
            await w.write_many(payloads(80, seed=9, high=300))
    assert fault.fired == 3
    # the new shard is there, without an index (its old one was removed before it was
    # committed), and no manifest: as if the writer had been killed between the two commits
    assert served.names() == ["p-0"]
    assert served.uploads() == []


async def test_an_indexed_writer_deletes_nothing_where_there_is_no_older_index(
    served: Target, fault_proxy: Any
) -> None:
    proxy = fault_proxy(served.upstream)
    async with streamrec.open_writer(
        f"{served.base}/p-{{index}}",
        max_records=30,
        part_bytes=served.part_bytes,
        retry=FAST,
        index=True,
        storage_options=served.via(proxy),
    ) as w:
        await w.write_many(payloads(80, seed=10, high=300))
    assert proxy.count("DELETE") == 0  # (a writer may lack the right to delete)
    names = ["p-0", "p-1", "p-2"]
    assert served.names() == sorted(
        ["_dataset_index.bin", "_manifest.json", *names, *(n + ".idx" for n in names)]
    )
