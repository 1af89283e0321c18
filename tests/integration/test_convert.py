"""``streamrec inspect --schema`` and ``streamrec convert`` (TFRecord <-> Parquet), end to end:
local and S3 (moto) stores, duckdb reading what was written, resume after a partial run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import streamrec
import streamrec.sync
from streamrec.cli import main
from streamrec.example import decode_batch, encode
from streamrec.format.example.infer import spec_from_json
from tests.support import convert_crash
from tests.support.servers import MotoS3Server


def _example(i: int) -> bytes:
    """A canonical Example: every feature present (so a round trip is byte for byte)."""
    rng = np.random.default_rng(i)
    return encode(
        {
            "label": i,
            "score": np.float32(rng.standard_normal()),
            "vec": rng.standard_normal(4).astype(np.float32),
            "name": f"item-{i}".encode(),
            "tags": rng.integers(0, 100, size=i % 4).astype(np.int64),
            "words": [b"w%d" % k for k in range(i % 3 + 1)],
        }
    )


def _write(directory: Path, payloads: list[bytes], per_shard: int) -> list[bytes]:
    with streamrec.sync.open_writer(
        str(directory / "part-{index:03d}.tfrecord"), max_records=per_shard
    ) as writer:
        writer.write_many(payloads)
    return payloads


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_schema_samples_every_shard_not_the_first_ones_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 'extra' is in every record of the first shard and in none of the others: a prefix
    # sample would call it a FixedLenFeature, which fails to parse the later shards
    payloads = [encode({"a": i, "extra": [i, i]} if i < 100 else {"a": i}) for i in range(600)]
    _write(tmp_path, payloads, per_shard=100)
    for where in (str(tmp_path), str(tmp_path / "part-*.tfrecord")):  # counts known / not
        status, out, _ = _run(capsys, "inspect", "--schema", "--sample", "60", "--json", where)
        assert status == 0
        report = json.loads(out)
        assert report["shards_sampled"] == report["shards_listed"] == 6
        assert report["records"] >= 60
        assert report["how"] == ("positions" if where == str(tmp_path) else "per-shard")
        spec = spec_from_json(report["spec"])
        assert report["spec"]["extra"] == {"type": "varlen", "dtype": "int64"}
        assert report["spec"]["a"] == {"type": "fixed", "dtype": "int64", "shape": []}
        assert [f["name"] for f in report["arrow_schema"]] == ["a", "extra"]
        decode_batch(payloads, spec, to="arrow")  # this spec parses every record
    status, out, _ = _run(capsys, "inspect", "--schema", "-n", "30", str(tmp_path))
    assert "looked at 30 records from 6 of 6 shards" in out
    assert "'extra': VarLenFeature(np.int64)," in out
    assert "extra: large_list<item: int64>" in out


def test_round_trip_through_parquet_is_byte_for_byte_and_duckdb_agrees(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payloads = _write(tmp_path / "src", [_example(i) for i in range(500)], per_shard=90)
    out_dir = tmp_path / "pq"
    status, out, err = _run(
        capsys,
        "convert",
        str(tmp_path / "src"),
        str(out_dir),
        "--to",
        "parquet",
        "--rows-per-file",
        "120",
        "--row-group-rows",
        "50",
        "--task-bytes",
        "20KiB",
        "--json",
    )
    assert status == 0, err
    summary = json.loads(out)
    assert summary["rows"] == 500 and summary["tasks"] > 1
    files = sorted(str(p) for p in out_dir.glob("*.parquet"))
    assert files == sorted(f["url"] for f in summary["files"])
    assert all(pq.ParquetFile(f).metadata.num_rows <= 120 for f in files)
    assert max(pq.ParquetFile(f).metadata.row_group(0).num_rows for f in files) == 50
    # duckdb's reading of the files agrees with decode_batch's of the records
    spec = {
        "label": streamrec.example.FixedLenFeature(np.int64),
        "score": streamrec.example.FixedLenFeature(np.float32),
        "vec": streamrec.example.FixedLenFeature(np.float32, (4,)),
        "name": streamrec.example.FixedLenFeature(bytes),
        "tags": streamrec.example.VarLenFeature(np.int64),
        "words": streamrec.example.VarLenFeature(bytes),
    }
    expected = decode_batch(payloads, spec, to="arrow").to_pylist()
    got = (
        duckdb.sql(
            "select label, score, vec, name, tags, words "
            f"from read_parquet({files!r}) order by label"
        )
        .arrow()
        .read_all()
    )
    rows = got.to_pylist()
    assert [r["label"] for r in rows] == list(range(500))
    for want, row in zip(expected, rows, strict=True):
        assert row == {k: want[k] for k in row}
    # and back: the same payloads, byte for byte, in the same order
    status, _, err = _run(
        capsys,
        "convert",
        str(out_dir),
        str(tmp_path / "back" / "part-{index:03d}.tfrecord"),
        "--from",
        "parquet",
        "--max-records",
        "200",
        "--index",
    )
    assert status == 0, err
    back = streamrec.open_dataset(str(tmp_path / "back"))
    assert list(back) == payloads
    assert back.get([0, 499]) == [payloads[0], payloads[499]]  # indexes written


def test_s3_destination_and_source(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    s3_server: MotoS3Server,
    s3_bucket: str,
) -> None:
    payloads = _write(tmp_path / "src", [_example(i) for i in range(200)], per_shard=70)
    options = json.dumps(s3_server.storage_options)
    status, _, err = _run(
        capsys,
        "convert",
        str(tmp_path / "src"),
        f"s3://{s3_bucket}/pq/",
        "--to",
        "parquet",
        "--rows-per-file",
        "80",
        "--storage-options",
        options,
    )
    assert status == 0, err
    keys = s3_server.list(s3_bucket)
    assert sorted(k for k in keys if k.endswith(".parquet")) == [
        "pq/part-00000-00000.parquet",
        "pq/part-00000-00001.parquet",
        "pq/part-00000-00002.parquet",
    ]
    assert s3_server.list_multipart_uploads(s3_bucket) == []
    status, _, err = _run(
        capsys,
        "convert",
        f"s3://{s3_bucket}/pq/*.parquet",
        str(tmp_path / "back" / "part-{index:03d}.tfrecord"),
        "--from",
        "parquet",
        "--storage-options",
        options,
    )
    assert status == 0, err
    assert list(streamrec.open_dataset(str(tmp_path / "back"))) == payloads


def test_a_partial_run_completes_without_rewriting_or_duplicating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(tmp_path / "src", [_example(i) for i in range(400)], per_shard=50)
    out_dir = tmp_path / "pq"
    argv = ["convert", str(tmp_path / "src"), str(out_dir), "--to", "parquet"]
    argv += ["--rows-per-file", "60", "--task-bytes", "10KiB", "--json"]
    status, out, _ = _run(capsys, *argv)
    assert status == 0
    first = json.loads(out)
    states = sorted(out_dir.glob("_convert/*/task-*.json"))
    assert len(states) == first["tasks"] > 2
    # a run killed in task 1: its state never written, its last file never stored
    states[1].unlink()
    task1 = sorted(out_dir.glob("part-00001-*.parquet"))
    task1[-1].unlink()
    mtimes = {p: p.stat().st_mtime_ns for p in out_dir.glob("*.parquet")}
    status, out, _ = _run(capsys, *argv)
    assert status == 0
    second = json.loads(out)
    assert second["tasks_skipped"] == first["tasks"] - 1
    assert second["files"] == first["files"]
    for path, mtime in mtimes.items():
        if not path.name.startswith("part-00001-"):
            assert path.stat().st_mtime_ns == mtime, f"{path} was written again"
    labels = duckdb.sql(f"select label from read_parquet('{out_dir}/*.parquet')").fetchall()
    assert sorted(label for (label,) in labels) == list(range(400))


def test_a_record_the_spec_does_not_fit_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(tmp_path / "src", [encode({"a": i}) for i in range(10)] + [encode({"b": 1})], 100)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"a": {"type": "fixed", "dtype": "int64", "shape": []}}))
    argv = ["convert", str(tmp_path / "src"), str(tmp_path / "pq"), "--to", "parquet"]
    status, _, err = _run(capsys, *argv, "--spec", str(spec_file))
    assert status == 1
    assert "record 10 in " in err and "part-000.tfrecord at byte offset" in err
    assert "'a'" in err
    assert not list((tmp_path / "pq").glob("*.parquet"))  # nothing half done appears
    spec_file.write_text(json.dumps({"a": {"type": "fixed", "dtype": "int32"}}))
    status, _, err = _run(capsys, *argv, "--spec", str(spec_file))
    assert status == 1 and "spec entry 'a': dtype must be" in err


def test_help_says_what_the_options_do(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text: Any = capsys.readouterr().out
    needles = ("--rows-per-file", "--row-group-rows", "--spec", "Resumable", "byte for")
    for needle in (*needles, "--engine dask", "--scheduler ADDRESS", "--workers"):
        assert needle in text


def _parquet_files(directory: Path, rows_per_file: list[int], row_group_rows: int) -> list[bytes]:
    """Parquet files of ``rows_per_file`` rows (small row groups: a shard's range starts and
    ends inside them); the rows' Examples, in file order."""
    directory.mkdir(parents=True)
    first = 0
    for k, rows in enumerate(rows_per_file):
        ids = pa.array(range(first, first + rows), type=pa.int64())
        table = pa.table({"id": ids, "name": pa.array([b"r%d" % i for i in range(rows)])})
        pq.write_table(table, directory / f"f-{k}.parquet", row_group_size=row_group_rows)
        first += rows
    table = pq.read_table(sorted(directory.glob("*.parquet")))
    return [encode({"id": [r["id"]], "name": [r["name"]]}) for r in table.to_pylist()]


