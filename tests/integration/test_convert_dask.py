"""``streamrec convert --engine dask`` on a real LocalCluster (two worker processes), both ways:
the same objects as the local engine, byte for byte, though a worker dies in the middle of a
task; a job interrupted in the middle of a task and run again on Dask redoes only the unfinished
tasks; damaged input is an error naming the file."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import streamrec
import streamrec.sync
from streamrec.cli import main
from streamrec.example import encode
from support import convert_crash
from support.servers import MotoS3Server

pytest.importorskip("dask.distributed")  # (the cluster: the dask_client fixture)

pytestmark = pytest.mark.slow  # a local Dask cluster of two worker processes


@pytest.fixture
def crash_hooks(dask_client: Any) -> Iterator[Any]:
    """``install(...)`` on every worker and in this process; removed afterwards."""

    def install(**hooks: Any) -> None:
        dask_client.run(convert_crash.install, **hooks)
        convert_crash.install(**hooks)

    try:
        yield install
    finally:
        dask_client.run(convert_crash.install)
        convert_crash.install()


def _example(i: int) -> bytes:
    rng = np.random.default_rng(i)
    return encode(
        {
            "label": i,
            "vec": rng.standard_normal(3).astype(np.float32),
            "name": f"item-{i}".encode(),
            "tags": rng.integers(0, 100, size=i % 4).astype(np.int64),
        }
    )


def _parquet_inputs(directory: Path) -> list[int]:
    """Three Parquet files written by pyarrow (a null: no feature); the ids in order."""
    directory.mkdir(parents=True)
    ids = []
    for f in range(3):
        rows = range(f * 70, f * 70 + 70)
        table = pa.table(
            {
                "id": pa.array(rows, pa.int32()),
                "x": pa.array([r / 3 for r in rows], pa.float64()),
                "name": pa.array([f"n{r}" for r in rows]),
                "tags": pa.array([list(range(r % 3)) for r in rows], pa.list_(pa.int64())),
                "maybe": pa.array([None if r % 5 == 0 else r for r in rows], pa.int64()),
            }
        )
        pq.write_table(table, directory / f"in-{f}.parquet", row_group_size=25)
        ids += rows
    return ids


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, json.loads(out) if status == 0 and "--json" in argv else out, err


def _job_name(name: str) -> str:
    """``name`` with the job's fingerprint (it names the destination) left out."""
    return re.sub(r"^_convert/[0-9a-f]{16}/", "_convert/JOB/", name)


