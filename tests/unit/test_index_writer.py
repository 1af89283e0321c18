"""The shard writer with ``index=True`` on local files: each shard's ``.idx`` sidecar,
committed after it, describing exactly its records; the manifest lists them; rotation by
records and by bytes (exact, restart points included); fixed sets; failures."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import streamrec
from streamrec.format.encoder import RESTART_BYTES
from streamrec.format.framing import RecordEncoder
from streamrec.manifest.core import ManifestEntry, loads, read_manifest
from support.indexes import check_sidecar

FRAME = 16


def varied(n: int, seed: int = 0, high: int = 3000) -> list[bytes]:
    """Random lengths, half of them incompressible, half repetitive."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        size = rng.randint(0, high)
        if rng.random() < 0.5:
            out.append(rng.randbytes(size))
        else:
            out.append((b"field%d " % rng.randint(0, 20) * (size // 7 + 1))[:size])
    return out


def groups_of(payloads: list[bytes], shards: list[ManifestEntry]) -> list[list[bytes]]:
    out, i = [], 0
    for entry in shards:
        out.append(payloads[i : i + entry.records])
        i += entry.records
    assert i == len(payloads)
    return out


def check_indexed_set(
    shards: list[ManifestEntry], groups: list[list[bytes]], compression: str | None
) -> None:
    """Every shard has its sidecar beside it, as the entry says, describing its records."""
    for entry, group in zip(shards, groups, strict=True):
        assert entry.index_url == entry.url + ".idx"
        sidecar = Path(entry.url + ".idx").read_bytes()
        assert entry.index_bytes == len(sidecar)
        check_sidecar(Path(entry.url).read_bytes(), sidecar, compression, group)


def write(
    template: str, payloads: list[bytes], batch: int, **options: object
) -> list[ManifestEntry]:
    with streamrec.sync.open_writer(template, index=True, **options) as w:
        for i in range(0, len(payloads), batch):
            if batch == 1:
                w.write(payloads[i])
            else:
                w.write_many(payloads[i : i + batch])
    return w.shards


@pytest.mark.parametrize("compression", [None, "gzip", "zlib"])
@pytest.mark.parametrize("batch", [1, 37])
async def test_rotation_by_records_indexes_every_shard(
    tmp_path: Path, compression: str | None, batch: int
) -> None:
    payloads = varied(700, seed=1)
    template = str(tmp_path / "part-{index:03d}.tfrecord")
    shards = write(template, payloads, batch, max_records=150, compression=compression)
    assert [e.records for e in shards] == [150, 150, 150, 150, 100]
    check_indexed_set(shards, groups_of(payloads, shards), compression)
    names = sorted(p.name for p in tmp_path.iterdir())
    stems = [f"part-{i:03d}.tfrecord" for i in range(5)]
    assert names == sorted(
        ["_dataset_index.bin", "_manifest.json", *stems, *(s + ".idx" for s in stems)]
    )
    # the manifest lists each sidecar by its relative name and size
    document = json.loads((tmp_path / "_manifest.json").read_text())
    for item, entry in zip(document["shards"], shards, strict=True):
        assert item["record_index"] == {"name": item["name"] + ".idx", "bytes": entry.index_bytes}
        assert isinstance(item["index"], int)  # the shard's position, as before
    assert await read_manifest(str(tmp_path / "_manifest.json")) == shards
    # what a reader lists from the manifest carries the sidecar: no lookup needed
    listed = await streamrec.open_dataset(str(tmp_path)).shards()
    assert [(o.index and o.index.url, o.index and o.index.size) for o in listed] == [
        (e.index_url, e.index_bytes) for e in shards
    ]
    assert list(streamrec.open_dataset(str(tmp_path))) == payloads


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_rotation_by_bytes_stays_exact_with_restart_points(
    tmp_path: Path, compression: str
) -> None:
    # shards of a few MiB: several restart points each, and the exact fit near the limit
    payloads = varied(900, seed=2, high=20_000)
    limit = 3 * RESTART_BYTES + 12_345
    template = str(tmp_path / "part-{index:03d}.tfrecord")
    shards = write(template, payloads, 50, max_bytes=limit, compression=compression)
    groups = groups_of(payloads, shards)
    assert len(shards) >= 2
    restarts = []
    for entry, group in zip(shards, groups, strict=True):
        assert entry.bytes <= limit
        index = check_sidecar(
            Path(entry.url).read_bytes(), Path(entry.url + ".idx").read_bytes(), compression, group
        )
        assert index.restarts is not None
        restarts.append(len(set(index.restarts.tolist())))
    assert max(restarts) >= 3
    for k in range(len(shards) - 1):  # a full shard: the next record did not fit
        room = limit - shards[k].bytes
        assert room < len(groups[k + 1][0]) + FRAME + 16


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_rotation_by_bytes_small_limits_never_pass_max_bytes(
    tmp_path: Path, compression: str | None
) -> None:
    payloads = [(b"record %d " % i) * (1 + i % 7) for i in range(300)]
    for limit in range(300, 1700, 97):
        out = tmp_path / f"{limit}"
        shards = write(
            str(out / "p-{index:03d}"), payloads, 300, max_bytes=limit, compression=compression
        )
        assert max(e.bytes for e in shards) <= limit
        check_indexed_set(shards, groups_of(payloads, shards), compression)


@pytest.mark.parametrize("order", ["round_robin", "contiguous"])
@pytest.mark.parametrize("compression", [None, "zlib"])
def test_fixed_sets_are_indexed(tmp_path: Path, order: str, compression: str | None) -> None:
    payloads = varied(101, seed=3, high=500)
    options: dict[str, object] = {"num_shards": 4, "order": order}
    if order == "contiguous":
        options["total_records"] = len(payloads)
    template = str(tmp_path / "t-{index:05d}-of-{num_shards:05d}")
    shards = write(template, payloads, 10, compression=compression, **options)
    if order == "round_robin":
        groups = [payloads[k::4] for k in range(4)]
    else:
        groups = groups_of(payloads, shards)
    assert [e.records for e in shards] == [len(g) for g in groups]
    check_indexed_set(shards, groups, compression)


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_an_empty_set_has_an_empty_index(tmp_path: Path, compression: str | None) -> None:
    shards = write(str(tmp_path / "e-{index}"), [], 1, compression=compression)
    assert [e.records for e in shards] == [0]
    assert Path(shards[0].url + ".idx").read_bytes() == b"" and shards[0].index_bytes == 0


def test_a_single_file_gets_its_sidecar_too(tmp_path: Path) -> None:
    payloads = varied(50, seed=4)
    shards = write(str(tmp_path / "one.tfrecord"), payloads, 7)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.tfrecord", "one.tfrecord.idx"]
    check_indexed_set(shards, [payloads], None)


def test_without_index_there_is_no_sidecar_and_the_manifest_has_none(tmp_path: Path) -> None:
    payloads = varied(30, seed=5)
    with streamrec.sync.open_writer(str(tmp_path / "p-{index}"), max_records=10) as w:
        w.write_many(payloads)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_manifest.json", "p-0", "p-1", "p-2"]
    assert all(e.index_url is None and e.index_bytes is None for e in w.shards)
    document = json.loads((tmp_path / "_manifest.json").read_text())
    assert all("record_index" not in item for item in document["shards"])


def test_rewriting_an_indexed_set_rewrites_its_indexes(tmp_path: Path) -> None:
    template = str(tmp_path / "p-{index}")
    write(template, varied(40, seed=6), 40, max_records=20)
    payloads = varied(40, seed=7)
    shards = write(template, payloads, 40, max_records=20)
    check_indexed_set(shards, groups_of(payloads, shards), None)


async def test_an_exception_leaves_no_index_without_its_shard(tmp_path: Path) -> None:
    payloads = varied(50, seed=8)
    with pytest.raises(RuntimeError, match="boom"):
        async with streamrec.open_writer(
            str(tmp_path / "p-{index}"), max_records=20, index=True, compression="gzip"
        ) as w:
            await w.write_many(payloads)  # p-0 and p-1 full: committing; p-2 open
            raise RuntimeError("boom")
    # the commits under way are cancelled at any point: a shard may stay without its index
    # (as when killed between the two), never an index without its shard, nothing partial
    left = sorted(p.name for p in tmp_path.iterdir())
    assert set(left) <= {"p-0", "p-0.idx", "p-1", "p-1.idx"}
    for k, name in enumerate(["p-0", "p-1"]):
        if name + ".idx" in left:
            assert name in left
            sidecar = (tmp_path / (name + ".idx")).read_bytes()
            stored = (tmp_path / name).read_bytes()
            check_sidecar(stored, sidecar, "gzip", payloads[20 * k : 20 * k + 20])


def test_a_sidecar_that_cannot_be_replaced_fails_the_writer_before_its_shard(
    tmp_path: Path,
) -> None:
    # a directory where the sidecar goes: its shard cannot be indexed, the writer fails
    (tmp_path / "p-1.idx").mkdir()
    (tmp_path / "p-1.idx" / "x").write_bytes(b"")
    with pytest.raises(streamrec.errors.StorageError, match=r"p-1\.idx"):
        write(str(tmp_path / "p-{index}"), varied(50, seed=9), 5, max_records=20)
    names = sorted(p.name for p in tmp_path.iterdir() if not p.is_dir())
    assert "_manifest.json" not in names and not [n for n in names if n.startswith(".")]
    assert "p-1" not in names  # its old sidecar could not be removed: the shard was not committed
    assert all(n[: -len(".idx")] in names for n in names if n.endswith(".idx"))


def test_manifest_record_index_names_are_checked_like_shard_names(tmp_path: Path) -> None:
    manifest = str(tmp_path / "_manifest.json")

    def document(record_index: object) -> str:
        item = {"name": "a", "records": 1, "bytes": 20, "crc32c": 0, "record_index": record_index}
        return json.dumps({"format": "streamrec.manifest.core", "version": 1, "shards": [item]})

    [entry] = loads(document({"name": "a.idx", "bytes": 40}), manifest).shards
    assert (entry.index_url, entry.index_bytes) == (str(tmp_path / "a.idx"), 40)
    [entry] = loads(document(None), manifest).shards
    assert entry.index_url is None
    for bad, why in (
        ({"name": "../a.idx", "bytes": 40}, "climbs out"),
        ({"name": "s3://other/a.idx", "bytes": 40}, "absolute url outside"),
        ({"name": "/etc/passwd", "bytes": 40}, "absolute url outside"),
        ({"name": "a.idx", "bytes": -1}, "not a non-negative integer"),
        ({"name": "a.idx"}, "not a non-negative integer"),
        ({"name": 3, "bytes": 4}, "not a string"),
        ("a.idx", "not an object"),
    ):
        with pytest.raises(streamrec.errors.FormatError, match=why):
            loads(document(bad), manifest)
    [entry] = loads(
        document({"name": "s3://other/a.idx", "bytes": 4}), manifest, allow_absolute_urls=True
    ).shards
    assert entry.index_url == "s3://other/a.idx"


def test_indexed_output_reads_the_same_as_unindexed_output(tmp_path: Path) -> None:
    payloads = varied(400, seed=10, high=9000)
    for compression in (None, "gzip", "zlib"):
        plain = tmp_path / f"plain-{compression}"
        with streamrec.sync.open_writer(str(plain), compression=compression) as w:
            w.write_many(payloads)
        indexed = tmp_path / f"indexed-{compression}"
        write(str(indexed), payloads, 400, compression=compression)
        if compression is None:
            assert (
                indexed.read_bytes() == plain.read_bytes() == RecordEncoder().encode_many(payloads)
            )
        assert list(streamrec.open_dataset(str(indexed), compression=compression)) == payloads
