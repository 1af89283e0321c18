"""What killed writers leave behind: ``streamrec cleanup`` and reshard's own rerun cleanup.

A SIGKILLed writer leaves an open S3 multipart upload (invisible, billed) or a hidden local
temporary file. The leftovers here are made the way a killed writer makes them: a real writer
process killed mid-shard, or the very requests an S3 writer sends before it is killed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamrec.cli.store.cleanup import parse_duration
from streamrec.format.framing import RecordEncoder
from streamrec.reshard.job import reshard
from support.servers import MotoS3Server

REPO = Path(__file__).resolve().parents[2]

KILLED_LOCAL_WRITER = """
import os, sys
import streamrec
w = streamrec.sync.open_writer(sys.argv[1])
w.__enter__()
w.write_many([b"x" * 100_000] * 300)  # 30 MB: past the first part, so on disk
os._exit(9)  # killed: no commit, no abort
"""


def cleanup(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamrec.cli", "cleanup", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=120,
    )


def open_uploads(s3_server: MotoS3Server, bucket: str) -> list[str]:
    uploads = s3_server.client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return sorted(u["Key"] for u in uploads)


def start_upload(s3_server: MotoS3Server, bucket: str, key: str) -> None:
    """What an S3 writer has sent when it is killed after its first part."""
    client = s3_server.client
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"x" * (5 << 20))


def test_duration_units() -> None:
    assert [parse_duration(t) for t in ("0", "90", "90s", "30m", "1h", "2d", "1.5h")] == [
        0,
        90,
        90,
        1800,
        3600,
        172800,
        5400,
    ]
    for bad in ("", "1w", "-1h", "h", "1 hour"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_duration(bad)


def test_local_temp_files_of_a_killed_writer_are_found_and_only_they_removed(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_LOCAL_WRITER, str(out / "part-00000.tfrecord")],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert killed.returncode == 9
    temps = [p.name for p in out.iterdir()]
    assert len(temps) == 1 and temps[0].startswith(".part-00000.tfrecord.")
    # the user's own hidden files are never touched, even when they end in .tmp
    for name in (".keep", ".notes.tmp", ".part-1.tfrecord.XYZ.tmp", "_manifest.json"):
        (out / name).write_text("mine")

    young = cleanup(str(out), "--json")  # default: only older than 1h
    assert young.returncode == 0, young.stderr
    assert json.loads(young.stdout)["leftovers"] == []

    dry = cleanup(str(out), "--older-than", "0", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    document = json.loads(dry.stdout)
    assert [(f["url"], f["kind"]) for f in document["leftovers"]] == [
        (str(out / "part-00000.tfrecord"), "temporary file")
    ]
    assert document["removed"] == 0 and (out / temps[0]).exists()

    done = cleanup(str(out), "--older-than", "0")
    assert done.returncode == 0, done.stderr
    assert "1 leftover(s) found, 1 removed" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [".keep", ".notes.tmp", ".part-1.tfrecord.XYZ.tmp", "_manifest.json"]
    )


def test_s3_open_multipart_uploads_under_the_prefix_are_aborted(
    s3_server: MotoS3Server, s3_bucket: str
) -> None:
    start_upload(s3_server, s3_bucket, "out/part-00000.tfrecord")
    start_upload(s3_server, s3_bucket, "out/deeper/part-00001.tfrecord")
    start_upload(s3_server, s3_bucket, "elsewhere/part-00000.tfrecord")
    options = json.dumps(s3_server.storage_options)
    prefix = f"s3://{s3_bucket}/out/"

    dry = cleanup(prefix, "--older-than", "0", "--dry-run", "--json", "--storage-options", options)
    assert dry.returncode == 0, dry.stderr
    found = json.loads(dry.stdout)["leftovers"]
    assert [(f["url"], f["kind"]) for f in found] == [
        (f"s3://{s3_bucket}/out/deeper/part-00001.tfrecord", "multipart upload"),
        (f"s3://{s3_bucket}/out/part-00000.tfrecord", "multipart upload"),
    ]
    assert len(open_uploads(s3_server, s3_bucket)) == 3

    # (--older-than is tested on local files: moto reports every upload as begun in 2010)
    done = cleanup(prefix, "--older-than", "0", "--storage-options", options)
    assert done.returncode == 0, done.stderr
    assert open_uploads(s3_server, s3_bucket) == ["elsewhere/part-00000.tfrecord"]


def test_reshard_rerun_aborts_the_uploads_its_killed_run_left(
    tmp_path: Path, s3_server: MotoS3Server, s3_bucket: str
) -> None:
    source = tmp_path / "in.tfrecord"
    source.write_bytes(b"".join(RecordEncoder().encode(b"r%d" % i) for i in range(50)))
    # a killed earlier run of the same job was uploading two of its shards
    start_upload(s3_server, s3_bucket, "out/part-00000-00000.tfrecord")
    start_upload(s3_server, s3_bucket, "out/part-00000-00001.tfrecord")
    start_upload(s3_server, s3_bucket, "out/notes.txt")  # not one of the job's names
    summary = reshard(
        str(source),
        f"s3://{s3_bucket}/out/part-{{index:05d}}.tfrecord",
        max_records=20,
        dst_storage_options=s3_server.storage_options,
        progress=False,
    )
    assert summary.records == 50
    assert open_uploads(s3_server, s3_bucket) == ["out/notes.txt"]