def _objects(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by its relative name, urls inside it made relative."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            name = _job_name(str(path.relative_to(root)))
            found[name] = path.read_bytes().replace(str(root).encode(), b"ROOT")
    return found


def _s3_objects(s3_server: MotoS3Server, bucket: str, prefix: str) -> dict[str, bytes]:
    url = f"s3://{bucket}/{prefix}".encode()
    return {
        _job_name(key[len(prefix) :]): s3_server.get(bucket, key).replace(url, b"ROOT/")
        for key in s3_server.list(bucket, prefix)
    }


def test_to_parquet_on_dask_is_the_local_engines_output_though_a_worker_dies(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    s3_server: MotoS3Server,
    s3_bucket: str,
    dask_client: Any,
    crash_hooks: Any,
) -> None:
    options = s3_server.storage_options
    with streamrec.sync.open_writer(
        f"s3://{s3_bucket}/src/part-{{index:03d}}.tfrecord", max_records=40, storage_options=options
    ) as writer:
        writer.write_many([_example(i) for i in range(300)])
    argv = ["convert", f"s3://{s3_bucket}/src/", "--to", "parquet", "--json"]
    argv += ["--rows-per-file", "25", "--row-group-rows", "10", "--task-bytes", "4KiB"]
    argv += ["--storage-options", json.dumps(options)]
    status, local, err = _run(capsys, *argv[:2], f"s3://{s3_bucket}/local/", *argv[2:])
    assert status == 0, err
    marker = tmp_path / "worker-died"
    crash_hooks(marker=str(marker))
    address = dask_client.scheduler.address
    dask_argv = [*argv[:2], f"s3://{s3_bucket}/dask/", *argv[2:], "--engine", "dask"]
    status, dask, err = _run(capsys, *dask_argv, "--scheduler", address)
    assert status == 0, err
    assert marker.exists()  # a worker did exit after storing a file, before its task's state
    assert dask["rows"] == 300 and dask["tasks"] > 2 and dask["tasks_skipped"] == 0
    assert json.dumps(dask["files"]).replace("/dask/", "/local/") == json.dumps(local["files"])
    objects = _s3_objects(s3_server, s3_bucket, "dask/")
    assert objects == _s3_objects(s3_server, s3_bucket, "local/")  # Parquet files and states
    assert len([k for k in objects if k.endswith(".parquet")]) == len(dask["files"])
    labels = []
    for entry in dask["files"]:
        key = entry["url"].removeprefix(f"s3://{s3_bucket}/")
        labels += pq.read_table(pa.BufferReader(s3_server.get(s3_bucket, key)))["label"].to_pylist()
    assert labels == list(range(300))
    assert s3_server.list_multipart_uploads(s3_bucket) == []


def test_from_parquet_on_dask_is_the_local_engines_output_though_a_worker_dies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dask_client: Any, crash_hooks: Any
) -> None:
    ids = _parquet_inputs(tmp_path / "pq")
    argv = ["convert", str(tmp_path / "pq"), "--from", "parquet", "--json", "--index"]
    argv += ["--max-records", "30", "--task-bytes", "1KiB"]
    template = "part-{index:03d}.tfrecord"
    status, _, err = _run(capsys, *argv[:2], str(tmp_path / "local" / template), *argv[2:])
    assert status == 0, err
    marker = tmp_path / "worker-died"
    crash_hooks(marker=str(marker))
    dask_argv = [*argv[:2], str(tmp_path / "dask" / template), *argv[2:], "--engine", "dask"]
    status, dask, err = _run(capsys, *dask_argv, "--scheduler", dask_client.scheduler.address)
    assert status == 0, err
    assert marker.exists()  # a worker did exit after committing a shard, before its task's
    assert dask["records"] == len(ids) and dask["tasks"] == 3 and dask["tasks_skipped"] == 0
    # 70 rows a file, a file a task, 30 rows a shard: the footers' row counts number them
    assert dask["shards"] == [str(tmp_path / "dask" / f"part-{k:03d}.tfrecord") for k in range(9)]
    # the same shards, indexes, dataset index and manifest, byte for byte
    assert _objects(tmp_path / "dask") == _objects(tmp_path / "local")
    spec = {"id": streamrec.example.FixedLenFeature(np.int64)}
    records = list(streamrec.open_dataset(str(tmp_path / "dask")))
    assert [int(streamrec.example.decode(r, spec)["id"]) for r in records] == ids


def test_num_shards_from_parquet_on_dask_is_the_local_engines_balanced_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dask_client: Any
) -> None:
    ids = _parquet_inputs(tmp_path / "pq")
    argv = ["--from", "parquet", "--num-shards", "4", "--index", "--json"]
    template = "part-{index:03d}.tfrecord"
    runs = {}
    for engine in ("local", "dask"):
        extra = ["--engine", "dask", "--scheduler", dask_client.scheduler.address]
        status, runs[engine], err = _run(
            capsys,
            "convert",
            str(tmp_path / "pq"),
            str(tmp_path / engine / template),
            *argv,
            *(extra if engine == "dask" else []),
        )
        assert status == 0, err
    assert runs["dask"]["tasks"] > 1  # 3 files of 70 rows: tasks by the file a shard starts in
    assert _objects(tmp_path / "dask") == _objects(tmp_path / "local")
    spec = {"id": streamrec.example.FixedLenFeature(np.int64)}
    shards = [
        [int(streamrec.example.decode(r, spec)["id"]) for r in streamrec.open_dataset(url)]
        for url in runs["dask"]["shards"]
    ]
    counts = [len(shard) for shard in shards]
    assert len(counts) == 4 and max(counts) - min(counts) <= 1
    assert [i for shard in shards for i in shard] == ids  # consecutive rows, in file order