def _fixed_set(
    tmp_path: Path, name: str, payloads: list[bytes], shards: int, order: str
) -> dict[str, bytes]:
    """``open_writer``'s ``num_shards`` set of ``payloads``: file name -> bytes."""
    extra: dict[str, Any] = {"total_records": len(payloads)} if order == "contiguous" else {}
    with streamrec.sync.open_writer(
        str(tmp_path / name / "part-{index:03d}.tfrecord"),
        num_shards=shards,
        order=order,  # type: ignore[arg-type]
        manifest=None,
        **extra,
    ) as writer:
        writer.write_many(payloads)
    return {p.name: p.read_bytes() for p in sorted((tmp_path / name).glob("*.tfrecord"))}


@pytest.mark.parametrize(
    ("rows_per_file", "shards"),
    [([1000, 1000, 1000], 2), ([10, 0, 15], 3), ([3, 1, 4, 1, 5, 9, 2, 6], 4), ([2, 0], 5)],
)
def test_num_shards_from_parquet_balances_rows_not_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows_per_file: list[int], shards: int
) -> None:
    payloads = _parquet_files(tmp_path / "pq", rows_per_file, row_group_rows=7)
    template = str(tmp_path / "out" / "part-{index:03d}.tfrecord")
    argv = ["convert", str(tmp_path / "pq"), template, "--from", "parquet"]
    status, out, err = _run(capsys, *argv, "--num-shards", str(shards), "--json")
    assert status == 0, err
    summary = json.loads(out)
    counts = [sum(1 for _ in streamrec.open_dataset(url)) for url in summary["shards"]]
    assert len(counts) == shards and max(counts) - min(counts) <= 1
    assert min(counts) > 0 or sum(rows_per_file) < shards  # empty only with fewer rows
    got = {p.name: p.read_bytes() for p in sorted((tmp_path / "out").glob("*.tfrecord"))}
    # consecutive rows in file order: open_writer's contiguous set of the same Examples,
    # byte for byte; with fewer rows than shards, also what its round-robin (before) gave
    assert got == _fixed_set(tmp_path, "contiguous", payloads, shards, "contiguous")
    if len(payloads) < shards:
        assert got == _fixed_set(tmp_path, "round-robin", payloads, shards, "round_robin")


