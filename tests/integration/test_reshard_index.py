"""``reshard(..., index=True)`` / ``streamrec reshard --index`` on local files: indexed output,
resuming (a task counts as done only with its sidecars; a run without the index is not
resumed by one with it), leftovers of sidecars aborted, sources that are output sidecars
refused. (S3, GCS, SIGKILL and Dask runs with the index: test_reshard.py,
test_reshard_dask.py.)"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

import streamrec
from integration.test_reshard import (
    check_output,
    framed_shards,
    input_files,
    make_records,
    write_local,
)
from streamrec.cli.reshard import main as cli_main
from streamrec.reshard.job import reshard
from streamrec.storage.sink_base import temp_name


def damaged_inputs(root: Path, records: list[bytes]) -> list[bytes]:
    """Four inputs of 30 records, the last one with a bad payload CRC; the good bytes."""
    shards = framed_shards(records, [30, 30, 30, 30])
    root.mkdir(parents=True, exist_ok=True)
    for k, data in enumerate(shards):
        (root / f"in-{k}.tfrecord").write_bytes(data)
    bad = bytearray(shards[3])
    bad[-3] ^= 0xFF
    (root / "in-3.tfrecord").write_bytes(bytes(bad))
    return shards


def listed(directory: Path) -> list[str]:
    return [str(p) for p in sorted(directory.iterdir()) if p.is_file()]


@pytest.mark.parametrize(
    "case",
    [
        {"max_records": 45, "task_bytes": 8000},
        {"max_bytes": 3000, "compression": "gzip", "task_bytes": 8000},
        {"num_shards": 5, "compression": "zlib", "shuffle": True},
    ],
    ids=["max_records", "max_bytes-gzip", "num_shards-zlib-shuffle"],
)
def test_indexed_output(tmp_path: Path, case: dict[str, object]) -> None:
    records = make_records()
    sources = write_local(tmp_path / "in", input_files(records))
    template = f"{tmp_path}/out/p-{{index:03d}}.tfrecord"
    summary = reshard(sources, template, progress=False, index=True, **case)  # type: ignore[arg-type]
    assert summary.tasks > 1 or "num_shards" in case
    out = tmp_path / "out"
    check_output(summary, collections.Counter(records), None, listed(out), indexed=True)
    # the same job without the index: the same shards, byte for byte, and no sidecar
    plain = reshard(sources, f"{tmp_path}/plain/p-{{index:03d}}.tfrecord", progress=False, **case)  # type: ignore[arg-type]
    check_output(plain, collections.Counter(records), None, listed(tmp_path / "plain"))
    if case.get("compression") is None:
        for a, b in zip(summary.shards, plain.shards, strict=True):
            assert Path(a).read_bytes() == Path(b).read_bytes()


def test_a_finished_task_missing_an_index_is_redone(tmp_path: Path) -> None:
    records = make_records(120)
    shards = damaged_inputs(tmp_path, records)
    template = f"{tmp_path}/out/p-{{index:02d}}.tfrecord"
    sources = str(tmp_path / "in-*.tfrecord")
    with pytest.raises(streamrec.errors.CorruptRecordError):
        reshard(sources, template, num_shards=4, progress=False, index=True)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.rglob("task-*.json")) == [
        "task-00000.json",
        "task-00001.json",
        "task-00002.json",
    ]
    assert sorted(p.name for p in out.glob("p-*")) == [
        f"p-{k:02d}.tfrecord{suffix}" for k in range(3) for suffix in ("", ".idx")
    ]
    (out / "p-01.tfrecord.idx").unlink()  # as if killed between the shard and its index
    (tmp_path / "in-3.tfrecord").write_bytes(shards[3])  # repaired
    kept = {p: p.stat().st_mtime_ns for p in (out / "p-00.tfrecord", out / "p-02.tfrecord")}
    summary = reshard(sources, template, num_shards=4, progress=False, index=True)
    assert summary.tasks_skipped == 2  # task 1 is redone: its index was missing
    assert {p: p.stat().st_mtime_ns for p in kept} == kept
    check_output(summary, collections.Counter(records), None, listed(out), indexed=True)


def test_a_run_without_the_index_is_not_resumed_by_one_with_it(tmp_path: Path) -> None:
    records = make_records(120)
    shards = damaged_inputs(tmp_path, records)
    template = f"{tmp_path}/out/p-{{index:02d}}.tfrecord"
    sources = str(tmp_path / "in-*.tfrecord")
    with pytest.raises(streamrec.errors.CorruptRecordError):
        reshard(sources, template, num_shards=4, progress=False)
    (tmp_path / "in-3.tfrecord").write_bytes(shards[3])
    summary = reshard(sources, template, num_shards=4, progress=False, index=True)
    assert summary.tasks_skipped == 0  # another job: its three finished tasks are not reused
    out = tmp_path / "out"
    check_output(summary, collections.Counter(records), None, listed(out), indexed=True)


def test_the_temporary_files_of_sidecars_a_killed_run_left_are_removed(tmp_path: Path) -> None:
    records = make_records()
    sources = write_local(tmp_path / "in", input_files(records))
    out = tmp_path / "out"
    out.mkdir()
    left = [out / temp_name("p-001.tfrecord.idx"), out / temp_name("p-001.tfrecord")]
    for path in left:
        path.write_bytes(b"half written")
    other = out / temp_name("notes.txt.idx")  # not one of this job's names: left alone
    other.write_bytes(b"x")
    summary = reshard(sources, f"{out}/p-{{index:03d}}.tfrecord", num_shards=3, progress=False)
    assert not any(path.exists() for path in left) and other.exists()
    other.unlink()
    check_output(summary, collections.Counter(records), None, listed(out))


def test_sources_that_are_output_sidecars_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_local(out, input_files(make_records()))
    sidecar = out / "p-00.tfrecord.idx"
    sidecar.write_bytes(b"0 20\n")  # what this job would write
    # globs never list sidecars as shards; named explicitly, one is refused
    with pytest.raises(ValueError, match="the sources include what"):
        reshard(
            [str(out / "*"), str(sidecar)],
            f"{out}/p-{{index:02d}}.tfrecord",
            num_shards=2,
            progress=False,
        )


def test_the_command_line_writes_indexes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = make_records()
    sources = write_local(tmp_path / "in", input_files(records))
    out = f"{tmp_path}/out/p-{{index:03d}}.tfrecord.gz"
    args = [sources, out, "--max-records", "50", "--compression", "gzip", "--index", "--json"]
    assert cli_main(args) == 0
    document = json.loads(capsys.readouterr().out)
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert [s["record_index"]["name"] for s in manifest["shards"]] == [
        Path(url).name + ".idx" for url in document["shards"]
    ]
    assert all(Path(url + ".idx").is_file() for url in document["shards"])
    with pytest.raises(SystemExit):
        cli_main(["--help"])
    assert "--index" in capsys.readouterr().out
