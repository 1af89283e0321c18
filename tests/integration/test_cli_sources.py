"""What a url stands for, the same in ``open_dataset`` and every CLI command: globs and
directory listings skip ``_``/``.`` names, a directory or prefix means its manifest (else its
shards), a manifest is a source, ``**`` recurses. Local files and S3 (moto)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import streamrec
from integration.test_cli import cli
from streamrec.example import encode
from support.servers import MotoS3Server

RECORDS = [encode({"i": i}) for i in range(7)]


def write_set(base: str, options: dict[str, Any] | None = None) -> None:
    """``base/part-0000{0,1,2}.tfrecord`` (3, 3, 1 records) and ``base/_manifest.json``."""
    with streamrec.sync.open_writer(
        f"{base}/part-{{index:05d}}.tfrecord", max_records=3, storage_options=options
    ) as writer:
        writer.write_many(RECORDS)


def read(urls: str | list[str], options: dict[str, Any] | None = None) -> list[bytes]:
    return list(streamrec.open_dataset(urls, storage_options=options))


def count(*args: str) -> tuple[int, int, str]:
    """``streamrec count --json ARGS``: (exit status, total records, stderr)."""
    run = cli("count", "--json", *args)
    total = run.json()["total_records"] if run.out else -1
    return run.rc, total, run.err


def check_written_set(base: str, options: dict[str, Any] | None = None) -> None:
    """Every obvious way to name a written set reads its 7 records, in the library and CLI."""
    storage = ["--storage-options", json.dumps(options)] if options else []
    for url in (f"{base}/*", base, f"{base}/", f"{base}/_manifest.json", f"{base}/part-*"):
        assert read(url, options) == RECORDS, url
        assert count(url, *storage) == (0, 7, ""), url


def test_a_written_local_set_reads_back_every_obvious_way(tmp_path: Path) -> None:
    write_set(str(tmp_path / "out"))
    check_written_set(str(tmp_path / "out"))


@pytest.mark.slow  # seconds: in the slow step
def test_a_written_s3_set_reads_back_every_obvious_way(
    s3_server: MotoS3Server, s3_bucket: str
) -> None:
    options = s3_server.storage_options
    write_set(f"s3://{s3_bucket}/out", options)
    check_written_set(f"s3://{s3_bucket}/out", options)


def test_directories_without_a_manifest_and_hidden_names(tmp_path: Path) -> None:
    write_set(str(tmp_path / "out"))
    (tmp_path / "out" / "_manifest.json").unlink()
    (tmp_path / "out" / ".part-00000.tfrecord.crc").write_bytes(b"\x00" * 8)
    # a directory without manifest: its visible shards
    assert read(str(tmp_path / "out")) == RECORDS
    assert count(str(tmp_path / "out")) == (0, 7, "")
    # a hidden file named explicitly is still read (and is no TFRecord file here)
    rc, _, err = count(str(tmp_path / "out" / ".part-00000.tfrecord.crc"))
    assert rc == 1 and ".part-00000.tfrecord.crc" in err
    # a glob matching only hidden names says so
    rc, _, err = count(str(tmp_path / "out" / ".*"))
    assert rc == 1
    assert "matched only names starting with '_' or '.'" in err
    # an empty directory
    (tmp_path / "empty").mkdir()
    rc, _, err = count(str(tmp_path / "empty"))
    assert rc == 1
    assert err == f"streamrec: error: {tmp_path / 'empty'}: the directory holds no shard files\n"


def test_s3_prefix_without_manifest_and_missing_prefix(
    s3_server: MotoS3Server, s3_bucket: str
) -> None:
    options = s3_server.storage_options
    write_set(f"s3://{s3_bucket}/out", options)
    s3_server.delete(s3_bucket, "out/_manifest.json")
    assert read(f"s3://{s3_bucket}/out", options) == RECORDS
    with pytest.raises(streamrec.errors.ObjectNotFoundError, match="nothing"):
        read(f"s3://{s3_bucket}/nothing", options)


def test_recursive_globs_find_every_level(
    tmp_path: Path, s3_server: MotoS3Server, s3_bucket: str
) -> None:
    options = s3_server.storage_options
    for base in (str(tmp_path), f"s3://{s3_bucket}"):
        opts = options if base.startswith("s3://") else None
        write_set(f"{base}/nested", opts)
        write_set(f"{base}/nested/deeper", opts)
        for pattern in ("nested/**", "nested/**/*.tfrecord"):
            assert read(f"{base}/{pattern}", opts) == RECORDS * 2, (base, pattern)