def test_num_shards_from_parquet_resumes_an_interrupted_job_to_the_same_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _parquet_files(tmp_path / "pq", [40, 0, 25, 35], row_group_rows=6)
    argv = ["--from", "parquet", "--num-shards", "6", "--jobs", "1", "--json"]

    def run(name: str) -> tuple[int, Any, str]:
        template = str(tmp_path / name / "part-{index:03d}.tfrecord")
        status, out, err = _run(capsys, "convert", str(tmp_path / "pq"), template, *argv)
        return status, json.loads(out) if status == 0 else None, err

    status, reference, err = run("reference")
    assert status == 0, err
    convert_crash.install(fail_task=1)  # task 0 done, task 1 dies after its first shard
    try:
        with pytest.raises(convert_crash.Interrupted):
            run("resumed")
    finally:
        convert_crash.install()
    status, resumed, err = run("resumed")
    assert status == 0, err
    assert resumed["tasks_skipped"] == 1 and resumed["tasks"] == reference["tasks"] > 2

    def objects(name: str) -> dict[str, bytes]:
        root = tmp_path / name
        return {  # (the manifest names the shards by url: made relative)
            str(p.relative_to(root)): p.read_bytes().replace(str(root).encode(), b"ROOT")
            for p in sorted(root.rglob("*"))
            if p.is_file() and "_reshard" not in p.parts
        }

    assert objects("resumed") == objects("reference")
