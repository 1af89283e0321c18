"""The Dask engine of streamrec.reshard.job on a real LocalCluster (2 worker processes) against the
S3 server (moto): the same output as the local engine (record index sidecars included), and a
worker that dies in the middle of a task (after committing a shard, before the task manifest)
is retried without duplicates."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import pytest

from integration.test_reshard import check_output, input_files, make_records, relative
from streamrec.manifest.core import load_manifest
from streamrec.reshard.job import reshard
from support.reshard_crash import SCRIPT
from support.servers import MotoS3Server

pytest.importorskip("dask.distributed")  # (the cluster: the dask_client fixture)
dask = pytest.importorskip("dask")

pytestmark = pytest.mark.slow  # a local Dask cluster of two worker processes


def upload_inputs(s3_server: MotoS3Server, bucket: str, records: list[bytes]) -> str:
    for name, data in input_files(records).items():
        s3_server.put(bucket, f"src/{name}", data)
    return f"s3://{bucket}/src/in-*"


@pytest.mark.parametrize("index", [False, True], ids=["", "index"])
def test_dask_writes_what_the_local_engine_writes(
    s3_server: MotoS3Server, s3_bucket: str, dask_client: Any, index: bool
) -> None:
    case = {"max_bytes": 1500, "compression": "gzip", "task_bytes": 6000, "shuffle": True}
    case["index"] = index
    records = make_records(salt="d")
    options = s3_server.storage_options
    sources = upload_inputs(s3_server, s3_bucket, records)
    runs = {}
    for engine in ("local", "dask"):
        runs[engine] = reshard(
            sources,
            f"s3://{s3_bucket}/{engine}/part-{{index:04d}}.tfrecord",
            engine=engine,  # type: ignore[arg-type]
            scheduler=dask_client if engine == "dask" else None,
            src_storage_options=options,
            dst_storage_options=options,
            progress=False,
            **case,
        )
    dask = runs["dask"]
    assert dask.engine == "dask" and dask.tasks > 1 and dask.bytes_read == dask.bytes_in
    listed = [f"s3://{s3_bucket}/{k}" for k in s3_server.list(s3_bucket, "dask/")]
    check_output(dask, collections.Counter(records), options, listed, index)
    manifests = {
        engine: relative(
            asyncio.run(load_manifest(summary.manifest_url, options)),
            f"s3://{s3_bucket}/{engine}/",
        )
        for engine, summary in runs.items()
    }
    assert manifests["dask"] == manifests["local"]  # same names, counts, sizes, CRCs
    for name, *_ in manifests["dask"] if index else []:  # and the same indexes
        assert s3_server.get(s3_bucket, f"dask/{name}.idx") == s3_server.get(
            s3_bucket, f"local/{name}.idx"
        )


def test_a_task_whose_worker_dies_is_retried_without_duplicates(
    tmp_path: Path, s3_server: MotoS3Server, s3_bucket: str
) -> None:
    records = make_records(salt="x")
    options = s3_server.storage_options
    sources = upload_inputs(s3_server, s3_bucket, records)
    marker = tmp_path / "worker-died"
    # every worker (restarted ones too) runs support/reshard_crash.py at start: the hook is set
    preload = {
        "distributed.worker.preload": [str(SCRIPT)],
        "distributed.worker.preload-argv": ["--exit-once", str(marker)],
    }
    with dask.config.set(preload):
        summary = reshard(  # no scheduler: reshard starts (and closes) its own LocalCluster
            sources,
            f"s3://{s3_bucket}/out/part-{{index:04d}}.tfrecord",
            num_shards=3,
            engine="dask",
            src_storage_options=options,
            dst_storage_options=options,
            progress=False,
        )
    assert marker.exists()  # a worker did exit in the middle of a task
    listed = [f"s3://{s3_bucket}/{k}" for k in s3_server.list(s3_bucket, "out/")]
    check_output(summary, collections.Counter(records), options, listed)
    assert summary.tasks == 3 and summary.tasks_skipped == 0
    assert summary.shards == [f"s3://{s3_bucket}/out/part-{k:04d}.tfrecord" for k in range(3)]
