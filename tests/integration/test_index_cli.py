"""``streamrec index``: sidecars exactly as the tfrecord package writes them, written only for
shards read without damage, skipped when valid, replaced when stale, counts only for
compressed shards; local files, S3 (moto) and GCS (fake-gcs-server), in a subprocess."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest
from tfrecord.tools.tfrecord2idx import create_index

import streamrec
from integration.test_cli import cli, corrupt_payload, frame_offsets
from streamrec.cli.index import COUNTS_ONLY
from streamrec.format.framing import RecordEncoder
from streamrec.format.index.core import IndexBuilder, parse_index
from support.servers import FakeGcsServer, MotoS3Server

COUNTS = [5, 0, 9, 2]


def payloads(shard: int, count: int) -> list[bytes]:
    return [bytes([shard]) * ((k * 37 + shard) % 300) for k in range(count)]


def write_shards(directory: Path, counts: list[int] = COUNTS) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for shard, count in enumerate(counts):
        path = directory / f"part-{shard}.tfrecord"
        path.write_bytes(RecordEncoder().encode_many(payloads(shard, count)))
        paths.append(path)
    return paths


def expected_index(path: Path, tmp_path: Path) -> bytes:
    """The sidecar the tfrecord package writes for ``path``."""
    target = tmp_path / "expected.idx"
    create_index(str(path), str(target))
    return target.read_bytes()


def index_json(*args: str) -> tuple[int, dict[str, Any], str]:
    run = cli("index", "--json", *args)
    return run.rc, json.loads(run.out) if run.out else {}, run.err


def test_sidecars_are_the_tfrecord_packages_and_a_second_run_skips_them(tmp_path: Path) -> None:
    data = tmp_path / "data"
    paths = write_shards(data)
    rc, doc, err = index_json(str(data))
    assert (rc, err) == (0, "")
    assert [s["action"] for s in doc["shards"]] == ["indexed"] * 4
    assert [s["records"] for s in doc["shards"]] == COUNTS
    assert doc["total_records"] == sum(COUNTS) and doc["complete"]
    assert (doc["indexed"], doc["skipped"], doc["failed"]) == (4, 0, 0)
    for path, shard in zip(paths, doc["shards"], strict=True):
        sidecar = Path(str(path) + ".idx")
        assert sidecar.read_bytes() == expected_index(path, tmp_path), path
        assert shard["index"] == str(sidecar) and shard["index_bytes"] == sidecar.stat().st_size
        assert shard["random_access"] is True and shard["note"] is None
    # the sidecars appeared whole (nothing half-written or temporary is left) and are no shards
    # (and the dataset index of them all beside them)
    assert sorted(os.listdir(data)) == sorted(
        [p.name for p in paths] + [p.name + ".idx" for p in paths] + ["_dataset_index.bin"]
    )
    assert doc["dataset_index"] == f"{data}/_dataset_index.bin"
    assert doc["dataset_index_bytes"] == (data / "_dataset_index.bin").stat().st_size
    count = cli("count", "--json", f"{data}/*").json()
    assert (count["num_shards"], count["total_records"]) == (4, sum(COUNTS))

    before = {p: os.stat(str(p) + ".idx").st_mtime_ns for p in paths}
    rc, doc, err = index_json(f"{data}/*")
    assert (rc, err) == (0, "")
    assert [s["action"] for s in doc["shards"]] == ["skipped"] * 4
    assert [s["records"] for s in doc["shards"]] == COUNTS
    assert {p: os.stat(str(p) + ".idx").st_mtime_ns for p in paths} == before

    rc, doc, _ = index_json(f"{data}/part-2.tfrecord", "--force", "--concurrency", "1")
    assert rc == 0 and [s["action"] for s in doc["shards"]] == ["indexed"]
    assert os.stat(str(paths[2]) + ".idx").st_mtime_ns != before[paths[2]]
    assert Path(str(paths[2]) + ".idx").read_bytes() == expected_index(paths[2], tmp_path)


def test_text_output_and_a_stale_index_is_replaced(tmp_path: Path) -> None:
    paths = write_shards(tmp_path)
    assert cli("index", str(tmp_path)).rc == 0
    paths[2].write_bytes(RecordEncoder().encode_many(payloads(7, 3)))  # rewritten since
    run = cli("index", str(tmp_path))
    assert (run.rc, run.err) == (0, "")
    lines = run.out.splitlines()
    assert lines[0].split() == [
        "SKIPPED",
        "5",
        str(paths[0]),
        "(its",
        "index",
        f"{paths[0]}.idx",
        "is",
        "valid)",
    ]
    assert lines[2].split() == ["INDEXED", "3", str(paths[2]), "->", f"{paths[2]}.idx"]
    assert lines[3].startswith("         replaced an index that did not fit the shard: ")
    assert "a stale index" in lines[3]  # its numbers go past the shard's end
    assert lines[-2] == "4 shards: 1 indexed, 3 skipped, 0 failed; 10 records"
    assert lines[-1].startswith(f"dataset index: {tmp_path}/_dataset_index.bin (")
    assert Path(f"{paths[2]}.idx").read_bytes() == expected_index(paths[2], tmp_path)


def test_a_damaged_shard_gets_no_index_and_the_error_names_file_and_offset(
    tmp_path: Path,
) -> None:
    paths = write_shards(tmp_path)
    data = bytearray(paths[2].read_bytes())
    offset = frame_offsets(payloads(2, 9))[4]
    corrupt_payload(data, offset)
    paths[2].write_bytes(bytes(data))
    rc, doc, err = index_json(str(tmp_path))
    assert rc == 1
    assert [s["action"] for s in doc["shards"]] == ["indexed", "indexed", "failed", "indexed"]
    assert not doc["complete"] and doc["failed"] == 1
    assert doc["shards"][2]["records"] is None
    assert f"record 4 in {paths[2]} at byte offset {offset}: payload CRC mismatch" in err
    assert err.count("\n") == 1 and err.startswith("streamrec: error: ")
    assert doc["shards"][2]["error"] in err
    assert not Path(f"{paths[2]}.idx").exists()
    assert Path(f"{paths[3]}.idx").read_bytes() == expected_index(paths[3], tmp_path)
    run = cli("index", str(tmp_path))
    assert run.rc == 1
    assert f"FAILED                 {paths[2]}  (no index written, see below)" in run.out


def test_compressed_shards_get_a_counts_only_index(tmp_path: Path) -> None:
    plain = RecordEncoder().encode_many(payloads(1, 6))
    (tmp_path / "plain.tfrecord").write_bytes(plain)
    (tmp_path / "a.tfrecord.gz").write_bytes(gzip.compress(plain))
    (tmp_path / "b.tfrecord").write_bytes(gzip.compress(plain))  # sniffed: no suffix
    rc, doc, err = index_json(f"{tmp_path}/*.gz", f"{tmp_path}/b.tfrecord")
    assert (rc, err) == (0, "")
    for shard in doc["shards"]:
        assert (shard["action"], shard["records"], shard["compression"]) == ("indexed", 6, "gzip")
        assert shard["random_access"] is False and shard["note"] == COUNTS_ONLY
    expected = expected_index(tmp_path / "plain.tfrecord", tmp_path)  # uncompressed offsets
    assert Path(f"{tmp_path}/a.tfrecord.gz.idx").read_bytes() == expected
    assert Path(f"{tmp_path}/b.tfrecord.idx").read_bytes() == expected
    run = cli("index", f"{tmp_path}/a.tfrecord.gz")
    assert run.rc == 0 and f"         {COUNTS_ONLY}" in run.out.splitlines()
    assert run.out.splitlines()[0].startswith("SKIPPED")
    assert "counts only" in cli("index", "--help").out


def test_a_random_access_index_of_a_compressed_shard_is_kept_while_it_agrees(
    tmp_path: Path,
) -> None:
    records = payloads(3, 5)
    shard = tmp_path / "c.tfrecord.gz"
    shard.write_bytes(gzip.compress(RecordEncoder().encode_many(records)))
    builder = IndexBuilder(extended=True)  # every record from the stream's start: valid
    builder.add_records([len(r) + 16 for r in records], restart=(0, 0))
    extended = builder.build().to_bytes()
    sidecar = Path(f"{shard}.idx")
    sidecar.write_bytes(extended)
    for args in ([], ["--force"]):
        rc, doc, _ = index_json(str(shard), *args)
        assert rc == 0 and doc["shards"][0]["action"] == "skipped", args
        assert doc["shards"][0]["random_access"] is True
        assert sidecar.read_bytes() == extended
    assert doc["shards"][0]["note"] == "its random-access index agrees with the shard: kept"
    # one whose records do not agree with the shard (it parses: the stream's end is unknown)
    wrong = IndexBuilder(extended=True)
    wrong.add_records([len(r) + 17 for r in records], restart=(0, 0))
    sidecar.write_bytes(wrong.build().to_bytes())
    rc, doc, _ = index_json(str(shard))
    assert rc == 0 and doc["shards"][0]["action"] == "skipped"  # valid as far as can be told
    rc, doc, _ = index_json(str(shard), "--force")
    assert rc == 0 and doc["shards"][0]["action"] == "indexed"
    index = parse_index(
        sidecar.read_bytes(), source="x", stored_size=shard.stat().st_size, compressed=True
    )
    assert index.counts_only and index.lengths.tolist() == [len(r) + 16 for r in records]


def test_help_answers_what_where_and_how(tmp_path: Path) -> None:
    text = cli("index", "--help").out
    for part in (
        "SHARD.idx",
        "DALI",
        "tfrecord package",
        "len(ds)",
        "--force",
        "--concurrency",
        "--json",
        "--storage-options",
        "examples:",
        "streamrec index ",
        "exit status",
        '"compressed: counts only, no random access"',
        "streamrec reshard --index",
        "skips .idx names",
    ):
        assert part in text, part
    assert "    index " in cli("--help").out


def check_remote(put: Any, get: Any, url: str, options: dict[str, Any], tmp_path: Path) -> None:
    local = write_shards(tmp_path / "local")
    for path in local:
        put(f"data/{path.name}", path.read_bytes())
    storage = ["--storage-options", json.dumps(options)]
    rc, doc, err = index_json(f"{url}/data/*", *storage)
    assert (rc, err) == (0, ""), err
    assert [s["action"] for s in doc["shards"]] == ["indexed"] * 4
    for path in local:
        assert get(f"data/{path.name}.idx") == expected_index(path, tmp_path)
    rc, doc, err = index_json(f"{url}/data", *storage)
    assert (rc, err) == (0, "")
    assert [s["action"] for s in doc["shards"]] == ["skipped"] * 4
    assert [s["records"] for s in doc["shards"]] == COUNTS
    ds = streamrec.open_dataset(f"{url}/data/*", storage_options=options)
    assert ds.num_records == sum(COUNTS) == len(ds) == len(list(ds))
    shares = [
        streamrec.open_dataset(f"{url}/data", storage_options=options, num_hosts=3, host_index=h)
        for h in range(3)
    ]
    assert [len(share) for share in shares] == [len(list(share)) for share in shares]
    assert sum(len(share) for share in shares) == sum(COUNTS)


def test_s3(s3_server: MotoS3Server, s3_bucket: str, tmp_path: Path) -> None:
    check_remote(
        lambda name, data: s3_server.put(s3_bucket, name, data),
        lambda name: s3_server.get(s3_bucket, name),
        f"s3://{s3_bucket}",
        s3_server.storage_options,
        tmp_path,
    )


def test_gcs(gcs_server: FakeGcsServer, gcs_bucket: str, tmp_path: Path) -> None:
    check_remote(
        lambda name, data: gcs_server.put(gcs_bucket, name, data),
        lambda name: gcs_server.get(gcs_bucket, name),
        f"gs://{gcs_bucket}",
        gcs_server.storage_options,
        tmp_path,
    )


def test_in_process_on_memory_urls(capsys: pytest.CaptureFixture[str]) -> None:
    from streamrec.cli import main

    root = f"memory://index-{os.getpid()}"
    with streamrec.sync.open_writer(f"{root}/p-{{index}}.tfrecord", max_records=4) as writer:
        writer.write_many(payloads(0, 10))
    assert main(["index", "--json", f"{root}/p-*"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["records"] for s in doc["shards"]] == [4, 4, 2]
    assert streamrec.open_dataset(f"{root}/p-*").num_records == 10
