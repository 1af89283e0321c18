"""The shard writer on local files and memory://: rotation, fixed shard sets, the manifest,
TensorFlow's byte layout, and nothing partial left behind on failure."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
import zlib
from pathlib import Path
from typing import Any

import fsspec
import pytest

import streamrec
from streamrec.errors import FormatError, ObjectNotFoundError
from streamrec.format.framing import RecordEncoder
from streamrec.manifest.core import loads, read_manifest

FRAME = 16


def framed(payload: bytes) -> int:
    return len(payload) + FRAME


def varied(n: int, seed: int = 0, low: int = 1, high: int = 3000) -> list[bytes]:
    """Payloads of random lengths: random bytes (incompressible)."""
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(low, high)) for _ in range(n)]


def compressible(n: int, seed: int = 0) -> list[bytes]:
    """Payloads that deflate well (repetitive words and numbers, random lengths)."""
    rng = random.Random(seed)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"tfrecord", b"shard"]
    return [
        b" ".join(
            rng.choice(words) + b"%d" % rng.randint(0, 99) for _ in range(rng.randint(1, 300))
        )
        for _ in range(n)
    ]


def shard_files(directory: Path, pattern: str = "part-*") -> list[Path]:
    return sorted(directory.glob(pattern))


def records_of(path: Path | str) -> list[bytes]:
    return list(streamrec.open_dataset(str(path)))


def inflate(data: bytes, compression: str | None) -> bytes:
    if compression is None:
        return data
    inflater = zlib.decompressobj(31 if compression == "gzip" else 15)
    out = inflater.decompress(data)
    assert inflater.eof and not inflater.unused_data  # one member / stream, nothing after it
    return out


def split_by_counts(payloads: list[bytes], counts: list[int]) -> list[list[bytes]]:
    out, i = [], 0
    for c in counts:
        out.append(payloads[i : i + c])
        i += c
    return out


# --- rotation -------------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [False, True])
async def test_rotation_by_records_is_exact(tmp_path: Path, batched: bool) -> None:
    payloads = varied(1001, high=300)
    template = str(tmp_path / "part-{index:05d}.tfrecord")
    async with streamrec.open_writer(template, max_records=250, flush_bytes=4096) as w:
        if batched:
            for i in range(0, len(payloads), 97):
                await w.write_many(payloads[i : i + 97])
        else:
            for p in payloads:
                await w.write(p)
    files = shard_files(tmp_path)
    assert [f.name for f in files] == [f"part-{i:05d}.tfrecord" for i in range(5)]
    assert [len(records_of(f)) for f in files] == [250, 250, 250, 250, 1]
    assert list(streamrec.open_dataset(str(tmp_path / "part-*.tfrecord"))) == payloads
    assert [e.records for e in w.shards] == [250, 250, 250, 250, 1]


@pytest.mark.parametrize("batched", [False, True])
def test_rotation_by_bytes_uncompressed_is_exact(tmp_path: Path, batched: bool) -> None:
    payloads = varied(600, seed=1)
    limit = 50_000
    template = str(tmp_path / "part-{index}.tfrecord")
    with streamrec.sync.open_writer(template, max_bytes=limit, flush_bytes=10_000) as w:
        if batched:
            for i in range(0, len(payloads), 64):
                w.write_many(payloads[i : i + 64])
        else:
            for p in payloads:
                w.write(p)
    counts = [e.records for e in w.shards]
    files = [Path(e.url) for e in w.shards]
    assert sum(counts) == 600 and len(files) > 5
    groups = split_by_counts(payloads, counts)
    for k, (path, group) in enumerate(zip(files, groups, strict=True)):
        size = path.stat().st_size
        assert size == sum(framed(p) for p in group) <= limit
        assert path.read_bytes() == RecordEncoder().encode_many(group)
        if k + 1 < len(groups):  # the next shard's first record would not have fitted
            assert size + framed(groups[k + 1][0]) > limit


def test_a_shard_is_filled_to_the_byte(tmp_path: Path) -> None:
    with streamrec.sync.open_writer(str(tmp_path / "b-{index}"), max_bytes=1000) as w:
        w.write_many([b"r" * 84] * 25)  # 100 bytes framed: exactly 10 fit
        w.write(b"s" * 84)
    assert [e.records for e in w.shards] == [10, 10, 6]
    assert [e.bytes for e in w.shards] == [1000, 1000, 600]


def test_a_record_bigger_than_max_bytes_gets_a_shard_of_its_own(tmp_path: Path) -> None:
    payloads = [b"a" * 100, b"b" * 100, b"H" * 5000, b"c" * 100, b"D" * 6000, b"E" * 7000]
    template = str(tmp_path / "s-{index}.tfrecord")
    with streamrec.sync.open_writer(template, max_bytes=1000) as w:
        w.write_many(payloads)
    assert [e.records for e in w.shards] == [2, 1, 1, 1, 1]
    assert [records_of(e.url) for e in w.shards] == [
        payloads[:2],
        [payloads[2]],
        [payloads[3]],
        [payloads[4]],
        [payloads[5]],
    ]


def test_both_limits_whichever_comes_first(tmp_path: Path) -> None:
    payloads = [b"x" * 10] * 10 + [b"y" * 400] * 6
    with streamrec.sync.open_writer(
        str(tmp_path / "p{index}.tfrecord"), max_records=4, max_bytes=900
    ) as w:
        w.write_many(payloads)
    # 4 by count, 4 by count, x x y y = 884 bytes by count, then y y = 832 bytes by size
    assert [e.records for e in w.shards] == [4, 4, 4, 2, 2]


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
@pytest.mark.parametrize("data", ["random", "compressible"])
def test_rotation_by_bytes_compressed_is_exact(tmp_path: Path, compression: str, data: str) -> None:
    payloads = varied(900, seed=2, high=2500) if data == "random" else compressible(3000)
    limit = 60_000
    suffix = ".gz" if compression == "gzip" else ".zlib"
    template = str(tmp_path / f"part-{{index:03d}}.tfrecord{suffix}")
    with streamrec.sync.open_writer(
        template, max_bytes=limit, compression=compression, flush_bytes=8192
    ) as w:
        for i in range(0, len(payloads), 50):
            w.write_many(payloads[i : i + 50])
    counts = [e.records for e in w.shards]
    groups = split_by_counts(payloads, counts)
    assert sum(counts) == len(payloads) and len(groups) >= 4
    for k, entry in enumerate(w.shards):
        stored = Path(entry.url).read_bytes()
        assert len(stored) == entry.bytes <= limit
        assert inflate(stored, compression) == RecordEncoder().encode_many(groups[k])
        if k + 1 < len(groups):
            # Exactness, seen from outside: the room left is smaller than what the next record
            # adds. A random record does not deflate: it adds its framed size plus a stored
            # block's 5 bytes. A compressible one adds less, but never as much as the bound
            # the writer uses to skip the exact check (n + n/8 + n/64 + 128).
            room = limit - len(stored)
            nxt = framed(groups[k + 1][0])
            if data == "random":
                assert room < nxt + 16
            else:
                assert room < nxt
                assert len(stored) > limit * 0.98  # compressed shards are filled, not cut
    assert list(streamrec.open_dataset(str(tmp_path / "part-*"))) == payloads


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_compressed_shards_never_pass_max_bytes(tmp_path: Path, compression: str) -> None:
    # Small limits over many offsets: the sync flush that makes the size exact must not
    # itself push a shard that then closes past the limit.
    payloads = [(b"record %d " % i) * (1 + i % 7) for i in range(400)]
    for limit in range(300, 1700, 37):
        out = tmp_path / f"{limit}"
        with streamrec.sync.open_writer(
            str(out / "p-{index:03d}.tfrecord"), max_bytes=limit, compression=compression
        ) as w:
            w.write_many(payloads)
        sizes = [entry.bytes for entry in w.shards]
        assert max(sizes) <= limit, (limit, sizes)
        assert list(streamrec.open_dataset(str(out / "p-*"), compression=compression)) == payloads


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_write_and_write_many_give_identical_shards(tmp_path: Path, compression: str) -> None:
    payloads = compressible(1500, seed=3)
    for name, batch in (("one", 1), ("many", 37)):
        with streamrec.sync.open_writer(
            str(tmp_path / name / "p-{index}"), max_bytes=20_000, compression=compression
        ) as w:
            for i in range(0, len(payloads), batch):
                if batch == 1:
                    w.write(payloads[i])
                else:
                    w.write_many(payloads[i : i + batch])
    one = [p.read_bytes() for p in shard_files(tmp_path / "one", "p-*")]
    many = [p.read_bytes() for p in shard_files(tmp_path / "many", "p-*")]
    assert len(one) > 3 and one == many


# --- fixed shard sets -------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [False, True])
def test_num_shards_round_robin_with_tensorflow_names(tmp_path: Path, batched: bool) -> None:
    payloads = varied(103, seed=4, high=200)
    template = str(tmp_path / "train-{index:05d}-of-{num_shards:05d}.tfrecord")
    with streamrec.sync.open_writer(template, num_shards=4) as w:
        if batched:
            w.write_many(payloads[:10])
            for i in range(10, 103, 7):
                w.write_many(payloads[i : i + 7])
        else:
            for p in payloads:
                w.write(p)
    names = [p.name for p in shard_files(tmp_path, "train-*")]
    assert names == [f"train-{i:05d}-of-00004.tfrecord" for i in range(4)]
    for k in range(4):
        assert records_of(tmp_path / names[k]) == payloads[k::4]
    assert [e.records for e in w.shards] == [26, 26, 26, 25]


def test_num_shards_with_fewer_records_than_shards_writes_empty_shards(tmp_path: Path) -> None:
    with streamrec.sync.open_writer(str(tmp_path / "d-{index}-of-{num_shards}"), num_shards=5) as w:
        w.write_many([b"a", b"b"])
    assert [e.records for e in w.shards] == [1, 1, 0, 0, 0]
    assert [(tmp_path / f"d-{i}-of-5").stat().st_size for i in range(5)] == [17, 17, 0, 0, 0]


@pytest.mark.parametrize("total", [10, 3, 0])
def test_num_shards_contiguous(tmp_path: Path, total: int) -> None:
    payloads = [b"r%d" % i for i in range(total)]
    template = str(tmp_path / "c-{index:02d}-of-{num_shards:02d}")
    with streamrec.sync.open_writer(
        template, num_shards=4, order="contiguous", total_records=total
    ) as w:
        for p in payloads:
            w.write(p)
    expected = {10: [3, 3, 2, 2], 3: [1, 1, 1, 0], 0: [0, 0, 0, 0]}[total]
    assert [e.records for e in w.shards] == expected
    assert split_by_counts(payloads, expected) == [
        records_of(tmp_path / f"c-{i:02d}-of-04") for i in range(4)
    ]


async def test_contiguous_refuses_a_wrong_record_count(tmp_path: Path) -> None:
    template = str(tmp_path / "c-{index}")
    w = streamrec.open_writer(template, num_shards=2, order="contiguous", total_records=3)
    await w.write_many([b"1", b"2", b"3"])
    with pytest.raises(ValueError, match="more records than total_records=3"):
        await w.write(b"4")
    await w.close()  # the refused record changed nothing
    assert [e.records for e in w.shards] == [2, 1]

    w = streamrec.open_writer(
        str(tmp_path / "short" / "c-{index}"), num_shards=2, order="contiguous", total_records=5
    )
    await w.write_many([b"1", b"2", b"3"])
    with pytest.raises(ValueError, match="3 records written, but total_records=5"):
        await w.close()
    # the second shard never appears, nor the manifest (the first may have been committed)
    left = sorted(p.name for p in (tmp_path / "short").glob("*"))
    assert left in ([], ["c-0"])


# --- what is refused at open ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "options", "message"),
    [
        ("out.tfrecord", {"max_records": 10}, r"no \{index\} field"),
        ("out.tfrecord", {"max_bytes": 1 << 20}, r"no \{index\} field"),
        ("out.tfrecord", {"num_shards": 3}, r"no \{index\} field"),
        ("out-{index}-of-{num_shards}", {"max_records": 3}, r"needs a fixed num_shards"),
        ("out-{shard}", {}, r"unknown template field \{shard\}"),
        ("out-{}", {}, r"unknown template field"),
        ("out-{index:q}", {}, "not a valid shard template"),
        ("out-{index", {}, "not a valid shard template"),
        ("o-{index}", {"num_shards": 2, "max_records": 5}, "cannot be combined"),
        ("o-{index}", {"num_shards": 2, "order": "contiguous"}, "total_records"),
        ("o-{index}", {"total_records": 5}, "only used with"),
        ("o-{index}", {"order": "sorted"}, "order must be"),
        ("o-{index}", {"max_bytes": 0}, "max_bytes must be a positive integer"),
        ("o-{index}", {"compression": "auto"}, "explicit compression"),
        ("d{index}/x", {"max_records": 2}, "directory varies"),
    ],
)
def test_bad_options_are_refused_at_open(
    tmp_path: Path, template: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        streamrec.open_writer(str(tmp_path / template), **options)


def test_http_is_read_only_and_refused_at_open() -> None:
    with pytest.raises(streamrec.errors.StorageError, match="read-only"):
        streamrec.open_writer("http://127.0.0.1:9/x-{index}", max_records=1)


def test_one_shard_set_with_num_shards_1_needs_no_index(tmp_path: Path) -> None:
    with streamrec.sync.open_writer(str(tmp_path / "only.tfrecord"), num_shards=1) as w:
        w.write(b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["only.tfrecord"]


# --- single files: backwards compatible -------------------------------------------------------


def test_plain_path_writes_one_file_and_no_manifest(tmp_path: Path) -> None:
    with streamrec.sync.open_writer(str(tmp_path / "out.tfrecord")) as w:
        w.write_many(varied(5000, high=100))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tfrecord"]
    assert w.manifest_url is None and len(w.shards) == 1 and w.shards[0].records == 5000


def test_a_manifest_for_a_single_file_when_asked(tmp_path: Path) -> None:
    with streamrec.sync.open_writer(str(tmp_path / "out.tfrecord"), manifest="m.json") as w:
        w.write(b"hello")
    document = json.loads((tmp_path / "m.json").read_text())
    assert [s["name"] for s in document["shards"]] == ["out.tfrecord"]


def test_no_manifest_when_turned_off(tmp_path: Path) -> None:
    with streamrec.sync.open_writer(str(tmp_path / "p-{index}"), max_records=1, manifest=None) as w:
        w.write_many([b"1", b"2"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p-0", "p-1"]


def test_an_empty_set_is_one_empty_shard(tmp_path: Path) -> None:
    with streamrec.sync.open_writer(str(tmp_path / "p-{index}"), max_records=10):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_manifest.json", "p-0"]
    assert (tmp_path / "p-0").read_bytes() == b""


# --- TensorFlow's byte layout -----------------------------------------------------------------

PLAIN = ["empty", "features", "images", "raw_lengths", "tiny_20k"]


@pytest.mark.parametrize("name", PLAIN)
@pytest.mark.parametrize("compression", [None, "gzip", "zlib"])
def test_rewritten_corpus_is_byte_identical_to_tensorflow(
    tmp_path: Path, corpus_dir: Path, name: str, compression: str | None
) -> None:
    payloads = records_of(corpus_dir / "plain" / f"{name}.tfrecord")
    folder, suffix = {None: ("plain", ""), "gzip": ("gzip", ".gz"), "zlib": ("zlib", ".zlib")}[
        compression
    ]
    expected = (corpus_dir / folder / f"{name}.tfrecord{suffix}").read_bytes()
    out = tmp_path / f"{name}.tfrecord{suffix}"
    with streamrec.sync.open_writer(str(out), compression=compression, flush_bytes=4096) as w:
        w.write_many(payloads)
    assert out.read_bytes() == expected
    # as shards of a set, and through memory:// too: the same bytes
    url = f"memory://writer-{uuid.uuid4().hex}/{name}-{{index}}{suffix}"
    with streamrec.sync.open_writer(url, max_bytes=1 << 30, compression=compression) as w:
        for p in payloads:
            w.write(p)
    assert fsspec.filesystem("memory").cat_file(url.format(index=0)) == expected


# --- the manifest -----------------------------------------------------------------------------


async def test_manifest_lists_every_shard(tmp_path: Path) -> None:
    payloads = varied(500, seed=5, high=400)
    template = str(tmp_path / "data" / "part-{index:04d}.tfrecord.gz")
    async with streamrec.open_writer(template, max_records=120, compression="gzip") as w:
        await w.write_many(payloads)
    path = tmp_path / "data" / "_manifest.json"
    document = json.loads(path.read_text())
    assert document["format"] == "streamrec.manifest.core" and document["version"] == 1
    assert document["compression"] == "gzip" and document["template"] == template
    assert document["num_shards"] == 5 and document["records"] == 500
    shards = document["shards"]
    assert [s["name"] for s in shards] == [f"part-{i:04d}.tfrecord.gz" for i in range(5)]
    assert [s["records"] for s in shards] == [120, 120, 120, 120, 20]
    for s in shards:
        data = (tmp_path / "data" / s["name"]).read_bytes()
        assert s["bytes"] == len(data)
        assert s["crc32c"] == streamrec.format.crc.crc32c(data)
        assert s["url"] == str(tmp_path / "data" / s["name"])
    assert document["bytes"] == sum(s["bytes"] for s in shards)
    entries = await read_manifest(str(path))
    assert [e.url for e in entries] == [str(tmp_path / "data" / s["name"]) for s in shards]
    assert entries == w.shards
    read = []
    for e in entries:
        read += [p async for p in streamrec.open_dataset(e.url)]
    assert read == payloads


async def test_manifest_names_resolve_after_the_set_is_moved(tmp_path: Path) -> None:
    async with streamrec.open_writer(str(tmp_path / "a" / "p-{index}"), max_records=2) as w:
        await w.write_many([b"1", b"2", b"3"])
    (tmp_path / "a").rename(tmp_path / "b")
    entries = await read_manifest(f"file://{tmp_path}/b/_manifest.json")
    assert [e.url for e in entries] == [f"file://{tmp_path}/b/p-0", f"file://{tmp_path}/b/p-1"]
    assert [records_of(e.url) for e in entries] == [[b"1", b"2"], [b"3"]]


async def test_read_manifest_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFoundError):
        await read_manifest(str(tmp_path / "_manifest.json"))
    good = {"format": "streamrec.manifest.core", "version": 1, "shards": []}
    for document, message in [
        ({**good, "version": 2}, "version 2 is newer"),
        ({**good, "format": "other"}, "format"),
        ({**good, "shards": [{"name": "x", "records": -1, "bytes": 0, "crc32c": 0}]}, "shard 0"),
        ({**good, "shards": [{"name": "x", "bytes": 0, "crc32c": 0}]}, "shard 0"),
        ({**good, "records": 3}, "does not match"),
    ]:
        with pytest.raises(FormatError, match=message):
            loads(json.dumps(document), "m.json")
    with pytest.raises(FormatError, match="not JSON"):
        loads(b"\x00", "m.json")


# --- nothing partial --------------------------------------------------------------------------


async def test_exception_mid_shard_keeps_committed_shards_and_no_manifest(
    tmp_path: Path,
) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        async with streamrec.open_writer(
            str(tmp_path / "p-{index}"), max_records=100, flush_bytes=64
        ) as w:
            await w.write_many(varied(250, high=50))  # two complete shards, one half-written
            raise RuntimeError("boom")
    # shards committed before the exception stay, complete; the rest is gone, no manifest
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left in ([], ["p-0"], ["p-0", "p-1"])
    assert [len(records_of(tmp_path / n)) for n in left] == [100] * len(left)


def test_exception_inside_sync_with_leaves_no_temp_file(tmp_path: Path) -> None:
    with (
        pytest.raises(KeyError),
        streamrec.sync.open_writer(
            str(tmp_path / "p-{index}"), max_records=1000, flush_bytes=10
        ) as w,
    ):
        w.write_many(varied(50, high=50))
        raise KeyError("boom")
    assert list(tmp_path.iterdir()) == []


async def test_cancelled_writer_leaves_no_temp_file(tmp_path: Path) -> None:
    written = asyncio.Event()

    async def produce() -> None:
        async with streamrec.open_writer(
            str(tmp_path / "p-{index}"), max_records=10, flush_bytes=10
        ) as w:
            for p in varied(25, high=50):
                await w.write(p)
            written.set()
            await asyncio.Event().wait()  # cancelled here, inside the third shard

    task = asyncio.create_task(produce())
    await written.wait()
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left in ([], ["p-0"], ["p-0", "p-1"])
    assert [len(records_of(tmp_path / n)) for n in left] == [10] * len(left)


async def test_close_after_a_failure_raises_again(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory must be")
    w = streamrec.open_writer(str(blocker / "p-{index}"), max_records=1, flush_bytes=1)
    with pytest.raises(streamrec.errors.StorageError, match="cannot create"):
        await w.write_many([b"1", b"2"])
    with pytest.raises(RuntimeError, match="writer is failed"):
        await w.write(b"3")
    with pytest.raises(streamrec.errors.StorageError, match="failed earlier"):
        await w.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]


def test_open_dataset_reads_a_manifest_and_only_its_shards(tmp_path: Path) -> None:
    payloads = [b"p%d" % i for i in range(50)]
    with streamrec.sync.open_writer(str(tmp_path / "out-{index}.tfrecord"), max_records=7) as w:
        w.write_many(payloads)
    # a stray file a glob would pick up is not part of the set
    (tmp_path / "out-99.tfrecord").write_bytes(RecordEncoder().encode(b"stray"))
    manifest = str(tmp_path / "_manifest.json")
    assert list(streamrec.open_dataset(manifest)) == payloads
    assert len(list(streamrec.open_dataset(str(tmp_path / "out-*.tfrecord")))) == 51
    ds = streamrec.open_dataset(manifest, cycle_length=3)
    assert sorted(ds) == sorted(payloads)
    (tmp_path / "out-3.tfrecord").unlink()
    with pytest.raises(streamrec.errors.ObjectNotFoundError, match=r"out-3\.tfrecord"):
        list(streamrec.open_dataset(manifest))
