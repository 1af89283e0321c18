"""``len(ds)``, ``ds.num_records`` and ``await ds.count_records()``: counts from manifests and
index sidecars, equal to what iterating yields for every host split, DataLoader worker split
(shard- and record-level), shuffled epoch and wrapper; a clear TypeError where counts are
unknown. Local files, S3 (moto) and GCS (fake-gcs-server)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streamrec
from streamrec.cli import main
from streamrec.errors import RecordCountUnknownError
from streamrec.example import FixedLenFeature, encode
from streamrec.format.framing import RecordEncoder
from support.servers import FakeGcsServer, MotoS3Server

COUNTS = [7, 0, 3, 12, 1, 5, 4]  # 32 records, uneven, one empty shard


def shard_bytes(shard: int, count: int) -> bytes:
    return RecordEncoder().encode_many([encode({"i": shard * 100 + k}) for k in range(count)])


def write_local(directory: Path) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    for shard, count in enumerate(COUNTS):
        (directory / f"part-{shard}.tfrecord").write_bytes(shard_bytes(shard, count))
    return f"{directory}/*"


def index(*args: str) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["index", "--no-progress", *args]) == 0


def check_lengths(url: str, **options: Any) -> None:
    """len(ds) is what iterating yields, for every host; num_records is the whole set."""
    for num_hosts in (1, 2, 3, 6, 7, 9):  # 9 > 7 shards: records split
        got = []
        for host in range(num_hosts):
            ds = streamrec.open_dataset(url, num_hosts=num_hosts, host_index=host, **options)
            assert ds.num_records == sum(COUNTS)
            assert len(ds) == len(list(ds)), (num_hosts, host)
            got.append(len(ds))
        assert sum(got) == sum(COUNTS), num_hosts


def test_len_is_what_an_epoch_yields_for_every_host_split(tmp_path: Path) -> None:
    url = write_local(tmp_path / "data")
    index(url)
    check_lengths(url)
    check_lengths(url, cycle_length=3, deterministic=False, shuffle_buffer=5)


def test_shuffled_shards_change_the_share_by_epoch_and_len_follows(tmp_path: Path) -> None:
    url = write_local(tmp_path / "data")
    index(url)
    ds = streamrec.open_dataset(url, shuffle_shards=True, seed=5, num_hosts=2, host_index=1)
    lengths = []
    for epoch in range(6):
        ds.set_epoch(epoch)
        assert len(ds) == len(list(ds)), epoch
        lengths.append(len(ds))
    assert len(set(lengths)) > 1  # the share really changed: the count is per epoch


def test_wrappers_count_items_and_batches(tmp_path: Path) -> None:
    url = write_local(tmp_path / "data")
    index(url)
    spec = {"i": FixedLenFeature(np.int64)}
    for host in range(2):
        ds = streamrec.open_dataset(url, num_hosts=2, host_index=host)
        records = len(ds)
        assert len(ds.parse(spec)) == records == len(list(ds.parse(spec)))
        for size in (1, 4, 5, 100):
            for drop in (False, True):
                batched = ds.parse(spec).batch(size, drop_remainder=drop)
                assert len(batched) == len(list(batched)), (size, drop)
                assert len(ds.batch(size, drop)) == len(list(ds.batch(size, drop)))
                expected = records // size if drop else -(-records // size)
                assert len(batched) == expected


def test_manifest_counts_need_no_sidecar_and_async_counts(tmp_path: Path) -> None:
    with streamrec.sync.open_writer(f"{tmp_path}/out/p-{{index}}.tfrecord", max_records=4) as w:
        w.write_many([encode({"i": k}) for k in range(10)])
    for url in (f"{tmp_path}/out", f"{tmp_path}/out/_manifest.json"):
        ds = streamrec.open_dataset(url, num_hosts=2, host_index=1)
        counts = asyncio.run(ds.count_records())
        assert (counts.total, counts.consumer) == (10, 4)  # shards 4, 4, 2: host 1 has p-1
        assert (ds.num_records, len(ds), len(list(ds))) == (10, 4, 4)


def test_unknown_counts_are_a_type_error_naming_the_command(tmp_path: Path) -> None:
    url = write_local(tmp_path / "data")
    index(f"{tmp_path}/data/part-[0-2].tfrecord")  # some shards indexed, not all
    ds = streamrec.open_dataset(url)
    with pytest.raises(RecordCountUnknownError) as info:
        len(ds)
    assert isinstance(info.value, TypeError)
    message = str(info.value)
    assert "the record count of 4 of 7 shards is not known" in message
    assert f"e.g. {tmp_path}/data/part-3.tfrecord" in message
    assert f"`streamrec index {shlex.quote(url)}`" in message
    with pytest.raises(RecordCountUnknownError):
        ds.num_records  # noqa: B018
    with pytest.raises(RecordCountUnknownError):
        asyncio.run(ds.count_records())
    with pytest.raises(TypeError, match="streamrec index"):
        len(ds.parse({"i": FixedLenFeature(np.int64)}).batch(2))
    assert len(list(ds)) == sum(COUNTS)  # list() asks for the length, then simply reads
    index(url)
    with pytest.raises(RecordCountUnknownError, match="and open the dataset again"):
        len(ds)  # the outcome is kept: list(ds) must not look every sidecar up each time
    assert len(streamrec.open_dataset(url)) == sum(COUNTS)


def test_a_stale_sidecar_makes_the_count_unknown_not_the_read(tmp_path: Path) -> None:
    url = write_local(tmp_path / "data")
    index(url)
    shard = tmp_path / "data" / "part-3.tfrecord"
    shard.write_bytes(shard_bytes(3, 2))  # rewritten: its sidecar no longer fits
    ds = streamrec.open_dataset(url)
    with pytest.raises(RecordCountUnknownError) as info:
        len(ds)
    message = str(info.value)
    assert f"in {shard}:" in message and f"{shard}.idx" in message
    assert f"streamrec index --force {shard}" in message
    assert len(list(ds)) == sum(COUNTS) - 10


def test_counts_are_listed_once_and_planned_per_split(tmp_path: Path) -> None:
    url = write_local(tmp_path / "data")
    index(url)
    ds = streamrec.open_dataset(url)
    assert len(ds) == sum(COUNTS)
    for sidecar in (tmp_path / "data").glob("*.idx"):
        sidecar.unlink()
    ds.split_hosts(3, 2)  # a new split: planned from the kept counts, no new listing
    assert len(ds) == len(list(ds)) == COUNTS[2] + COUNTS[5]
    assert len(streamrec.open_dataset(url)) == sum(COUNTS)  # the dataset index has them
    (tmp_path / "data" / "_dataset_index.bin").unlink()
    with pytest.raises(RecordCountUnknownError):
        len(streamrec.open_dataset(url))  # a new dataset lists again


class _PerWorker:
    """Yields ``(worker id, len(ds) in that worker)`` once per record the worker reads."""

    def __init__(self, ds: streamrec.Dataset) -> None:
        self.ds = ds

    def __iter__(self) -> Any:
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        length = len(self.ds)
        for _ in self.ds:
            yield info.id, length


@pytest.mark.parametrize("files", [7, 1])  # 1 shard for 2 workers: split by record
def test_len_inside_dataloader_workers_is_each_workers_share(tmp_path: Path, files: int) -> None:
    torch = pytest.importorskip("torch")
    import streamrec.torch

    url = write_local(tmp_path / "data")
    index(url)
    urls = sorted(str(p) for p in (tmp_path / "data").glob("part-*.tfrecord"))[-files:]
    ds = streamrec.open_dataset(urls)
    wrapped = streamrec.torch.IterableDataset(ds)
    total = sum(COUNTS[-files:])
    assert len(wrapped) == len(ds) == total  # the main process: all workers together

    class Probe(torch.utils.data.IterableDataset):  # type: ignore[misc]
        def __iter__(self) -> Any:
            return iter(_PerWorker(ds))

    loader = torch.utils.data.DataLoader(Probe(), batch_size=None, num_workers=2)
    seen: dict[int, list[int]] = {}
    for worker, length in loader:
        seen.setdefault(int(worker), []).append(int(length))
    assert sum(len(v) for v in seen.values()) == total
    for worker, lengths in seen.items():
        assert set(lengths) == {len(lengths)}, worker  # its len() == what it yielded
    batches = torch.utils.data.DataLoader(wrapped, batch_size=4, num_workers=0)
    assert len(batches) == -(-total // 4) == len(list(batches))


def check_remote(put: Any, url: str, options: dict[str, Any]) -> None:
    for shard, count in enumerate(COUNTS):
        put(f"data/part-{shard}.tfrecord", shard_bytes(shard, count))
    storage = ["--storage-options", json.dumps(options)]
    index(f"{url}/data/*", *storage)
    check_lengths(f"{url}/data/*", storage_options=options)
    check_lengths(f"{url}/data/*.tfrecord", storage_options=options)  # sidecars looked up
    for shard in range(9):  # enough in one directory for one listing of its sidecars
        put(f"many/p-{shard}.tfrecord", shard_bytes(shard, shard))
    index(f"{url}/many", *storage)
    ds = streamrec.open_dataset(f"{url}/many/p-*.tfrecord", storage_options=options)
    assert ds.num_records == 36 == len(ds) == len(list(ds))


def test_s3(s3_server: MotoS3Server, s3_bucket: str) -> None:
    check_remote(
        lambda name, data: s3_server.put(s3_bucket, name, data),
        f"s3://{s3_bucket}",
        s3_server.storage_options,
    )


def test_gcs(gcs_server: FakeGcsServer, gcs_bucket: str) -> None:
    check_remote(
        lambda name, data: gcs_server.put(gcs_bucket, name, data),
        f"gs://{gcs_bucket}",
        gcs_server.storage_options,
    )
