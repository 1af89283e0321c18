"""streamrec.interop.ray on a real local Ray cluster (2 CPUs, started once for the module):
read tasks by shard and by record range, raw and decoded, local and S3, a damaged shard, and
the datasink's shards and manifest read back by streamrec."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray

import streamrec
from streamrec.errors import CorruptRecordError, StreamrecError
from streamrec.example import FeatureSpec, FixedLenFeature, VarLenFeature, decode_batch, encode
from streamrec.interop.ray import TFRecordDatasink, TFRecordDatasource, read_tfrecords
from support.servers import MotoS3Server

pytestmark = pytest.mark.slow  # seconds a test: `pytest -m slow` (a CI step of its own)

SHARDS, PER_SHARD = 3, 100
TOTAL = SHARDS * PER_SHARD
SPEC: dict[str, FeatureSpec] = {
    "n": FixedLenFeature(np.int64),
    "box": FixedLenFeature(np.float32, (2, 2)),
    "tags": VarLenFeature(bytes),
}
ROOT = Path(streamrec.__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[None]:
    # the workers import this checkout's streamrec, as the test process does
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    # blocks in task order (Ray's default hands them on as they finish): the tests compare
    # rows in order, and on a loaded machine a later task may finish first
    context.execution_options.preserve_order = True
    yield
    ray.shutdown()


def record(n: int) -> bytes:
    return encode(
        {"n": n, "box": [float(n), 1.5, 2.5, 3.5], "tags": [b"t%d" % k for k in range(n % 3)]}
    )


def write_shards(directory: Path | str, *, compression: str | None = None, **options: Any) -> str:
    suffix = ".gz" if compression else ""
    for shard in range(SHARDS):
        url = f"{directory}/part-{shard}.tfrecord{suffix}"
        with streamrec.sync.open_writer(url, compression=compression, **options) as writer:
            writer.write_many([record(shard * PER_SHARD + i) for i in range(PER_SHARD)])
    return f"{directory}/part-*.tfrecord{suffix}"


def columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {name: [row[name] for row in rows] for name in rows[0]}


def streamrec_rows(urls: str, **options: Any) -> dict[str, list[Any]]:
    """streamrec's own decode of the same shards, as Arrow rows."""
    payloads = list(streamrec.open_dataset(urls, **options))
    table = decode_batch(payloads, SPEC, to="arrow")
    return {name: table.column(name).to_pylist() for name in table.schema.names}


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_rows_equal_streamrec_decode(tmp_path: Path, compression: str | None) -> None:
    urls = write_shards(tmp_path, compression=compression)
    dataset = read_tfrecords(urls, spec=SPEC, override_num_blocks=2, batch_size=64)
    assert dataset.schema().names == ["n", "box", "tags"]
    assert columns(dataset.take_all()) == streamrec_rows(urls)  # in order, every record
    raw = read_tfrecords(urls).take_all()
    assert [row["record"] for row in raw] == [record(n) for n in range(TOTAL)]


def test_indexed_dataset_split_by_record_ranges(tmp_path: Path) -> None:
    urls = write_shards(tmp_path, index=True)
    assert len(TFRecordDatasource(urls).get_read_tasks(200)) == 1  # tiny: one task's worth
    source = TFRecordDatasource(
        urls, spec={"n": FixedLenFeature(np.int64)}, batch_size=32, min_task_bytes=0
    )
    tasks = source.get_read_tasks(7)
    assert len(tasks) == 7 > SHARDS  # cut inside shards
    rows = [task.metadata.num_rows for task in tasks]
    assert sum(rows) == TOTAL and max(rows) <= 2 * TOTAL // 7  # none over twice its share
    # cuts within half a task (38 records) of a shard's end move there: whole shards stream
    halves = source.get_read_tasks(4)
    assert [task.metadata.num_rows for task in halves] == [PER_SHARD, 50, 50, PER_SHARD]
    assert [[p.whole for p in task.read_fn.pieces] for task in halves] == [  # type: ignore[attr-defined]
        [True],
        [False],
        [False],
        [True],
    ]
    dataset = read_tfrecords(urls, spec={"n": FixedLenFeature(np.int64)}, override_num_blocks=7)
    materialized = dataset.materialize()
    assert materialized.num_blocks() >= 7
    assert [row["n"] for row in materialized.take_all()] == list(range(TOTAL))  # each once


def test_default_asks_ray_for_the_tasks_made(tmp_path: Path) -> None:
    urls = write_shards(tmp_path, index=True)  # 3 small shards: one task's worth of bytes
    assert TFRecordDatasource(urls).num_tasks(200) == 1
    # Ray would split one task's block into 200 of a row or two; asked for 1, it keeps 1
    materialized = read_tfrecords(urls, spec={"n": FixedLenFeature(np.int64)}).materialize()
    assert materialized.num_blocks() == 1
    assert [row["n"] for row in materialized.take_all()] == list(range(TOTAL))