def test_an_interrupted_job_is_resumed_on_dask_both_ways(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dask_client: Any, crash_hooks: Any
) -> None:
    with streamrec.sync.open_writer(
        str(tmp_path / "src/part-{index:03d}.tfrecord"), max_records=40
    ) as w:
        w.write_many([_example(i) for i in range(200)])
    _parquet_inputs(tmp_path / "pq")
    address = dask_client.scheduler.address
    ways = {  # source, destination, options, the names of task 0's outputs
        "to": (
            str(tmp_path / "src"),
            "{}/",
            ["--to", "parquet", "--rows-per-file", "15"],
            r"part-00000-\d+\.parquet",
        ),
        "from": (  # 70 rows a file, a file a task: 2 shards a task
            str(tmp_path / "pq"),
            "{}/part-{{index:03d}}.tfrecord",
            ["--from", "parquet", "--max-records", "50"],
            r"part-00[01]\.tfrecord",
        ),
    }
    for way, (source, destination, options, task0_names) in ways.items():
        argv = [*options, "--task-bytes", "1KiB", "--jobs", "1", "--json"]
        reference_at, resumed_at = (
            destination.format(tmp_path / f"{way}-{name}") for name in ("reference", "resumed")
        )
        status, reference, err = _run(capsys, "convert", source, reference_at, *argv)
        assert status == 0, err
        crash_hooks(fail_task=1)  # here: the local engine runs task 0, then dies in task 1
        with pytest.raises(convert_crash.Interrupted):
            _run(capsys, "convert", source, resumed_at, *argv)
        crash_hooks()
        done_before = {
            p: p.stat().st_mtime_ns for p in (tmp_path / f"{way}-resumed").rglob("*") if p.is_file()
        }
        argv += ["--engine", "dask", "--scheduler", address]
        status, resumed, err = _run(capsys, "convert", source, resumed_at, *argv)
        assert status == 0, err
        assert resumed["tasks_skipped"] == 1 and resumed["tasks"] == reference["tasks"] > 2
        reference_objects = _objects(tmp_path / f"{way}-reference")
        resumed_objects = _objects(tmp_path / f"{way}-resumed")
        assert resumed_objects == reference_objects
        task0 = [p for p in done_before if re.fullmatch(task0_names, p.name)]
        assert len(task0) >= 2  # written by the interrupted run, not again:
        assert all(p.stat().st_mtime_ns == done_before[p] for p in task0)


def test_bad_input_on_dask_is_an_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dask_client: Any
) -> None:
    address = dask_client.scheduler.address
    with streamrec.sync.open_writer(
        str(tmp_path / "src/part-{index:03d}.tfrecord"), max_records=40
    ) as w:
        w.write_many([_example(i) for i in range(120)])
    damaged = tmp_path / "src/part-001.tfrecord"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"label": {"type": "fixed", "dtype": "int64", "shape": []}}))
    argv = ["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--to", "parquet"]
    argv += ["--spec", str(spec), "--task-bytes", "1KiB", "--engine", "dask"]
    status, _, err = _run(capsys, *argv, "--scheduler", address)
    assert status == 1 and str(damaged) in err and "CRC" in err, err
    _parquet_inputs(tmp_path / "pq")
    (tmp_path / "pq/in-1.parquet").write_bytes(b"PAR1 not really Parquet PAR1")
    template = str(tmp_path / "back/part-{index:03d}.tfrecord")
    argv = ["convert", str(tmp_path / "pq"), template, "--from", "parquet", "--engine", "dask"]
    status, _, err = _run(capsys, *argv, "--task-bytes", "1KiB", "--scheduler", address)
    assert status == 1 and "not a Parquet file" in err, err
    assert str(tmp_path / "pq/in-1.parquet") in err
    assert not (tmp_path / "back/_manifest.json").exists()
