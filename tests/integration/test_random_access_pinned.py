"""A local shard replaced while it is read by index: never records of two versions (issue 29,
B.15).

Reads by index (``ds.get()``, global and block shuffle, ``even``) pin every shard of their
table (``pin_shards``): a shard's reads go through one descriptor while it is open, and a file
opened again (or first) must be the one noted when the table was first pinned, else an
ObjectChangedError naming it. Before, every range read opened the path again: after an atomic
rename the new file's records came out (same sizes: the old index frames them cleanly), or a
CorruptRecordError at the seam.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.errors import ObjectChangedError
from streamrec.format.framing import RecordEncoder
from streamrec.format.index.core import IndexBuilder
from streamrec.storage.local import store

COUNT, SIZE = 200, 1000  # records per shard, bytes each
TAKEN = 5  # records read before the shard is replaced


def payloads(tag: str, shard: int, extra: int = 0) -> list[bytes]:
    return [
        (b"%s-%d-%04d-" % (tag.encode(), shard, i)).ljust(SIZE + extra, b".") for i in range(COUNT)
    ]


def write_shard(path: Path, records: list[bytes]) -> None:
    path.write_bytes(RecordEncoder().encode_many(records))


def make_dataset(base: Path) -> tuple[str, list[bytes]]:
    """Two indexed shards of old records; the glob and the records in index order."""
    old: list[bytes] = []
    for shard in range(2):
        records = payloads("old", shard)
        path = base / f"part-{shard}.tfrecord"
        write_shard(path, records)
        builder = IndexBuilder()
        builder.add_records([len(r) + 16 for r in records])
        (base / f"part-{shard}.tfrecord.idx").write_bytes(builder.build().to_bytes())
        old += records
    return f"{base}/part-*.tfrecord", old


def replace_shard(base: Path, shard: int, successor: str) -> None:
    """Replace shard ``shard`` by an atomic rename: records of the same sizes (its index frames
    them cleanly) or longer ones (another size)."""
    new = base / "next.tfrecord"
    write_shard(new, payloads("new", shard, extra=0 if successor == "same size" else 24))
    os.replace(new, base / f"part-{shard}.tfrecord")


def settled(got: list[bytes], old: list[bytes], error: BaseException | None) -> None:
    """Every record yielded is an old one; an error is an ObjectChangedError naming a shard."""
    assert not [r for r in got if r.startswith(b"new")]
    assert set(got) <= set(old)
    if error is not None:
        assert isinstance(error, ObjectChangedError), repr(error)
        assert "part-" in str(error)
    else:
        assert sorted(got) == sorted(old)


@pytest.mark.parametrize("successor", ["same size", "other size"])
@pytest.mark.parametrize("shard", [0, 1])
def test_get_reads_the_version_first_seen(
    tmp_path: Path, scanner: str, successor: str, shard: int
) -> None:
    url, old = make_dataset(tmp_path)
    ds = streamrec.open_dataset(url)
    assert ds.get(range(TAKEN)) == old[:TAKEN]  # shard 0 read; shard 1 not yet
    replace_shard(tmp_path, shard, successor)
    got: list[bytes] = []
    error = None
    try:
        got = ds.get(range(len(old)))
    except Exception as exc:
        error = exc
    settled(got, old, error)
    if shard == 1:  # never opened before it was replaced: it is not the file noted
        assert isinstance(error, ObjectChangedError)
        assert "part-1.tfrecord" in str(error)
    ds.close()


@pytest.mark.parametrize("successor", ["same size", "other size"])
@pytest.mark.parametrize("shuffle", ["global", "block"])
@pytest.mark.parametrize("open_pins", [1, store.MAX_OPEN_PINS])
def test_an_indexed_epoch_never_mixes_versions(
    tmp_path: Path,
    scanner: str,
    monkeypatch: pytest.MonkeyPatch,
    successor: str,
    shuffle: str,
    open_pins: int,
) -> None:
    # one descriptor open: the shards' reads alternate, each opens its file again
    monkeypatch.setattr(store, "MAX_OPEN_PINS", open_pins)
    url, old = make_dataset(tmp_path)
    options: dict[str, Any] = {"shuffle": shuffle, "seed": 3, "prefetch_bytes": 16 << 10}
    if shuffle == "block":
        options.update(window_records=4, even=True)
    ds = streamrec.open_dataset(url, **options)
    got: list[bytes] = []
    error = None
    try:
        for record in ds:
            got.append(record)
            if len(got) == TAKEN:
                replace_shard(tmp_path, 0, successor)
                replace_shard(tmp_path, 1, successor)
    except Exception as exc:
        error = exc
    settled(got, old, error)
    if open_pins == 1:  # files opened again after the change
        assert isinstance(error, ObjectChangedError)
    # the next epoch (the dataset's table and versions kept) reads no new record either
    again: list[bytes] = []
    error = None
    try:
        again.extend(ds)
    except Exception as exc:
        error = exc
    assert isinstance(error, ObjectChangedError)
    assert not [r for r in again if r.startswith(b"new")]