def test_counted_unindexed_shards_cut_by_streaming(tmp_path: Path) -> None:
    with streamrec.sync.open_writer(
        str(tmp_path / "part-{index}.tfrecord"), max_records=PER_SHARD
    ) as writer:  # a manifest counts the records; no index to read them by
        writer.write_many([record(n) for n in range(TOTAL)])
    dataset = read_tfrecords(str(tmp_path), override_num_blocks=7)
    assert [row["record"] for row in dataset.take_all()] == [record(n) for n in range(TOTAL)]


def test_unindexed_shards_are_read_whole(tmp_path: Path) -> None:
    urls = write_shards(tmp_path)  # no index, no manifest: counts unknown
    tasks = TFRecordDatasource(urls, min_task_bytes=0).get_read_tasks(7)
    assert len(tasks) == SHARDS and all(task.metadata.num_rows is None for task in tasks)
    rows = read_tfrecords(urls, override_num_blocks=7).take_all()
    assert sorted(row["record"] for row in rows) == sorted(record(n) for n in range(TOTAL))


def test_compressed_shards_are_not_cut(tmp_path: Path) -> None:
    urls = write_shards(tmp_path, compression="gzip", index=True)
    tasks = TFRecordDatasource(urls, min_task_bytes=0).get_read_tasks(7)
    assert [task.metadata.num_rows for task in tasks] == [PER_SHARD] * SHARDS
    rows = read_tfrecords(urls, override_num_blocks=7).take_all()
    assert [row["record"] for row in rows] == [record(n) for n in range(TOTAL)]


def test_s3_dataset(s3_server: MotoS3Server, s3_bucket: str) -> None:
    options = s3_server.storage_options
    with streamrec.sync.open_writer(
        f"s3://{s3_bucket}/train/part-{{index:05d}}.tfrecord",
        max_records=PER_SHARD,
        index=True,
        storage_options=options,
    ) as writer:
        writer.write_many([record(n) for n in range(TOTAL)])
    url = f"s3://{s3_bucket}/train/"  # its manifest and dataset index
    dataset = read_tfrecords(url, spec=SPEC, storage_options=options, override_num_blocks=4)
    assert columns(dataset.take_all()) == streamrec_rows(url, storage_options=options)


def test_damaged_shard_raises_streamrec_error(tmp_path: Path) -> None:
    urls = write_shards(tmp_path)
    shard = tmp_path / "part-1.tfrecord"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40  # inside some record's payload or header
    shard.write_bytes(bytes(data))
    with pytest.raises(StreamrecError) as raised:
        read_tfrecords(urls, spec=SPEC).materialize()
    assert isinstance(raised.value, CorruptRecordError)  # Ray's error is a subclass of it
    assert "part-1.tfrecord" in str(raised.value)


def test_bad_arguments_fail_on_the_driver(tmp_path: Path) -> None:
    urls = write_shards(tmp_path)
    with pytest.raises(ValueError, match="shuffle"):
        read_tfrecords(urls, shuffle="global")
    with pytest.raises(ValueError, match="batch_size"):
        read_tfrecords(urls, batch_size=0)


def test_datasink_round_trip(tmp_path: Path) -> None:
    urls = write_shards(tmp_path / "in", index=True)
    out = tmp_path / "out"
    dataset = read_tfrecords(urls, spec=SPEC, override_num_blocks=4)
    dataset.write_datasink(TFRecordDatasink(str(out), max_records=40, index=True))
    back = streamrec.open_dataset(str(out))  # its manifest: every task's shards, in order
    assert len(back) == TOTAL
    assert streamrec_rows(str(out)) == streamrec_rows(urls)
    assert back.get([0, TOTAL - 1]) == [record(0), record(TOTAL - 1)]  # the dataset index
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["records"] == TOTAL and manifest["num_shards"] == len(manifest["shards"])
    assert (out / "_dataset_index.bin").exists()

    dropped = record(5)  # (the lambda goes to the workers by value: no module global in it)
    raw = read_tfrecords(urls).filter(lambda row: row["record"] != dropped)
    raw.write_datasink(TFRecordDatasink(str(out), payload_column="record", compression="gzip"))
    again = streamrec.open_dataset(str(out))  # the new manifest, not the first run's
    assert list(again) == [record(n) for n in range(TOTAL) if n != 5]
    assert all(
        entry["name"].endswith(".gz")
        for entry in json.loads((out / "_manifest.json").read_text())["shards"]
    )
